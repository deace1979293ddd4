"""Mixed precision and FP8 rules: consistent bf16/fp16 flags, precision-aware optimizer, MXFP8 buffers.

One ``Rule`` per constraint; the fields are explained in ``rules/model.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

from .. import schema as S
from .context import SRC_FSDP_CFG, SRC_VALIDATE, kv, raw_get
from .model import Rule

# Config fields typed ``torch.dtype`` whose dataclass default is None (the pinned sources, each
# ``Optional[torch.dtype] = None`` or ``torch.dtype = None``). Bridge's override path turns a string
# into a dtype only when the field already holds one (megatron/bridge/training/utils/omegaconf_utils.py
# :: _apply_overrides, 'if isinstance(current_attr, torch.dtype) and isinstance(value, str)'), and
# ``ConfigContainer.from_yaml`` never does, so a string written into one of these fields reaches the
# code that uses it as a string. tests/rules/test_dtype_fields.py reads the pinned wheels and fails
# when a field of this class is missing here or in DTYPE_NONE_SKIPPED.
# Megatron FSDP's own dtype fields: the string reaches its MixedPrecisionPolicy
# (megatron/core/distributed/fsdp/mcore_fsdp_adapter.py :: FullyShardedDataParallel.__init__) and fails
# at the model wrap (main grads: 'group.grad_dtype.is_floating_point' in ParamAndGradBuffer.
# _init_each_parameter_group_buffers, AttributeError on str) or at the first gradient reduction
# (grad comm: a buffer allocated with dtype=str in GradReducePipeline._bucket_group_gradient_reduce).
# Each field maps to where the string fails.
FSDP_DTYPE_NONE_FIELDS: dict[str, str] = {
    "ddp.megatron_fsdp_main_grads_dtype": "Megatron FSDP's mixed-precision policy, and the model wrap fails "
    "(AttributeError: 'str' object has no attribute 'is_floating_point')",
    "ddp.megatron_fsdp_grad_comm_dtype": "Megatron FSDP's mixed-precision policy, and the first buffer "
    "allocated in it fails (at the model wrap with double buffering or HSDP, else at the first gradient "
    "reduce-scatter)",
}
# The other fields of the class: a string is kept and fails where the field is used.
OTHER_DTYPE_NONE_FIELDS: dict[str, str] = {
    "model.autocast_dtype": "the model config as a string",
    "model.pipeline_dtype": "the model config as a string",
    "model.mamba_training_ssm_states_dtype": "the model config as a string",
    "peft.lora_dtype": "the LoRA adapters' weight allocation as a string",
}
# Fields of the class the rule leaves alone, with the reason.
DTYPE_NONE_SKIPPED: dict[str, str] = {
    "mixed_precision.params_dtype": "every preset Bridge registers fills it (megatron/bridge/training/"
    "mixed_precision.py :: bf16_mixed ...), so an override reaches a dtype and is converted",
    "mixed_precision.pipeline_dtype": "filled by the presets, as params_dtype",
    "mixed_precision.autocast_dtype": "filled by the presets, as params_dtype",
}
# The torch name of each dtype spelling Bridge's str_to_dtype accepts (megatron/bridge/utils/
# activation_map.py :: DTYPE_MAP), for the fix text.
_TORCH_DTYPE = {
    **dict.fromkeys(("fp32", "float32", "32", "32-true"), "torch.float32"),
    **dict.fromkeys(("fp16", "float16", "16", "16-mixed"), "torch.float16"),
    **dict.fromkeys(("bf16", "bfloat16", "bf16-mixed"), "torch.bfloat16"),
    **dict.fromkeys(("fp8", "float8_e4m3fn"), "torch.float8_e4m3fn"),
    "float8_e5m2": "torch.float8_e5m2",
}


def torch_dtype_name(value: object) -> str:
    """``'fp32'`` -> ``'torch.float32'``; an unknown spelling gives ``torch.float32`` as the example."""
    name = str(value).strip().lower()
    return _TORCH_DTYPE.get(name.removeprefix("torch."), "torch.float32")


def dtype_fix(path: str, value: object) -> str:
    """The override that sets a real dtype. Bridge instantiates ``{_target_: torch.X, _call_: false}`` to
    ``torch.X`` (omegaconf_utils.py :: _apply_overrides, its ``_target_`` branch; megatron/training/config/
    instantiate_utils.py :: instantiate_node returns the target itself when ``_call_`` is false), the form
    Bridge's own YAML dumper writes for a dtype (megatron/training/config/yaml_utils.py ::
    _torch_dtype_representer), so it works on Bridge's command line (Hydra), in a YAML file and in a
    run_config.yaml alike."""
    name = torch_dtype_name(value)
    return (
        f"'{path}={{_target_:{name},_call_:false}}' (YAML: {path.split('.', 1)[1]}: "
        f"{{_target_: {name}, _call_: false}}; Python: {name})"
    )


def _string_dtypes(e, fields: Mapping[str, str]) -> list[tuple[str, str, str]]:
    out = []
    for path in fields:
        if path.startswith("model.") and e.mp is not None:
            continue  # MixedPrecisionConfig.setup overwrites model.*_dtype from the preset or mapping
        value = raw_get(e.cfg, path)
        if isinstance(value, str):
            out.append(
                (
                    path,
                    f"{path}={value!r} is a string on a dtype field whose default is None: Bridge converts a "
                    f"string to a dtype only when the field already holds one, so the string reaches {fields[path]}.",
                    dtype_fix(path, value),
                )
            )
    return out


RULES: list[Rule] = [
    Rule(
        id="MFSDP-DTYPE-STRING",
        severity="error",
        stage="runtime",
        topic="precision",
        paths=tuple(FSDP_DTYPE_NONE_FIELDS),
        when=lambda e: _string_dtypes(e, FSDP_DTYPE_NONE_FIELDS) if e.fsdp else [],
        message=None,
        fix=None,
        source="megatron/bridge/training/utils/omegaconf_utils.py: _apply_overrides: 'if "
        "isinstance(current_attr, torch.dtype) and isinstance(value, str):' (defaults None: "
        f"{S.MC_DDP}: megatron_fsdp_main_grads_dtype / megatron_fsdp_grad_comm_dtype); "
        "megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py: "
        "ParamAndGradBuffer._init_each_parameter_group_buffers: assert group.grad_dtype.is_floating_point",
    ),
    Rule(
        id="MFSDP-DTYPE-STRING-OTHER",
        severity="warning",
        stage="input",
        topic="precision",
        paths=tuple(OTHER_DTYPE_NONE_FIELDS),
        when=lambda e: _string_dtypes(e, OTHER_DTYPE_NONE_FIELDS),
        message=None,
        fix=None,
        source="megatron/bridge/training/utils/omegaconf_utils.py: _apply_overrides: 'if "
        "isinstance(current_attr, torch.dtype) and isinstance(value, str):' (defaults None: "
        f"{S.MC_MP}: 'autocast_dtype: Optional[torch.dtype] = None', 'pipeline_dtype: torch.dtype = None'; "
        f"{S.MC_TC}: 'mamba_training_ssm_states_dtype: Optional[torch.dtype] = None'; "
        "megatron/bridge/peft/lora.py: 'lora_dtype: torch.dtype = None')",
    ),
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
        # Only optim_grads_params releases gathered weights, and the transpose cache with them; the other
        # strategies keep whole weights and never read the flag (megatron_fsdp.py :: _register_fsdp_hooks:
        # release_module_parameters on unit modules, and for non-unit modules 'not
        # self.ddp_config.keep_fp8_transpose_cache and self.data_parallel_sharding_strategy ==
        # "optim_grads_params"').
        when=lambda e: (
            e.fsdp
            and bool(e.get("ddp.keep_fp8_transpose_cache"))
            and e.get("ddp.data_parallel_sharding_strategy") == "optim_grads_params"
        ),
        message=lambda e: (
            "ddp.keep_fp8_transpose_cache=true keeps each FP8 parameter's transpose after use instead of "
            "discarding it: more memory, less recomputation (a speed setting, not a memory one; read only "
            "under optim_grads_params). The default false is what Bridge's FSDP perf recipes keep."
        ),
        fix="ddp.keep_fp8_transpose_cache=false when memory is short (else keep it and measure the step time)",
        source=f"{S.MC_DDP}: DistributedDataParallelConfig.keep_fp8_transpose_cache (default False); "
        "megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py: MegatronFSDP "
        "docstring 'It will use significantly more GPU memory but can improve performance.' and "
        "'if not self.ddp_config.keep_fp8_transpose_cache:' (release_params_fp8_transpose_cache after "
        "use, on the optim_grads_params release paths only); megatron/bridge/perf_recipes/nemotronh/common.py: _apply_nemotron_3_ultra_fsdp_hsdp "
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
