"""The built-in shapes and the meta-device rule (``mfsdp_gpu.presets``)."""

from __future__ import annotations

from mfsdp_gpu import presets, report


def test_parameter_estimates_match_the_known_trunks():
    assert abs(presets.estimate_params(presets.PRESETS["llama-1b"]) / 1e9 - 1.1) < 0.05
    assert abs(presets.estimate_params(presets.PRESETS["llama3-8b"]) / 1e9 - 7.2) < 0.3  # 8 B minus the 128k vocabulary
    assert abs(presets.estimate_params(presets.PRESETS["qwen3-moe-16l"]) / 1e9 - 10.1) < 0.2
    assert 68 < presets.estimate_params(presets.PRESETS["llama3-70b"]) / 1e9 < 70


def test_meta_init_only_where_the_unsharded_model_would_not_fit():
    h200 = 139 * report.GIB
    big = presets.estimate_params(presets.PRESETS["llama3-70b"])
    small = presets.estimate_params(presets.PRESETS["llama3-8b"])
    assert presets.decide_meta_init(None, True, big, h200)[0] is True
    assert presets.decide_meta_init(None, True, small, h200)[0] is False
    assert presets.decide_meta_init(None, False, big, h200)[0] is False  # DDP cannot start from the meta device
    used, why = presets.decide_meta_init(True, False, small, h200)
    assert used is False and "needs Megatron FSDP" in why
    assert presets.decide_meta_init(False, True, big, h200) == (False, "requested")
