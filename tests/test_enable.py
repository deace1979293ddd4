"""enable.plan / yaml_edit / apply_to_object: the result passes the rules, and nothing else moves."""

from __future__ import annotations

import pytest
import yaml

from mfsdp_lib import config_io, enable, rules
from mfsdp_lib.findings import InputError

FIXUP = "fixtures/bridge-0.6.2-recipes/llama3_8b_pretrain_fsdp_fixup.yaml"


def _errors(cfg, env=None):
    return [f.rule for f in rules.evaluate(cfg, env or {}) if f.severity == "error"]


def test_minimal_overrides_are_the_five():
    assert enable.MINIMAL_OVERRIDES == {
        "dist.use_megatron_fsdp": True,
        "ddp.use_megatron_fsdp": True,
        "ddp.data_parallel_sharding_strategy": "optim_grads_params",
        "ddp.average_in_collective": False,
        "checkpoint.ckpt_format": "fsdp_dtensor",
    }


def test_plan_on_recipe_reproduces_the_real_fixup(tests_dir):
    """enable on the recipe with --save-dir gives the fix-up the real Bridge validated, with checkpoint.load kept.

    The recorded fix-up cleared checkpoint.load (as Bridge's perf recipes do); enable keeps it so that a
    preempted job resumes. Bridge's only load-related check (the fsdp_dtensor format assert) holds either way.
    """
    cfg = config_io.load_effective(None)
    changes = enable.plan(cfg, save_dir="/workspace/fsdp_ckpts")
    result = enable.apply(cfg, changes)
    load = config_io.get(cfg, "checkpoint.load")
    assert load and config_io.get(result, "checkpoint.load") == load
    fixup = config_io.load_effective(
        str(tests_dir / FIXUP), ["model.context_parallel_size=2", f"checkpoint.load={load}"]
    )
    assert result == fixup
    assert _errors(result) == []


def test_changes_say_from_what_and_why():
    cfg = config_io.load_effective(None)
    by_path = {c.path: c for c in enable.plan(cfg)}
    c = by_path["checkpoint.ckpt_format"]
    assert (c.old, c.new) == ("torch_dist", "fsdp_dtensor") and "fsdp_dtensor" in c.why
    assert "checkpoint.load" not in by_path  # kept: clearing it would silently turn auto-resume off
    assert all(c.why for c in by_path.values())
    notes = enable.advice(cfg, list(by_path.values()))
    assert len(notes) == 1 and "torch_dist" in notes[0] and "--expect fsdp_dtensor" in notes[0]


def test_plan_is_idempotent():
    cfg = config_io.load_effective(None)
    once = enable.apply(cfg, enable.plan(cfg))
    assert [c.path for c in enable.plan(once)] == []


def test_load_kept_when_already_fsdp_dtensor(tests_dir):
    cfg = config_io.load_effective(str(tests_dir / FIXUP), ["checkpoint.load=/ckpt/fsdp"])
    assert "checkpoint.load" not in {c.path for c in enable.plan(cfg)}


@pytest.mark.parametrize(
    "overrides,expected_path",
    [
        (["checkpoint.also_save_hf_checkpoint=true"], "checkpoint.also_save_hf_checkpoint"),
        (["dist.use_torch_fsdp2=true"], "dist.use_torch_fsdp2"),
        (["dist.use_tp_pp_dp_mapping=true"], "dist.use_tp_pp_dp_mapping"),
        (["ddp.fsdp_manual_registration=true"], "ddp.fsdp_manual_registration"),
        (
            ["train.check_weight_hash_across_dp_replicas_interval=10"],
            "train.check_weight_hash_across_dp_replicas_interval",
        ),
        (["env_vars.CUDA_DEVICE_MAX_CONNECTIONS=1"], "env_vars.CUDA_DEVICE_MAX_CONNECTIONS"),
        (
            ["checkpoint.async_save=true", "checkpoint.use_persistent_ckpt_worker=false"],
            "checkpoint.use_persistent_ckpt_worker",
        ),  # fixed by the fix-point pass over the rule table
    ],
)
def test_plan_fixes_what_follows(overrides, expected_path):
    cfg = config_io.load_effective(None, overrides)
    changes = enable.plan(cfg)
    assert expected_path in {c.path for c in changes}
    assert _errors(enable.apply(cfg, changes)) == []


