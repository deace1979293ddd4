"""Bridge set-up without Bridge (``mfsdp_gpu.bridge``): dotted get/set, the record of changes, strategy settings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mfsdp_gpu import args, bridge, fakeworld


def _parse(*argv):
    return args.rehearse_parser().parse_intermixed_args(list(argv))


def _cfg():
    return SimpleNamespace(
        ddp=SimpleNamespace(check_for_nan_in_grad=True, use_megatron_fsdp=False),
        train=SimpleNamespace(exit_signal_handler=True, train_iters=1000),
        env_vars={},
        model=None,
    )


def test_set_dotted_refuses_unknown_names_and_unset_sections():
    cfg = _cfg()
    assert bridge.set_dotted(cfg, "ddp.check_for_nan_in_grad", False) is True
    assert cfg.ddp.check_for_nan_in_grad is False
    bridge.set_dotted(cfg, "env_vars.NCCL_DEBUG", "INFO")
    assert cfg.env_vars == {"NCCL_DEBUG": "INFO"}
    with pytest.raises(args.InputError, match="no attribute 'check_nan'"):
        bridge.set_dotted(cfg, "ddp.check_nan", False)
    with pytest.raises(args.InputError, match="'model' is not set"):
        bridge.set_dotted(cfg, "model.seq_length", 1)


def test_settings_record_only_real_changes_with_reason_and_category():
    cfg = _cfg()
    s = bridge.Settings(cfg)
    for key, (value, why) in fakeworld.FAKE_BACKEND_SETTINGS.items():
        if key.startswith("rerun"):
            continue
        s.apply(key, value, "fake-backend", why, only_if_present=True)
    s.apply("train.train_iters", 1000, "rehearsal", "unchanged: not recorded")
    keys = [r["key"] for r in s.rows]
    assert keys == ["ddp.check_for_nan_in_grad", "train.exit_signal_handler"]  # gloo key absent here: skipped
    row = s.rows[0]
    assert row["was"] is True and row["value"] is False and row["category"] == "fake-backend" and row["why"]


def test_strategy_settings():
    fsdp = bridge.strategy_settings("optim_grads")
    assert fsdp["ddp.data_parallel_sharding_strategy"] == "optim_grads"
    assert fsdp["dist.use_megatron_fsdp"] is True and fsdp["checkpoint.ckpt_format"] == "fsdp_dtensor"
    dist = bridge.strategy_settings("distopt")
    assert dist["ddp.use_distributed_optimizer"] is True and dist["dist.use_megatron_fsdp"] is False
    assert bridge.strategy_settings("ddp")["ddp.use_distributed_optimizer"] is False


def test_setup_forgets_the_singletons_a_previous_run_left(monkeypatch):
    # Bridge's initialize_megatron asserts megatron-core's rerun state machine and micro-batch calculator do
    # not exist yet; a second training run in one process (the migration driver) needs both forgotten first.
    import sys
    import types

    calls = []
    core = types.ModuleType("megatron.core")
    rerun = types.ModuleType("megatron.core.rerun_state_machine")
    micro = types.ModuleType("megatron.core.num_microbatches_calculator")
    rerun.destroy_rerun_state_machine = lambda: calls.append("rerun")  # stand-in for megatron-core's function
    micro.destroy_num_microbatches_calculator = lambda: calls.append("micro")  # likewise
    core.rerun_state_machine, core.num_microbatches_calculator = rerun, micro
    monkeypatch.setitem(sys.modules, "megatron", types.ModuleType("megatron"))
    monkeypatch.setitem(sys.modules, "megatron.core", core)
    monkeypatch.setitem(sys.modules, "megatron.core.rerun_state_machine", rerun)
    monkeypatch.setitem(sys.modules, "megatron.core.num_microbatches_calculator", micro)
    bridge.reset_process_globals()
    assert calls == ["rerun", "micro"]


def test_the_hydra_dtype_form_is_parsed_field_scoped():
    """``{_target_: torch.X, _call_: false}`` (Bridge's own YAML form of a dtype) is a TorchTarget, in either key
    order and with spaces; a plain string, JSON, or a dict with other keys stays what it was."""
    assert args.parse_value("{_target_:torch.float32,_call_:false}") == args.TorchTarget("float32")
    assert args.parse_value("{ _call_: false, _target_: torch.bfloat16 }") == args.TorchTarget("bfloat16")
    assert args.parse_overrides(["ddp.megatron_fsdp_main_grads_dtype={_target_:torch.float32,_call_:false}"]) == {
        "ddp.megatron_fsdp_main_grads_dtype": args.TorchTarget("float32")
    }
    assert args.parse_value("fp32") == "fp32"
    assert args.parse_value("{_target_:torch.float32}") == "{_target_:torch.float32}"  # called: not a dtype
    assert args.parse_value("{_target_:os.system,_call_:false}") == "{_target_:os.system,_call_:false}"
    assert args.parse_value('{"a": 1}') == {"a": 1}


class _Dtype:  # stand-in for torch.dtype: this machine has no torch (labelled; the GPU tests use the real one)
    def __init__(self, name):
        self.name = name


def test_set_dotted_turns_the_dtype_form_into_the_torch_dtype(monkeypatch):
    import sys
    import types

    fake = types.ModuleType("torch")
    fake.dtype = _Dtype
    fake.float32 = _Dtype("float32")
    fake.nn = object()
    monkeypatch.setitem(sys.modules, "torch", fake)
    cfg = SimpleNamespace(ddp=SimpleNamespace(megatron_fsdp_main_grads_dtype=None))
    bridge.set_dotted(cfg, "ddp.megatron_fsdp_main_grads_dtype", args.TorchTarget("float32"))
    assert cfg.ddp.megatron_fsdp_main_grads_dtype is fake.float32
    with pytest.raises(args.InputError, match="torch.nn is not a torch dtype"):
        bridge.set_dotted(cfg, "ddp.megatron_fsdp_main_grads_dtype", args.TorchTarget("nn"))
    # a string on a field whose default is None stays a string, as Bridge's override path leaves it
    cfg.ddp.megatron_fsdp_grad_comm_dtype = None
    bridge.set_dotted(cfg, "ddp.megatron_fsdp_grad_comm_dtype", "fp32")
    assert cfg.ddp.megatron_fsdp_grad_comm_dtype == "fp32"


def test_te_only_grad_accum_fusion_turns_it_off_in_megatron_core_linears_only(monkeypatch):
    """--te-grad-accum-fusion: megatron-core's constructor check passes while the model is built, then its
    own linear layers (not Transformer Engine's) run without the fusion; the flag is restored."""
    import sys
    import types

    layers = types.ModuleType(bridge.MCORE_GAF_FLAG[0])

    class ColumnParallelLinear:
        def __init__(self):
            self.gradient_accumulation_fusion = True

    class RowParallelLinear(ColumnParallelLinear):
        pass

    class TELinear:  # Transformer Engine's layers are other classes
        def __init__(self):
            self.gradient_accumulation_fusion = True

    layers.ColumnParallelLinear, layers.RowParallelLinear = ColumnParallelLinear, RowParallelLinear
    setattr(layers, bridge.MCORE_GAF_FLAG[1], False)
    for name in ("megatron", "megatron.core", "megatron.core.tensor_parallel"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, bridge.MCORE_GAF_FLAG[0], layers)

    undo = bridge.allow_grad_accum_fusion_without_apex()
    assert getattr(layers, bridge.MCORE_GAF_FLAG[1]) is True
    undo()
    assert getattr(layers, bridge.MCORE_GAF_FLAG[1]) is False

    mods = {"output_layer": ColumnParallelLinear(), "decoder.proj": RowParallelLinear(), "decoder.fc1": TELinear()}
    chunk = SimpleNamespace(named_modules=lambda: list(mods.items()))
    assert bridge.mcore_linears_without_fusion([chunk]) == ["output_layer", "decoder.proj"]
    assert mods["decoder.fc1"].gradient_accumulation_fusion is True
    assert not mods["output_layer"].gradient_accumulation_fusion
    assert bridge.mcore_linears_without_fusion(chunk) == []  # already off; a single chunk is accepted
    d = bridge.te_only_grad_accum_fusion_deviation()
    assert d["id"] == "grad-accum-fusion-te-only" and {"why", "memory_effect", "time_effect"} <= set(d)
