"""Activation memory rules: recomputation and CPU / fine-grained activation offloading.

One ``Rule`` per constraint; the fields are explained in ``rules/model.py``.
"""

from __future__ import annotations

from .. import schema as S
from .context import as_int, bad_offload_layers, fmt, int_gt, kv
from .model import Rule

RULES: list[Rule] = [
    Rule(
        id="MFSDP-RECOMPUTE-FULL-METHOD",
        severity="error",
        stage="validate",
        topic="activations",
        paths=("model.recompute_method", "model.recompute_granularity"),
        when=lambda e: e.get("model.recompute_granularity") == "full" and e.get("model.recompute_method") is None,
        message=lambda e: "model.recompute_granularity=full with model.recompute_method=null.",
        fix="model.recompute_method=uniform (or block; with model.recompute_num_layers)",
        source=f'{S.MC_TC}: TransformerConfig.__post_init__: ValueError \'recompute_method must be "block" or "uniform"\'',
    ),
    Rule(
        id="MFSDP-RECOMPUTE-FULL-NUM-LAYERS",
        severity="error",
        stage="validate",
        topic="activations",
        paths=("model.recompute_num_layers", "model.recompute_granularity"),
        when=lambda e: e.get("model.recompute_granularity") == "full" and e.get("model.recompute_num_layers") is None,
        message=lambda e: "model.recompute_granularity=full with model.recompute_num_layers=null.",
        fix="model.recompute_num_layers=1 (between 1 and the layers per pipeline rank)",
        source=f"{S.MC_TC}: TransformerConfig.__post_init__: ValueError 'recompute_num_layers must be between "
        "1 and num_layers_per_pipeline_rank'",
    ),
    Rule(
        id="MFSDP-RECOMPUTE-SELECTIVE-NUM-LAYERS",
        severity="error",
        stage="validate",
        topic="activations",
        paths=("model.recompute_num_layers", "model.recompute_granularity"),
        when=lambda e: (
            e.get("model.recompute_granularity") == "selective" and e.get("model.recompute_num_layers") is not None
        ),
        message=lambda e: f"model.recompute_granularity=selective with {kv(e, 'model.recompute_num_layers')}.",
        fix="model.recompute_num_layers=null",
        source=f"{S.MC_TC}: TransformerConfig.__post_init__: ValueError 'recompute_num_layers must be None.'",
    ),
    Rule(
        id="MFSDP-CPU-OFFLOAD-PP",
        severity="error",
        stage="validate",
        topic="activations",
        paths=("model.cpu_offloading", "model.pipeline_model_parallel_size"),
        when=lambda e: bool(e.get("model.cpu_offloading")) and int_gt(e.get("model.pipeline_model_parallel_size"), 1),
        message=lambda e: f"model.cpu_offloading=true with {kv(e, 'model.pipeline_model_parallel_size')}.",
        fix="model.pipeline_model_parallel_size=1 (or model.cpu_offloading=false)",
        source=f"{S.MC_TC}: TransformerConfig.__post_init__ (run by model.finalize): ValueError 'Currently there is "
        "no support for Pipeline parallelism with CPU offloading'",
    ),
    Rule(
        id="MFSDP-CPU-OFFLOAD-RECOMPUTE",
        severity="error",
        stage="validate",
        topic="activations",
        paths=("model.recompute_granularity", "model.cpu_offloading"),
        when=lambda e: bool(e.get("model.cpu_offloading")) and e.get("model.recompute_granularity") is not None,
        message=lambda e: f"model.cpu_offloading=true with {kv(e, 'model.recompute_granularity')}.",
        fix="model.recompute_granularity=null (or model.cpu_offloading=false)",
        source=f"{S.MC_TC}: TransformerConfig.__post_init__: ValueError 'CPU offloading does not work when "
        "activation recomputation is enabled'",
    ),
    Rule(
        id="MFSDP-CPU-OFFLOAD-LAYERS",
        severity="error",
        stage="validate",
        topic="activations",
        paths=("model.cpu_offloading_num_layers", "model.num_layers"),
        when=lambda e: bool(e.get("model.cpu_offloading")) and bad_offload_layers(e),
        message=lambda e: (
            f"{kv(e, 'model.cpu_offloading_num_layers')} must be >= 0 and < "
            f"model.num_layers={fmt(e.get('model.num_layers'))}."
        ),
        fix=lambda e: f"model.cpu_offloading_num_layers={max(0, as_int(e.get('model.num_layers'), 1) - 1)}",
        source=f"{S.MC_TC}: TransformerConfig.__post_init__: ValueError 'CPU offloading can be done only for layers "
        "less than {num_layers}'",
    ),
    Rule(
        id="MFSDP-CPU-OFFLOAD-FINE-GRAINED",
        severity="error",
        stage="validate",
        topic="activations",
        paths=("model.fine_grained_activation_offloading", "model.cpu_offloading"),
        when=lambda e: bool(e.get("model.cpu_offloading")) and bool(e.get("model.fine_grained_activation_offloading")),
        message=lambda e: "model.cpu_offloading=true together with model.fine_grained_activation_offloading=true.",
        fix="choose one: model.fine_grained_activation_offloading=false or model.cpu_offloading=false",
        source=f"{S.MC_TC}: TransformerConfig.__post_init__: assert 'fine_grained_activation_offloading cannot be "
        "enabled with cpu_offloading.'",
    ),
    Rule(
        id="MFSDP-FINE-GRAINED-OFFLOAD-MODULES",
        severity="error",
        stage="validate",
        topic="activations",
        paths=("model.offload_modules", "model.fine_grained_activation_offloading"),
        when=lambda e: bool(e.get("model.fine_grained_activation_offloading")) and not e.get("model.offload_modules"),
        message=lambda e: (
            f"model.fine_grained_activation_offloading=true with {kv(e, 'model.offload_modules')}: nothing to offload."
        ),
        fix="model.offload_modules=[core_attn,attn_proj] (or model.fine_grained_activation_offloading=false)",
        source=f"{S.MC_TC}: TransformerConfig.__post_init__: "
        "'assert self.offload_modules is not None and len(self.offload_modules) > 0'",
    ),
    Rule(
        id="MFSDP-FINE-GRAINED-OFFLOAD-IMPL",
        severity="error",
        stage="validate",
        topic="activations",
        paths=("model.transformer_impl", "model.fine_grained_activation_offloading"),
        when=lambda e: (
            bool(e.get("model.fine_grained_activation_offloading"))
            and e.get("model.transformer_impl") != "transformer_engine"
        ),
        message=lambda e: f"fine-grained activation offloading with {kv(e, 'model.transformer_impl')}.",
        fix="model.transformer_impl=transformer_engine",
        source=f"{S.B_CFG}: _validate_fine_grained_activation_offloading: ValueError 'Fine-grained activation "
        "offloading is only supported with transformer_engine implementation.'",
    ),
]
