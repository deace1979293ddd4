"""Parallel layout rules: rank mapping, HSDP outer sharding, communication overlap.

One ``Rule`` per constraint; the fields are explained in ``rules/model.py``.
"""

from __future__ import annotations

from .. import schema as S
from .context import (
    GITHUB_ONLY,
    SRC_FSDP_CFG,
    SRC_MCORE_FSDP,
    SRC_MFSDP_BUF,
    comm_overlap_on,
    eval_batch_problem,
    fmt,
    int_gt,
    kv,
    pp_size,
    train_batch_problem,
    world_problem,
)
from .model import Rule


def _dp_formula(p: dict) -> str:
    lay = p["lay"]
    return f"DP = {p['world']} / (TP {lay['tp']} x PP {lay['pp']} x CP {lay['cp']}) = {p['dp']}"


def _world_message(e) -> str:
    p = world_problem(e)
    assert p is not None
    bad = "; ".join(f"{what} = {n} does not divide it" for what, n in p["bad"])
    return f"{p['world']} GPUs ({p['how']}) cannot hold this layout: {bad}."


def _world_fix(e) -> str:
    p = world_problem(e)
    assert p is not None
    lay = p["lay"]
    dense, expert = lay["tp"] * lay["pp"] * lay["cp"], lay["etp"] * lay["ep"] * lay["pp"]
    step = dense * expert // _gcd(dense, expert)
    return f"a world size that is a multiple of {step}, or parallel sizes whose products divide {p['world']}"


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _train_batch_message(e) -> str:
    p = train_batch_problem(e)
    assert p is not None
    where = f"at {p['world']} GPUs ({p['how']}; {_dp_formula(p)})"
    if p["decrease"]:
        return (
            f"train.global_batch_size={p['gbs']} is smaller than train.micro_batch_size {p['mbs']} x data-parallel "
            f"size {p['dp']} = {p['step']} {where}: even with train.decrease_batch_size_if_needed=true there is not "
            "one micro-batch per data-parallel rank, and megatron-core refuses to start training."
        )
    return (
        f"train.global_batch_size={p['gbs']} is not a multiple of train.micro_batch_size {p['mbs']} x data-parallel "
        f"size {p['dp']} = {p['step']} {where}: megatron-core refuses to start training."
    )


def _train_batch_fix(e) -> str:
    p = train_batch_problem(e)
    assert p is not None
    near = sorted({v for v in (p["up"], p["down"]) if v}, key=lambda v: (abs(v - p["gbs"]), -v))
    options = [f"train.global_batch_size={near[0]}" + "".join(f" (or {v})" for v in near[1:])]
    if p["micro"] is not None:
        options.append(f"train.micro_batch_size={p['micro']} (keeps the global batch)")
    options.append("fewer data-parallel ranks (more TP or CP, or fewer GPUs)")
    return ", or ".join(options)


def _eval_batch_message(e) -> str:
    p = eval_batch_problem(e)
    assert p is not None
    unset = " (unset: it follows train.global_batch_size)" if p["follows_train"] else ""
    return (
        f"validation.eval_global_batch_size={p['egbs']}{unset} is not a multiple of eval_micro_batch_size "
        f"{p['embs']} x data-parallel size {p['dp']} = {p['step']} at {p['world']} GPUs ({p['how']}): "
        "Bridge's validate() rejects it."
    )


def _eval_batch_fix(e) -> str:
    p = eval_batch_problem(e)
    assert p is not None
    fix = (
        f"validation.eval_global_batch_size={p['nearest']} (the nearest multiple of {p['step']}; "
        "'mfsdp.py enable --fit-eval-batch' sets it and scales validation.eval_iters to keep the samples evaluated)"
    )
    if p["follows_train"]:
        fix += ", or a train.global_batch_size that fits (the eval batch follows it)"
    return fix