def test_strategy_and_perf():
    cfg = config_io.load_effective(None)
    changes = {c.path: c.new for c in enable.plan(cfg, strategy="optim_grads", perf=True)}
    assert changes["ddp.data_parallel_sharding_strategy"] == "optim_grads"
    assert changes["model.init_model_with_meta_device"] is True
    with pytest.raises(InputError):
        enable.plan(cfg, strategy="optim_grad_params")


def test_perf_leaves_the_fp8_transpose_cache_alone(mcore_src):
    """keep_fp8_transpose_cache=True keeps a transpose to save recomputation: turning it off saves memory,
    not time, and False is already the default, so --perf never touches it."""
    text = (mcore_src / "megatron/core/distributed/distributed_data_parallel_config.py").read_text()
    assert "    keep_fp8_transpose_cache: bool = False\n" in text
    cfg = config_io.load_effective(None, ["ddp.keep_fp8_transpose_cache=true"])
    changes = {c.path: c.new for c in enable.plan(cfg, perf=True)}
    assert "ddp.keep_fp8_transpose_cache" not in changes
    assert "ddp.keep_fp8_transpose_cache" not in enable.PERF_OVERRIDES


def test_model_decisions_are_left_to_the_user():
    """CPU offloading with PP>1: which to give up is the user's call; enable changes neither and the error stays."""
    cfg = config_io.load_effective(None, ["model.cpu_offloading=true", "model.pipeline_model_parallel_size=2"])
    changes = enable.plan(cfg)
    assert not {c.path for c in changes} & {"model.cpu_offloading", "model.pipeline_model_parallel_size"}
    errors = _errors(enable.apply(cfg, changes))
    assert {"MFSDP-CPU-OFFLOAD-PP", "MFSDP-PIPELINE-PARALLEL"} <= set(errors)


def test_set_pp1_sets_pipeline_to_one_and_drops_pipeline_only_keys():
    cfg = config_io.load_effective(
        None, ["model.pipeline_model_parallel_size=4", "model.virtual_pipeline_model_parallel_size=2"]
    )
    assert "MFSDP-PIPELINE-PARALLEL" in _errors(enable.apply(cfg, enable.plan(cfg)))
    changes = {c.path: c for c in enable.plan(cfg, set_pp1=True)}
    assert changes["model.pipeline_model_parallel_size"].new == 1
    assert "--set-pp-1" in changes["model.pipeline_model_parallel_size"].why
    assert changes["model.virtual_pipeline_model_parallel_size"].new is None
    assert _errors(enable.apply(cfg, list(changes.values()))) == []


@pytest.mark.parametrize(
    "overrides,fixed",
    [
        (
            [
                "model.num_moe_experts=8",
                "model.expert_model_parallel_size=2",
                "comm_overlap.tp_comm_overlap=false",
                "comm_overlap.overlap_moe_expert_parallel_comm=true",
                "ddp.megatron_fsdp_max_pool_double_buffer=true",
                "ddp.fsdp_double_buffer=true",
            ],
            {"ddp.fsdp_double_buffer": False, "ddp.megatron_fsdp_max_pool_double_buffer": False},
        ),
        (["model.moe_single_grouped_weight=true"], {"model.moe_single_grouped_weight": False}),
        (
            ["model.cuda_graph_impl=full_iteration"],
            {"ddp.megatron_fsdp_cuda_graph_mode": True, "ddp.fsdp_all_gather_in_start_param_sync": False},
        ),
        (["model.cuda_graph_impl=transformer_engine"], {"ddp.megatron_fsdp_cuda_graph_mode": True}),
    ],
)
def test_plan_fixes_wrap_time_failures_that_are_safe_to_fix(overrides, fixed):
    cfg = config_io.load_effective(None, overrides)
    changes = enable.plan(cfg)
    got = {c.path: c.new for c in changes}
    assert {k: got.get(k) for k in fixed} == fixed
    assert all(c.why for c in changes)
    result = enable.apply(cfg, changes)
    assert _errors(result) == []
    assert not [f for f in rules.evaluate(result, {}) if f.severity == "warning" and f.rule.startswith("MFSDP-CUDA")]


