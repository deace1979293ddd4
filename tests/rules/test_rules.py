"""Every rule fires on a config that breaks it and stays quiet on its near miss.

The base is the embedded Llama 3 8B recipe with the minimal Megatron FSDP fix-up, the
same config the real Bridge validated (see scripts/data/README.md); each case adds the
few overrides that break (or almost break) one rule. The source anchors are checked
against the wheels: the cited files exist and the quoted assert messages are in them.
"""

from __future__ import annotations

import re

import pytest

from _helpers_config import text_in_source, wheel_file
from mfsdp_lib import config_io, rules

BASE = [
    "dist.use_megatron_fsdp=true",
    "ddp.use_megatron_fsdp=true",
    "ddp.data_parallel_sharding_strategy=optim_grads_params",
    "ddp.average_in_collective=false",
    "checkpoint.ckpt_format=fsdp_dtensor",
    "checkpoint.load=null",
]
OFF = ["dist.use_megatron_fsdp=false", "ddp.use_megatron_fsdp=false", "checkpoint.ckpt_format=torch_dist"]
MC = rules.MAX_CONN
# A small MoE layout (the comm_overlap section is required whole: tp_comm_overlap has no default).
MOE = ["model.num_moe_experts=8", "model.expert_model_parallel_size=2", "comm_overlap.tp_comm_overlap=false"]
LORA = ["peft={_target_: megatron.bridge.peft.lora.LoRA, dim: 8}"]

