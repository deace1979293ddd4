#!/usr/bin/env python3
"""How long the whole test suite takes (``bash scripts/dev.sh test``, what CI runs), against an older tree.

The suite is what every change waits for, locally and in CI. The goal is the full ``dev.sh test`` (lint and
types, the whole suite on Python 3.12, the scripts' tests on Python 3.10) in under 7 minutes on a 2-CPU
machine, with the coverage it had before it was made faster. This script measures both halves of that claim
on two commits of this repository, a baseline (the tree before the suite was made faster) and a candidate
(by default the checkout's HEAD):

``run``
    Clones each commit into a work folder (a clean checkout, as CI has), does each clone's set-up once
    outside the timing (``dev.sh setup``, the Python 3.10 virtualenv), then times ``bash scripts/dev.sh test``
    in pairs, baseline and candidate back to back, alternating which goes first, so that a drift in machine
    speed hits both alike. Each timed run starts as CI's would: no tool caches (mypy, ruff, pytest,
    hypothesis; in the clone or its dev folder) and an empty per-user cache folder (``XDG_CACHE_HOME``), with ``CI=true`` and
    ``EVALS_E2E_REQUIRE=1`` as ``.ci/run`` sets them. Before each run the script waits until the machine
    is quiet (CPU busy under ``MAX_BUSY`` over ``QUIET_SAMPLE_S``) and records that, and the load average.
    Each run's output is kept line by line with its time, so the phases are read from ``dev.sh``'s own
    ``[dev.sh]`` lines and the counts from pytest's summary lines. One JSON file and one log per run are
    written to the raw folder as soon as the run ends, so an interrupted benchmark keeps what it measured.
``coverage``
    Runs each commit's ``dev.sh test`` once more, untimed, with line coverage of ``scripts/`` and ``evals/``
    switched on in every Python process the suites start (a ``.pth`` start-up hook in each clone's
    virtualenvs, ``COVERAGE_PROCESS_START``), and keeps the totals and the per-file figures.
``summarize``
    Builds ``benchmarks/results/suite_speed.json`` (the shape BENCHMARK.md is built from) from the raw
    folder: per commit, the median wall time with its range, the phases, the CPU seconds, the test counts and
    the coverage; per pair, the candidate's time over the baseline's.

    python3 benchmarks/bench_suite.py run --baseline REV --pairs 3 --raw DIR
    python3 benchmarks/bench_suite.py coverage --baseline REV --raw DIR
    python3 benchmarks/bench_suite.py summarize DIR            # -> benchmarks/results/suite_speed.json

The figure is only meaningful on a quiet machine of the size the goal names (2 CPUs): nothing else running.
Needs git, and what ``dev.sh`` needs (Python 3.12 and 3.10, Node 18+); the package registries for the
clones' set-up. Exit codes: 0 done, 1 a measured run failed (recorded, the benchmark goes on), 2 bad input.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: pip's own copy of the same parser
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import host  # noqa: E402  (beside this script: how the result names the machine)
import raw_store  # noqa: E402  (beside this script: the raw results are read from their archive)
from mfsdp_lib import config_io  # noqa: E402  (the atomic write)

RESULT = ROOT / "benchmarks" / "results" / "suite_speed.json"
TARGET_S = 7 * 60  # the goal: the whole `dev.sh test` under 7 minutes on a 2-CPU machine
LABELS = ("baseline", "candidate")
# Tool caches a clean checkout does not have; each timed run starts without them, as CI does. Older trees keep them
# in the checkout; newer ones in the checkout's dev folder (DEV_TOOL_CACHE, scripts/mfsdp_lib/devenv.py).
TOOL_CACHES = (".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis")
DEV_TOOL_CACHE = "tool-cache"
# Virtualenvs of a tree: in the checkout (older trees) or in its dev folder (newer ones).
TREE_VENVS = (".venv", ".venv310")
DEV_VENVS = ("venv", "venv310")
MAX_BUSY = 0.10  # the machine counts as quiet when at most 10 % of its CPU time was busy over the sample
QUIET_SAMPLE_S = 3.0  # long enough to see a background job, short enough to re-sample often
SETTLE_S = 600  # give up (exit 2) when the machine has not been quiet for this long before a run
# dev.sh's own progress lines mark where each phase starts (scripts/dev.sh, say "...").
PHASE_MARKS = (
    ("lint", re.compile(r"^\[dev\.sh\] ruff check")),
    ("suite_312", re.compile(r"^\[dev\.sh\] the test suite on Python 3\.12")),
    ("suite_310", re.compile(r"^\[dev\.sh\] the scripts' tests on Python 3\.10")),
)
PHASES = ("setup", "lint", "suite_312", "suite_310")
# pytest's closing line: "==== 3602 passed, 8 skipped in 234.90s (0:03:54) ====" (no = signs under -q).
SUMMARY = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+) in ([\d.]+)s\b")
COUNT = re.compile(r"(\d+) ([a-z]+)")
# pytest -ra's short summary: "FAILED tests/x.py::test_y - reason" (the log prefixes each line with its time).
FAILED_LINE = re.compile(r"^\s*[\d.]*\s*(?:FAILED|ERROR) (\S+::\S+)")
# The coverage module the `coverage` step installs into each clone's virtualenvs: the pin in pyproject.toml's
# bench extra (read from there, so the version is written once).
COVERAGE_EXTRA = "bench"
COVERED = ("scripts", "evals")  # the product code whose lines the suites are to keep covering
PTH_NAME = "zz_mfsdp_bench_coverage.pth"
# The GPU-side code: it runs under torch and Megatron-Bridge on a GPU machine, so here only its pure parts run and
# its GPU tests skip. Its share of the code changes between trees (the rehearsal moved into a package and grew),
# so the coverage is reported for it and for the rest apart: one total would mix the two.
GPU_SIDE = re.compile(r"^scripts/(mfsdp_gpu/|rehearse_train\.py$|smoke_train\.py$)")
COVERAGE_QUIET = "no-data-collected, module-not-imported, module-not-measured, couldnt-parse, no-ctracer"


class BenchError(Exception):
    """Bad input or an unusable environment: one line for the user, exit 2."""


# ---------------------------------------------------------------------------------------------------- machine


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies over all CPUs, from /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [float(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def busy_between(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The busy share of the CPU time between two ``cpu_times()`` readings."""
    return (after[0] - before[0]) / max(after[1] - before[1], 1e-9)


