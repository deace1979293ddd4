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
    fmt,
    int_gt,
    kv,
    pp_size,
)
from .model import Rule

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
]
