"""The fake world's settings and the checkpoint planner's coverage waiver (``mfsdp_gpu.fakeworld``)."""

from __future__ import annotations

import sys

from mfsdp_gpu import fakeworld


def test_fake_backend_needs_exactly_the_documented_settings():
    assert set(fakeworld.FAKE_BACKEND_SETTINGS) == {
        "ddp.check_for_nan_in_grad",
        "dist.use_gloo_process_groups",
        "train.exit_signal_handler",
        "rerun_state_machine.check_for_nan_in_loss",
        "rerun_state_machine.check_for_spiky_loss",
    }
    assert all(v is False and why for v, why in fakeworld.FAKE_BACKEND_SETTINGS.values())


def test_global_plan_waiver_answers_valid_in_the_callers_terms(monkeypatch):
    """The waiver keeps torch's verdict on record and answers "valid" as the installed torch spells it."""
    import types

    fake_dp = types.ModuleType("torch.distributed.checkpoint.default_planner")
    pkg = {
        "torch": types.ModuleType("torch"),
        "torch.distributed": types.ModuleType("torch.distributed"),
        "torch.distributed.checkpoint": types.ModuleType("torch.distributed.checkpoint"),
        "torch.distributed.checkpoint.default_planner": fake_dp,
    }
    for verdict, valid in ((False, True), (["key:w has a gap"], [])):
        fake_dp._validate_global_plan = lambda plan, md, v=verdict: v
        for name, mod in pkg.items():
            monkeypatch.setitem(sys.modules, name, mod)
        pkg["torch.distributed.checkpoint"].default_planner = fake_dp
        fakeworld.GLOBAL_PLAN_CHECKS.clear()
        assert fakeworld.waive_global_plan_coverage_check().startswith("global-plan coverage check waived")
        assert fake_dp._validate_global_plan([], None) == valid
        assert (
            fakeworld.GLOBAL_PLAN_CHECKS[-1]["torch_verdict"] is False
            and fakeworld.GLOBAL_PLAN_CHECKS[-1]["waived"] is True
        )
        assert fakeworld.waive_global_plan_coverage_check() == ""  # installed once