def test_no_shard_perf_does_not_add_meta_device_init():
    cfg = config_io.load_effective(None)
    changes = {c.path: c.new for c in enable.plan(cfg, strategy="no_shard", perf=True)}
    assert "model.init_model_with_meta_device" not in changes
    cfg = config_io.load_effective(None, ["model.init_model_with_meta_device=true"])
    changes = {c.path: c.new for c in enable.plan(cfg, strategy="no_shard")}
    assert changes["model.init_model_with_meta_device"] is False


def test_peft_keeps_pretrained_checkpoint_and_turns_meta_init_off():
    cfg = config_io.load_effective(
        None,
        [
            "peft={_target_: megatron.bridge.peft.lora.LoRA, dim: 8}",
            "checkpoint.pretrained_checkpoint=/models/base",
            "model.init_model_with_meta_device=true",
        ],
    )
    changes = enable.plan(cfg, perf=True)
    by_path = {c.path: c.new for c in changes}
    assert "checkpoint.pretrained_checkpoint" not in by_path and "checkpoint.load" not in by_path
    assert by_path["model.init_model_with_meta_device"] is False
    assert _errors(enable.apply(cfg, changes)) == []
    notes = enable.advice(cfg, changes)
    assert any("pretrained_checkpoint=/models/base" in n and "Hugging Face" in n for n in notes)


def test_blocked_when_the_optimizer_is_muon():
    cfg = config_io.load_effective(None, ["optimizer.optimizer=dist_muon"])
    result = enable.apply(cfg, enable.plan(cfg))
    assert [f.rule for f in enable.blocking(rules.evaluate(result, {}))] == ["MFSDP-OPTIMIZER-UNSUPPORTED"]


def test_no_op_changes_are_not_listed():
    """A value that is already right is not a change, even when a later step revisits it."""
    cfg = config_io.load_effective(None)
    once = enable.apply(cfg, enable.plan(cfg, save_dir="/ckpt"))
    assert enable.plan(once, save_dir="/ckpt") == []


def test_yaml_edit_keeps_comments_and_order():
    text = (
        "# my run\nddp:\n  use_megatron_fsdp: false   # off for now\n  bucket_size: 100\n"
        "checkpoint:\n  save: /ckpt\n  load: /ckpt\n\ntrain:\n  train_iters: 10\n"
    )
    data = config_io.parse_yaml(text, "t")
    cfg = config_io.merge_file(config_io._defaults(), data, "t")
    changes = enable.plan(cfg)
    new, in_place = enable.yaml_edit(text, data, changes)
    assert in_place
    assert new.startswith("# my run\nddp:\n  use_megatron_fsdp: true   # off for now\n  bucket_size: 100\n")
    assert "train:\n  train_iters: 10\n" in new
    parsed = yaml.safe_load(new)
    assert list(parsed) == ["ddp", "checkpoint", "train", "dist", "optimizer"]  # new sections appended, order kept
    assert list(parsed["ddp"])[:2] == ["use_megatron_fsdp", "bucket_size"]  # new keys go after existing ones
    assert parsed["checkpoint"] == {"save": "/ckpt", "load": "/ckpt", "ckpt_format": "fsdp_dtensor"}  # load kept
    assert parsed["dist"] == {"use_megatron_fsdp": True}


def test_yaml_edit_falls_back_to_redump_for_flow_style():
    text = "ddp: {use_megatron_fsdp: false}\n"
    data = config_io.parse_yaml(text, "t")
    changes = [enable.Change("ddp.use_megatron_fsdp", False, True, "x")]
    new, in_place = enable.yaml_edit(text, data, changes)
    assert not in_place and yaml.safe_load(new) == {"ddp": {"use_megatron_fsdp": True}}


