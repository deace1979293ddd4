"""The CPU-testable part of ``benchmarks/bench_ckpt_migration.py``: rows that survive failures, the resume check.

The GPU work (training, conversions, logits) runs on the H200; what decides pass or fail from the losses, and
what a failing row leaves behind, is plain Python and is checked here with made-up loss values.
"""

from __future__ import annotations

import json

import pytest

import bench_ckpt_migration as B


def _row(tmp_path, name="r"):
    return B.Row(str(tmp_path), name, model="dense", **{"from": "torch_dist", "to": "fsdp_dtensor"})


def test_a_failing_row_writes_its_json_and_log_and_lets_the_next_row_run(tmp_path):
    with _row(tmp_path, "first") as row:
        row.log("about to fail")
        raise RuntimeError("boom\nsecond line")
    with _row(tmp_path, "second") as row:
        row.data.update(passed=True, exit=0)
    first = json.loads((tmp_path / "first.json").read_text())
    assert first["passed"] is False and first["error"] == "RuntimeError: boom"
    assert "Traceback" in (tmp_path / "first.log").read_text()
    assert json.loads((tmp_path / "second.json").read_text())["passed"] is True


def test_keyboard_interrupt_is_not_swallowed(tmp_path):
    with pytest.raises(KeyboardInterrupt), _row(tmp_path):
        raise KeyboardInterrupt
    assert (tmp_path / "r.json").is_file()


# Losses keyed as Bridge's on_train_step_end sees train_state.step (before its increment): 0 .. N-1.
REF = {i: 5.0 - 0.1 * i for i in range(B.N)}


def test_resume_passes_within_bf16_tolerance_and_reports_the_optimizer_cost(tmp_path):
    resumed = {i: REF[i] + (0.01 if i == B.K else 0.05) for i in range(B.K, B.N)}
    with _row(tmp_path) as row:
        row.data["exit"] = 0
        B.compare_resume(row, REF, resumed, B.K)
    d = row.data
    assert d["passed"] is True and d["difference"] == pytest.approx(0.01)
    assert d["tolerance"] == pytest.approx(B.LOSS_RTOL * REF[B.K])
    assert d["optimizer_drop_cost"]["max"] == pytest.approx(0.05) and d["optimizer_drop_cost"]["steps"] == B.N - B.K - 1


def test_resume_fails_beyond_tolerance_or_when_convert_failed(tmp_path):
    far = {i: REF[i] + 1.0 for i in range(B.K, B.N)}
    with _row(tmp_path) as row:
        row.data["exit"] = 0
        B.compare_resume(row, REF, far, B.K)
    assert row.data["passed"] is False
    same = {i: REF[i] for i in range(B.K, B.N)}
    with _row(tmp_path) as row:
        row.data["exit"] = 1
        B.compare_resume(row, REF, same, B.K)
    assert row.data["passed"] is False


def test_resume_that_started_elsewhere_is_an_error(tmp_path):
    late = {i: REF[i] for i in range(B.K + 1, B.N)}  # e.g. comparing a step after the fresh Adam update
    with _row(tmp_path) as row:
        row.data["exit"] = 0
        B.compare_resume(row, REF, late, B.K)
    assert row.data["passed"] is False and "started at step" in row.data["error"]


def test_every_expected_result_row_is_one_the_driver_writes():
    import ckpt_migration_result as R

    written = {
        f"{kind}_{key}_{B.ROW_NAMES[key][0]}_to_{B.ROW_NAMES[key][1]}"
        for kind, keys in B.WORKERS.items()
        for key in keys
        if key in B.ROW_NAMES
    }
    assert written == set(R.EXPECTED_ROWS)
