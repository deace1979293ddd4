"""The rehearsal report (``mfsdp_gpu.report``): written phase by phase, the failure located, always valid JSON."""

from __future__ import annotations

import json

from mfsdp_gpu import report


def test_innermost_frames_name_bridge_core_and_fsdp():
    frames = [
        ("/opt/skill/scripts/mfsdp_gpu/rehearse.py", 10, "run_once"),
        ("/usr/lib/python3.12/site-packages/megatron/bridge/training/setup.py", 253, "setup"),
        ("/usr/lib/python3.12/site-packages/megatron/bridge/models/model_provider.py", 698, "get_model"),
        (
            "/usr/lib/python3.12/site-packages/megatron/core/distributed/fsdp/mcore_fsdp_adapter.py",
            140,
            "_get_dp_tp_mesh",
        ),
        ("/usr/lib/python3.12/site-packages/einops/einops.py", 400, "rearrange"),
    ]
    got = report.innermost_frames(frames)
    assert got["bridge"] == "megatron/bridge/models/model_provider.py:698 in get_model"
    assert got["core"] == "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:140 in _get_dp_tp_mesh"
    assert got["innermost"] == "einops.py:400 in rearrange"
    assert "fsdp" not in got


def test_report_is_written_phase_by_phase_and_keeps_the_failure(tmp_path):
    rep = report.Report(str(tmp_path / "run"), {"request": {"world_size": 8}})
    rep.begin("config")
    on_disk = json.loads((tmp_path / "run" / "report.json").read_text())
    assert on_disk["phases"]["config"]["status"] == "running" and on_disk["result"] == "running"
    rep.end(allocated_bytes=3 * report.GIB)
    rep.begin("model_wrap")
    try:
        raise ValueError("einops shape mismatch")
    except ValueError as exc:
        rep.fail(exc)
    on_disk = json.loads((tmp_path / "run" / "report.json").read_text())
    assert on_disk["phases"]["config"] == {
        "status": "passed",
        "wall_s": on_disk["phases"]["config"]["wall_s"],
        "allocated_bytes": 3 * report.GIB,
    }
    assert on_disk["phases"]["model_wrap"]["status"] == "failed"
    ff = on_disk["first_failure"]
    assert ff["phase"] == "model_wrap" and ff["type"] == "ValueError" and "einops" in ff["message"]
    assert "test_gpu_report.py" in ff["frames"]["innermost"]
    assert on_disk["result"] == "failed" and on_disk["request"] == {"world_size": 8}
    assert not list((tmp_path / "run").glob("*.tmp"))


def test_report_failure_inside_a_step_names_the_step_and_part(tmp_path):
    rep = report.Report(str(tmp_path))
    rep.begin("train")
    rep.data["phases"]["train"]["current"] = {"iteration": 2, "phase": "optimizer_step"}
    rep.fail(RuntimeError("CUDA out of memory"))
    ff = json.loads((tmp_path / "report.json").read_text())["first_failure"]
    assert (ff["step"], ff["sub_phase"]) == (2, "optimizer_step")


def test_jsonable_keeps_reports_valid_json():
    got = report.jsonable({"a": float("inf"), "b": (1, 2), 3: object.__new__(object)})
    assert got["a"] == "inf" and got["b"] == [1, 2] and got["3"].startswith("<object")
    json.dumps(got, allow_nan=False)
