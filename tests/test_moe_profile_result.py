"""The MoE profile result script (``benchmarks/moe_profile_result.py``) on a raw folder made at test time.

The engine reports here are synthetic (labelled: made from made-up kernel lists through the real summariser,
``mfsdp_gpu.kernel_profile``), not measurements: the test checks the arithmetic and the wording, not a GPU.
"""

from __future__ import annotations

import json

import moe_profile_result as mpr
from mfsdp_gpu import kernel_profile as kp


def _report(tmp, name, kernels, step_s):
    rep = {
        "result": "passed",
        "device": "SYNTHETIC GPU",
        "memory": {"steps": [{"loss": 1.0, "cuda_event_s": {"step_s": t}} for t in step_s]},
        "kernel_profile": kp.summarise(kp.group_by_name(kernels), steps=2),
    }
    (tmp / f"{name}.rank_0.report.json").write_text(json.dumps(rep))


def test_the_gap_is_split_by_kind_and_the_mirror_share_is_stated(tmp_path):
    raw = tmp_path / "moe_profile_1xsynthetic"
    raw.mkdir()
    gemm = [("nvjet_gemm", 400_000.0)]  # 200 ms per step over 2 steps, in every run
    copies = [("void at::native::direct_copy_kernel_cuda(x)", 120_000.0)]  # 60 ms/step: the mirror's copies
    memcpy = [("Memcpy DtoD (Device -> Device)", 40_000.0)]  # 20 ms/step: FSDP's own bucket copies
    _report(raw, "moe_prof_fsdp", gemm + copies + memcpy, [0.30, 0.31])
    _report(raw, "moe_prof_distopt", gemm, [0.21, 0.2])
    _report(raw, "moe_prof_fsdp_nomirror", gemm + memcpy, [0.24, 0.23])
    (raw / "driver.json").write_text(json.dumps({"started_utc": "2026-12-05T17:00:00+00:00"}))
    doc = mpr.build(raw)
    comp = doc["raw"]["comparison"]
    assert comp["fsdp_minus_distopt_total_ms_per_step"] == 80.0
    assert comp["fsdp_minus_distopt_ms_per_step"] == {"copy": 60.0, "memcpy": 20.0, "gemm": 0.0}
    assert comp["mirror_total_ms_per_step"] == 60.0 and comp["mirror_share_of_gap"] == 0.75
    assert doc["benchmark"] == "moe_profile_1xsynthetic" and doc["date"] == "2026-12-05"
    assert doc["rows"][0][:5] == ["moe_prof_fsdp", "optim_grads_params", "on", 0.305, 280.0]
    text = " ".join(doc["notes"])
    assert "+40.0%" in text and "copy +60.0 ms" in text and "75%" in text


def test_a_run_without_a_profile_is_named_and_exits_1(tmp_path, capsys):
    raw = tmp_path / "moe_profile_1xsynthetic"
    raw.mkdir()
    _report(raw, "moe_prof_fsdp", [("nvjet_gemm", 1000.0)], [0.1])
    assert mpr.main([str(raw), "--out", str(tmp_path / "o.json")]) == 1
    assert "no profile: moe_prof_distopt, moe_prof_fsdp_nomirror" in capsys.readouterr().out
    doc = json.loads((tmp_path / "o.json").read_text())
    assert doc["raw"]["comparison"] == {} and doc["rows"][1][4] is None
    assert mpr.main([str(tmp_path / "absent")]) == 2