def test_yaml_edit_null_section_and_quoting():
    text = "comm_overlap: null\ncheckpoint:\n  save: null\n"
    data = config_io.parse_yaml(text, "t")
    changes = [
        enable.Change("comm_overlap.defer_embedding_wgrad_compute", None, False, "x"),
        enable.Change("checkpoint.save", None, "/a b/#c: d", "x"),
    ]
    new, in_place = enable.yaml_edit(text, data, changes)
    assert in_place
    assert yaml.safe_load(new) == {
        "comm_overlap": {"defer_embedding_wgrad_compute": False},
        "checkpoint": {"save": "/a b/#c: d"},
    }


def test_renderers():
    changes = [
        enable.Change("ddp.use_megatron_fsdp", False, True, "x"),
        enable.Change("checkpoint.load", "/a", None, "x"),
        enable.Change("checkpoint.save", None, "/my ckpt", "x"),
        enable.Change("env_vars.CUDA_DEVICE_MAX_CONNECTIONS", 1, 32, "x"),
    ]
    assert enable.render_overrides(changes) == (
        "ddp.use_megatron_fsdp=true\ncheckpoint.load=null\n"
        "checkpoint.save='/my ckpt'\nenv_vars.CUDA_DEVICE_MAX_CONNECTIONS=32\n"
    )
    new_env = [enable.Change("env_vars.NVTE_CPU_OFFLOAD_V1", None, 1, "x")]
    assert enable.render_overrides(new_env) == "+env_vars.NVTE_CPU_OFFLOAD_V1=1\n"  # Hydra: adding a key
    py = enable.render_python(changes)
    assert "cfg.ddp.use_megatron_fsdp = True\n" in py and "cfg.checkpoint.load = None\n" in py
    assert "cfg.env_vars['CUDA_DEVICE_MAX_CONNECTIONS'] = 32\n" in py
    # the overrides round-trip through our own parser
    for line in enable.render_overrides(changes).splitlines():
        p, v = config_io.parse_override(line)
        assert {c.path: c.new for c in changes}[p] == v


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_apply_to_object():
    cfg = _Obj(ddp=_Obj(use_megatron_fsdp=False), checkpoint=_Obj(ckpt_format="torch_dist"), env_vars={})
    enable.apply_to_object(
        cfg,
        {
            "ddp.use_megatron_fsdp": True,
            "checkpoint.ckpt_format": "fsdp_dtensor",
            "env_vars.CUDA_DEVICE_MAX_CONNECTIONS": 32,
        },
    )
    assert cfg.ddp.use_megatron_fsdp is True and cfg.checkpoint.ckpt_format == "fsdp_dtensor"
    assert cfg.env_vars == {"CUDA_DEVICE_MAX_CONNECTIONS": 32}
    with pytest.raises(InputError, match="no attribute 'use_megatron_fdsp'"):
        enable.apply_to_object(cfg, {"ddp.use_megatron_fdsp": True})


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_values = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=30))


@settings(max_examples=300, deadline=None)
@given(_values)
def test_rendered_values_round_trip(value):
    """What enable prints (YAML scalar, Hydra value) parses back to the very value it changed."""
    assert yaml.safe_load(enable.yaml_scalar(value)) == value
    assert config_io.parse_value(enable.hydra_value(value)) == value


def test_set_pp1_on_a_gpt_model_config_edits_the_nested_transformer(tmp_path):
    text = (
        "model:\n  _target_: megatron.training.models.gpt.GPTModelConfig\n  vocab_size: 128256\n"
        "  transformer:\n    pipeline_model_parallel_size: 2\n    num_layers: 4\n"
    )
    data = config_io.parse_yaml(text, "t")
    cfg = config_io.merge_file(config_io._defaults(), data, "t")
    changes = enable.plan(cfg, set_pp1=True)
    assert "model.transformer.pipeline_model_parallel_size" in {c.path for c in changes}
    new, _ = enable.yaml_edit(text, data, changes)
    parsed = yaml.safe_load(new)
    assert parsed["model"]["transformer"]["pipeline_model_parallel_size"] == 1
    assert "pipeline_model_parallel_size" not in parsed["model"]  # no stray top-level key GPTModelConfig would reject
    assert _errors(enable.apply(cfg, changes)) == []


