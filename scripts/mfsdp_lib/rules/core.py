"""Core Megatron FSDP rules: the enabling flags, sharding strategy, DDP buffers, what Bridge rewrites.

One ``Rule`` per constraint; the fields are explained in ``rules/model.py``.
"""

from __future__ import annotations

from .. import schema as S
from .context import (
    SRC_FSDP_CFG,
    SRC_MFSDP_BUF,
    SRC_VALIDATE,
    bad_enums,
    closest,
    fmt,
    int_gt,
    kv,
)
from .model import Rule


def overlap_grad_reduce_at_wrap(e) -> bool:
    """``ddp.overlap_grad_reduce`` as Megatron-Core's wrapper reads it, before Megatron FSDP forces it on.

    A ``comm_overlap`` section decides it when the distributed optimizer is already set in ``ddp``
    (megatron/bridge/training/comm_overlap.py :: CommOverlapConfig.setup, _get_optimizer_overlap_cfgs): its
    own value when given, else on (at DP > 1, the only size where sharding matters). Otherwise the ddp value.
    """
    co = e.cfg.get("comm_overlap")
    if isinstance(co, dict) and bool(e.get("ddp.use_distributed_optimizer")):
        own = co.get("overlap_grad_reduce")
        return True if own is None else bool(own)
    return bool(e.get("ddp.overlap_grad_reduce"))


# Strategies without FSDP units: every parameter is bucketed by ddp.bucket_size alone (mcore_fsdp_adapter.py
# :: FullyShardedDataParallel.__init__ gives unit modules to optim_grads_params only).
UNITLESS_STRATEGIES = ("optim", "optim_grads")