# rule -> ((trigger overrides, trigger env), (near-miss overrides, near-miss env)); "@world" in env: the world size
CASES = {
    # the base has CP=2: its smallest world is 2 GPUs, DP 1; at 8 GPUs DP is 4
    "MFSDP-TRAIN-BATCH-DP": (
        (["train.global_batch_size=6", "train.micro_batch_size=2"], {"@world": 8}),
        (["train.global_batch_size=8", "train.micro_batch_size=2"], {"@world": 8}),
    ),
    "MFSDP-EVAL-BATCH-DP": (
        (["validation.eval_global_batch_size=3", "validation.eval_micro_batch_size=2"], {}),
        (["validation.eval_global_batch_size=4", "validation.eval_micro_batch_size=2"], {}),
    ),
    "MFSDP-WORLD-LAYOUT": (
        (["model.tensor_model_parallel_size=2"], {"@world": 6}),
        (["model.tensor_model_parallel_size=2"], {"@world": 8}),
    ),
    "MFSDP-FSDP2-EXCLUSIVE": (
        (["dist.use_torch_fsdp2=true"], {}),
        (["dist.use_megatron_fsdp=false", "dist.use_torch_fsdp2=true"], {}),
    ),
    "MFSDP-CKPT-FORMAT": (
        (["checkpoint.ckpt_format=torch_dist"], {}),
        (["checkpoint.ckpt_format=torch_dist", "checkpoint.save=null"], {}),
    ),
    "MFSDP-DTENSOR-NEEDS-MFSDP": (
        (["dist.use_megatron_fsdp=false", "ddp.use_megatron_fsdp=false"], {}),
        (["dist.use_megatron_fsdp=false"], {}),
    ),
    "MFSDP-ENV-MAX-CONNECTIONS": (([], {MC: "1"}), ([], {MC: "32"})),
    "MFSDP-MANUAL-REG-NEEDS-NCCL-UB": (
        (["ddp.fsdp_manual_registration=true"], {}),
        (["ddp.fsdp_manual_registration=true", "ddp.nccl_ub=true", "ddp.fsdp_double_buffer=true"], {}),
    ),
    "MFSDP-WEIGHT-HASH": (
        (["train.check_weight_hash_across_dp_replicas_interval=100"], {}),
        (
            [
                "train.check_weight_hash_across_dp_replicas_interval=100",
                "ddp.data_parallel_sharding_strategy=optim_grads",
            ],
            {},
        ),
    ),
    "MFSDP-TP-PP-DP-MAPPING": (
        (["dist.use_tp_pp_dp_mapping=true"], {}),
        (OFF + ["dist.use_tp_pp_dp_mapping=true"], {}),
    ),
    "MFSDP-ASYNC-FORMAT": (
        (OFF + ["checkpoint.async_save=true", "checkpoint.ckpt_format=torch"], {}),
        (["checkpoint.async_save=true"], {}),
    ),
    "MFSDP-ASYNC-NEEDS-SAVE": (
        (["checkpoint.async_save=true", "checkpoint.save=null"], {}),
        (["checkpoint.async_save=true"], {}),
    ),
    "MFSDP-ASYNC-PERSISTENT-WORKER": (
        (["checkpoint.async_save=true", "checkpoint.use_persistent_ckpt_worker=false"], {}),
        (["checkpoint.use_persistent_ckpt_worker=false"], {}),
    ),
    "MFSDP-ASYNC-DTENSOR-NVRX": (
        (["checkpoint.async_save=true"], {}),
        (["checkpoint.async_save=false"], {}),
    ),
    "MFSDP-PRETRAINED-HF-AFTER-WRAP": (
        (["checkpoint.pretrained_checkpoint=/models/Llama-3-8B-hf"], {}),
        (LORA + ["checkpoint.pretrained_checkpoint=/models/Llama-3-8B-hf"], {}),  # PEFT loads before the wrap
    ),
    "MFSDP-HF-EXPORT-DTENSOR": (
        (["checkpoint.also_save_hf_checkpoint=true"], {}),
        (OFF + ["checkpoint.also_save_hf_checkpoint=true"], {}),
    ),
    "MFSDP-HF-EXPORT-LOCAL": (
        (["checkpoint.also_save_hf_checkpoint=true", "checkpoint.non_persistent_ckpt_type=local"], {}),
        (["checkpoint.non_persistent_ckpt_type=local"], {}),
    ),
    "MFSDP-HF-EXPORT-SOURCE": (
        (OFF + ["checkpoint.also_save_hf_checkpoint=true", "model.hf_model_id=null"], {}),
        (OFF + ["checkpoint.also_save_hf_checkpoint=true"], {}),
    ),
    "MFSDP-CKPT-NO-GLOO": (
        (["dist.use_gloo_process_groups=false", "checkpoint.ckpt_format=torch", "checkpoint.save=null"], {}),
        (["dist.use_gloo_process_groups=false"], {}),
    ),
    "MFSDP-MXFP8-REUSE-NEEDS-FP8-GATHER": (
        (["mixed_precision=null", "ddp.reuse_grad_buf_for_mxfp8_param_ag=true"], {}),
        (["ddp.reuse_grad_buf_for_mxfp8_param_ag=true"], {}),
    ),  # preset overwrites
    "MFSDP-MXFP8-REUSE-NON-FSDP": (
        (
            OFF + ["mixed_precision=null", "mixed_precision.fp8_param_gather=true", "mixed_precision.fp8_recipe=mxfp8"],
            {},
        ),
        (OFF + ["mixed_precision=bf16_with_mxfp8_mixed"], {}),
    ),
    "MFSDP-DDP-BUCKETS": ((["ddp.num_buckets=4", "ddp.bucket_size=1000"], {}), (["ddp.num_buckets=4"], {})),
    "MFSDP-PRECISION-BOTH": ((["mixed_precision=null", "model.fp16=true"], {}), (["model.fp16=true"], {})),
    "MFSDP-PRECISION-AWARE-MISMATCH": (
        (["mixed_precision=null", "optimizer.use_precision_aware_optimizer=true", "optimizer.bf16=false"], {}),
        (["optimizer.use_precision_aware_optimizer=true", "optimizer.bf16=false"], {}),
    ),
    "MFSDP-PRECISION-AWARE-NEEDS-DIST-OPT": (
        (["optimizer.use_precision_aware_optimizer=true", "optimizer.use_distributed_optimizer=false"], {}),
        (["optimizer.use_precision_aware_optimizer=true"], {}),
    ),
    "MFSDP-PRECISION-AWARE-ADAM": (
        (["optimizer.use_precision_aware_optimizer=true", "optimizer.optimizer=sgd"], {}),
        (["optimizer.optimizer=sgd"], {}),
    ),
    "MFSDP-RECOMPUTE-FULL-METHOD": (
        (["model.recompute_granularity=full", "model.recompute_num_layers=1"], {}),
        (["model.recompute_granularity=full", "model.recompute_num_layers=1", "model.recompute_method=uniform"], {}),
    ),
    "MFSDP-RECOMPUTE-FULL-NUM-LAYERS": (
        (["model.recompute_granularity=full", "model.recompute_method=block"], {}),
        (["model.recompute_granularity=full", "model.recompute_method=block", "model.recompute_num_layers=2"], {}),
    ),
    "MFSDP-RECOMPUTE-SELECTIVE-NUM-LAYERS": (
        (["model.recompute_granularity=selective", "model.recompute_num_layers=2"], {}),
        (["model.recompute_granularity=selective"], {}),
    ),
    "MFSDP-CPU-OFFLOAD-PP": (
        (["model.cpu_offloading=true", "model.pipeline_model_parallel_size=2"], {}),
        (["model.pipeline_model_parallel_size=2"], {}),
    ),
    "MFSDP-CPU-OFFLOAD-RECOMPUTE": (
        (["model.cpu_offloading=true", "model.recompute_granularity=full"], {}),
        (["model.recompute_granularity=full"], {}),
    ),
    "MFSDP-CPU-OFFLOAD-LAYERS": (
        (["model.cpu_offloading=true", "model.cpu_offloading_num_layers=32"], {}),
        (["model.cpu_offloading=true", "model.cpu_offloading_num_layers=31"], {}),
    ),
    "MFSDP-CPU-OFFLOAD-FINE-GRAINED": (
        (["model.cpu_offloading=true", "model.fine_grained_activation_offloading=true"], {"NVTE_CPU_OFFLOAD_V1": "1"}),
        (["model.fine_grained_activation_offloading=true"], {"NVTE_CPU_OFFLOAD_V1": "1"}),
    ),
    "MFSDP-FINE-GRAINED-OFFLOAD-MODULES": (
        (["model.fine_grained_activation_offloading=true"], {}),
        (["model.fine_grained_activation_offloading=true", "model.offload_modules=[core_attn]"], {}),
    ),
    "MFSDP-CPU-OFFLOAD-CUDA-GRAPH": (
        (["model.cpu_offloading=true", "model.cuda_graph_impl=local"], {}),
        (["model.cpu_offloading=true", "model.cuda_graph_impl=full_iteration"], {}),
    ),
    "MFSDP-FINE-GRAINED-OFFLOAD-IMPL": (
        (["model.fine_grained_activation_offloading=true", "model.transformer_impl=local"], {}),
        (["model.transformer_impl=local"], {}),
    ),
    "MFSDP-FINE-GRAINED-OFFLOAD-ENV": (
        (["model.fine_grained_activation_offloading=true"], {}),
        (["model.fine_grained_activation_offloading=true"], {"NVTE_CPU_OFFLOAD_V1": "1"}),
    ),
    "MFSDP-FSDP2-DDP-FLAG": (
        (["dist.use_megatron_fsdp=false", "dist.use_torch_fsdp2=true"], {}),
        (["dist.use_megatron_fsdp=false"], {}),
    ),
    "MFSDP-NCCL-UB-DOUBLE-BUFFER": (
        (["ddp.nccl_ub=true"], {}),
        (["ddp.nccl_ub=true", "ddp.megatron_fsdp_max_pool_double_buffer=true"], {}),
    ),
    "MFSDP-HSDP-OUTER-NEEDS-FULL-SHARD": (
        (
            [
                "ddp.outer_dp_sharding_strategy=optim",
                "ddp.num_distributed_optimizer_instances=2",
                "ddp.data_parallel_sharding_strategy=optim_grads",
            ],
            {},
        ),
        (["ddp.outer_dp_sharding_strategy=optim", "ddp.num_distributed_optimizer_instances=2"], {}),
    ),
    "MFSDP-HSDP-OUTER-WITHOUT-HSDP": (
        (["ddp.outer_dp_sharding_strategy=optim"], {}),
        (["ddp.outer_dp_sharding_strategy=optim", "ddp.num_distributed_optimizer_instances=2"], {}),
    ),
    "MFSDP-FSDP2-EXPERIMENTAL": ((OFF + ["dist.use_torch_fsdp2=true"], {}), (OFF, {})),
    "MFSDP-AVG-IN-COLLECTIVE": (
        (["ddp.average_in_collective=true"], {}),
        (["ddp.average_in_collective=true", "ddp.disable_symmetric_registration=true"], {}),
    ),
    "MFSDP-NO-SHARD": (
        (["ddp.data_parallel_sharding_strategy=no_shard"], {}),
        (["ddp.data_parallel_sharding_strategy=optim"], {}),
    ),
    "MFSDP-SHARDING-WITHOUT-FSDP": (
        (OFF + ["ddp.data_parallel_sharding_strategy=optim"], {}),
        (["ddp.data_parallel_sharding_strategy=optim"], {}),
    ),
    "MFSDP-ENV-MAX-CONN-TP-OVERLAP": (
        (["model.tp_comm_overlap=true"], {"@arch": "hopper"}),
        (["model.tp_comm_overlap=true"], {"@arch": "blackwell"}),
    ),
    "MFSDP-NCCL-UB-EXPANDABLE-SEGMENTS": (
        (["ddp.nccl_ub=true", "ddp.fsdp_double_buffer=true"], {}),  # recipe env_vars
        (["ddp.nccl_ub=true", "ddp.fsdp_double_buffer=true"], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}),
    ),
    "MFSDP-KEEP-FP8-TRANSPOSE-CACHE": (
        (["ddp.keep_fp8_transpose_cache=true"], {}),
        (["ddp.keep_fp8_transpose_cache=true", "ddp.data_parallel_sharding_strategy=optim_grads"], {}),
    ),
    "MFSDP-OVERLAP-OFF-ONE-BUCKET": (
        (["ddp.data_parallel_sharding_strategy=optim_grads", "ddp.overlap_grad_reduce=false"], {}),
        (["ddp.data_parallel_sharding_strategy=optim_grads_params", "ddp.overlap_grad_reduce=false"], {}),
    ),
    "MFSDP-DTYPE-STRING": (
        (["ddp.megatron_fsdp_main_grads_dtype=fp32"], {}),
        (["ddp.megatron_fsdp_main_grads_dtype={_target_:torch.float32,_call_:false}"], {}),
    ),
    "MFSDP-DTYPE-STRING-OTHER": (
        (["mixed_precision=null", "model.autocast_dtype=bf16"], {}),
        (["model.autocast_dtype=bf16"], {}),  # the mixed-precision preset overwrites it
    ),
    "MFSDP-DEFER-EMBEDDING-WGRAD": (
        (["comm_overlap.tp_comm_overlap=false", "comm_overlap.defer_embedding_wgrad_compute=true"], {}),
        (["comm_overlap.tp_comm_overlap=false", "comm_overlap.defer_embedding_wgrad_compute=false"], {}),
    ),
    "MFSDP-CUSTOM-FSDP-DEPRECATED": ((["ddp.use_custom_fsdp=true"], {}), ([], {})),
    "MFSDP-FLAGS-SYNC": ((["dist.use_megatron_fsdp=false"], {}), ([], {})),
    "MFSDP-DIST-OPT-FORCED": (
        (["ddp.use_distributed_optimizer=false"], {}),
        (OFF + ["ddp.use_distributed_optimizer=false"], {}),
    ),
    "MFSDP-MXFP8-REUSE-OFF": ((["mixed_precision=bf16_with_mxfp8_mixed"], {}), (["mixed_precision=bf16_mixed"], {})),
    "MFSDP-DECOUPLED-GRAD": (
        (["optimizer.use_precision_aware_optimizer=true"], {}),
        (["optimizer.use_precision_aware_optimizer=true", "ddp.megatron_fsdp_use_decoupled_grad=true"], {}),
    ),
    "MFSDP-NCCL-UB-MANUAL-REG": (
        (["ddp.nccl_ub=true", "ddp.fsdp_double_buffer=true"], {}),
        (["ddp.nccl_ub=true", "ddp.fsdp_double_buffer=true", "ddp.fsdp_manual_registration=true"], {}),
    ),
    "MFSDP-META-DEVICE-INIT": (([], {}), (["model.init_model_with_meta_device=true"], {})),
    "MFSDP-PIPELINE-PARALLEL": (
        (["model.pipeline_model_parallel_size=2"], {}),
        (OFF + ["model.pipeline_model_parallel_size=2"], {}),
    ),
    "MFSDP-NO-SHARD-META-INIT": (
        (["ddp.data_parallel_sharding_strategy=no_shard", "model.init_model_with_meta_device=true"], {}),
        (["ddp.data_parallel_sharding_strategy=optim", "model.init_model_with_meta_device=true"], {}),
    ),
    "MFSDP-MOE-OVERLAP-DOUBLE-BUFFER": (
        (
            MOE
            + ["comm_overlap.overlap_moe_expert_parallel_comm=true", "ddp.megatron_fsdp_max_pool_double_buffer=true"],
            {},
        ),
        (MOE + ["comm_overlap.overlap_moe_expert_parallel_comm=false", "ddp.fsdp_double_buffer=true"], {}),
    ),
    "MFSDP-MOE-SINGLE-GROUPED-WEIGHT": (
        (MOE + ["model.moe_single_grouped_weight=true"], {}),
        (OFF + MOE + ["model.moe_single_grouped_weight=true"], {}),
    ),
    "MFSDP-MOE-OVERLAP-CUDA-GRAPH": (
        (MOE + ["comm_overlap.overlap_moe_expert_parallel_comm=true", "model.cuda_graph_impl=transformer_engine"], {}),
        (MOE + ["comm_overlap.overlap_moe_expert_parallel_comm=true", "model.cuda_graph_impl=full_iteration"], {}),
    ),
    "MFSDP-FULL-ITER-CUDA-GRAPH": (
        (["model.cuda_graph_impl=full_iteration", "ddp.megatron_fsdp_cuda_graph_mode=true"], {}),
        (
            [
                "model.cuda_graph_impl=full_iteration",
                "rerun_state_machine.check_for_nan_in_loss=false",
                "ddp.megatron_fsdp_cuda_graph_mode=true",
                "ddp.fsdp_all_gather_in_start_param_sync=false",
            ],
            {},
        ),
    ),
    "MFSDP-FULL-ITER-NAN-CHECK": (
        (["model.cuda_graph_impl=full_iteration"], {}),
        (["model.cuda_graph_impl=full_iteration", "rerun_state_machine.check_for_nan_in_loss=false"], {}),
    ),
    # GPTModelProvider.provide asserts the TE RNG tracker under any CUDA graph; hybrid (Mamba) providers do not
    "MFSDP-CUDA-GRAPH-TE-RNG": (
        (["model.cuda_graph_impl=transformer_engine"], {}),
        (["model.cuda_graph_impl=transformer_engine", "model.use_te_rng_tracker=true"], {}),
    ),
    "MFSDP-CUDA-GRAPH-SAFE-MODE": (
        (["model.cuda_graph_impl=transformer_engine"], {}),
        (["model.cuda_graph_impl=transformer_engine", "ddp.megatron_fsdp_cuda_graph_mode=true"], {}),
    ),
    "MFSDP-OPTIMIZER-UNSUPPORTED": (
        (["optimizer.optimizer=dist_muon"], {}),
        (OFF + ["optimizer.optimizer=dist_muon"], {}),
    ),
    "MFSDP-PEFT-NEEDS-PRETRAINED": ((LORA, {}), (LORA + ["checkpoint.pretrained_checkpoint=/models/hf"], {})),
    "MFSDP-PEFT-META-DEVICE": (
        (LORA + ["checkpoint.pretrained_checkpoint=/models/hf", "model.init_model_with_meta_device=true"], {}),
        (LORA + ["checkpoint.pretrained_checkpoint=/models/hf"], {}),
    ),
    "MFSDP-PEFT-PRETRAINED-FORMAT": (
        (LORA + ["checkpoint.pretrained_checkpoint=/models/base"], {}),
        (OFF + LORA + ["checkpoint.pretrained_checkpoint=/models/base"], {}),
    ),
}


