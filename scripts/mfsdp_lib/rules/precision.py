"""Mixed precision and FP8 rules: consistent bf16/fp16 flags, precision-aware optimizer, MXFP8 buffers.

One ``Rule`` per constraint; the fields are explained in ``rules/model.py``.
"""

from __future__ import annotations

from .. import schema as S
from .context import SRC_FSDP_CFG, SRC_VALIDATE, kv
from .model import Rule

RULES: list[Rule] = [
    Rule(
        id="MFSDP-MXFP8-REUSE-NEEDS-FP8-GATHER",
        severity="error",
        stage="validate",
        topic="precision",
        paths=("ddp.reuse_grad_buf_for_mxfp8_param_ag", "ddp.fp8_param_gather"),
        when=lambda e: bool(e.get("ddp.reuse_grad_buf_for_mxfp8_param_ag")) and not e.get("ddp.fp8_param_gather"),
        message=lambda e: (
            f"{kv(e, 'ddp.reuse_grad_buf_for_mxfp8_param_ag')} without fp8_param_gather "
            "(checked when the DDP config is finalized, before Megatron FSDP switches it off)."
        ),
        fix=lambda e: f"{e.origin('ddp.reuse_grad_buf_for_mxfp8_param_ag')}=false",
        source=f"{S.MC_DDP}: DistributedDataParallelConfig.__post_init__ (run by the Bridge ddp.finalize): "
        "assert 'Reuse grad buffer only when keeping params in MXFP8.'",
    ),
    Rule(
        id="MFSDP-MXFP8-REUSE-NON-FSDP",
        severity="error",
        stage="validate",
        topic="precision",
        paths=("mixed_precision.reuse_grad_buf_for_mxfp8_param_ag", "dist.use_megatron_fsdp"),
        when=lambda e: (
            not e.fsdp
            and e.mp is not None
            and bool(e.mp.get("fp8_param_gather"))
            and e.mp.get("fp8_recipe") == "mxfp8"
            and not e.mp.get("reuse_grad_buf_for_mxfp8_param_ag")
        ),
        message=lambda e: (
            "Without Megatron FSDP, MXFP8 with fp8_param_gather needs reuse_grad_buf_for_mxfp8_param_ag=true."
        ),
        fix="mixed_precision.reuse_grad_buf_for_mxfp8_param_ag=true (or enable Megatron FSDP)",
        source=f"{SRC_VALIDATE}: assert \"When fp8_param_gather=True and fp8_recipe='mxfp8', "
        'reuse_grad_buf_for_mxfp8_param_ag must be set to True"',
    ),
    Rule(
        id="MFSDP-PRECISION-BOTH",
        severity="error",
        stage="validate",
        topic="precision",
        paths=("model.bf16", "model.fp16"),
        when=lambda e: (
            (bool(e.get("model.bf16")) and bool(e.get("model.fp16")))
            or (bool(e.get("optimizer.bf16")) and bool(e.get("optimizer.fp16")))
        ),
        message=lambda e: (
            f"bf16 and fp16 both on ({kv(e, 'model.bf16')}, {kv(e, 'model.fp16')}, "
            f"{kv(e, 'optimizer.bf16')}, {kv(e, 'optimizer.fp16')})."
        ),
        fix="mixed_precision=bf16_mixed (sets model and optimizer consistently)",
        source=f"{S.B_CFG}: _validate_mixed_precision_consistency: assert 'Model config cannot have both bf16=True "
        "and fp16=True.'",
    ),
    Rule(
        id="MFSDP-PRECISION-AWARE-MISMATCH",
        severity="error",
        stage="validate",
        topic="precision",
        paths=("optimizer.bf16", "optimizer.use_precision_aware_optimizer"),
        when=lambda e: (
            bool(e.get("optimizer.use_precision_aware_optimizer"))
            and (
                (bool(e.get("model.bf16")) and not e.get("optimizer.bf16"))
                or (bool(e.get("model.fp16")) and not e.get("optimizer.fp16"))
                or (
                    not e.get("model.bf16")
                    and not e.get("model.fp16")
                    and (bool(e.get("optimizer.bf16")) or bool(e.get("optimizer.fp16")))
                )
            )
        ),
        message=lambda e: (
            f"optimizer.use_precision_aware_optimizer=true with model precision ({kv(e, 'model.bf16')}, "
            f"{kv(e, 'model.fp16')}) different from the optimizer's ({kv(e, 'optimizer.bf16')}, "
            f"{kv(e, 'optimizer.fp16')})."
        ),
        fix="set optimizer.bf16/optimizer.fp16 equal to model.bf16/model.fp16 (a mixed_precision preset does it)",
        source=f"{S.B_CFG}: _validate_mixed_precision_consistency: assert 'optimizer.bf16=True must be set when "
        "model.bf16=True and use_precision_aware_optimizer=True.'",
    ),
    Rule(
        id="MFSDP-PRECISION-AWARE-NEEDS-DIST-OPT",
        severity="error",
        stage="validate",
        topic="precision",
        paths=("optimizer.use_distributed_optimizer", "optimizer.use_precision_aware_optimizer"),
        when=lambda e: (
            bool(e.get("optimizer.use_precision_aware_optimizer")) and not e.get("optimizer.use_distributed_optimizer")
        ),
        message=lambda e: (
            "optimizer.use_precision_aware_optimizer=true with optimizer.use_distributed_optimizer=false: "
            "checked when the optimizer config is finalized, before Megatron FSDP would turn it on."
        ),
        fix="optimizer.use_distributed_optimizer=true",
        source=f"{S.MC_OPT}: OptimizerConfig.__post_init__ (run by the Bridge optimizer.finalize): "
        "assert '--use-precision-aware-optimizer only supported with distributed optimizer'",
    ),
    Rule(
        id="MFSDP-PRECISION-AWARE-ADAM",
        severity="error",
        stage="validate",
        topic="precision",
        paths=("optimizer.optimizer", "optimizer.use_precision_aware_optimizer"),
        when=lambda e: (
            bool(e.get("optimizer.use_precision_aware_optimizer")) and e.get("optimizer.optimizer") != "adam"
        ),
        message=lambda e: f"optimizer.use_precision_aware_optimizer=true with {kv(e, 'optimizer.optimizer')}.",
        fix="optimizer.optimizer=adam (or optimizer.use_precision_aware_optimizer=false)",
        source=f"{S.MC_OPT}: OptimizerConfig.__post_init__: assert '--use-precision-aware-optimizer only supported with adam'",
    ),
    Rule(
        id="MFSDP-KEEP-FP8-TRANSPOSE-CACHE",
        severity="info",
        stage="advice",
        topic="precision",
        paths=("ddp.keep_fp8_transpose_cache",),
        when=lambda e: e.fsdp and bool(e.get("ddp.keep_fp8_transpose_cache")),
        message=lambda e: (
            "ddp.keep_fp8_transpose_cache=true keeps each FP8 parameter's transpose after use instead of "
            "discarding it: more memory, less recomputation (a speed setting, not a memory one). The default "
            "false is what Bridge's FSDP perf recipes keep."
        ),
        fix="ddp.keep_fp8_transpose_cache=false when memory is short (else keep it and measure the step time)",
        source=f"{S.MC_DDP}: DistributedDataParallelConfig.keep_fp8_transpose_cache (default False); "
        "megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py: MegatronFSDP "
        "docstring 'It will use significantly more GPU memory but can improve performance.' and "
        "'if not self.ddp_config.keep_fp8_transpose_cache:' (release_params_fp8_transpose_cache after "
        "use); megatron/bridge/perf_recipes/nemotronh/common.py: _apply_nemotron_3_ultra_fsdp_hsdp "
        "'cfg.ddp.keep_fp8_transpose_cache = False'",
    ),
    Rule(
        id="MFSDP-MXFP8-REUSE-OFF",
        severity="info",
        stage="rewrite",
        topic="precision",
        paths=("ddp.reuse_grad_buf_for_mxfp8_param_ag", "optimizer.reuse_grad_buf_for_mxfp8_param_ag"),
        when=lambda e: (
            e.fsdp
            and (
                bool(e.get("ddp.reuse_grad_buf_for_mxfp8_param_ag"))
                or bool(e.get("optimizer.reuse_grad_buf_for_mxfp8_param_ag"))
            )
        ),
        message=lambda e: (
            "reuse_grad_buf_for_mxfp8_param_ag is not implemented for Megatron FSDP; Bridge turns it off, "
            "but only after ddp.finalize(): without ddp.fp8_param_gather validation fails first "
            "(MFSDP-MXFP8-REUSE-NEEDS-FP8-GATHER)."
        ),
        fix=lambda e: f"{e.origin('ddp.reuse_grad_buf_for_mxfp8_param_ag')}=false",
        source=f"{SRC_FSDP_CFG}: 'reuse_grad_buf_for_mxfp8_param_ag not implemented for Megatron FSDP. Deactivating...'",
    ),
]
