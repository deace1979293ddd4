#!/usr/bin/env python3
"""How long ``mfsdp.py check`` takes, relative to a bare interpreter start.

The agent runs ``check`` after every edit, so its cost must stay within a few
interpreter start-ups (target: at most 5x ``python3 -c pass``). Absolute times
depend on the machine and its load, so both commands are measured in the same run,
interleaved (A, B, A, B, ...) so that load changes hit both alike, and the ratio of
the medians is the figure reported. Each run is a fresh process, as when an agent
calls the script.

    python3 benchmarks/bench_check.py               # 40 repetitions of each
    python3 benchmarks/bench_check.py --reps 200

Writes ``benchmarks/results/check_speed.json`` in the shape BENCHMARK.md is built from.
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

from mfsdp_lib import config_io  # noqa: E402  (atomic write of the result)

RESULT = ROOT / "benchmarks" / "results" / "check_speed.json"
TARGET_RATIO = 5.0  # the goal: check on the embedded default within 5x a bare interpreter start
WARMUP = 3  # first runs pay for .pyc compilation and a cold page cache: not what an agent sees


def _time(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    dt_s = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{shlex.join(cmd)} failed ({proc.returncode}): {proc.stderr.decode()[-300:]}")
    return dt_s


def _stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {
        "median_ms": round(statistics.median(xs) * 1000, 2),
        "mean_ms": round(statistics.fmean(xs) * 1000, 2),
        "p10_ms": round(xs[len(xs) // 10] * 1000, 2),
        "p90_ms": round(xs[(len(xs) * 9) // 10] * 1000, 2),
        "min_ms": round(xs[0] * 1000, 2),
    }


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=40, help="measured runs of each command (default 40)")
    ap.add_argument("--out", default=str(RESULT))
    a = ap.parse_args(argv)
    if a.reps < 5:
        ap.error("--reps must be at least 5")
    py = sys.executable
    bare = [py, "-c", "pass"]
    # A fixed --env makes the result independent of this shell's environment.
    check = [py, "scripts/mfsdp.py", "check", "--env", "PATH=/usr/bin"]
    check_json = check + ["--format", "json"]
    env = dict(os.environ)
    env.pop("MFSDP_DEBUG", None)
    # Two set-ups. "cached": bytecode is cached, as in a normal install (here in a temporary
    # PYTHONPYCACHEPREFIX, so the skill folder is not written to). "no cache": every run compiles
    # the modules again (PYTHONDONTWRITEBYTECODE=1, e.g. a read-only skill folder): the worst case.
    tmp_cache = tempfile.mkdtemp(prefix="mfsdp-bench-pycache-")
    env_cached = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env_cached["PYTHONPYCACHEPREFIX"] = tmp_cache
    env_nocache = dict(env, PYTHONDONTWRITEBYTECODE="1")
    try:
        for _ in range(WARMUP):
            _time(bare, env_cached), _time(check, env_cached), _time(check_json, env_cached)
            _time(check, env_nocache)
        t_bare, t_check, t_json, t_nocache = [], [], [], []
        for _ in range(a.reps):
            t_bare.append(_time(bare, env_cached))
            t_check.append(_time(check, env_cached))
            t_json.append(_time(check_json, env_cached))
            t_nocache.append(_time(check, env_nocache))
    finally:
        shutil.rmtree(tmp_cache, ignore_errors=True)
    s_bare, s_check, s_json, s_nc = _stats(t_bare), _stats(t_check), _stats(t_json), _stats(t_nocache)
    ratio = s_check["median_ms"] / s_bare["median_ms"]
    ratio_json = s_json["median_ms"] / s_bare["median_ms"]
    ratio_nc = s_nc["median_ms"] / s_bare["median_ms"]
    doc = {
        "benchmark": "check_speed",
        "title": "mfsdp.py check on the embedded Llama 3 8B recipe vs. a bare interpreter start",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(),
        "command": shlex.join(
            ["python3", "benchmarks/bench_check.py", "--reps", str(a.reps)]
            + (["--out", a.out] if a.out != str(RESULT) else [])
        ),
        "columns": ["command", "median ms", "p10 ms", "p90 ms", "ratio to bare (median)", "target"],
        "rows": [
            ["python3 -c pass", s_bare["median_ms"], s_bare["p10_ms"], s_bare["p90_ms"], 1.0, ""],
            [
                "mfsdp.py check",
                s_check["median_ms"],
                s_check["p10_ms"],
                s_check["p90_ms"],
                round(ratio, 2),
                f"<= {TARGET_RATIO:g}",
            ],
            [
                "mfsdp.py check --format json",
                s_json["median_ms"],
                s_json["p10_ms"],
                s_json["p90_ms"],
                round(ratio_json, 2),
                f"<= {TARGET_RATIO:g}",
            ],
            [
                "mfsdp.py check, no bytecode cache",
                s_nc["median_ms"],
                s_nc["p10_ms"],
                s_nc["p90_ms"],
                round(ratio_nc, 2),
                "(worst case)",
            ],
        ],
        "notes": [
            f"{a.reps} interleaved runs of each command after {WARMUP} warm-up runs; each run a fresh process.",
            "Bytecode cached in a temporary PYTHONPYCACHEPREFIX, as after a normal install; the last row "
            "recompiles every module on each run (PYTHONDONTWRITEBYTECODE=1, e.g. a read-only skill folder).",
            "check reads the embedded 800-line run_config.yaml (C YAML loader when available) and evaluates "
            "every rule; --env fixes the environment it judges.",
            f"ratio {ratio:.2f} vs target <= {TARGET_RATIO:g}: {'met' if ratio <= TARGET_RATIO else 'NOT met'}.",
        ],
        "raw": {
            "bare_s": [round(x, 5) for x in t_bare],
            "check_s": [round(x, 5) for x in t_check],
            "check_json_s": [round(x, 5) for x in t_json],
            "check_nocache_s": [round(x, 5) for x in t_nocache],
            "stats": {"bare": s_bare, "check": s_check, "check_json": s_json, "check_nocache": s_nc},
            "target_ratio": TARGET_RATIO,
            "ratio_median": round(ratio, 3),
            "python": f"{os.path.basename(py)} {platform.python_version()}",
        },
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config_io.write_atomic(str(out), json.dumps(doc, indent=2) + "\n")
    print(
        f"bare {s_bare['median_ms']} ms, check {s_check['median_ms']} ms, ratio {ratio:.2f} "
        f"(target <= {TARGET_RATIO:g}); no bytecode cache {s_nc['median_ms']} ms, ratio {ratio_nc:.2f} -> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