def _ids(overrides, env):
    env = dict(env)
    arch = env.pop("@arch", None)
    world = env.pop("@world", None)  # the job's world size, when the case gives one (enable --gpus)
    cfg = config_io.load_effective(None, BASE + list(overrides))
    return [f.rule for f in rules.evaluate(cfg, env, arch, world)]


def test_every_rule_has_a_case():
    assert set(CASES) | {"MFSDP-ENUM"} == {r.id for r in rules.RULES}


def test_ids_unique_and_well_formed():
    ids = [r.id for r in rules.RULES]
    assert len(ids) == len(set(ids))
    for r in rules.RULES:
        assert re.match(r"^MFSDP-[A-Z0-9-]+$", r.id)
        assert r.severity in ("error", "warning", "info")
        assert r.stage in ("validate", "runtime", "rewrite", "input", "advice")
        assert r.paths and all("." in p for p in r.paths)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fires_and_near_miss_does_not(rule_id):
    (t_ovr, t_env), (m_ovr, m_env) = CASES[rule_id]
    assert rule_id in _ids(t_ovr, t_env), f"{rule_id} did not fire on {t_ovr} {t_env}"
    assert rule_id not in _ids(m_ovr, m_env), f"{rule_id} fired on its near miss {m_ovr} {m_env}"