RULES: list[Rule] = [
    Rule(
        id="MFSDP-PIPELINE-PARALLEL",
        severity="error",
        stage="runtime",
        topic="parallel",
        paths=("model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"),
        when=lambda e: e.fsdp and pp_size(e) > 1,
        message=lambda e: (
            f"{kv(e, 'model.pipeline_model_parallel_size')} with Megatron FSDP: validate() accepts it, but "
            "wrapping the model fails. Megatron FSDP's device mesh factors the whole world into DP x EP x TP "
            "with no pipeline axis (einops 'Shape mismatch' in _get_dp_tp_mesh)."
        ),
        fix="model.pipeline_model_parallel_size=1 and model.virtual_pipeline_model_parallel_size=null "
        "(absorb the stages with more TP or data parallelism; 'mfsdp.py memory' says what fits), "
        "or keep the distributed optimizer without Megatron FSDP",
        source=f"{SRC_MCORE_FSDP}: _get_dp_tp_mesh (line 561): einops.rearrange(torch.arange(world_size), "
        '"(dp_cp ep tp) -> ep dp_cp tp") over the whole world (dp_cp, ep, tp only); '
        f"{SRC_MCORE_FSDP}: _init_dist_index (line 445): 'mesh = _get_dp_tp_mesh(dp_cp_group, tp_group)'",
    ),
    Rule(
        id="MFSDP-TP-PP-DP-MAPPING",
        severity="error",
        stage="validate",
        topic="parallel",
        paths=("dist.use_tp_pp_dp_mapping",),
        when=lambda e: e.fsdp and bool(e.get("dist.use_tp_pp_dp_mapping")),
        message=lambda e: "dist.use_tp_pp_dp_mapping=true is not supported with Megatron FSDP.",
        fix="dist.use_tp_pp_dp_mapping=false",
        source=f"{SRC_FSDP_CFG}: assert 'use_tp_pp_dp_mapping is not supported with Megatron FSDP'",
    ),
    Rule(
        id="MFSDP-HSDP-OUTER-NEEDS-FULL-SHARD",
        severity="error",
        stage="runtime",
        topic="parallel",
        paths=("ddp.data_parallel_sharding_strategy", "ddp.outer_dp_sharding_strategy"),
        when=lambda e: (
            e.fsdp
            and e.get("ddp.outer_dp_sharding_strategy") != "no_shard"
            and int_gt(e.get("ddp.num_distributed_optimizer_instances"), 1)
            and e.get("ddp.data_parallel_sharding_strategy") != "optim_grads_params"
        ),
        message=lambda e: (
            f"{kv(e, 'ddp.outer_dp_sharding_strategy')} (hybrid FSDP) needs "
            f"data_parallel_sharding_strategy optim_grads_params, found "
            f"{fmt(e.get('ddp.data_parallel_sharding_strategy'))}."
        ),
        fix="ddp.data_parallel_sharding_strategy=optim_grads_params (or ddp.outer_dp_sharding_strategy=no_shard)",
        source=f"{SRC_MFSDP_BUF}: NotImplementedError '[Megatron-FSDP] Optimizer fully-sharded HFSDP is only supported "
        "with full-sharding on DP-Shard.'",
    ),
    Rule(
        id="MFSDP-HSDP-OUTER-WITHOUT-HSDP",
        severity="error",
        stage="runtime",
        topic="parallel",
        paths=("ddp.outer_dp_sharding_strategy", "ddp.num_distributed_optimizer_instances"),
        when=lambda e: (
            e.fsdp
            and e.get("ddp.outer_dp_sharding_strategy") != "no_shard"
            and not int_gt(e.get("ddp.num_distributed_optimizer_instances"), 1)
        ),
        message=lambda e: (
            f"{kv(e, 'ddp.outer_dp_sharding_strategy')} with "
            f"{kv(e, 'ddp.num_distributed_optimizer_instances')}: hybrid FSDP is off, so the outer "
            "strategy has no group to shard over."
        ),
        fix="ddp.outer_dp_sharding_strategy=no_shard (or num_distributed_optimizer_instances > 1 for HSDP)",
        source="megatron/bridge/perf_recipes/nemotronh/common.py: _apply_nemotron_3_ultra_fsdp_hsdp "
        "'the first param all-gather hits a None HSDP helper buffer'; "
        "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py: "
        "'enable_hsdp = self.ddp_config.num_distributed_optimizer_instances > 1'",
    ),
    Rule(
        id="MFSDP-DEFER-EMBEDDING-WGRAD",
        severity="warning",
        stage="advice",
        topic="parallel",
        paths=("comm_overlap.defer_embedding_wgrad_compute",),
        when=lambda e: e.fsdp and comm_overlap_on(e, "defer_embedding_wgrad_compute"),
        message=lambda e: (
            "comm_overlap.defer_embedding_wgrad_compute=true: Bridge's performance harness turns it off for Megatron FSDP."
        ),
        fix="comm_overlap.defer_embedding_wgrad_compute=false",
        source=f"{S.B_CO}: CommOverlapConfig.defer_embedding_wgrad_compute; {GITHUB_ONLY} "
        "scripts/performance/utils/overrides.py: _set_megatron_fsdp_overrides: 'Disabling deferring embedding "
        "wgrad compute because it cannot work with FSDP together.'",
    ),
    Rule(
        id="MFSDP-WORLD-LAYOUT",
        severity="error",
        stage="validate",
        topic="parallel",
        paths=(
            "model.tensor_model_parallel_size",
            "model.pipeline_model_parallel_size",
            "model.context_parallel_size",
            "model.expert_model_parallel_size",
            "model.expert_tensor_parallel_size",
        ),
        when=lambda e: world_problem(e) is not None,
        message=_world_message,
        fix=_world_fix,
        source=f"{S.B_CFG}: ConfigContainer.get_data_parallel_size (line 1024): assert "
        "'is not divisible by total_model_size'; megatron/core/parallel_state.py: initialize_model_parallel "
        "(line 881): RuntimeError 'is not divisible by expert_tensor_model_pipeline_parallel size'",
    ),
    Rule(
        id="MFSDP-TRAIN-BATCH-DP",
        severity="error",
        stage="runtime",
        topic="parallel",
        paths=("train.global_batch_size", "train.micro_batch_size", "train.decrease_batch_size_if_needed"),
        when=lambda e: train_batch_problem(e) is not None,
        message=_train_batch_message,
        fix=_train_batch_fix,
        source="megatron/core/num_microbatches_calculator.py: ConstantNumMicroBatchesCalculator.__init__ (lines "
        "381, 391): assert 'is not divisible by micro batch size', 'number of microbatches should be at least 1'; "
        "megatron/bridge/training/initialize.py: init_num_microbatches_calculator (line 115, with "
        "cfg.data_parallel_size, when training starts)",
    ),
    Rule(
        id="MFSDP-EVAL-BATCH-DP",
        severity="error",
        stage="validate",
        topic="parallel",
        paths=(
            "validation.eval_global_batch_size",
            "validation.eval_micro_batch_size",
            "train.global_batch_size",
            "dist.eval_context_parallel_size",
        ),
        when=lambda e: eval_batch_problem(e) is not None,
        message=_eval_batch_message,
        fix=_eval_batch_fix,
        source=f"{S.B_CFG}: ConfigContainer.validate (line 1335): assert "
        "'eval_micro_batch_size * eval_data_parallel_size' (eval_global_batch_size must be divisible by it)",
    ),
]
