#!/usr/bin/env python3
"""What a ``mfsdp.py check`` costs a user, first call and second, against a bare interpreter start.

The agent runs ``check`` after every edit, so what matters is the second and later calls of a session: the
target is that call (``warm``) at most 5x ``python3 -c pass``. The first call (``cold``) also compiles the
library and the modules it loads, and writes their bytecode into the per-user cache
(``scripts/mfsdp_lib/bytecode_cache.py``); it is reported too.

Each round runs, back to back, in fresh processes with the environment a user has (no
``PYTHONDONTWRITEBYTECODE``, no ``PYTHONPYCACHEPREFIX``; ``XDG_CACHE_HOME`` pointed at an empty folder made
for the round):

    bare   python3 -c pass
    cold   mfsdp.py check            (empty cache: compiles, writes the cache)
    warm   mfsdp.py check            (the same cache: the user's second call)

Interleaving the three within a round means a change of machine load hits all three alike; the figures are
the medians over the rounds, with p10/p90 as the spread, and the ratio of each round's time to that
round's bare start (median and p10/p90 of those ratios). The rounds after ``--warmup`` discarded ones are
kept. The script refuses to report when the cache was not written, or when any ``.pyc`` appeared in the skill
folder. Absolute times depend on the machine: run it on a quiet one.

    python3 benchmarks/bench_check.py                  # 40 rounds
    python3 benchmarks/bench_check.py --reps 100       # what BENCHMARK.md reports

Writes ``benchmarks/results/check_speed.json`` (``--out``) in the shape BENCHMARK.md is built from.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import host  # noqa: E402  (beside this script: how the result names the machine)
from mfsdp_lib import bytecode_cache, config_io  # noqa: E402  (the cache's location; the atomic write)

RESULT = ROOT / "benchmarks" / "results" / "check_speed.json"
TARGET_RATIO = 5.0  # the goal: a session's second check within 5x a bare interpreter start (median of rounds)
WARMUP = 3  # rounds discarded first: a cold page cache for the interpreter and the sources is no user's case
DEFAULT_REPS = 40
MIN_REPS = 5  # fewer rounds give no meaningful median or spread
KINDS = ("bare", "cold", "warm")  # the order within a round; warm must follow the cold run of its round
# Variables that change where (or whether) bytecode is cached, and the debug switch: a user has none set.
CACHE_VARS = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "MFSDP_DEBUG")


def commands(py: str) -> dict[str, list[str]]:
    # A fixed --env makes the result independent of this shell's environment.
    check = [py, "scripts/mfsdp.py", "check", "--env", "PATH=/usr/bin"]
    return {"bare": [py, "-c", "pass"], "cold": check, "warm": check}


def user_env(cache_home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARS}
    env["XDG_CACHE_HOME"] = cache_home
    return env


def _time(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    elapsed = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{shlex.join(cmd)} failed ({proc.returncode}): {proc.stderr.decode()[-300:]}")
    return elapsed


def skill_bytecode() -> set[str]:
    """Every .pyc/.pyo in the skill folder outside the tool folders (.venv, .cache, .git ...)."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        if dirpath == str(ROOT):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found |= {os.path.join(dirpath, f) for f in filenames if f.endswith((".pyc", ".pyo"))}
    return found


def cached_files(cache_home: str) -> int:
    folder = bytecode_cache.default_dir({"XDG_CACHE_HOME": cache_home})
    return sum(len([f for f in files if f.endswith(".pyc")]) for _, _, files in os.walk(folder))


def one_round(cmds: dict[str, list[str]], scratch: str, index: int) -> dict[str, float]:
    """bare, cold, warm, back to back; cold and warm share a cache folder that starts empty."""
    cache_home = os.path.join(scratch, f"round{index}")
    os.mkdir(cache_home, 0o700)
    env = user_env(cache_home)
    times = {kind: _time(cmds[kind], env) for kind in KINDS}
    if not cached_files(cache_home):
        raise SystemExit(
            f"the cold check wrote no bytecode into {bytecode_cache.default_dir({'XDG_CACHE_HOME': cache_home})}: "
            "the warm figure would measure an uncached call"
        )
    shutil.rmtree(cache_home, ignore_errors=True)
    return times


def stats(xs: list[float], scale: float = 1000.0, digits: int = 2) -> dict:
    """median, p10, p90, min, max of xs (seconds -> ms by default)."""
    s = sorted(xs)
    n = len(s)

    def q(p: float) -> float:  # nearest-rank percentile
        return s[min(n - 1, max(0, round(p * (n - 1))))]

    return {
        "median": round(statistics.median(s) * scale, digits),
        "p10": round(q(0.10) * scale, digits),
        "p90": round(q(0.90) * scale, digits),
        "min": round(s[0] * scale, digits),
        "max": round(s[-1] * scale, digits),
    }