def test_base_is_clean():
    """The fix-up the real Bridge validated has no error or warning (only advice)."""
    cfg = config_io.load_effective(None, BASE)
    assert [f.severity for f in rules.evaluate(cfg, {})] == ["info"]


def test_enum_rule_on_a_raw_dict():
    """config_io rejects a misspelt enum as input; evaluate() on a raw dict reports it as a finding."""
    cfg = config_io.load_effective(None, BASE)
    cfg["ddp"]["data_parallel_sharding_strategy"] = "optim_grad_params"
    cfg["checkpoint"]["ckpt_format"] = "fsdp_dtensr"
    found = [f for f in rules.evaluate(cfg, {}) if f.rule == "MFSDP-ENUM"]
    assert {f.path for f in found} == {"ddp.data_parallel_sharding_strategy", "checkpoint.ckpt_format"}
    fixes = {f.fix for f in found}
    assert "ddp.data_parallel_sharding_strategy=optim_grads_params" in fixes
    assert "checkpoint.ckpt_format=fsdp_dtensor" in fixes
    assert all("optim_grad_params" in f.message or "fsdp_dtensr" in f.message for f in found)


def test_env_vars_setdefault_semantics():
    """The config's env_vars apply only where the environment does not set the name (Bridge: setdefault)."""
    cfg = config_io.load_effective(None, BASE + [f"env_vars.{rules.MAX_CONN}=1"])
    f = [f for f in rules.evaluate(cfg, {}) if f.rule == "MFSDP-ENV-MAX-CONNECTIONS"][0]
    assert f.path == f"env_vars.{rules.MAX_CONN}" and f.fix == f"env_vars.{rules.MAX_CONN}=32"
    assert "from the config's env_vars" in f.message
    assert "MFSDP-ENV-MAX-CONNECTIONS" not in [f.rule for f in rules.evaluate(cfg, {rules.MAX_CONN: "8"})]
    cfg = config_io.load_effective(None, BASE + [f"env_vars.{rules.MAX_CONN}=8"])
    assert "MFSDP-ENV-MAX-CONNECTIONS" in [f.rule for f in rules.evaluate(cfg, {rules.MAX_CONN: "1"})]