def busy_fraction(seconds: float = QUIET_SAMPLE_S) -> float:
    before = cpu_times()
    time.sleep(seconds)
    return busy_between(before, cpu_times())


def wait_quiet(settle_s: float = SETTLE_S, max_busy: float = MAX_BUSY, sample_s: float = QUIET_SAMPLE_S) -> dict:
    """Block until the CPUs have been (nearly) idle over one sample; what was seen, for the record."""
    start = time.monotonic()
    samples = []
    while True:
        busy = busy_fraction(sample_s)
        samples.append(round(busy, 3))
        if busy <= max_busy:
            return {
                "busy": round(busy, 3),
                "waited_s": round(time.monotonic() - start, 1),
                "samples": len(samples),
                "loadavg": [round(x, 2) for x in os.getloadavg()],
            }
        if time.monotonic() - start > settle_s:
            raise BenchError(
                f"the machine was never quiet in {settle_s:.0f} s (CPU busy {samples[-5:]}, limit {max_busy}): "
                "stop what else runs and start again"
            )
        print(f"  waiting for a quiet machine (CPU {busy:.0%} busy)", file=sys.stderr)


def machine() -> str:
    memory = host.memory_gib()
    return host.describe(*([memory] if memory else []))


# ----------------------------------------------------------------------------------------------------- clones


def git(*args: str, cwd: Path = ROOT) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"git {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout.strip()


def resolve(rev: str) -> str:
    return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")


