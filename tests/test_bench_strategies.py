"""The GPU result files are restated from raw records by scripts, and the estimator is held to them.

``benchmarks/results/gpu_*.json`` feed BENCHMARK.md; nothing in them may be typed by hand.
These tests rebuild both files from the committed raw records and compare, and check the
memory estimator's between-step figure against the measured one (the goal: within 10%).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import raw_store  # benchmarks/: the raw GPU results, extracted from their archive on first use

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
RAW = raw_store.folder()
SHAPE = {"benchmark", "title", "date", "machine", "command", "columns", "rows", "notes", "raw"}


def _run(*args: str) -> None:
    subprocess.run([sys.executable, *args], check=True, capture_output=True, text=True, cwd=ROOT)


def _committed(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def test_strategy_result_is_rebuilt_from_raw(tmp_path):
    committed = _committed("gpu_strategies_1xh200.json")
    _run(
        "benchmarks/bench_strategies.py",
        "--assemble",
        "--iters",
        "20",
        "--tag",
        "1xh200",
        "--raw-dir",
        str(RAW / "gpu_strategies_1xh200"),
        "--repeat-raw-dir",
        str(RAW / "gpu_strategies_1xh200_repeats" / "run_a_8iters"),
        "--repeat-raw-dir",
        str(RAW / "gpu_strategies_1xh200_repeats" / "run_b_8iters"),
        "--machine",
        committed["machine"],
        "--results-dir",
        str(tmp_path),
    )
    rebuilt = json.loads((tmp_path / "gpu_strategies_1xh200.json").read_text())
    assert set(rebuilt) == SHAPE and rebuilt["columns"] == committed["columns"]
    measured = [c for c in committed["columns"] if "estimate" not in c]
    idx = [committed["columns"].index(c) for c in measured]
    assert [[r[i] for i in idx] for r in rebuilt["rows"]] == [[r[i] for i in idx] for r in committed["rows"]]
    assert rebuilt["date"] == committed["date"] and rebuilt["command"] == committed["command"]
    assert [r[0] for r in rebuilt["rows"]] == ["ddp", "distopt", "optim", "optim_grads", "optim_grads_params"]


def test_estimator_within_10_percent_of_measured_model_state():
    res = _committed("gpu_strategies_1xh200.json")
    cols = res["columns"]
    meas = cols.index("model state GiB (measured)")
    est = cols.index("model state + step transient GiB (estimate)")
    for row in res["rows"]:
        assert row[est] is not None, row
        assert abs(row[est] - row[meas]) <= 0.10 * row[meas], row


def test_fsdp_and_ddp_memory_differ_as_measured_at_dp1():
    """With one GPU nothing is sharded: FSDP's model state is not smaller than DDP's."""
    res = _committed("gpu_strategies_1xh200.json")
    meas = res["columns"].index("model state GiB (measured)")
    by = {r[0]: r[meas] for r in res["rows"]}
    assert by["optim_grads_params"] >= by["ddp"]


def test_smoke_result_is_rebuilt_from_raw(tmp_path):
    committed = _committed("gpu_smoke_1xh200.json")
    _run(
        "benchmarks/gpu_smoke_result.py",
        "--raw-dir",
        str(RAW / "gpu_smoke_1xh200"),
        "--pytest-log",
        "tests/fixtures/gpu-run/pytest_smoke.log",
        "--tag",
        "1xh200",
        "--machine",
        committed["machine"],
        "--command",
        committed["command"],
        "--results-dir",
        str(tmp_path),
    )
    rebuilt = json.loads((tmp_path / "gpu_smoke_1xh200.json").read_text())
    assert set(rebuilt) == SHAPE
    assert rebuilt["rows"] == committed["rows"] and rebuilt["date"] == committed["date"]
    pytest_row, smoke_row = rebuilt["rows"]
    assert pytest_row[1].startswith("1 passed") and smoke_row[1] == "pass"
    assert pytest_row[7] == "fsdp_dtensor" and pytest_row[8] == 0.0
