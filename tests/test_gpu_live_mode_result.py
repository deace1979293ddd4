"""benchmarks/gpu_live_mode_result.py: the live-mode result restates the H200 raw files, nothing else."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import raw_store  # benchmarks/: the raw GPU results, extracted from their archive on first use

ROOT = Path(__file__).resolve().parent.parent
RAW = raw_store.path("gpu_live_mode_1xh200")
RESULT = ROOT / "benchmarks" / "results" / "gpu_live_mode_1xh200.json"
_spec = importlib.util.spec_from_file_location("gpu_live_mode_result", ROOT / "benchmarks" / "gpu_live_mode_result.py")
assert _spec is not None and _spec.loader is not None
glr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(glr)


def test_committed_result_is_rebuilt_from_the_raw_files(tmp_path):
    assert glr.main(["--raw-dir", str(RAW), "--tag", "1xh200", "--results-dir", str(tmp_path)]) == 0
    assert json.loads((tmp_path / RESULT.name).read_text()) == json.loads(RESULT.read_text())


def test_rows_say_what_the_h200_said():
    doc = json.loads(RESULT.read_text())
    rows = {r[0]: dict(zip(doc["columns"], r, strict=True)) for r in doc["rows"]}
    # with a model shape, Bridge was reached and agreed with our rules every time
    for run in ("A0", "A", "B", "C", "D"):
        assert rows[run]["agreement"] == "agree", rows[run]
    assert rows["A"]["exit"] == 0 and rows["A"]["Bridge runtime_config_update()"] == "accepted"
    assert rows["D"]["our errors"] == "MFSDP-ENV-MAX-CONNECTIONS" and rows["D"]["exit"] == 1
    assert rows["B"]["overrides on stdout"] == rows["A"]["overrides on stdout"] + 1  # the weight-hash interval cleared
    assert (
        rows["F"]["agreement"].startswith("disagree")
        and "ZeroDivisionError" in rows["F"]["Bridge runtime_config_update()"]
    )
    # the two bugs the run showed: a failing recipe called a skill bug (exit 3), and log lines on stdout
    assert rows["E0"]["exit"] == 3 and "internal error" in rows["E0"]["Bridge runtime_config_update()"]
    assert rows["E"]["exit"] == 2
    assert rows["A0"]["other stdout lines"] > 0


def test_raw_override_lines_are_the_ones_enable_plans():
    lines = [ln for ln in (RAW / "B.out").read_text().splitlines() if glr.OVERRIDE.match(ln)]
    assert "train.check_weight_hash_across_dp_replicas_interval=null" in lines
    assert "ddp.data_parallel_sharding_strategy=optim_grads_params" in lines
    c = [ln for ln in (RAW / "C.out").read_text().splitlines() if glr.OVERRIDE.match(ln)]
    assert "ddp.data_parallel_sharding_strategy=optim" in c
    assert not any(ln.startswith("train.check_weight_hash") for ln in c)  # Bridge allows it with optim