def test_mixed_precision_overrides_ddp_and_points_there():
    cfg = config_io.load_effective(None, BASE + ["mixed_precision=bf16_with_mxfp8_mixed"])
    f = [x for x in rules.evaluate(cfg, {}) if x.rule == "MFSDP-MXFP8-REUSE-OFF"][0]
    assert f.path == "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag"


def test_findings_name_the_value_found():
    cfg = config_io.load_effective(None, BASE + ["train.check_weight_hash_across_dp_replicas_interval=123"])
    f = [x for x in rules.evaluate(cfg, {}) if x.rule == "MFSDP-WEIGHT-HASH"][0]
    assert "123" in f.message and f.fix == "train.check_weight_hash_across_dp_replicas_interval=null"


_QUOTE = re.compile(
    r"""(?:assert|ValueError|NotImplementedError|TypeError|docstring|: )\s*(['"])(.+?)\1(?=\s*(?:$|;|\(|/|'|"))"""
)


@pytest.mark.parametrize("rule", rules.RULES, ids=lambda r: r.id)
def test_source_anchor_exists_in_wheels(bridge_src, mcore_src, rule):
    # a part cited from the Bridge repository but not shipped in the wheel cannot be checked offline
    wheel_part = rule.source.split(rules.GITHUB_ONLY)[0]
    files = re.findall(r"(megatron/[\w/]+\.py)", wheel_part)
    assert files, f"{rule.id}: no source file in the wheels cited"
    paths = [wheel_file(bridge_src, mcore_src, f) for f in files]
    for p in paths:
        assert p.is_file(), f"{rule.id}: {p} not in the wheels"
    # every quoted text is in one of the cited files (assert messages, code, comments)
    quotes = [q for _, q in re.findall(r"""(['"])(.{12,}?)\1""", wheel_part)]
    assert quotes or rule.stage in ("advice",), f"{rule.id}: cite the assert/raise message"
    for q in quotes:
        q = q.replace("{num_layers}", "")
        assert any(text_in_source(p, q) for p in paths), f"{rule.id}: {q!r} not found in {files}"
    # the symbol after the file name exists there
    for f, sym in re.findall(r"(megatron/[\w/]+\.py): ([A-Za-z_][\w.]*)", wheel_part):
        name = sym.split(".")[-1]
        text = wheel_file(bridge_src, mcore_src, f).read_text()
        assert re.search(rf"\b{re.escape(name)}\b", text), f"{rule.id}: {sym} not in {f}"