def test_set_pp1_says_at_which_world_the_batch_was_checked():
    cfg = config_io.load_effective(None, ["model.pipeline_model_parallel_size=4"])
    changes = enable.plan(cfg, set_pp1=True)
    notes = enable.advice(cfg, changes)
    # the embedded recipe has CP 2: with PP 4 its smallest world is 8 GPUs, where PP 1 gives DP 4
    assert any("4x larger" in n and "8 GPUs (DP 4)" in n and "--gpus N" in n for n in notes), notes
    assert not any("4x larger" in n for n in enable.advice(cfg, changes, gpus=8))  # the world is known: no guess


def test_set_pp1_batch_judged_at_the_world_the_layout_had():
    """PP 4 -> 1 on the same GPUs: DP x4. 512 / (1 x 4) divides; 6 / (2 x 4) does not, and enable leaves it."""
    cfg = config_io.load_effective(None, ["model.pipeline_model_parallel_size=4"])
    result = enable.apply(cfg, enable.plan(cfg, set_pp1=True))
    world = enable.job_world(cfg, result)
    assert world[0] == 8 and "--gpus" in world[1]
    assert _errors(result) == []
    small = config_io.load_effective(
        None, ["model.pipeline_model_parallel_size=4", "train.global_batch_size=6", "train.micro_batch_size=2"]
    )
    changes = enable.plan(small, set_pp1=True)
    assert not any(c.path.startswith(("train.", "validation.")) for c in changes)  # the user's decision
    found = rules.evaluate(
        enable.apply(small, changes), {}, None, *enable.job_world(small, enable.apply(small, changes))
    )
    assert {"MFSDP-TRAIN-BATCH-DP", "MFSDP-EVAL-BATCH-DP"} <= {f.rule for f in found if f.severity == "error"}
    assert enable.job_world(small, small, gpus=64) == (64, "given with --gpus")


def test_fit_eval_batch_moves_the_eval_batch_and_keeps_the_samples():
    cfg = config_io.load_effective(
        None,
        [
            "model.pipeline_model_parallel_size=4",
            "validation.eval_global_batch_size=36",
            "validation.eval_micro_batch_size=2",
            "validation.eval_iters=10",
        ],
    )
    changes = {c.path: c for c in enable.plan(cfg, set_pp1=True, fit_eval_batch=True)}
    # 8 GPUs, PP 1: DP 4, 2 x 4 = 8 per step; 36 -> 40 (nearest; ties go up), eval_iters 10 -> 9 (360 -> 360 samples)
    assert changes["validation.eval_global_batch_size"].new == 40
    assert changes["validation.eval_iters"].new == 9 and "--fit-eval-batch" in changes["validation.eval_iters"].why
    changes = {c.path: c for c in enable.plan(cfg, set_pp1=True, fit_eval_batch=True, gpus=32)}
    assert changes["validation.eval_global_batch_size"].new == 32  # DP 16: 32 per step
    assert changes["validation.eval_iters"].new == 12  # ceil(360 / 32): at least as many samples
    assert "validation.eval_global_batch_size" not in {c.path for c in enable.plan(cfg, set_pp1=True)}


def test_the_ckpt_command_in_advice_quotes_the_path():
    # a path with a space or a shell character is printed so that the command can be pasted as it is
    cfg = config_io.load_effective(None, ["checkpoint.load=/runs/my run/ckpt"])
    notes = enable.advice(cfg, enable.plan(cfg))
    assert "`mfsdp.py ckpt '/runs/my run/ckpt' --expect fsdp_dtensor`" in notes[0]
