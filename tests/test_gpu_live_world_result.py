"""benchmarks/gpu_live_world_result.py: live mode judged one world with our rules and Bridge on the H200."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import raw_store  # benchmarks/: the raw GPU results, extracted from their archive on first use

ROOT = Path(__file__).resolve().parent.parent
RAW = raw_store.path("gpu_live_world_1xh200")
RESULT = ROOT / "benchmarks" / "results" / "gpu_live_world_1xh200.json"
_spec = importlib.util.spec_from_file_location(
    "gpu_live_world_result", ROOT / "benchmarks" / "gpu_live_world_result.py"
)
assert _spec is not None and _spec.loader is not None
glw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(glw)


def test_committed_result_is_rebuilt_from_the_raw_files(tmp_path):
    assert glw.main(["--raw-dir", str(RAW), "--tag", "1xh200", "--results-dir", str(tmp_path)]) == 0
    assert json.loads((tmp_path / RESULT.name).read_text()) == json.loads(RESULT.read_text())


def test_a_streak_missing_a_run_is_refused(tmp_path, capsys):
    (tmp_path / "stages.txt").write_text("setup rc=0 53s\n")
    assert glw.main(["--raw-dir", str(tmp_path), "--tag", "x", "--results-dir", str(tmp_path)]) == 2
    assert "has no line for W1" in capsys.readouterr().err


def test_our_rules_and_bridge_judged_the_same_world():
    doc = json.loads(RESULT.read_text())
    rows = {r[0]: dict(zip(doc["columns"], r, strict=True)) for r in doc["rows"]}
    for run in ("W1", "W3", "W5"):  # 32 at 8 GPUs, 24 at the layout's 1, 24 at --gpus 4 over WORLD_SIZE=8
        assert rows[run]["exit"] == 0 and rows[run]["Bridge runtime_config_update()"] == "accepted", rows[run]
        assert rows[run]["overrides on stdout"] > 0 and rows[run]["other stdout lines"] == 0
    for run in ("W2", "W4"):  # 24 at 8 GPUs: --gpus 8, or a launcher's WORLD_SIZE=8
        assert rows[run]["exit"] == 1 and rows[run]["agreement"] == "agree", rows[run]
        assert "MFSDP-TRAIN-BATCH-DP" in rows[run]["our errors"]
    # the same call as W4, before live_world(): Bridge at 8 GPUs, our rules at 1
    assert rows["W40"]["code"] == "before live_world()" and rows["W40"]["agreement"].startswith("disagree")
    assert rows["W40"]["our errors"] == "none" and "(2 * 8 = 16)" in rows["W40"]["Bridge runtime_config_update()"]
    assert rows["W6"]["exit"] == 2 and "WORLD_SIZE='eight'" in rows["W6"]["Bridge runtime_config_update()"]
    assert all(r["code"] == "current" for n, r in rows.items() if n != "W40")