RULES: list[Rule] = [
    Rule(
        id="MFSDP-FSDP2-EXCLUSIVE",
        severity="error",
        stage="validate",
        topic="core",
        paths=("dist.use_torch_fsdp2", "dist.use_megatron_fsdp"),
        when=lambda e: bool(e.get("dist.use_megatron_fsdp")) and bool(e.get("dist.use_torch_fsdp2")),
        message=lambda e: "dist.use_megatron_fsdp=true and dist.use_torch_fsdp2=true: Bridge allows only one FSDP.",
        fix="dist.use_torch_fsdp2=false",
        source=f"{SRC_VALIDATE}: ValueError 'use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive.'",
    ),
    Rule(
        id="MFSDP-MANUAL-REG-NEEDS-NCCL-UB",
        severity="error",
        stage="validate",
        topic="core",
        paths=("ddp.fsdp_manual_registration", "ddp.nccl_ub"),
        when=lambda e: e.fsdp and not e.get("ddp.nccl_ub") and bool(e.get("ddp.fsdp_manual_registration")),
        message=lambda e: "ddp.fsdp_manual_registration=true without ddp.nccl_ub=true.",
        fix="ddp.fsdp_manual_registration=false (or ddp.nccl_ub=true)",
        source=f"{SRC_FSDP_CFG}: assert 'DDP.fsdp_manual_registration requires DDP.nccl_ub!'",
    ),
    Rule(
        id="MFSDP-WEIGHT-HASH",
        severity="error",
        stage="validate",
        topic="core",
        paths=("train.check_weight_hash_across_dp_replicas_interval", "ddp.data_parallel_sharding_strategy"),
        when=lambda e: (
            e.fsdp
            and e.get("ddp.data_parallel_sharding_strategy") == "optim_grads_params"
            and e.get("train.check_weight_hash_across_dp_replicas_interval") is not None
        ),
        message=lambda e: (
            f"{kv(e, 'train.check_weight_hash_across_dp_replicas_interval')} with sharding "
            "optim_grads_params: weights are sharded, there are no replicas to hash."
        ),
        fix="train.check_weight_hash_across_dp_replicas_interval=null",
        source=f"{SRC_FSDP_CFG}: assert 'TrainingConfig.check_weight_hash_across_dp_replicas_interval is not supported "
        "with the Megatron-FSDP optim_grads_params sharding strategy'",
    ),
    Rule(
        id="MFSDP-DDP-BUCKETS",
        severity="error",
        stage="validate",
        topic="core",
        paths=("ddp.num_buckets", "ddp.bucket_size"),
        when=lambda e: (
            e.get("ddp.num_buckets") is not None
            and (e.get("ddp.bucket_size") is not None or not int_gt(e.get("ddp.num_buckets"), 0))
        ),
        message=lambda e: (
            f"{kv(e, 'ddp.num_buckets')} with {kv(e, 'ddp.bucket_size')}: set one of them, and num_buckets must be > 0."
        ),
        fix="ddp.bucket_size=null (or ddp.num_buckets=null)",
        source=f"{S.MC_DDP}: DistributedDataParallelConfig.__post_init__: assert 'Cannot specify both num_buckets "
        "and bucket_size' / 'num_buckets must be greater than 0'",
    ),
    Rule(
        id="MFSDP-ENUM",
        severity="error",
        stage="input",
        topic="core",
        paths=("ddp.data_parallel_sharding_strategy",),
        when=lambda e: [
            (
                p,
                f"{p}={fmt(v)} is not one of {', '.join(c)}; Bridge stores it without checking and the "
                "job fails later (or silently does something else).",
                f"{p}={closest(v, c)}",
            )
            for p, v, c in bad_enums(e)
        ],
        message=None,
        fix=None,
        source=f"{S.MC_DDP}: DistributedDataParallelConfig.data_parallel_sharding_strategy docstring "
        "\"Valid values are 'no_shard', 'optim', 'optim_grads', 'optim_grads_params'.\"; Literal types in "
        f"{S.MT_TRAIN} and {S.MC_TC} (Bridge stores any string without checking)",
    ),
    Rule(
        id="MFSDP-OVERLAP-OFF-ONE-BUCKET",
        severity="warning",
        stage="advice",
        topic="core",
        paths=("ddp.overlap_grad_reduce", "ddp.data_parallel_sharding_strategy"),
        when=lambda e: (
            e.fsdp
            and e.get("ddp.data_parallel_sharding_strategy") in UNITLESS_STRATEGIES
            and not overlap_grad_reduce_at_wrap(e)
        ),
        message=lambda e: (
            f"ddp.overlap_grad_reduce is off when the model is wrapped: Bridge's wrapper then sets "
            f"bucket_size=None, and {kv(e, 'ddp.data_parallel_sharding_strategy')} (no FSDP units) holds every "
            "gradient in one bucket"
            + (
                ": each micro-batch's reduce-scatter waits for the whole backward and allocates an unsharded "
                "copy of all gradients"
                if e.get("ddp.data_parallel_sharding_strategy") == "optim_grads"
                else ": its reduce-scatter cannot start before the whole last backward has finished"
            )
            + ". Megatron FSDP forces the flag on only afterwards."
        ),
        fix="ddp.overlap_grad_reduce=true",
        source="megatron/training/models/dist_utils.py: _ddp_wrap: '# Set bucket_size to infinity if "
        "overlap_grad_reduce is False.'; megatron/core/distributed/fsdp/mcore_fsdp_adapter.py: "
        "FullyShardedDataParallel.__init__ (unit modules only for 'optim_grads_params'); "
        "megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py: MegatronFSDP.__init__ "
        "'# Default to overlapped gradient reduce-scatter when sharding gradients.'",
    ),
    Rule(
        id="MFSDP-FSDP2-DDP-FLAG",
        severity="error",
        stage="runtime",
        topic="core",
        paths=("dist.use_torch_fsdp2", "ddp.use_megatron_fsdp"),
        when=lambda e: (
            not e.get("dist.use_megatron_fsdp")
            and bool(e.get("ddp.use_megatron_fsdp"))
            and bool(e.get("dist.use_torch_fsdp2"))
        ),
        message=lambda e: (
            "ddp.use_megatron_fsdp=true with dist.use_torch_fsdp2=true: Bridge's exclusivity check reads "
            "only dist.use_megatron_fsdp, then turns it on; wrapping the model then fails."
        ),
        fix="dist.use_torch_fsdp2=false and dist.use_megatron_fsdp=true",
        source="megatron/training/models/dist_utils.py: _ddp_wrap: ValueError 'Using use_megatron_fsdp and "
        f"use_torch_fsdp2 at the same time is not supported.'; {SRC_VALIDATE} checks only dist.use_megatron_fsdp "
        "before _validate_and_apply_megatron_fsdp_configs sets it",
    ),
    Rule(
        id="MFSDP-NO-SHARD-META-INIT",
        severity="error",
        stage="runtime",
        topic="core",
        paths=("model.init_model_with_meta_device", "ddp.data_parallel_sharding_strategy"),
        when=lambda e: (
            e.fsdp
            and e.get("ddp.data_parallel_sharding_strategy") == "no_shard"
            and bool(e.get("model.init_model_with_meta_device"))
        ),
        message=lambda e: (
            "model.init_model_with_meta_device=true with data_parallel_sharding_strategy=no_shard: nothing is "
            "sharded, so nothing is materialised from the meta device; the wrap fails copying meta tensors "
            "('Cannot copy out of meta tensor')."
        ),
        fix="model.init_model_with_meta_device=false (or a sharding strategy other than no_shard)",
        source=f"{SRC_MFSDP_BUF}: DataParallelBuffer.set_item (line 1591): 'shard.data.copy_(item_data.flatten())' "
        "(NotImplementedError from PyTorch on a meta tensor); "
        "megatron/core/distributed/fsdp/src/megatron_fsdp/fully_shard.py: fully_shard (line 364): ValueError "
        "'Meta device initialization (init_model_with_meta_device=True) is not supported or necessary' "
        "(its own entry point refuses the pair; Bridge has no such check)",
    ),
    Rule(
        id="MFSDP-FSDP2-EXPERIMENTAL",
        severity="warning",
        stage="runtime",
        topic="core",
        paths=("dist.use_torch_fsdp2",),
        when=lambda e: bool(e.get("dist.use_torch_fsdp2")) and not e.fsdp,
        message=lambda e: (
            "dist.use_torch_fsdp2=true: PyTorch FSDP2 is not in a stable release stage in Megatron; "
            "validate() accepts it, problems show only once the job runs. This skill covers Megatron FSDP."
        ),
        fix="dist.use_torch_fsdp2=false, then mfsdp.py enable",
        source=f"{S.MT_COMMON}: DistributedInitConfig.use_torch_fsdp2 docstring 'It is still not in a stable release "
        "stage, and may therefore contain bugs or other potential issues.'",
    ),
    Rule(
        id="MFSDP-AVG-IN-COLLECTIVE",
        severity="warning",
        stage="rewrite",
        topic="core",
        paths=("ddp.average_in_collective", "ddp.disable_symmetric_registration"),
        when=lambda e: (
            e.fsdp and bool(e.get("ddp.average_in_collective")) and not e.get("ddp.disable_symmetric_registration")
        ),
        message=lambda e: (
            "ddp.average_in_collective=true: Bridge turns it off for Megatron FSDP (NCCL symmetric registration)."
        ),
        fix="ddp.average_in_collective=false",
        source=f"{SRC_FSDP_CFG}: 'average_in_collective not supported with NCCL symmetric registration. Deactivating...'",
    ),
    Rule(
        id="MFSDP-NO-SHARD",
        severity="warning",
        stage="advice",
        topic="core",
        paths=("ddp.data_parallel_sharding_strategy",),
        when=lambda e: e.fsdp and e.get("ddp.data_parallel_sharding_strategy") == "no_shard",
        message=lambda e: (
            "Megatron FSDP with data_parallel_sharding_strategy=no_shard shards nothing (no memory saving)."
        ),
        fix="ddp.data_parallel_sharding_strategy=optim_grads_params",
        source=f"{S.MC_DDP}: DistributedDataParallelConfig.data_parallel_sharding_strategy (default 'no_shard')",
    ),
    Rule(
        id="MFSDP-SHARDING-WITHOUT-FSDP",
        severity="info",
        stage="advice",
        topic="core",
        paths=("ddp.data_parallel_sharding_strategy", "ddp.use_megatron_fsdp"),
        when=lambda e: not e.fsdp and e.get("ddp.data_parallel_sharding_strategy") not in ("no_shard", None),
        message=lambda e: (
            f"{kv(e, 'ddp.data_parallel_sharding_strategy')} has no effect while Megatron FSDP is off "
            "(only Megatron FSDP reads it; Bridge's common recipes set it ahead of enabling FSDP)."
        ),
        # Not the two use_megatron_fsdp flags alone: validate() then refuses the checkpoint format (MFSDP-CKPT-FORMAT,
        # 'Megatron-FSDP requires the fsdp_dtensor checkpointing format!') and a PP > 1 layout fails at wrap
        # (MFSDP-PIPELINE-PARALLEL). enable sets all five settings and stops where a decision is the user's.
        fix="'mfsdp.py enable' (all five Megatron FSDP settings, ckpt_format included), or "
        "ddp.data_parallel_sharding_strategy=no_shard",
        source=f"{S.B_CFG}: ConfigContainer._validate_and_apply_megatron_fsdp_configs and "
        "megatron/core/optimizer/__init__.py: 'if ddp_config.use_megatron_fsdp:' (the only readers, "
        "with megatron_fsdp itself)",
    ),
    Rule(
        id="MFSDP-CUSTOM-FSDP-DEPRECATED",
        severity="warning",
        stage="advice",
        topic="core",
        paths=("ddp.use_custom_fsdp",),
        when=lambda e: bool(e.get("ddp.use_custom_fsdp")),
        message=lambda e: "ddp.use_custom_fsdp=true is deprecated and ignored by Bridge's checks.",
        fix="ddp.use_custom_fsdp=false, ddp.use_megatron_fsdp=true, dist.use_megatron_fsdp=true",
        source=f"{S.MC_DDP}: DistributedDataParallelConfig.use_custom_fsdp docstring 'The flag `use_custom_fsdp` is "
        "deprecated and will be removed in future versions.'",
    ),
    Rule(
        id="MFSDP-FLAGS-SYNC",
        severity="info",
        stage="rewrite",
        topic="core",
        paths=("dist.use_megatron_fsdp", "ddp.use_megatron_fsdp"),
        when=lambda e: bool(e.get("dist.use_megatron_fsdp")) != bool(e.get("ddp.use_megatron_fsdp")),
        message=lambda e: (
            f"dist.use_megatron_fsdp={fmt(e.get('dist.use_megatron_fsdp'))} and ddp.use_megatron_fsdp="
            f"{fmt(e.get('ddp.use_megatron_fsdp'))} differ; Bridge turns both on."
        ),
        fix="dist.use_megatron_fsdp=true ddp.use_megatron_fsdp=true",
        source=f"{SRC_FSDP_CFG}: 'self.dist.use_megatron_fsdp = True' / 'self.ddp.use_megatron_fsdp = True'",
    ),
    Rule(
        id="MFSDP-DIST-OPT-FORCED",
        severity="info",
        stage="rewrite",
        topic="core",
        paths=("ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"),
        when=lambda e: (
            e.fsdp and not (e.get("ddp.use_distributed_optimizer") and e.get("optimizer.use_distributed_optimizer"))
        ),
        message=lambda e: (
            f"{kv(e, 'ddp.use_distributed_optimizer')}, {kv(e, 'optimizer.use_distributed_optimizer')}: "
            "Megatron FSDP always uses the distributed optimizer; Bridge turns both on."
        ),
        fix="ddp.use_distributed_optimizer=true optimizer.use_distributed_optimizer=true",
        source=f"{SRC_FSDP_CFG}: 'use_distributed_optimizer=True is required for Megatron-FSDP. Activating...'",
    ),
    Rule(
        id="MFSDP-DECOUPLED-GRAD",
        severity="info",
        stage="rewrite",
        topic="core",
        paths=("ddp.megatron_fsdp_use_decoupled_grad",),
        when=lambda e: (
            e.fsdp
            and bool(e.get("optimizer.use_precision_aware_optimizer"))
            and not e.get("ddp.megatron_fsdp_use_decoupled_grad")
        ),
        message=lambda e: (
            "optimizer.use_precision_aware_optimizer=true: Bridge sets ddp.megatron_fsdp_use_decoupled_grad=true "
            "(gradients in param.decoupled_grad)."
        ),
        fix="ddp.megatron_fsdp_use_decoupled_grad=true",
        source=f"{SRC_FSDP_CFG}: 'Megatron-FSDP installs gradients in `param.decoupled_grad` when using FusedAdam.'",
    ),
    Rule(
        id="MFSDP-NCCL-UB-MANUAL-REG",
        severity="info",
        stage="rewrite",
        topic="core",
        paths=("ddp.fsdp_manual_registration", "ddp.nccl_ub"),
        when=lambda e: e.fsdp and bool(e.get("ddp.nccl_ub")) and not e.get("ddp.fsdp_manual_registration"),
        message=lambda e: (
            "ddp.nccl_ub=true: Bridge sets ddp.fsdp_manual_registration=true (registration is slow otherwise)."
        ),
        fix="ddp.fsdp_manual_registration=true",
        source=f"{SRC_FSDP_CFG}: '# Without manual registration, UBR is really slow.'",
    ),
    Rule(
        id="MFSDP-NCCL-UB-DOUBLE-BUFFER",
        severity="info",
        stage="rewrite",
        topic="core",
        paths=("ddp.fsdp_double_buffer", "ddp.nccl_ub"),
        when=lambda e: (
            e.fsdp
            and bool(e.get("ddp.nccl_ub"))
            and not e.get("ddp.fsdp_double_buffer")
            and not e.get("ddp.megatron_fsdp_max_pool_double_buffer")
        ),
        message=lambda e: (
            "ddp.nccl_ub=true: Megatron FSDP turns ddp.fsdp_double_buffer on (user-buffer registration needs "
            "persistent buffers), which costs memory the estimate should include."
        ),
        fix="ddp.fsdp_double_buffer=true",
        source=f"{SRC_MFSDP_BUF}: ParamAndGradBuffer.__init__ '# Since the user buffer registration requires (non-dynamic) "
        "persistent memory,' then 'self.ddp_config.fsdp_double_buffer = True'",
    ),
    Rule(
        id="MFSDP-META-DEVICE-INIT",
        severity="info",
        stage="advice",
        topic="core",
        paths=("model.init_model_with_meta_device",),
        # Only where meta-device init works: a sharding strategy other than no_shard (under no_shard Megatron FSDP
        # builds no model weight buffer, and only that buffer's set-up materialises meta parameters; the wrap
        # then fails: MFSDP-NO-SHARD-META-INIT) and no PEFT (its pre-wrap hook loads the base weights into the
        # meta model: MFSDP-PEFT-META-DEVICE). tests/rules/test_fix_closure.py applies this fix everywhere.
        when=lambda e: (
            e.fsdp
            and e.get("ddp.data_parallel_sharding_strategy") != "no_shard"
            and e.get("peft") is None
            and not e.get("model.init_model_with_meta_device")
        ),
        message=lambda e: (
            "model.init_model_with_meta_device=false: the full model is materialised on each GPU before sharding."
        ),
        fix="model.init_model_with_meta_device=true",
        source="megatron/bridge/perf_recipes/nemotronh/common.py: _apply_nemotron_3_ultra_fsdp_hsdp "
        "(cfg.model.init_model_with_meta_device = True); not under no_shard: "
        f"{SRC_MFSDP_BUF}: ParamAndGradBuffer._init_each_parameter_group_buffers (line 2645) "
        "'if data_parallel_sharding_strategy != \"no_shard\":' (the only model_weight_buffer), then (line 2880) "
        "'if self.reset_parameters_for_meta_device_init_module and p.is_meta:' runs only 'if wbuf:'",
    ),
]
