"""Step timing and the smoke summary (``mfsdp_gpu.steps``): the parts that need no GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mfsdp_gpu import steps


def test_step_summary_skips_warmup_and_flags_nan():
    recs = [
        {"time_s": t, "loss": loss, "allocated_bytes": 5}
        for t, loss in [(9.0, 10.4), (1.0, 10.3), (0.5, 10.2), (0.7, 10.1), (0.6, 10.0)]
    ]
    s = steps.summarise_steps(recs, tokens_per_step=4096)
    assert s["step_time_s_median"] == 0.6  # median of steps 3..5; the 9 s first step is left out
    assert s["tokens_per_s"] == pytest.approx(4096 / 0.6)
    assert s["finite"] and s["final_loss"] == 10.0 and s["model_state_bytes"] == 5
    assert s["timed_from_step"] == steps.WARMUP_STEPS + 1
    recs[3]["loss"] = float("nan")
    assert not steps.summarise_steps(recs, 4096)["finite"]


def test_step_loss_prefers_an_entry_named_loss():
    assert steps.step_loss(SimpleNamespace(loss_dict={"z": 3.0, "lm loss": 2.5})) == 2.5
    assert steps.step_loss(SimpleNamespace(loss_dict={"z": 3})) == 3.0  # no "loss" entry: the first one
    assert steps.step_loss(SimpleNamespace(loss_dict={})) is None
    with pytest.raises(ValueError):
        steps.step_loss(SimpleNamespace(loss_dict={"loss": "garbage"}))