def summarize(rounds: list[dict[str, float]]) -> dict:
    """Per kind: time stats (ms) and, for cold and warm, the stats of the per-round ratio to bare."""
    out: dict = {}
    for kind in KINDS:
        out[kind] = {"ms": stats([r[kind] for r in rounds])}
        if kind != "bare":
            out[kind]["ratio"] = stats([r[kind] / r["bare"] for r in rounds], scale=1.0)
    return out


def _machine() -> str:
    extra = [f"Python {platform.python_version()}"]
    if hasattr(os, "getloadavg"):
        extra.append(f"load average at the start {os.getloadavg()[0]:.2f}")
    return host.describe(*extra)


def document(rounds: list[dict[str, float]], reps: int, out: str, machine: str) -> dict:
    s = summarize(rounds)
    warm_ratio = s["warm"]["ratio"]["median"]
    label = {
        "bare": "python3 -c pass",
        "cold": "mfsdp.py check, first call (empty cache)",
        "warm": "mfsdp.py check, second call (cached)",
    }
    rows = []
    for kind in KINDS:
        ms = s[kind]["ms"]
        ratio = s[kind].get("ratio")
        rows.append(
            [
                label[kind],
                ms["median"],
                ms["p10"],
                ms["p90"],
                ratio["median"] if ratio else 1.0,
                f"{ratio['p10']}-{ratio['p90']}" if ratio else "",
                f"<= {TARGET_RATIO:g}" if kind == "warm" else "",
            ]
        )
    return {
        "benchmark": "check_speed",
        "title": "mfsdp.py check on the embedded Llama 3 8B recipe, first and second call, vs. a bare "
        "interpreter start",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "command": shlex.join(
            ["python3", "benchmarks/bench_check.py", "--reps", str(reps)]
            + (["--out", out] if out != str(RESULT) else [])
        ),
        "columns": [
            "command",
            "median ms",
            "p10 ms",
            "p90 ms",
            "ratio to bare (median of rounds)",
            "ratio p10-p90",
            "target",
        ],
        "rows": rows,
        "notes": [
            f"{len(rounds)} rounds after {WARMUP} discarded; each round runs bare, cold and warm back to back, "
            "each a fresh process; the ratio is each round's time over that round's bare start.",
            "cold: an empty per-user bytecode cache (XDG_CACHE_HOME set to a new folder each round), so the call "
            "compiles the library and writes the cache; warm: the next call with that cache, as a user's second "
            "check of a session. No PYTHONDONTWRITEBYTECODE or PYTHONPYCACHEPREFIX set, as for a user.",
            "check reads the embedded run_config.yaml and evaluates every rule; --env fixes the environment it judges.",
            f"warm ratio {warm_ratio:.2f} vs target <= {TARGET_RATIO:g}: "
            f"{'met' if warm_ratio <= TARGET_RATIO else 'NOT met'}.",
        ],
        "raw": {
            "order": list(KINDS),
            "rounds_s": [{k: round(r[k], 5) for k in KINDS} for r in rounds],
            "stats": s,
            "target_ratio": TARGET_RATIO,
            "warm_ratio_median": warm_ratio,
            "python": f"{os.path.basename(sys.executable)} {platform.python_version()}",
        },
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=DEFAULT_REPS, help=f"measured rounds (default {DEFAULT_REPS})")
    ap.add_argument("--out", default=str(RESULT), help="result file (default benchmarks/results/check_speed.json)")
    a = ap.parse_args(argv)
    if a.reps < MIN_REPS:
        ap.error(f"--reps must be at least {MIN_REPS}")
    cmds = commands(sys.executable)
    machine = _machine()
    before = skill_bytecode()
    scratch = tempfile.mkdtemp(prefix="mfsdp-bench-check-")
    rounds = []
    try:
        for i in range(WARMUP + a.reps):
            r = one_round(cmds, scratch, i)
            if i >= WARMUP:
                rounds.append(r)
            if (i + 1) % 10 == 0:
                print(f"round {i + 1}/{WARMUP + a.reps}", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    planted = skill_bytecode() - before
    if planted:
        raise SystemExit(f"bytecode appeared in the skill folder during the benchmark: {sorted(planted)[:5]}")
    doc = document(rounds, a.reps, a.out, machine)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config_io.write_atomic(str(out), json.dumps(doc, indent=2) + "\n")
    s = doc["raw"]["stats"]
    print(
        f"bare {s['bare']['ms']['median']} ms; check cold {s['cold']['ms']['median']} ms "
        f"(x{s['cold']['ratio']['median']}), warm {s['warm']['ms']['median']} ms (x{s['warm']['ratio']['median']}, "
        f"target <= {TARGET_RATIO:g}) -> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
