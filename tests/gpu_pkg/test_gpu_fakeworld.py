"""The fake world's settings, the checkpoint planner's coverage waiver and the FP8 scale keeper (``mfsdp_gpu.fakeworld``)."""

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


class _Scalar:
    """A one-element tensor stand-in: what the keeper does with ``_scale_inv`` (clone, copy_)."""

    def __init__(self, v: float):
        self.v = v

    def clone(self):
        return _Scalar(self.v)

    def copy_(self, other):
        self.v = other.v


class _Weight:
    def __init__(self, scale_inv: float):
        self._scale_inv = _Scalar(scale_inv)


def _te_like_cast(params, group, *args, **kwargs):
    """What TE's current-scaling cast does to scales: amax from the local master shard (0 without
    one), an all-reduce that under the fake backend changes nothing, then scale_inv = amax / 448
    (1.0 for an amax of 0, TE's guard)."""
    for weight, master, _offset, _shard in params:
        amax = max((abs(x) for x in master), default=0.0) if master is not None else 0.0
        weight._scale_inv.v = amax / 448.0 if amax else 1.0
    return "cast"


def test_unowned_weights_keep_their_scale_and_owned_ones_are_recast():
    owned, unowned = _Weight(0.5 / 448), _Weight(0.4 / 448)
    params = [(owned, [0.25, -0.5], 0, object()), (unowned, None, None, None)]
    assert fakeworld.unowned_positions(params) == [1]
    wrapped = fakeworld.keep_unowned_scales(_te_like_cast)
    before = dict(fakeworld.FP8_SCALE_KEEPER)
    try:
        assert wrapped(params, group=None) == "cast"  # the cast's own result is returned
        assert owned._scale_inv.v == 0.5 / 448  # recast from its shard, as TE does
        assert unowned._scale_inv.v == 0.4 / 448  # kept: without the keeper it would be 1.0
        assert fakeworld.FP8_SCALE_KEEPER["kept_last_call"] == 1
        assert fakeworld.FP8_SCALE_KEEPER["weights_last_call"] == 2
        # unwrapped, the same call resets the unowned weight's scale (what made the steps NaN)
        _te_like_cast(params, group=None)
        assert unowned._scale_inv.v == 1.0
    finally:
        fakeworld.FP8_SCALE_KEEPER.clear()
        fakeworld.FP8_SCALE_KEEPER.update(before)


def test_the_keeper_patches_the_module_attribute_te_looks_up(monkeypatch):
    import types

    mod = types.ModuleType(fakeworld.TE_CAST_MODULE)
    setattr(mod, fakeworld.TE_CAST_CURRENT_SCALING, _te_like_cast)
    monkeypatch.setitem(sys.modules, fakeworld.TE_CAST_MODULE, mod)
    assert fakeworld.install_fp8_scale_keeper().startswith("FP8 current-scaling weights")
    patched = getattr(mod, fakeworld.TE_CAST_CURRENT_SCALING)
    assert patched is not _te_like_cast and patched.__wrapped__ is _te_like_cast
    fakeworld.install_fp8_scale_keeper()  # a second install does not wrap twice
    assert getattr(mod, fakeworld.TE_CAST_CURRENT_SCALING) is patched
    delattr(mod, fakeworld.TE_CAST_CURRENT_SCALING)
    assert fakeworld.install_fp8_scale_keeper() == ""  # a TE without the function: nothing to do


def test_the_keeper_deviation_names_the_counts():
    d = fakeworld.fp8_scale_deviation({"kept_last_call": 112, "weights_last_call": 128})
    assert d["id"] == "fp8-unowned-scales-kept" and "112 of 128" in d["what"]
    assert {"why", "memory_effect", "time_effect"} <= set(d)


def test_tp_comm_overlap_is_turned_off_in_a_fake_world_and_says_what_that_changes():
    """Bridge's userbuffers set-up needs the tensor-parallel peers' GPUs; the rehearsal turns the overlap off
    only under the fake backend, as a labelled deviation with its memory and time effect."""
    import inspect

    from mfsdp_gpu import rehearse

    d = fakeworld.tp_comm_overlap_deviation()
    assert d["id"] == "tp-comm-overlap-off" and d["what"] == "comm_overlap.tp_comm_overlap: true -> false"
    assert d["memory_effect"].startswith("too low") and "initialize_ub" in d["memory_effect"]
    src = inspect.getsource(rehearse.configure)
    guard = 'if fake and get_dotted(cfg, "comm_overlap.tp_comm_overlap") is True:'
    assert guard in src and src.index(guard) < src.index("fakeworld.tp_comm_overlap_deviation()")


def test_nccl_option_settings_go_back_to_their_defaults_under_the_fake_backend():
    """megatron-core gives the groups these settings name NCCL options, which the fake backend's groups refuse
    (a TypeError at Bridge's initialize, measured): under the fake backend each returns to megatron-core's
    default (an empty list, no file), with why."""
    opts = fakeworld.FAKE_BACKEND_NCCL_OPTIONS
    assert {k: v for k, (v, _why) in opts.items()} == {
        "dist.high_priority_stream_groups": [],
        "dist.nccl_communicator_config_path": None,
    }
    assert all("NCCL options" in why for _v, why in fakeworld.FAKE_BACKEND_NCCL_OPTIONS.values())
    assert not set(fakeworld.FAKE_BACKEND_NCCL_OPTIONS) & set(fakeworld.FAKE_BACKEND_SETTINGS)
