"""Memory terms that do not depend on the sharding strategy: precision and activations.

``Precision`` holds the dtypes and switches that decide bytes per parameter;
``activation_bytes`` sizes a layer's saved tensors term by term (Korthikanti et al. 2022,
Table 2) for the model's attention, FFN and dropout settings, with pipeline in-flight
microbatches, recomputation, context parallelism and CPU offloading applied on top.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .common import (
    DEFAULT_MICRO_BATCH,
    FP32,
    ModelError,
    _bool,
    _first,
    _get,
    _int,
    dtype_bytes,
)
from .shapes import Shape

# --------------------------------------------------------------------------- precision settings


@dataclass(frozen=True)
class Precision:
    """The dtypes and switches that decide bytes per parameter, read from the config."""

    param_bytes: int = 2  # bf16 (model.bf16) / fp16; 4 when neither
    param_dtype: str = "bf16"
    ddp_grad_bytes: int = 4  # ddp.grad_reduce_in_fp32 (Megatron-Core DDP and distopt only)
    fsdp_grad_bytes: int = 2  # ddp.megatron_fsdp_main_grads_dtype, None = param dtype
    fsdp_main_bytes: int = 4  # ddp.megatron_fsdp_main_params_dtype, None = no main weights
    fsdp_comm_grad_bytes: int = 2  # ddp.megatron_fsdp_grad_comm_dtype, None = main grads dtype
    precision_aware: bool = False  # optimizer.use_precision_aware_optimizer
    master_bytes: int = 4  # optimizer.main_params_dtype (precision-aware only)
    exp_avg_bytes: int = 4  # optimizer.exp_avg_dtype (precision-aware only)
    exp_avg_sq_bytes: int = 4  # optimizer.exp_avg_sq_dtype (precision-aware only)
    store_param_remainders: bool = True  # optimizer.store_param_remainders
    optimizer_offload_fraction: float = 0.0  # optimizer.optimizer_cpu_offload / _offload_fraction
    fsdp_double_buffer: bool = False  # ddp.fsdp_double_buffer (or nccl_ub, max-pool double buffer)
    suggested_communication_unit_size: int | None = None
    bucket_size: int | None = None  # ddp.bucket_size
    # model.init_model_with_meta_device / use_cpu_initialization: when both are off, the model
    # is first built whole (its TP/PP shard) on the GPU and only then wrapped and sharded.
    built_on_gpu: bool = True
    # ddp.fsdp_all_gather_in_start_param_sync: after the optimizer step, start_param_sync
    # all-gathers the first bucket with prefetch, so the next layers are gathered between steps.
    gather_after_step: bool = True


def _mixed_precision(cfg: Mapping | None) -> dict:
    """What ``mixed_precision`` forces: Bridge's ``MixedPrecisionConfig.setup`` copies its
    ``bf16``/``fp16``/``grad_reduce_in_fp32`` onto the model, optimizer and DDP configs, so it
    wins over them. A recipe name (``bf16_mixed``, ``fp16_with_fp8_..._mixed``) stands for
    that recipe: the bf16 ones reduce gradients in fp32, the fp16 ones do not
    (``training/mixed_precision.py``)."""
    mp = _get(cfg, "mixed_precision")
    if isinstance(mp, str):
        name = mp.lower()
        fp16 = name.startswith("fp16")
        return {"bf16": "bf16" in name, "fp16": fp16, "grad_reduce_in_fp32": not fp16}
    if isinstance(mp, Mapping):
        return {k: _bool(mp[k]) for k in ("bf16", "fp16", "grad_reduce_in_fp32") if mp.get(k) is not None}
    return {}


def _fraction(value, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ModelError(f"{name} must be a number in [0, 1], got {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise ModelError(f"{name} must be in [0, 1], got {value!r}")
    return number


def precision_from_config(cfg: Mapping | None) -> Precision:
    mp = _mixed_precision(cfg)
    fp16 = mp.get("fp16", _bool(_first(cfg, ("model.fp16", "optimizer.fp16")), False))
    # Said nowhere: bf16, as every Bridge pretraining recipe sets (mixed_precision="bf16_mixed").
    bf16 = mp.get("bf16", _bool(_first(cfg, ("model.bf16", "optimizer.bf16")), not fp16))
    pbytes = 2 if (bf16 or fp16) else 4
    # MixedPrecisionConfig's default (and bf16_mixed's) is grad_reduce_in_fp32=True.
    grad_fp32 = mp.get("grad_reduce_in_fp32", _bool(_get(cfg, "ddp.grad_reduce_in_fp32"), True))
    fsdp_grad = dtype_bytes(_get(cfg, "ddp.megatron_fsdp_main_grads_dtype"), pbytes)
    ddp = _get(cfg, "ddp")
    ddp = ddp if isinstance(ddp, Mapping) else {}
    # Absent: the fp32 default. An explicit null: no main weights, the compute weights are optimized.
    fsdp_main = dtype_bytes(ddp.get("megatron_fsdp_main_params_dtype", "float32"), 0)
    precision_aware = _bool(_get(cfg, "optimizer.use_precision_aware_optimizer"), False)
    offload = 0.0
    if _bool(_get(cfg, "optimizer.optimizer_cpu_offload"), False):
        key = "optimizer.optimizer_offload_fraction"
        offload = _fraction(_get(cfg, key, 0.0), key)
    unit = _get(cfg, "ddp.suggested_communication_unit_size")
    bucket = _get(cfg, "ddp.bucket_size")
    return Precision(
        param_bytes=pbytes,
        param_dtype="fp16" if fp16 else ("bf16" if bf16 else "fp32"),
        ddp_grad_bytes=FP32 if grad_fp32 else pbytes,
        fsdp_grad_bytes=fsdp_grad,
        fsdp_main_bytes=fsdp_main,
        fsdp_comm_grad_bytes=dtype_bytes(_get(cfg, "ddp.megatron_fsdp_grad_comm_dtype"), fsdp_grad),
        precision_aware=precision_aware,
        master_bytes=dtype_bytes(_get(cfg, "optimizer.main_params_dtype"), FP32),
        exp_avg_bytes=dtype_bytes(_get(cfg, "optimizer.exp_avg_dtype"), FP32),
        exp_avg_sq_bytes=dtype_bytes(_get(cfg, "optimizer.exp_avg_sq_dtype"), FP32),
        store_param_remainders=_bool(_get(cfg, "optimizer.store_param_remainders"), True),
        optimizer_offload_fraction=offload,
        fsdp_double_buffer=any(
            _bool(_get(cfg, k), False)
            for k in ("ddp.fsdp_double_buffer", "ddp.nccl_ub", "ddp.megatron_fsdp_max_pool_double_buffer")
        ),
        suggested_communication_unit_size=_int(unit, "ddp.suggested_communication_unit_size")
        if unit is not None
        else None,
        bucket_size=_int(bucket, "ddp.bucket_size") if bucket is not None else None,
        gather_after_step=_bool(_get(cfg, "ddp.fsdp_all_gather_in_start_param_sync"), True),
        built_on_gpu=not any(
            _bool(_get(cfg, k)) for k in ("model.init_model_with_meta_device", "model.use_cpu_initialization")
        ),
    )


# --------------------------------------------------------------------------- activations


@dataclass(frozen=True)
class ActivationSettings:
    seq_length: int
    micro_batch_size: int
    sequence_parallel: bool = False
    recompute_granularity: str | None = None  # None, "selective", "full"
    recompute_method: str | None = None  # "uniform", "block"
    recompute_num_layers: int | None = None
    virtual_pipeline: int | None = None
    num_microbatches: int | None = None
    offload_layers: int = 0  # model.cpu_offloading with cpu_offloading_activations
    unfused_attention: bool = False  # model.attention_backend unfused/local: s x s scores are stored
    hidden_dropout: float = 0.0  # > 0: a 1-byte mask per dropout (two per layer, one after the embedding)
    bias_activation_fusion: bool = True  # gated FFN: the fused SwiGLU saves no extra activation output
    gradient_accumulation_fusion: bool = True  # off: the output layer's weight gradient is a bf16 temporary


def _in_flight(a: ActivationSettings, pp: int) -> float:
    """Microbatches the first pipeline stage holds (Megatron-LM's schedule factors)."""
    if pp == 1:
        return 1.0
    if a.virtual_pipeline:
        return pp * (1 + (pp - 1) / (pp * a.virtual_pipeline))
    if a.num_microbatches is not None:
        return pp * min(1.0, a.num_microbatches / pp)
    return float(pp)


def megatron_activation_bytes(shape: Shape, a: ActivationSettings, *, tp: int = 1, pp: int = 1, cp: int = 1) -> float:
    """Megatron-LM's own estimate, term for term (``megatron/training/theoretical_memory_usage.py``).

    ``compute_activation_memory`` with sequence parallelism: per layer
    ``sbh(18 + 4 ffn/h)``, embedding ``8sb + sbh``, output layer ``4sbh(1 + V/h)``, all over
    ``t``; ``compute_activation_memory_without_sp`` otherwise: per layer ``sbh(10 + 24/t)``,
    output ``2(sbV/t + sbh)``, plus 5 %. Both: ``pp`` microbatches in flight (interleaving
    penalty, or ``min(1, microbatches/pp)``); Bridge's estimator divides by CP. Kept as the
    published reference the tests pin; ``activation_bytes`` refines it.
    """
    s, b, h = a.seq_length, a.micro_batch_size, shape.hidden_size
    sbh = s * b * h
    layers = shape.num_layers
    factor = _in_flight(a, pp) / pp  # Megatron multiplies all L layers by the schedule penalty
    vocab = shape.padded_vocab(tp)
    if a.sequence_parallel and tp > 1:
        total = sbh * (18 + 4 * _ffn_ratio(shape)) * layers * factor
        total += (8 * s * b + sbh) * pp * factor
        if pp == 1:
            total += 4 * sbh * (1 + vocab / h)
        return total / tp / cp
    total = sbh * (10 + 24 / tp) * layers * factor + (8 * s * b + sbh) * pp * factor
    if pp == 1:
        total += 2 * (s * b * vocab / tp + sbh)
    return total * MEGATRON_NO_SP_OVERHEAD / cp


def activation_bytes(shape: Shape, a: ActivationSettings, *, tp: int = 1, pp: int = 1, cp: int = 1) -> float:
    """Peak activation bytes on the first pipeline stage: the tensors each layer saves for backward.

    Korthikanti et al. 2022 (arXiv:2205.05198) decompose a layer's ``34 sbh`` bytes as: the
    inputs and outputs of the two LayerNorms (8), Q, K, V and the attention output (8), the
    MLP's two wide tensors (16 = 4 ffn/h) and two 1-byte dropout masks (2); without sequence
    parallelism the first 10 are whole on every TP rank, the rest split ``/t``
    (``10 + 24/t``, Megatron-LM's ``compute_activation_memory_without_sp``), with it all are
    ``/t`` (``34/t``). This keeps that decomposition term by term and sizes each term for the
    model at hand, which is what Megatron-LM's formula leaves out:

    * K and V have ``num_query_groups`` heads (GQA): ``2sb(2 q + 2 kv)`` for Q, O, K, V;
    * a gated FFN saves its ``2 ffn``-wide FC1 output (4 sb ffn) and the FC2 input
      (2 sb ffn), and the unfused activation (``bias_activation_fusion`` off) also its own
      output: 6 or 8 ``sb ffn``; ungated, 4 ``sb ffn`` as in the paper;
    * dropout masks only when ``hidden_dropout`` > 0 (Llama: 0);
    * output layer: the final norm's input and output (4 sbh) and the loss's fp32 softmax,
      saved for backward (``4 sbV/t``, ``fused_cross_entropy.py``/``cross_entropy.py``
      ``save_for_backward(exp_logits ...)``); at the start of the backward pass also the
      bf16 logits gradient (``2 sbV/t``) and, without gradient-accumulation fusion, the
      output weight's bf16 gradient;
    * unfused attention (``attention_backend`` unfused/local) without selective recompute
      adds the paper's ``5 a s^2 b / t``; flash/fused attention (Bridge's ``auto``) does not.

    Pipeline in-flight microbatches, the interleaving penalty and the division by CP follow
    Megatron-LM and Bridge; full recompute keeps one ``2sbh`` checkpoint per recomputed chunk
    plus one chunk rematerialised; CPU-offloaded layers are not counted.
    """
    s, b, h = a.seq_length, a.micro_batch_size, shape.hidden_size
    sbh = s * b * h
    sp = a.sequence_parallel and tp > 1
    mask = 2 * sbh if a.hidden_dropout > 0 else 0  # two 1-byte masks
    whole = (8 * sbh + mask) / (tp if sp else 1)  # norm inputs/outputs, masks
    heads, groups, hd = shape.num_attention_heads, shape.groups, shape.head_dim
    attention = 2 * s * b * (2 * heads * hd + 2 * groups * hd) / tp  # Q, O, K, V (bf16)
    if shape.gated_linear_unit:
        mlp_width = 6 if a.bias_activation_fusion else 8
    else:
        mlp_width = 4
    mlp = mlp_width * s * b * _ffn_ratio(shape) * h / tp
    per_layer = whole + attention + mlp
    if a.unfused_attention and a.recompute_granularity != "selective":
        per_layer += 5 * heads * s * s * b / tp  # softmax input/output and dropout mask of the scores
    checkpoint = 2 * sbh / (tp if sp else 1)  # a layer's bf16 input, kept by full recompute

    layers = math.ceil(shape.num_layers / pp)
    in_flight = _in_flight(a, pp)
    stored_layers = max(0, layers - a.offload_layers)
    if a.recompute_granularity == "full":
        n = max(1, a.recompute_num_layers or 1)
        if a.recompute_method == "block":
            recomputed = min(n, stored_layers)
            per_mb = recomputed * checkpoint + (stored_layers - recomputed) * per_layer
            stack = per_mb * in_flight + (per_layer if recomputed else 0)
        else:  # uniform (Megatron's default method for full recompute)
            chunks = math.ceil(stored_layers / n)
            stack = chunks * checkpoint * in_flight + min(n, stored_layers) * per_layer
    else:
        stack = stored_layers * per_layer * in_flight

    embedding = (8 * s * b + (sbh if a.hidden_dropout > 0 else 0) / (tp if sp else 1)) * in_flight
    output = 0.0
    if pp == 1:
        vocab = shape.padded_vocab(tp)
        output = 4 * sbh / (tp if sp else 1) + 4 * s * b * vocab / tp  # final norm, fp32 softmax
        output += 2 * s * b * vocab / tp  # bf16 logits gradient at the start of backward
        if not a.gradient_accumulation_fusion:
            output += 2 * vocab * h / tp  # the output weight's gradient before it reaches main_grad
    return (stack + embedding + output) / cp


MEGATRON_NO_SP_OVERHEAD = 1.05  # compute_activation_memory_without_sp: "5% overhead"
MCORE_HIDDEN_DROPOUT = 0.1  # TransformerConfig.hidden_dropout default
# megatron/core/transformer/enums.py AttnBackend values, for configs that store the number.
ATTN_BACKENDS = {1: "flash", 2: "fused", 3: "unfused", 4: "local", 5: "auto"}


def _ffn_ratio(shape: Shape) -> float:
    """Average FFN width over hidden per layer, routed experts counted top-k times (as Bridge does)."""
    pattern = shape.moe_layers()
    moe_width = (shape.moe_ffn_hidden_size or shape.ffn) * shape.moe_router_topk + (
        shape.moe_shared_expert_intermediate_size or 0
    )
    widths = [moe_width if is_moe else shape.ffn for is_moe in pattern]
    return sum(widths) / (len(widths) * shape.hidden_size)


def activation_settings(
    cfg: Mapping | None,
    shape: Shape | None,
    *,
    seq_length=None,
    micro_batch_size=None,
    dp: int = 1,
    builtin: bool = False,
) -> ActivationSettings:
    seq = (
        _int(seq_length, "seq_length")
        or _int(_first(cfg, ("model.seq_length", "dataset.seq_length")), "model.seq_length")
        or (shape.seq_length if shape else None)
    )
    mbs = (
        _int(micro_batch_size, "micro_batch_size")
        or _int(_get(cfg, "train.micro_batch_size"), "train.micro_batch_size")
        or DEFAULT_MICRO_BATCH
    )
    gbs = _int(_get(cfg, "train.global_batch_size"), "train.global_batch_size")
    granularity = _get(cfg, "model.recompute_granularity")
    if granularity not in (None, "full", "selective"):
        raise ModelError(f"model.recompute_granularity must be null, 'selective' or 'full', got {granularity!r}")
    method = _get(cfg, "model.recompute_method")
    if method not in (None, "uniform", "block"):
        raise ModelError(f"model.recompute_method must be null, 'uniform' or 'block', got {method!r}")
    offload = 0
    if _bool(_get(cfg, "model.cpu_offloading")) and _bool(_get(cfg, "model.cpu_offloading_activations"), True):
        offload = _int(
            _get(cfg, "model.cpu_offloading_num_layers"), "model.cpu_offloading_num_layers", minimum=0, default=0
        )
    backend = _get(cfg, "model.attention_backend")
    if isinstance(backend, Mapping):
        backend = backend.get("_name_") or backend.get("_args_")
    if isinstance(backend, (list, tuple)) and backend:
        backend = backend[0]
    backend = ATTN_BACKENDS.get(backend, backend)
    # Without a config, a built-in shape runs as Bridge's Llama bridge sets it up
    # (llama_bridge.py: hidden_dropout 0, bias_activation_fusion on); else mcore's defaults.
    llama = builtin and cfg is None
    return ActivationSettings(
        seq_length=seq or 0,
        micro_batch_size=mbs,
        hidden_dropout=float(_get(cfg, "model.hidden_dropout", 0.0 if llama else MCORE_HIDDEN_DROPOUT)),
        bias_activation_fusion=_bool(_get(cfg, "model.bias_activation_fusion"), llama),
        gradient_accumulation_fusion=_bool(_get(cfg, "model.gradient_accumulation_fusion"), llama),
        unfused_attention=str(backend).rsplit(".", 1)[-1].lower() in ("unfused", "local"),
        sequence_parallel=_bool(_get(cfg, "model.sequence_parallel")),
        recompute_granularity=granularity,
        recompute_method=method,
        recompute_num_layers=_int(_get(cfg, "model.recompute_num_layers"), "model.recompute_num_layers"),
        virtual_pipeline=_int(
            _get(cfg, "model.virtual_pipeline_model_parallel_size"), "model.virtual_pipeline_model_parallel_size"
        ),
        num_microbatches=(gbs // (mbs * dp)) if gbs and gbs >= mbs * dp else None,
        offload_layers=offload,
    )