def shared_env() -> dict[str, str]:
    """The external fixtures folder as the tests find it beside this checkout; the clones live elsewhere."""
    if os.environ.get("MFSDP_SHARED_DIR"):
        return {"MFSDP_SHARED_DIR": os.environ["MFSDP_SHARED_DIR"]}
    beside = ROOT.parent / "shared"
    return {"MFSDP_SHARED_DIR": str(beside)} if beside.is_dir() else {}


def clone(sha: str, dest: Path) -> Path:
    """A clean checkout of SHA at DEST (reused when it is already there at that commit)."""
    if (dest / ".git").exists() and git("rev-parse", "HEAD", cwd=dest) == sha:
        return dest
    if dest.exists():
        raise BenchError(f"{dest} exists and is not a clone of {sha[:12]}: give another --workdir")
    dest.parent.mkdir(parents=True, exist_ok=True)
    git("clone", "-q", "--no-checkout", str(ROOT), str(dest))
    git("checkout", "-q", "--detach", sha, cwd=dest)
    return dest


def set_up(tree: Path, log) -> None:
    """The one-time set-up a timed run must not include: the virtualenvs and the skills CLI."""
    for args in (["setup"], ["test310", "--version"]):
        print(f"  set-up: dev.sh {' '.join(args)} in {tree}", file=sys.stderr)
        proc = subprocess.run(
            ["bash", "scripts/dev.sh", *args],
            cwd=tree,
            env=run_env(None, tree),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if proc.returncode != 0:
            raise BenchError(f"dev.sh {' '.join(args)} failed in {tree} (exit {proc.returncode}); see {log.name}")


def dev_home(tree: Path) -> Path:
    """The tree's dev folder (MFSDP_DEV_HOME), beside the clone: fixed, so the set-up done once outside the timing
    is what the timed runs use, though each of them gets an empty XDG_CACHE_HOME (trees whose dev.sh keeps its
    virtualenvs in the checkout ignore it)."""
    return tree.parent / f"{tree.name}.dev"


def run_env(cache_home: str | None, tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["MFSDP_DEV_HOME"] = str(dev_home(tree))
    env.update(shared_env())
    env.update({"CI": "true", "EVALS_E2E_REQUIRE": "1"})  # what .ci/run sets: nothing that must run may skip
    if cache_home:
        env["XDG_CACHE_HOME"] = cache_home
    env.pop("MFSDP_TEST_WORKERS", None)  # each tree's own default
    return env


def clear_tool_caches(tree: Path) -> None:
    for name in TOOL_CACHES:
        shutil.rmtree(tree / name, ignore_errors=True)
    shutil.rmtree(dev_home(tree) / DEV_TOOL_CACHE, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ one timed run


def timed_run(tree: Path, log_path: Path, env_extra: dict | None = None) -> dict:
    """`bash scripts/dev.sh test` in TREE, each output line kept with its time since the start; the run gets an
    empty per-user cache folder of its own, removed afterwards."""
    cache_home = tempfile.mkdtemp(prefix="mfsdp-bench-suite-cache-")
    try:
        return _timed_run(tree, log_path, {**run_env(cache_home, tree), **(env_extra or {})})
    finally:
        shutil.rmtree(cache_home, ignore_errors=True)


def _timed_run(tree: Path, log_path: Path, env: dict[str, str]) -> dict:
    lines: list[tuple[float, str]] = []
    ru0 = os.times()
    cpu0 = cpu_times()
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8", buffering=1) as log:  # line-buffered: the log shows progress
        proc = subprocess.Popen(
            ["bash", "scripts/dev.sh", "test"],
            cwd=tree,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            t = time.monotonic() - start
            line = line.rstrip("\n")
            lines.append((t, line))
            log.write(f"{t:9.2f} {line}\n")
        rc = proc.wait()
    wall = time.monotonic() - start
    cpu1 = cpu_times()
    ru1 = os.times()
    out = parse_lines(lines, wall)
    out.update(
        {
            "exit": rc,
            "wall_s": round(wall, 2),
            "cpu_s": round((ru1.children_user - ru0.children_user) + (ru1.children_system - ru0.children_system), 1),
            "machine_busy_during": round(busy_between(cpu0, cpu1), 3),
        }
    )
    return out


def parse_lines(lines: list[tuple[float, str]], wall: float) -> dict:
    """Phase durations from dev.sh's marker lines; pytest's summary lines, in order (3.12 first, then 3.10)."""
    marks: dict[str, float] = {}
    summaries = []
    for t, line in lines:
        for phase, pattern in PHASE_MARKS:
            if phase not in marks and pattern.search(line):
                marks[phase] = t
        m = SUMMARY.search(line.strip())
        if m:
            counts = {word: int(n) for n, word in COUNT.findall(m.group(1))}
            summaries.append({"counts": counts, "pytest_s": float(m.group(2)), "at_s": round(t, 2)})
    starts = {"setup": 0.0, **marks}
    phases: dict[str, float | None] = {}
    for i, phase in enumerate(PHASES):
        if phase not in starts:
            phases[phase] = None
            continue
        later = [starts[p] for p in PHASES[i + 1 :] if p in starts]
        end = later[0] if later else wall
        phases[phase] = round(end - starts[phase], 2)
    return {"phases_s": phases, "pytest": summaries}


# -------------------------------------------------------------------------------------------------- commands


def _trees(a) -> dict[str, tuple[str, Path]]:
    work = Path(a.workdir).resolve()
    shas = {}
    for label, rev in (("baseline", a.baseline), ("candidate", a.candidate)):
        try:
            shas[label] = resolve(rev)
        except BenchError:
            raise BenchError(f"--{label} {rev!r} is not a commit of this repository") from None
    if shas["baseline"] == shas["candidate"]:
        raise BenchError("--baseline and --candidate are the same commit")
    return {label: (sha, work / label) for label, sha in shas.items()}


def _prepared_trees(a, raw: Path) -> dict[str, tuple[str, Path]]:
    """Both commits cloned into the work folder and set up (untimed); the raw folder made."""
    raw.mkdir(parents=True, exist_ok=True)
    trees = _trees(a)
    with open(raw / "setup.log", "a", encoding="utf-8") as log:
        for sha, path in trees.values():
            clone(sha, path)
            set_up(path, log)
    return trees


def cmd_run(a) -> int:
    if a.pairs < 1:
        raise BenchError("--pairs must be at least 1")
    if git("status", "--porcelain", "--untracked-files=no") and a.candidate == "HEAD":
        print("note: the checkout has uncommitted changes; only the committed HEAD is measured", file=sys.stderr)
    raw = Path(a.raw)
    trees = _prepared_trees(a, raw)
    failed = 0
    for pair in range(a.pairs):
        order = LABELS if pair % 2 == 0 else tuple(reversed(LABELS))  # alternate who runs first
        for label in order:
            sha, tree = trees[label]
            name = f"pair{pair}_{label}"
            if (raw / f"{name}.json").exists():
                print(f"{name}: already measured, kept", file=sys.stderr)
                continue
            clear_tool_caches(tree)
            quiet = wait_quiet(a.settle)
            print(f"{name}: dev.sh test at {sha[:12]} (CPU {quiet['busy']:.0%} busy before)", file=sys.stderr)
            rec = timed_run(tree, raw / f"{name}.log")
            rec.update({"label": label, "pair": pair, "commit": sha, "quiet_before": quiet, "machine": machine()})
            rec["date"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            (raw / f"{name}.json").write_text(json.dumps(rec, indent=2) + "\n", encoding="utf-8")
            failed += rec["exit"] != 0
            print(
                f"{name}: {rec['wall_s']:.0f} s, exit {rec['exit']}, phases {rec['phases_s']}, "
                f"pytest {[s['counts'] for s in rec['pytest']]}",
                file=sys.stderr,
            )
    record_command(raw, "run")
    return 1 if failed else 0


def record_command(raw: Path, sub: str, argv: list[str] | None = None) -> None:
    """Keep this subcommand's command line in RAW/command.txt (one line per subcommand, the latest call's)."""
    path = raw / "command.txt"
    line = shlex.join(["python3", "benchmarks/bench_suite.py", *(sys.argv[1:] if argv is None else argv)])
    kept = [ln for ln in path.read_text().splitlines() if ln.split()[2:3] != [sub]] if path.is_file() else []
    path.write_text("\n".join([*kept, line]) + "\n")


def coverage_pin(tree: Path = ROOT) -> str:
    """The coverage requirement of the bench extra in TREE's pyproject.toml (the one place it is written)."""
    with open(tree / "pyproject.toml", "rb") as fh:
        extras = tomllib.load(fh)["project"].get("optional-dependencies", {})
    pins = [r for r in extras.get(COVERAGE_EXTRA, []) if r.replace(" ", "").startswith("coverage==")]
    if not pins:
        raise BenchError(f"pyproject.toml has no coverage pin in the {COVERAGE_EXTRA} extra")
    return pins[0]


def _site_packages(venv: Path) -> Path:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def coverage_run(label: str, sha: str, tree: Path, raw: Path) -> dict:
    """One untimed `dev.sh test` with coverage in every Python process of the clone's virtualenvs."""
    candidates = [tree / v for v in TREE_VENVS] + [dev_home(tree) / v for v in DEV_VENVS]
    venvs = [v for v in candidates if (v / "bin" / "python").exists()]
    pin = coverage_pin()
    data = Path(tempfile.mkdtemp(prefix=f"mfsdp-bench-cov-{label}-"))
    rc_file = data / "coveragerc"
    sources = "\n    ".join(str(tree / d) for d in COVERED)
    # Warnings off: a process that imports none of the sources would print one on stderr, which tests that
    # expect a silent stderr from a command would read as a failure.
    rc_file.write_text(
        f"[run]\nparallel = True\ndata_file = {data}/.coverage\nsource =\n    {sources}\n"
        f"disable_warnings =\n    {COVERAGE_QUIET}\n"
    )
    hooks = []
    try:
        for venv in venvs:
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", pin], check=True)
            pth = _site_packages(venv) / PTH_NAME
            pth.write_text("import coverage; coverage.process_startup()\n")
            hooks.append(pth)
        clear_tool_caches(tree)
        rec = timed_run(tree, raw / f"coverage_{label}.log", {"COVERAGE_PROCESS_START": str(rc_file)})
    finally:
        for pth in hooks:
            pth.unlink(missing_ok=True)
    py = str(venvs[0] / "bin" / "python")
    subprocess.run([py, "-m", "coverage", "combine", f"--rcfile={rc_file}", "-q"], check=True, cwd=data)
    report = data / "coverage.json"
    subprocess.run([py, "-m", "coverage", "json", f"--rcfile={rc_file}", "-q", "-o", str(report)], check=True, cwd=data)
    cov = json.loads(report.read_text())
    files = {}
    for path, entry in cov["files"].items():
        rel = os.path.relpath(path, tree)
        s = entry["summary"]
        files[rel] = {"statements": s["num_statements"], "covered": s["covered_lines"]}
    shutil.rmtree(data, ignore_errors=True)
    t = cov["totals"]
    return {
        "label": label,
        "commit": sha,
        "exit": rec["exit"],
        "pytest": rec["pytest"],
        "coverage_version": pin,
        "statements": t["num_statements"],
        "covered": t["covered_lines"],
        "percent": round(100.0 * t["covered_lines"] / max(t["num_statements"], 1), 2),
        "files": files,
    }


def cmd_coverage(a) -> int:
    raw = Path(a.raw)
    trees = _prepared_trees(a, raw)
    failed = 0
    for label, (sha, tree) in trees.items():
        print(f"coverage: dev.sh test at {sha[:12]} ({label})", file=sys.stderr)
        rec = coverage_run(label, sha, tree, raw)
        (raw / f"coverage_{label}.json").write_text(json.dumps(rec, indent=2) + "\n", encoding="utf-8")
        failed += rec["exit"] != 0
        print(f"coverage {label}: {rec['percent']} % of {rec['statements']} lines", file=sys.stderr)
    record_command(raw, "coverage")
    return 1 if failed else 0


# ------------------------------------------------------------------------------------------------- summarize


def _counts(rec: dict, index: int) -> dict:
    s = rec.get("pytest") or []
    return s[index]["counts"] if len(s) > index else {}


def _tests(counts: dict) -> str:
    if not counts:
        return "—"
    parts = [f"{counts.get('passed', 0)} passed"]
    parts += [f"{counts[k]} {k}" for k in ("skipped", "failed", "error", "errors") if counts.get(k)]
    return ", ".join(parts)


def _coverage_cell(cov: dict | None) -> str:
    if not cov:
        return "not measured"
    split = coverage_split(cov)
    return f"{split['rest']['percent']:.1f} % / {split['gpu_side']['percent']:.1f} %"


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 1) if xs else None


def failed_tests(log: Path) -> list[str]:
    """The test ids pytest's short summary names as failed or in error, from a run's log."""
    if not log.is_file():
        return []
    found = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = FAILED_LINE.search(line)
        if m and m.group(1) not in found:
            found.append(m.group(1))
    return found


def load_raw(raw: Path) -> tuple[list[dict], dict[str, dict]]:
    runs = []
    for path in sorted(raw.glob("pair*_*.json")):
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BenchError(f"{path}: not readable JSON ({exc})") from None
        rec["failed_tests"] = failed_tests(path.with_suffix(".log"))
        runs.append(rec)
    covs = {}
    for label in LABELS:
        path = raw / f"coverage_{label}.json"
        if path.is_file():
            covs[label] = json.loads(path.read_text(encoding="utf-8"))
    if not runs:
        raise BenchError(f"{raw}: no timed runs (pair*_*.json); run `bench_suite.py run --raw {raw}` first")
    return runs, covs


def coverage_split(cov: dict) -> dict[str, dict]:
    """Line totals of one tree, for the GPU-side code (``GPU_SIDE``) and for the rest."""
    out: dict[str, dict[str, float]] = {
        "rest": {"statements": 0, "covered": 0},
        "gpu_side": {"statements": 0, "covered": 0},
    }
    for rel, f in cov["files"].items():
        part = out["gpu_side" if GPU_SIDE.search(rel) else "rest"]
        part["statements"] += f["statements"]
        part["covered"] += f["covered"]
    for part in out.values():
        part["percent"] = round(100.0 * part["covered"] / max(part["statements"], 1), 2)
    return out


def coverage_drops(covs: dict[str, dict], min_points: float = 1.0) -> list[str]:
    """Files in both trees whose line coverage fell by at least MIN_POINTS percentage points."""
    if set(covs) != set(LABELS):
        return []
    base, cand = covs["baseline"]["files"], covs["candidate"]["files"]
    out = []
    for rel in sorted(set(base) & set(cand)):
        b, c = base[rel], cand[rel]
        pb = 100.0 * b["covered"] / max(b["statements"], 1)
        pc = 100.0 * c["covered"] / max(c["statements"], 1)
        if pb - pc >= min_points:
            out.append(f"{rel} {pb:.1f} % -> {pc:.1f} %")
    return out


def summarize(runs: list[dict], covs: dict[str, dict], command: str, raw_rel: str) -> dict:
    by = {label: [r for r in runs if r["label"] == label] for label in LABELS}
    if not by["candidate"]:
        raise BenchError("no timed run of the candidate in the raw folder")
    rows = []
    for label in LABELS:
        rs = by[label]
        if not rs:
            continue
        walls = [r["wall_s"] for r in rs]
        phases = {p: _median([r["phases_s"].get(p) for r in rs]) for p in PHASES}
        cov = covs.get(label)
        rows.append(
            [
                label,
                rs[0]["commit"][:12],
                len(rs),
                _median(walls),
                f"{min(walls):.0f}-{max(walls):.0f}",
                phases["setup"],
                phases["lint"],
                phases["suite_312"],
                phases["suite_310"],
                _median([r["cpu_s"] for r in rs]),
                _tests(_counts(rs[0], 0)),
                _tests(_counts(rs[0], 1)),
                _coverage_cell(cov),
                f"< {TARGET_S // 60} min" if label == "candidate" else "",
            ]
        )
    pairs = sorted({r["pair"] for r in runs})
    ratios = []
    for p in pairs:
        both = {r["label"]: r for r in runs if r["pair"] == p}
        if set(both) == set(LABELS):
            ratios.append(round(both["candidate"]["wall_s"] / both["baseline"]["wall_s"], 3))
    cand_walls = [r["wall_s"] for r in by["candidate"]]
    met = all(w < TARGET_S for w in cand_walls) and all(r["exit"] == 0 for r in by["candidate"])
    busy = [r["quiet_before"]["busy"] for r in runs]
    notes = [
        f"{len(runs)} timed runs of `bash scripts/dev.sh test` (with CI=true and EVALS_E2E_REQUIRE=1, as .ci/run "
        "sets them), each on a clean clone of its commit whose one-time set-up (virtualenvs, the skills CLI) was "
        "done before and is not timed; tool caches and the per-user cache folder emptied before every run.",
        "Interleaved in pairs, alternating which tree runs first; the machine was quiet before every run (CPU busy "
        f"at most {max(busy):.0%} over {QUIET_SAMPLE_S:g} s, limit {MAX_BUSY:.0%}).",
        "Phases from dev.sh's own progress lines: setup = the set-up check, lint = ruff and mypy plus the bytecode "
        "warm-up, 3.12 = the whole suite on Python 3.12, 3.10 = the scripts' tests on Python 3.10; CPU s = user + "
        "system time of every process the run started.",
    ]
    if ratios:
        notes.append(
            f"Candidate over baseline, per pair: {', '.join(f'{x:.2f}' for x in ratios)} "
            f"(median {statistics.median(ratios):.2f})."
        )
    failed = [
        f"{r['label']} pair {r['pair']} (exit {r['exit']}{': ' + ', '.join(r['failed_tests']) if r.get('failed_tests') else ''})"
        for r in runs
        if r["exit"] != 0
    ]
    if failed:
        notes.append("Runs whose suite failed: " + "; ".join(failed) + "; their times still count.")
    if set(covs) == set(LABELS):
        drops = coverage_drops(covs)
        parts = []
        for label in LABELS:
            sp, cov = coverage_split(covs[label]), covs[label]
            parts.append(
                f"{label} {sp['rest']['percent']:.1f} % of {sp['rest']['statements']} lines outside the GPU-side "
                f"code, {sp['gpu_side']['percent']:.1f} % of its {sp['gpu_side']['statements']} "
                f"({cov['percent']:.1f} % of {cov['statements']} in all)"
            )
        notes.append(
            f"Coverage (the column: outside / inside the GPU-side code): line coverage of "
            f"{' and '.join(d + '/' for d in COVERED)} in every Python process the suites start, one untimed run "
            f"per tree: {'; '.join(parts)}. The GPU-side code (scripts/mfsdp_gpu/, rehearse_train.py, "
            "smoke_train.py) runs in full only on a GPU machine, where its own tests run; its share grew between "
            "the trees, so the totals are not compared. Files in both trees whose coverage fell by a point or "
            f"more: {'; '.join(drops) if drops else 'none'}."
        )
    else:
        notes.append("Coverage: not measured (`bench_suite.py coverage`).")
    notes.append(
        f"Candidate: every run under {TARGET_S // 60} min and passing: {'met' if met else 'NOT met'} "
        f"(median {_median(cand_walls)} s, slowest {max(cand_walls):.0f} s)."
    )
    first = by["candidate"][0]
    return {
        "benchmark": "suite_speed",
        "title": "The whole test suite (`bash scripts/dev.sh test`, what CI runs) against the tree before it was "
        "made faster",
        "date": max(r["date"] for r in runs),
        "machine": first.get("machine", "unknown"),
        "command": command,
        "columns": [
            "tree",
            "commit",
            "runs",
            "wall s (median)",
            "wall s range",
            "setup s",
            "lint s",
            "3.12 suite s",
            "3.10 suite s",
            "CPU s",
            "tests on 3.12",
            "tests on 3.10",
            "line coverage (rest / GPU-side)",
            "target",
        ],
        "rows": rows,
        "notes": notes,
        "raw": {
            "folder": raw_rel,
            "pair_ratios": ratios,
            "target_s": TARGET_S,
            "met": met,
            "runs": [
                {
                    k: r.get(k)
                    for k in (
                        "label",
                        "pair",
                        "commit",
                        "wall_s",
                        "cpu_s",
                        "exit",
                        "failed_tests",
                        "phases_s",
                        "pytest",
                    )
                }
                | {"busy_before": r["quiet_before"]["busy"], "loadavg_before": r["quiet_before"]["loadavg"]}
                for r in sorted(runs, key=lambda r: (r["pair"], r["label"]))
            ],
            "coverage": {
                label: {k: c[k] for k in ("commit", "statements", "covered", "percent")} | coverage_split(c)
                for label, c in covs.items()
            },
        },
    }


def cmd_summarize(a) -> int:
    raw = Path(a.raw)
    if not raw.is_dir():
        raise BenchError(f"{raw}: no such folder")
    runs, covs = load_raw(raw)
    cmd_file = raw / "command.txt"
    record_command(raw, "summarize", ["summarize", a.raw, *(x for n in a.note for x in ("--note", n))])
    recorded = cmd_file.read_text().split("\n") if cmd_file.is_file() else []
    command = " && ".join([ln for ln in recorded if ln.strip()] or ["python3 benchmarks/bench_suite.py run"])
    try:
        raw_rel = raw_store.logical(raw) or str(raw.resolve().relative_to(ROOT))
    except ValueError:
        raw_rel = str(raw)
    doc = summarize(runs, covs, command, raw_rel)
    doc["notes"][-1:-1] = a.note  # the reader's explanations go before the verdict
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config_io.write_atomic(str(out), json.dumps(doc, indent=2) + "\n")
    print(doc["notes"][-1], f"-> {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, helptext in (
        ("run", "time dev.sh test on both commits, interleaved in pairs"),
        ("coverage", "one untimed dev.sh test per commit with line coverage on"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument(
            "--baseline", required=True, help="the commit to compare against (e.g. the tree before a change)"
        )
        p.add_argument("--candidate", default="HEAD", help="the commit measured (default HEAD)")
        p.add_argument("--raw", required=True, help="folder for the raw per-run JSON files and logs")
        p.add_argument(
            "--workdir",
            default=os.path.join(tempfile.gettempdir(), "mfsdp-bench-suite"),
            help="where the clones live (reused across calls; default under the temp folder)",
        )
        if name == "run":
            p.add_argument("--pairs", type=int, default=3, help="interleaved pairs of runs (default 3)")
            p.add_argument("--settle", type=float, default=SETTLE_S, help="most seconds to wait for a quiet machine")
    p = sub.add_parser("summarize", help="build the result file from a raw folder")
    p.add_argument("raw", help="the raw folder `run` (and `coverage`) wrote")
    p.add_argument("--out", default=str(RESULT), help="result file (default benchmarks/results/suite_speed.json)")
    p.add_argument(
        "--note",
        action="append",
        default=[],
        help="a sentence for the notes, e.g. why a baseline test failed (repeatable; kept in the command line)",
    )
    a = ap.parse_args(argv)
    try:
        return {"run": cmd_run, "coverage": cmd_coverage, "summarize": cmd_summarize}[a.cmd](a)
    except BenchError as exc:
        print(f"bench_suite.py: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
