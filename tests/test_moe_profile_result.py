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
    gemm = [("nvjet_gemm", 200_000.0)] * 2  # 200 ms and one launch per step over 2 steps, in every run
    mirror = [("Memcpy DtoD (Device -> Device)", 10.0)] * 60  # 60 memcpys per step over 2 steps: the mirror's
    fsdp_own = [("void at::native::direct_copy_kernel_cuda(x)", 20_000.0)] * 2  # 20 ms, 1 copy per step: FSDP's own
    _report(raw, "moe_prof_fsdp", gemm + fsdp_own + mirror, [0.50, 0.55])
    _report(raw, "moe_prof_distopt", gemm, [0.40, 0.44])
    _report(raw, "moe_prof_fsdp_nomirror", gemm + fsdp_own, [0.45, 0.46])
    (raw / "driver.json").write_text(json.dumps({"started_utc": "2026-12-05T17:00:00+00:00"}))
    doc = mpr.build(raw)
    comp = doc["raw"]["comparison"]
    assert comp["fsdp_minus_distopt_total_ms_per_step"] == 20.3
    assert comp["fsdp_minus_distopt_ms_per_step"]["copy"] == 20.0
    assert comp["fsdp_minus_distopt_ms_per_step"]["memcpy"] == 0.3
    assert comp["launches_fsdp_over_distopt"] == 32.0  # 32 kernels and copies per step against 1
    assert comp["mirror_extra_launches_per_step"] == 30 and comp["mirror_extra_memcpy_per_step"] == 30
    assert comp["mirror_share_of_extra_launches"] == round(30 / 31, 3)
    assert doc["benchmark"] == "moe_profile_1xsynthetic" and doc["date"] == "2026-12-05"
    fsdp = doc["rows"][0]
    assert fsdp[:6] == ["moe_prof_fsdp", "optim_grads_params", "on", 0.525, 220.3, 0.42]
    assert fsdp[7:] == [32, 30]
    text = " ".join(doc["notes"])
    assert "42% busy" in text and "+2.9 ms" not in text and "copy +20.0" in text
    assert "the mirror adds 30 (30 memcpys), 97% of what FSDP issues beyond" in text
    assert "differ by up to 10%" in text  # the spread of a run's own timed steps


def test_a_run_without_a_profile_is_named_and_exits_1(tmp_path, capsys):
    raw = tmp_path / "moe_profile_1xsynthetic"
    raw.mkdir()
    _report(raw, "moe_prof_fsdp", [("nvjet_gemm", 1000.0)], [0.1])
    assert mpr.main([str(raw), "--out", str(tmp_path / "o.json")]) == 1
    assert "no profile: moe_prof_distopt, moe_prof_fsdp_nomirror" in capsys.readouterr().out
    doc = json.loads((tmp_path / "o.json").read_text())
    assert doc["raw"]["comparison"] == {} and doc["rows"][1][4] is None and doc["rows"][1][7] is None
    assert mpr.main([str(tmp_path / "absent")]) == 2