@pytest.mark.parametrize(
    "name,arch",
    [
        ("H100", "hopper"),
        ("hopper", "hopper"),
        ("sm_90", "hopper"),
        ("9.0", "hopper"),
        ("sm_100", "blackwell"),
        ("gb200", "blackwell"),
        ("sm_89", "ada"),
        ("sm_80", "ampere"),
        ("pascal", None),
        ("sm_60", None),
        ("", None),
    ],
)
def test_normalize_arch(name, arch):
    assert rules.normalize_arch(name) == arch


def test_model_config_with_nested_transformer_is_read(tmp_path):
    """Megatron's GPTModelConfig keeps TransformerConfig fields under model.transformer (proxied by Bridge)."""
    p = tmp_path / "gpt_model_config.yaml"
    p.write_text(
        "model:\n  _target_: megatron.training.models.gpt.GPTModelConfig\n  vocab_size: 128256\n"
        "  transformer:\n    pipeline_model_parallel_size: 2\n    num_layers: 4\n"
    )
    cfg = config_io.load_effective(str(p), BASE)
    assert "MFSDP-PIPELINE-PARALLEL" in [f.rule for f in rules.evaluate(cfg, {})]


def test_batch_rules_compute_dp_as_bridge_does():
    """DP = world / (TP x PP x CP); at the smallest world of the layout when no world is given; the fixes name the
    nearest valid values, and decrease_batch_size_if_needed only needs one micro-batch per rank."""
    cfg = config_io.load_effective(None, BASE + ["train.global_batch_size=36", "train.micro_batch_size=4"])
    found = {f.rule: f for f in rules.evaluate(cfg, {}, None, 48, "given with --gpus")}
    train = found["MFSDP-TRAIN-BATCH-DP"]  # DP = 48 / (1 x 1 x 2) = 24: 4 x 24 = 96
    assert "4 x data-parallel size 24 = 96 at 48 GPUs" in train.message
    assert train.fix.startswith("train.global_batch_size=0") is False and "train.global_batch_size=96" in train.fix
    evalf = found["MFSDP-EVAL-BATCH-DP"]
    assert "unset: it follows train.global_batch_size" in evalf.message
    assert evalf.fix.startswith("validation.eval_global_batch_size=0") is False
    # at the smallest world (2 GPUs, DP 1): 36 divides by 4
    assert not {"MFSDP-TRAIN-BATCH-DP", "MFSDP-EVAL-BATCH-DP"} & {f.rule for f in rules.evaluate(cfg, {}, None)}
    cfg = config_io.load_effective(None, BASE + ["train.global_batch_size=100", "train.micro_batch_size=1"])
    fix = next(f.fix for f in rules.evaluate(cfg, {}, None, 48) if f.rule == "MFSDP-TRAIN-BATCH-DP")
    assert fix.startswith("train.global_batch_size=96 (or 120)")  # DP 24: 96 is nearer than 120
    cfg = config_io.load_effective(
        None,
        BASE + ["train.global_batch_size=100", "train.micro_batch_size=1", "train.decrease_batch_size_if_needed=true"],
    )
    assert "MFSDP-TRAIN-BATCH-DP" not in {f.rule for f in rules.evaluate(cfg, {}, None, 48)}
    assert "MFSDP-TRAIN-BATCH-DP" in {f.rule for f in rules.evaluate(cfg, {}, None, 400)}  # DP 200 > 100


def test_batch_rules_use_the_expert_layout_for_the_smallest_world():
    """ETP x EP x PP divides the world too (megatron-core); ETP unset means TP."""
    cfg = config_io.load_effective(
        None,
        BASE
        + MOE
        + [
            "model.tensor_model_parallel_size=2",
            "model.expert_model_parallel_size=4",
            "model.context_parallel_size=1",
            "train.global_batch_size=2",
            "train.micro_batch_size=1",
        ],
    )
    # smallest world: lcm(TP 2, ETP 2 x EP 4) = 8, DP = 8 / 2 = 4 > 2
    found = {f.rule: f for f in rules.evaluate(cfg, {}, None)}
    assert "data-parallel size 4 = 4 at 8 GPUs" in found["MFSDP-TRAIN-BATCH-DP"].message


def test_muon_under_fsdp_names_the_measured_failure_and_other_optimizers_stay_unverified():
    def found(optimizer):
        cfg = config_io.load_effective(None, BASE + [f"optimizer.optimizer={optimizer}"])
        return next(f for f in rules.evaluate(cfg, {}) if f.rule == "MFSDP-OPTIMIZER-UNSUPPORTED")

    msg = found("muon").message
    assert "main_grad" in msg and "first optimizer step fails" in msg and "unverified" not in msg
    assert "unverified" in found("soap").message and "main_grad" not in found("soap").message


def test_muon_evidence_shows_the_failure_under_fsdp_and_a_pass_under_the_distributed_optimizer():
    import json

    import raw_store

    raw = raw_store.path("muon_fsdp_1xh200")
    fsdp = json.loads((raw / "optim_grads_params" / "rank_0.report.json").read_text())
    dist = json.loads((raw / "distopt" / "rank_0.report.json").read_text())
    fail = fsdp["first_failure"]
    assert fail["phase"] == "train" and fail["type"] == "AttributeError" and "main_grad" in fail["message"]
    assert "_copy_model_grads_to_main_grads" in fail["frames"]["innermost"]
    assert dist["result"] == "passed" and dist["first_failure"] is None
    for rep in (fsdp, dist):
        assert "optimizer.optimizer" in rep["settings_summary"]["user"]
