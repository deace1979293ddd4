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
from .shapes import Shape, dsa_computes_topk

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
    # ddp.overlap_grad_reduce: with it, Bridge's wrapper (dist_utils.py:291-295, _ddp_wrap)
    # sets an unset bucket_size to max(40e6, 1e6 x DP x CP), which also cuts Megatron FSDP's group of
    # non-unit parameters into buckets; without it there is one bucket (default off: Megatron-Core's).
    overlap_grad_reduce: bool = False
    # A ``comm_overlap`` section replaces both when the configured ddp.use_distributed_optimizer is on
    # (megatron/bridge/training/comm_overlap.py: CommOverlapConfig.setup -> _get_optimizer_overlap_cfgs,
    # run by runtime_config_update before validate()): at DP > 1 bucket_size = 128 Mi and
    # overlap_grad_reduce = True, at DP 1 None and False; a non-null comm_overlap.bucket_size /
    # comm_overlap.overlap_grad_reduce wins over either. ``strategies.wrapper_bucket`` applies it.
    comm_overlap_dp: bool = False
    comm_overlap_bucket_size: int | None = None
    comm_overlap_grad_reduce: bool | None = None
    # model.init_model_with_meta_device / use_cpu_initialization: when both are off, the model
    # is first built whole (its TP/PP shard) on the GPU and only then wrapped and sharded.
    built_on_gpu: bool = True
    # ddp.fsdp_all_gather_in_start_param_sync: after the optimizer step, start_param_sync
    # all-gathers the first bucket with prefetch, so the next layers are gathered between steps.
    gather_after_step: bool = True
    # FP8 (model.fp8 / mixed_precision *fp8*): linear layers compute in FP8 and TE saves their
    # inputs for backward as FP8 (1 byte). model.fp8_param (= fp8_param_gather): the linear
    # weights themselves are stored as FP8 (transformer_config.py:581, mixed_precision.py:60-100).
    fp8: bool = False
    fp8_params: bool = False
    # optimizer.optimizer: adam (default), sgd, muon / adaptive_muon (emerging_optimizers.py),
    # dist_muon = muon + use_layer_wise_distributed_optimizer (optimizer/__init__.py:744-754).
    optimizer: str = "adam"
    layer_wise: bool = False  # optimizer.use_layer_wise_distributed_optimizer
    muon_scalar_optimizer: str = "adam"  # optimizer.muon_scalar_optimizer: for non-matrix params
    sgd_momentum: bool = True  # optimizer.sgd_momentum > 0: one momentum buffer


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


OPTIMIZERS = ("adam", "sgd", "muon", "adaptive_muon", "dist_muon", "dist_adaptive_muon")


def _fp8_from_config(cfg: Mapping | None) -> tuple[bool, bool]:
    """(FP8 compute, FP8 parameters). ``mixed_precision`` wins (MixedPrecisionConfig.setup copies
    fp8/fp8_param onto the model config); every Bridge FP8 recipe but the subchannel ones sets
    ``fp8_param_gather = True`` (training/mixed_precision.py, bf16_with_fp8_*_mixed)."""
    mp = _get(cfg, "mixed_precision")
    if isinstance(mp, str):
        name = mp.lower()
        fp8 = "fp8" in name
        return fp8, fp8 and "subchannel" not in name
    if isinstance(mp, Mapping) and (mp.get("fp8") or mp.get("fp8_param_gather") or mp.get("fp8_param")):
        return bool(mp.get("fp8")), _bool(mp.get("fp8_param")) or _bool(mp.get("fp8_param_gather"))
    fp8 = _get(cfg, "model.fp8")
    fp8_on = fp8 not in (None, False, "", "none", "None")
    return fp8_on, fp8_on and _bool(_get(cfg, "model.fp8_param"))


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
    fp8, fp8_params = _fp8_from_config(cfg)
    co = _get(cfg, "comm_overlap")
    co = co if isinstance(co, Mapping) else None
    co_bucket = co.get("bucket_size") if co else None
    co_ogr = co.get("overlap_grad_reduce") if co else None
    opt = str(_get(cfg, "optimizer.optimizer", "adam")).strip().lower()
    if opt not in OPTIMIZERS:
        raise ModelError(f"optimizer.optimizer {opt!r} is not sized (known: {', '.join(OPTIMIZERS)})")
    layer_wise = _bool(_get(cfg, "optimizer.use_layer_wise_distributed_optimizer"), False) or opt.startswith("dist_")
    scalar = str(_get(cfg, "optimizer.muon_scalar_optimizer", "adam")).strip().lower()
    momentum = _get(cfg, "optimizer.sgd_momentum", 0.9)
    return Precision(
        fp8=fp8,
        fp8_params=fp8_params,
        optimizer=opt.removeprefix("dist_"),
        layer_wise=layer_wise,
        muon_scalar_optimizer=scalar,
        sgd_momentum=float(momentum or 0) > 0,
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
        overlap_grad_reduce=_bool(_get(cfg, "ddp.overlap_grad_reduce"), False),
        comm_overlap_dp=co is not None and _bool(_get(cfg, "ddp.use_distributed_optimizer"), False),
        comm_overlap_bucket_size=_int(co_bucket, "comm_overlap.bucket_size") if co_bucket is not None else None,
        comm_overlap_grad_reduce=_bool(co_ogr) if co_ogr is not None else None,
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
    # model.cross_entropy_loss_fusion with model.cross_entropy_fusion_impl "te": Transformer Engine's cross-entropy
    # (2 bytes a logit for its saved copy, not the fp32 softmax; _loss_bytes)
    te_cross_entropy: bool = False
    # model.cross_entropy_loss_fusion (Bridge's GPTModelProvider default True, gpt_provider.py:204). Off, the loss is
    # megatron-core's eager vocab_parallel_cross_entropy, whose exp and division run in place on the fp32 copy
    # (_loss_bytes: 6 bytes a logit, not the fused path's 10).
    fused_cross_entropy: bool = True
    # PEFT: the base linears are frozen. Transformer Engine keeps a linear's input for backward only for its weight
    # gradient (module/linear.py:399, layernorm_linear.py:200 and :427, grouped_linear.py:441: backward_needs_input =
    # is_grad_enabled and weight.requires_grad), so a frozen linear that no adapter wraps saves no input; one that an
    # adapter wraps has its input saved by the adapter's linear_in instead (Bridge peft/utils.py ParallelLinearAdapter,
    # megatron-core tensor_parallel/layers.py:548 save_for_backward(input, weight)). ``frozen_linears``: the module
    # names (linear_qkv, linear_proj, linear_fc1, linear_fc2) no adapter targets; ``peft``: the output layer's weight
    # is frozen too, so it has no weight gradient.
    peft: bool = False
    frozen_linears: tuple = ()
    # model.final_logit_softcapping (Gemma 2): the output layer returns cap x tanh(logits / cap) (Bridge
    # models/gemma/gemma2_provider.py:411-423, Gemma2OutputLayer), and tanh keeps its bf16 output for backward.
    logit_softcap: bool = False
    fp8: bool = False  # model.fp8: TE saves linear inputs as FP8
    # model.recompute_modules with selective recompute (transformer_config.py:546-560; default core_attn)
    recompute_modules: tuple = ("core_attn",)
    # model.use_mamba_mem_eff_path (default True): off, Mamba layers run megatron-core's unfused path
    # (ssm/mamba_mixer.py:502, _ssm_prefill), which saves more for backward (layer_activation_bytes).
    mamba_mem_eff_path: bool = True
    # model.activation_func_clamp_value set (GPT-OSS: 7.0): the experts clamp their gated activation's input
    # (moe/experts.py:836-844, :867-871). Not a term: it selects the calibration family (calibration.family).
    moe_activation_clamp: bool = False

    def recomputes(self, module: str) -> bool:
        return self.recompute_granularity == "selective" and module in self.recompute_modules

    def saves_input(self, module: str) -> bool:
        """Whether the linear ``module`` keeps its input for backward: not when PEFT froze it and no adapter wraps it."""
        return module not in self.frozen_linears


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


# Router tensors saved per token, in bytes per expert: fp32 logits and fp32 probabilities
# (router.py: routing runs in fp32 with moe_router_dtype, and the score function's output is
# kept for backward), plus the boolean routing map (moe_utils.py topk_routing_with_score_function).
MOE_ROUTER_BYTES_PER_EXPERT = 4 + 4 + 1


def layer_activation_bytes(
    shape: Shape, kind: str, a: ActivationSettings, *, tp: int = 1, etp: int | None = None
) -> float:
    """Bytes one layer of ``kind`` saves for backward, per microbatch (see ``activation_bytes``).

    Pieces: ``attention``/``mla`` (input norm, Q, K, V, the attention output), ``mlp`` (pre-MLP
    norm, FC1 output, FC2 input), ``moe`` (pre-MLP norm; per routed copy of each token
    (top-k): the permuted FC1 input (experts.py TEGroupedMLP), the FC1 output and FC2 input, and
    one more copy's worth for the token dispatcher's buffers (the combine side's all-to-all and
    unpermute of the layer whose backward starts, token_dispatcher.py:875-895, moe_utils.py
    ``unpermute``); the router's logits/probabilities; a shared expert as an MLP),
    ``mamba`` (input norm, the z x B C dt projection, the scan output, the gated norm input and
    output; ssm/mamba_mixer.py:738-779). FP8 (``model.fp8``): TE saves
    the linear layers' inputs (norm outputs, attention output, FC2 input) as 1-byte FP8.
    """
    s, b, h = a.seq_length, a.micro_batch_size, shape.hidden_size
    sbh = s * b * h
    sp = a.sequence_parallel and tp > 1
    lin = 1 if a.fp8 else 2  # bytes of a saved linear-layer input
    seq_div = tp if sp else 1
    total = 0.0
    pieces = kind.split("+")
    # Selective recompute (transformer_config.py:546-560): "layernorm" discards the norms' outputs,
    # "mlp"/"moe"/"shared_experts" keep only the module's input, "moe_act" discards the experts'
    # activation output, "mla_up_proj" discards MLA's Q, K, V (they are recomputed in backward).
    norm_out = 0 if a.recomputes("layernorm") else lin * sbh

    def norm_before(linear: str, fused_norm: bool = True) -> float:
        # The norm's input (bf16) and output; the output is the next linear's input, kept only when that linear saves
        # it (a frozen linear_qkv/linear_fc1 without an adapter: TE's LayerNormLinear frees it, layernorm_linear.py:427).
        # LoRA with sequence parallelism: Bridge makes the norm-fused linear return its output gathered over TP
        # (peft/utils.py:600, :611 return_layernorm_output_gathered), which the adapter's linear_in keeps whole
        # beside TE's own shard: one more bf16 s x b x h less the shard.
        out = (2 * sbh + (norm_out if a.saves_input(linear) else 0)) / seq_div
        if a.peft and sp and fused_norm and a.saves_input(linear) and not a.recomputes("layernorm"):
            out += 2 * sbh * (1 - 1 / seq_div)
        return out

    # Post-attention and post-feed-forward norms (Gemma 2/3: TERowParallelLinearLayerNorm, Bridge
    # models/common/te_layers.py:49-57): each keeps its input, the row-parallel linear's bf16 output.
    total += shape.layer_post_norms * 2 * sbh / seq_div if "+" in kind else 0
    for piece in pieces:
        # The PEFT rules above follow GPT attention's module names (linear_qkv) and a Mamba mixer's (in_proj, a
        # TELayerNormColumnParallelLinear: hybrid_layer_specs.py:111); MLA layers keep the full count.
        if piece == "attention":
            norm = norm_before("linear_qkv")
        elif piece == "mamba":
            norm = norm_before("in_proj")
        else:
            norm = (2 * sbh + norm_out) / seq_div
        if piece in ("attention", "mla"):
            total += norm + (sbh if a.hidden_dropout > 0 else 0) / seq_div
            if piece == "attention":
                heads, groups, hd = shape.num_attention_heads, shape.groups, shape.head_dim
                total += s * b * (2 * heads * hd + 2 * 2 * groups * hd + lin * heads * hd) / tp
                if shape.attention_output_gate:
                    # The gated output (attention.py:1605-1628, _apply_output_gate under jit_fuser) keeps the
                    # core attention output and the gate's contiguous copy; linear_proj's input is then the
                    # product, a third tensor of the same width.
                    total += s * b * (2 + 2) * heads * hd / tp
            else:
                heads = shape.num_attention_heads
                q_head = shape.qk_head_dim + shape.qk_pos_emb_head_dim
                latent = (shape.q_lora_rank or 0) + shape.kv_lora_rank
                total += lin * s * b * latent  # the up-projections' inputs (after the q/kv norms)
                qkv = 0 if a.recomputes("mla_up_proj") else 2 * 2 * q_head + 2 * shape.v_head_dim
                total += s * b * heads * (qkv + lin * shape.v_head_dim) / tp
            if a.unfused_attention and not a.recomputes("core_attn"):
                total += 5 * shape.num_attention_heads * s * s * b / tp
        elif piece == "mlp":
            total += norm_before("linear_fc1") + (sbh if a.hidden_dropout > 0 else 0) / seq_div
            if not a.recomputes("mlp"):
                total += _mlp_saved(shape, shape.ffn, a, lin) * s * b / tp
        elif piece == "moe":
            # The pre-MLP norm's output feeds the router and the experts' FC1: with both frozen (PEFT, no adapter on
            # linear_fc1) nothing keeps it (the permute's index_select keeps only its indices).
            total += norm_before("linear_fc1", fused_norm=False) + (sbh if a.hidden_dropout > 0 else 0) / seq_div
            k = shape.moe_router_topk
            width = shape.moe_latent_size or h
            # Tokens: with TP > 1 training needs sequence parallelism (moe_layer.py:629-633), so the router sees this
            # rank's s/TP shard; the all-to-all then brings each rank top-k copies of as many tokens (balanced) and
            # the expert-TP all-gather multiplies them by ETP (token_dispatcher.py:734-743), whose ranks each hold
            # ffn/ETP of every expert (ETP unset: TP, Megatron-Core's default).
            e_tp = etp or tp
            routed = k * s * b * e_tp / tp  # routed token copies on this rank
            expert_ffn = (shape.moe_ffn_hidden_size or shape.ffn) / e_tp
            if not a.recomputes("moe"):
                fc1_in = lin * width if a.saves_input("linear_fc1") else 0
                total += routed * (fc1_in + 2 * width)  # permuted FC1 inputs, dispatcher buffers
                act_out = lin * expert_ffn if a.recomputes("moe_act") and a.saves_input("linear_fc2") else 0
                total += routed * (_mlp_saved(shape, expert_ffn, a, lin) - act_out)
                total += s * b / tp * (shape.num_moe_experts or 0) * MOE_ROUTER_BYTES_PER_EXPERT
            if shape.moe_shared_expert_intermediate_size and not a.recomputes("shared_experts"):
                total += _mlp_saved(shape, shape.moe_shared_expert_intermediate_size, a, lin) * s * b / tp
        elif piece == "gdn":
            total += gdn_layer_bytes(shape, a, tp=tp, norm=norm_before("in_proj"))
        elif piece == "mamba":
            heads = shape.mamba_num_heads or (2 * h) // shape.mamba_head_dim
            d_inner = heads * shape.mamba_head_dim
            bc = 2 * shape.mamba_num_groups * shape.mamba_state_dim
            # Memory-efficient path (ssm/mamba_mixer.py:738-779): the fused conv1d + scan keeps its
            # contiguous z x B C dt input and the scan output; the gated norm keeps its input; out_proj
            # keeps the norm's output. Conv outputs and chunk states are recomputed in backward.
            total += norm
            total += 2 * s * b * (2 * d_inner + bc + heads) / tp  # zxBCdt (contiguous copy)
            total += 2 * s * b * d_inner / tp  # scan output kept by the fused function
            # The gated norm's input; out_proj's input (a TERowParallelLinear, hybrid_layer_specs.py:113, called
            # outside the fused kernel on both paths, mamba_mixer.py:513) unless PEFT froze out_proj unadapted.
            total += (2 + (lin if a.saves_input("out_proj") else 0)) * s * b * d_inner / tp
            if not a.mamba_mem_eff_path:
                total += mamba_unfused_extra_bytes(s, b, d_inner, bc) / tp
        else:  # pragma: no cover
            raise ModelError(f"unknown layer kind {piece!r}")
    return total


# flash-linear-attention's chunk size for the gated delta rule (fla/ops/gated_delta_rule/chunk.py:38, chunk_local_cumsum
# chunk_size=64; chunk_scaled_dot_kkt_fwd and chunk_gated_delta_rule_fwd_h default chunk_size=64): the WY matrix A it
# saves is [B, T, H, 64] and the chunk states h are [B, T/64, H, K, V].
GDN_CHUNK = 64
FP32_BYTES = 4


def gdn_layer_bytes(shape: Shape, a: ActivationSettings, *, tp: int = 1, norm: float = 0.0) -> float:
    """Bytes a gated delta net mixer saves for backward, per microbatch, on megatron-core 0.19.2's path with
    flash-linear-attention's kernels (``deterministic_mode`` off, no packed sequences). Per token, on one TP rank
    (``qk`` = key heads x key dim, ``v`` = value heads x value dim, ``nv`` = value heads, all / TP):

    * ``norm``: in_proj's fused input norm, its input and output (the caller's ``norm_before``; the output only when
      in_proj keeps its input for the weight gradient);
    * the whole in_proj output, bf16 ``2 qk + 2 v + 2 nv``: fla's ``CausalConv1dFunction`` saves its input ``x``
      as given (fla/modules/conv/triton/ops.py:342 ``input_guard(no_guard_contiguous=["x"])``, :364
      ``save_for_backward(x, ...)``), and megatron passes a strided view of the projection (gdn.py:154-159
      ``transpose``/``split``, :196-204), so the view keeps the projection's whole buffer;
    * the L2-normalised q and k, bf16 ``2 qk``, and one fp32 rstd per head (``_prepare_input_for_gated_delta_rule``,
      common.py:411 -> fla/modules/l2norm.py:249 ``save_for_backward(y, rstd)``);
    * what ``ChunkGatedDeltaRuleFunction`` saves (fla/ops/gated_delta_rule/chunk.py:261): q and k repeated to the
      value heads (common.py:418-426, bf16 ``2 x nv x key dim``), v's contiguous copy (bf16 ``v``), the chunk-local
      cumulative g (fp32 ``nv``, chunk.py:38), beta (bf16 ``nv``) and the WY matrix A (bf16 ``nv x 64``,
      chunk.py:48-53 ``solve_tril(output_dtype=k.dtype)``); the chunk states h are recomputed in backward
      (chunk.py:134), not saved;
    * g and beta's fused computation (``_compute_g_and_beta``, common.py:444-445): its fp32 softplus input, ``nv``;
    * the gated output norm (``_apply_gated_norm``, common.py:370-379): the kernel output (the norm's input) and its
      fp32 rstd, the norm's output and the gate z's contiguous copy (bf16 ``v`` each, common.py:427) - or, with
      ``gdn_norm_out`` in the selective recompute modules (common.py:264-265, :250-259), only the kernel output
      and z, which the checkpoint keeps;
    * out_proj's input, ``v`` in the linear-input dtype (the transposed contiguous copy, common.py:348-349), unless
      a frozen out_proj (PEFT without an adapter on it) keeps none.
    """
    s, b = a.seq_length, a.micro_batch_size
    lin = 1 if a.fp8 else 2
    qk = shape.linear_num_key_heads * shape.linear_key_head_dim / tp
    v = shape.linear_num_value_heads * shape.linear_value_head_dim / tp
    nk, nv = shape.linear_num_key_heads / tp, shape.linear_num_value_heads / tp
    per_token = 2 * (2 * qk + 2 * v + 2 * nv)  # in_proj output, kept by the conv's saved view
    per_token += 2 * 2 * qk + FP32_BYTES * 2 * nk  # l2norm output and rstd
    per_token += 2 * 2 * nv * shape.linear_key_head_dim + 2 * v  # q, k at the value heads, v
    per_token += FP32_BYTES * nv + 2 * nv + 2 * GDN_CHUNK * nv  # g (cumsum), beta, A
    per_token += FP32_BYTES * nv  # softplus input of g
    if a.recomputes("gdn_norm_out"):
        per_token += 2 * v + 2 * v  # the checkpoint's inputs: kernel output, z
    else:
        per_token += 2 * v + FP32_BYTES * nv + 2 * v + 2 * v  # kernel output, rstd, norm output, z
        per_token += lin * v if a.saves_input("out_proj") else 0
    return norm + s * b * per_token


def gdn_backward_bytes(shape: Shape, a: ActivationSettings, *, tp: int = 1) -> float:
    """The working set of one gated delta net layer's kernel backward, beyond what it saved (a transient).

    ``chunk_gated_delta_rule_bwd`` (fla/ops/gated_delta_rule/chunk.py:105-216) recomputes w and u (:121) and the
    chunk states h with v_new (:134), then allocates dv (:145, chunk_o.py:623), dh and dv2 (:173,
    chunk_delta_h.py:745-749), dq, dk, dw, dg (:187, chunk_o.py:680-683) and dk2, dv, db, dg2 (:202,
    wy_fast.py:303-306); with the incoming gradient of the output all are live inside ``prepare_wy_repr_bwd``.
    Per token, bf16: five tensors of ``nv x key dim`` (w, dq, dk, dw, dk2), five of ``nv x value dim`` (the output
    gradient, u, v_new, dv2, dv), h and dh (``nv x key dim x value dim / 64`` each), and fp32 g-sized gradients.
    It lives only while that layer's backward runs: ``activation_bytes`` takes it where it can meet the stack
    (the larger of it and the loss buffers, which are freed before it)."""
    if not any("gdn" in k for k in shape.layer_kinds()):
        return 0.0
    s, b = a.seq_length, a.micro_batch_size
    nv = shape.linear_num_value_heads / tp
    dk, dv = shape.linear_key_head_dim, shape.linear_value_head_dim
    per_token = 2 * (5 * nv * dk + 5 * nv * dv + 2 * nv * dk * dv / GDN_CHUNK) + FP32_BYTES * 4 * nv
    return s * b * per_token


def _mlp_saved(shape: Shape, ffn: float, a: ActivationSettings, lin: int) -> float:
    """Bytes per token an MLP of width ``ffn`` saves: the FC1 output (x2 gated; the activation's input) and the
    FC2 input (not when PEFT froze linear_fc2 and no adapter wraps it); an unfused gated activation also its own
    output (the product's saved factor)."""
    fc2_in = lin * ffn if a.saves_input("linear_fc2") else 0
    if shape.gated_linear_unit:
        return 2 * 2 * ffn + fc2_in + (0 if a.bias_activation_fusion else 2 * ffn)
    return 2 * ffn + fc2_in


def activation_bytes(
    shape: Shape, a: ActivationSettings, *, tp: int = 1, pp: int = 1, cp: int = 1, etp: int | None = None
) -> float:
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
      adds the paper's ``5 a s^2 b / t``; flash/fused attention (Bridge's ``auto``) does not;
    * multi-token-prediction depths (``mtp_activation_bytes``): on the last pipeline stage, beside
      the main loss's buffers.

    Pipeline in-flight microbatches, the interleaving penalty and the division by CP follow
    Megatron-LM and Bridge; full recompute keeps one ``2sbh`` checkpoint per recomputed chunk
    plus one chunk rematerialised; CPU-offloaded layers are not counted.
    """
    s, b, h = a.seq_length, a.micro_batch_size, shape.hidden_size
    sbh = s * b * h
    sp = a.sequence_parallel and tp > 1
    kinds = shape.layer_kinds()
    layers = math.ceil(shape.num_layers / pp)
    stage_kinds = kinds[:layers]  # the first stage's layers
    sizes = {k: layer_activation_bytes(shape, k, a, tp=tp, etp=etp) for k in set(stage_kinds)}
    per_layer = max(sizes.values())  # the largest layer: what one rematerialised layer needs
    checkpoint = 2 * sbh / (tp if sp else 1)  # a layer's bf16 input, kept by full recompute

    in_flight = _in_flight(a, pp)
    # Under PEFT a hybrid model's leading layers without an adapter save nothing (peft_frozen_prefix); with full
    # recompute their checkpoints are still counted (the safe side).
    skip = max(a.offload_layers, peft_frozen_prefix(shape, a, stage_kinds) if a.recompute_granularity != "full" else 0)
    stored = stage_kinds[skip:] if skip else stage_kinds
    stored_layers = len(stored)
    if a.recompute_granularity == "full":
        n = max(1, a.recompute_num_layers or 1)
        if a.recompute_method == "block":
            recomputed = min(n, stored_layers)
            per_mb = recomputed * checkpoint + sum(sizes[k] for k in stored[recomputed:])
            stack = per_mb * in_flight + (per_layer if recomputed else 0)
        else:  # uniform (Megatron's default method for full recompute)
            chunks = math.ceil(stored_layers / n)
            stack = chunks * checkpoint * in_flight + min(n, stored_layers) * per_layer
    else:
        stack = sum(sizes[k] for k in stored) * in_flight

    embedding = (8 * s * b + (sbh if a.hidden_dropout > 0 else 0) / (tp if sp else 1)) * in_flight
    loss_forward, start_backward = _loss_bytes(shape, a, tp)
    # A gated delta net layer's backward working set comes after the loss's buffers are freed: the larger counts.
    gdn_backward = gdn_backward_bytes(shape, a, tp=tp)
    # MTP depths (mtp_activation_bytes) run before the main output layer and are freed only when the backward has gone
    # back through them, before the decoder's: they meet the main loss's buffers, and a gated delta net layer's backward
    # working set only when an MTP depth holds such a layer.
    mtp = mtp_activation_bytes(shape, a, tp=tp, etp=etp)
    mtp_gdn = mtp if any("gdn" in k for kinds in shape.mtp_kinds() for k in kinds) else 0.0
    output = 4 * sbh / (tp if sp else 1)  # the final norm
    output += max(loss_forward + mtp, start_backward + mtp, gdn_backward + mtp_gdn)
    if pp == 1:
        return (stack + embedding + output) / cp
    stack += gdn_backward  # the first stage has no loss: its first backward meets the whole stack
    # The last stage holds one microbatch in flight (1F1B) but the output layer and the loss.
    last_kinds = kinds[len(kinds) - layers :]
    last_sizes = {k: layer_activation_bytes(shape, k, a, tp=tp, etp=etp) for k in set(last_kinds)}
    if a.recompute_granularity == "full":
        n = max(1, a.recompute_num_layers or 1)
        if a.recompute_method == "block":
            recomputed = min(n, len(last_kinds))
            last = recomputed * checkpoint + sum(last_sizes[k] for k in last_kinds[recomputed:])
            last += max(last_sizes.values()) if recomputed else 0
        else:
            last = math.ceil(len(last_kinds) / n) * checkpoint + min(n, len(last_kinds)) * max(last_sizes.values())
    else:
        last = sum(last_sizes[k] for k in last_kinds)
    return max(stack + embedding, last + output) / cp


def peft_frozen_prefix(shape: Shape, a: ActivationSettings, kinds: list) -> int:
    """How many leading layers of ``kinds`` save nothing for backward: under PEFT, in a hybrid model, the layers
    before the first one a LoRA adapter wraps.

    Traced: Bridge's PEFT freezes every base parameter (peft/base.py ``freeze_model`` -> ``freeze_parameters``,
    :188-190), the embedding's included, so the decoder's input does not require a gradient. megatron-core's
    ``TransformerBlock`` turns that on for every GPT model (transformer/transformer_block.py:593
    ``make_viewless_tensor(..., requires_grad=True)``), but the hybrid model's ``HybridBlock`` keeps the input's own
    flag (models/hybrid/hybrid_block.py:398-400 ``requires_grad=hidden_states.requires_grad``). Until the first
    adapter no operation has an input or a weight that requires a gradient, so autograd records no graph there and
    nothing those layers compute is kept for backward. The first adapted layer is counted whole (the safe side).
    """
    if not (a.peft and shape.hybrid):
        return 0
    for n, kind in enumerate(kinds):
        for piece in kind.split("+"):
            linears = LAYER_LINEARS.get(piece)
            if linears is None or any(a.saves_input(m) for m in linears):
                return n  # an adapted layer, or one whose linears are not sized here (it may hold an adapter)
    return len(kinds)


LOSS_FORWARD_BYTES_PER_LOGIT = 2 + 4 + 4  # bf16 logits, fp32 copy, fp32 exp buffer
# model.cross_entropy_loss_fusion off: megatron-core's eager vocab_parallel_cross_entropy
# (language_module.py:167, :194 -> tensor_parallel/cross_entropy.py). Its fp32 copy (:25 ``.float()``) is shifted,
# exponentiated and divided in place (:42 ``-=``, :62 ``torch.exp(..., out=exp_logits)``, :77 ``div_``) and saved
# (:181), so the loss forward holds the caller's bf16 logits and that copy; the start of backward the fp32 softmax,
# turned into the gradient in place (:111, :114), and its bf16 cast for the output layer.
UNFUSED_LOSS_FORWARD_BYTES_PER_LOGIT = 2 + 4
UNFUSED_LOSS_BACKWARD_BYTES_PER_LOGIT = 4 + 2
LOGIT_SOFTCAP_BYTES_PER_LOGIT = 2  # Gemma 2's tanh output, saved by autograd (ActivationSettings.logit_softcap)
# Transformer Engine's cross-entropy (model.cross_entropy_fusion_impl "te"): the bf16 logits and the bf16 copy it
# saves for backward (transformer_engine/pytorch/triton/cross_entropy.py, cross_entropy_forward: saved_input is a new
# tensor unless overwrite_input, which megatron-core's te_parallel_cross_entropy leaves False); its backward writes the
# logits gradient into that copy (cross_entropy_backward), so the start of backward holds 2 bytes a logit.
TE_LOSS_FORWARD_BYTES_PER_LOGIT = 2 + 2
TE_LOSS_BACKWARD_BYTES_PER_LOGIT = 2


def _loss_bytes(shape: Shape, a: ActivationSettings, tp: int) -> tuple[float, float]:
    """(loss forward, start of backward) bytes of the output layer and loss, per micro-batch.

    Loss forward (language_module.py compute_language_model_loss -> cross entropy): the bf16
    logits, their fp32 copy (tensor_parallel/cross_entropy.py:25 ``.float()``) and the exp
    buffer torch.compile's functionalised in-place ops allocate (jit.py: jit_fuser =
    torch.compile; cross_entropy.py:41-63): 2 + 4 + 4 bytes per logit. Start of backward: the
    fp32 softmax saved for backward and the bf16 logits gradient; without gradient-accumulation
    fusion also the output weight's bf16 gradient (none under PEFT: the output layer is frozen). With
    Transformer Engine's cross-entropy (``te_cross_entropy``) 4 and 2 bytes a logit instead (``TE_LOSS_*``);
    without the fusion (``fused_cross_entropy`` off) 6 and 6 (``UNFUSED_LOSS_*``)."""
    vocab = shape.padded_vocab(tp)
    logits = a.seq_length * a.micro_batch_size * vocab / tp
    frozen_output = a.peft
    weight_grad = 0 if a.gradient_accumulation_fusion or frozen_output else 2 * vocab * shape.hidden_size / tp
    # Gemma 2's final soft-capping: tanh's saved bf16 output lives from the loss forward into the backward.
    softcap = LOGIT_SOFTCAP_BYTES_PER_LOGIT * logits if a.logit_softcap else 0
    if a.te_cross_entropy:
        forward, backward = TE_LOSS_FORWARD_BYTES_PER_LOGIT, TE_LOSS_BACKWARD_BYTES_PER_LOGIT
    elif not a.fused_cross_entropy:
        forward, backward = UNFUSED_LOSS_FORWARD_BYTES_PER_LOGIT, UNFUSED_LOSS_BACKWARD_BYTES_PER_LOGIT
    else:
        forward, backward = LOSS_FORWARD_BYTES_PER_LOGIT, 4 + 2
    return forward * logits + softcap, backward * logits + weight_grad + softcap


def loss_forward_headroom(shape: Shape, a: ActivationSettings, *, tp: int = 1, pp: int = 1, cp: int = 1) -> float:
    """Bytes by which the loss forward exceeds the start of backward (0 when it does not, or with PP).

    ``activation_bytes`` counts the larger of the two; the gradient buffers Megatron FSDP allocates
    in backward (the output layer's unsharded gradients first) exist only at the second moment, so
    when the loss forward is the larger, they fit in this difference instead of adding to it
    (``strategies.strategy_memory``, ``loss_headroom``). Large vocabularies make the difference
    large: 4 bytes per logit less gradient-accumulation fusion's weight gradient."""
    if pp != 1:
        return 0.0
    loss_forward, start_backward = _loss_bytes(shape, a, tp)
    return max(0.0, loss_forward - start_backward) / cp


# Bytes a loss keeps saved for backward per logit once its forward has returned, by implementation: the fused and the
# eager megatron-core losses keep an fp32 softmax (fusions/fused_cross_entropy.py:119 and
# tensor_parallel/cross_entropy.py:181, ``save_for_backward(exp_logits, ...)``); Transformer Engine's keeps its bf16
# copy of the logits (TE_LOSS_BACKWARD_BYTES_PER_LOGIT above: its backward writes the gradient into that copy).
LOSS_SAVED_BYTES_PER_LOGIT = FP32_BYTES
TE_LOSS_SAVED_BYTES_PER_LOGIT = TE_LOSS_BACKWARD_BYTES_PER_LOGIT
# A token id kept by an embedding lookup (int64), as the main embedding term counts it (``8 s b``).
TOKEN_ID_BYTES = 8
# The linear an MTP depth adds (transformer/multi_token_prediction.py::MultiTokenPredictionLayer.__init__, eh_proj):
# frozen under PEFT unless targeted, when it keeps no input (the rule ActivationSettings.saves_input applies).
MTP_LINEARS = ("eh_proj",)


def mtp_loss_saved_bytes(shape: Shape, a: ActivationSettings, *, tp: int = 1) -> float:
    """Bytes one MTP depth's loss keeps for backward, per microbatch, from its forward to the backward.

    ``process_mtp_loss`` (transformer/multi_token_prediction.py, :841 ``output_layer`` -> :855
    ``compute_language_model_loss``) computes each depth's logits with the shared output layer and its loss with the
    main loss's implementation; ``MTPLossAutoScaler.apply`` (:887/:890, ``save_for_backward(mtp_loss)`` :730) hangs
    that loss on the main hidden states, so every depth's saved loss tensors live until the backward reaches the main
    output layer's input, past the main loss. The logits (``s b V / t``: the output layer gathers the sequence) keep
    ``LOSS_SAVED_BYTES_PER_LOGIT`` (fp32 softmax) or, with Transformer Engine's cross-entropy,
    ``TE_LOSS_SAVED_BYTES_PER_LOGIT``; Gemma 2's soft-capping (the shared output layer's tanh) keeps 2 more."""
    logits = a.seq_length * a.micro_batch_size * shape.padded_vocab(tp) / tp
    per_logit = TE_LOSS_SAVED_BYTES_PER_LOGIT if a.te_cross_entropy else LOSS_SAVED_BYTES_PER_LOGIT
    if a.logit_softcap:
        per_logit += LOGIT_SOFTCAP_BYTES_PER_LOGIT
    return per_logit * logits


def mtp_depth_bytes(
    shape: Shape, kinds: list[str], a: ActivationSettings, *, tp: int = 1, etp: int | None = None
) -> tuple[float, float]:
    """(kept outside a recompute checkpoint, kept inside it) bytes of one MTP depth, per microbatch.

    Traced from megatron-core 0.19.2, transformer/multi_token_prediction.py, ``MultiTokenPredictionLayer``
    (``t`` divides ``s`` with sequence parallelism):

    * outside (``_get_embeddings``, :1112): the shared embedding of the tokens rolled one to the left, bf16
      ``2 s b h / t``, which ``enorm`` keeps as its input (``_concat_embeddings``, :1132) and full recompute as the
      checkpoint's input; the lookup's int64 token ids (``TOKEN_ID_BYTES s b``); the embedding dropout's 1-byte mask
      when ``hidden_dropout`` > 0 (models/common/embeddings/language_model_embedding.py:150-152);
    * inside (``_proj_and_transformer_layer``): the concatenation of the normed embedding and the normed hidden state
      (:1138, ``2h`` wide), kept by ``eh_proj`` (:1139) for its weight gradient (1 byte under FP8; none when PEFT
      leaves eh_proj frozen); the projection's gather and sequence-parallel scatter (:1146-1152) keep nothing; the
      inner layer or layers (:1190-1220; the kinds ``Shape.mtp_kinds`` gives), each as ``layer_activation_bytes``
      sizes a decoder layer of that kind; and ``final_layernorm``'s input (``_postprocess``, :1233), bf16
      ``2 s b h / t``.

    ``hnorm``'s input is the previous depth's output (the decoder's for the first depth): the caller counts it."""
    s, b, h = a.seq_length, a.micro_batch_size, shape.hidden_size
    sbh = s * b * h
    seq_div = tp if a.sequence_parallel and tp > 1 else 1
    lin = 1 if a.fp8 else 2
    outside = 2 * sbh / seq_div + TOKEN_ID_BYTES * s * b + (sbh / seq_div if a.hidden_dropout > 0 else 0)
    inside = (lin * 2 * sbh / seq_div if a.saves_input("eh_proj") else 0) + 2 * sbh / seq_div
    inside += sum(layer_activation_bytes(shape, k, a, tp=tp, etp=etp) for k in kinds)
    return outside, inside


def mtp_activation_bytes(shape: Shape, a: ActivationSettings, *, tp: int = 1, etp: int | None = None) -> float:
    """Bytes the multi-token-prediction block keeps for backward, per microbatch, on the stage that runs it (0 without
    MTP depths). Not divided by CP (``activation_bytes`` divides the whole).

    Where it runs: on the last pipeline stage only (transformer/multi_token_prediction.py::mtp_on_this_rank, :654,
    and get_mtp_num_layers_to_build, :708, without a custom ``pipeline_model_parallel_layout``; with one,
    all depths still sit on one stage), after the decoder and before the main output layer
    (models/gpt/gpt_model.py::GPTModel._postprocess, :667 ``self.mtp(...)``, :701 ``process_mtp_loss``, then :762 the
    main logits and :794 the main loss; models/hybrid/hybrid_model.py::HybridModel._postprocess the same, :540, :573).
    So the whole of it is alive when the main loss runs: ``activation_bytes`` adds it beside the loss buffers.

    What it keeps (``MultiTokenPredictionBlock.forward``, :1825-1848, one iteration per depth, ``mtp_num_layers``
    of them, also with ``mtp_use_repeated_layer``), with ``D`` depths:

    * each depth's ``mtp_depth_bytes`` (outside and inside a checkpoint);
    * each depth's output (its final norm's output, bf16 ``2 s b h / t``) but the last's, which the next depth's
      ``hnorm`` keeps as its input (:1134): ``D - 1`` of them;
    * the block's ``torch.cat`` of the decoder output and every depth's output (:1848), bf16
      ``(1 + D) 2 s b h / t``, which ``process_mtp_loss`` splits into views (:804) that the output layer keeps as
      its saved input (tensor_parallel/layers.py:548 ``save_for_backward(input, weight)``; under PEFT the frozen
      output layer saves none, but ``_postprocess`` holds the main view through the main loss's forward);
    * each depth's saved loss, ``mtp_loss_saved_bytes``.

    Full recompute (``recompute_granularity`` full, in training, :1499) runs each depth through
    ``_checkpointed_forward``: with ``recompute_method`` uniform the checkpoint wraps the whole
    ``_proj_and_transformer_layer`` (:1415-1423; it asserts ``recompute_num_layers == 1``), so a depth keeps only its
    outside part and its output, and one depth is rematerialised in backward (the largest inside part, counted on top,
    as ``activation_bytes`` does for the decoder's chunks); with ``block`` it warns and does not recompute (:1424-1443).
    Selective recompute applies inside the inner layer as in the decoder's (``layer_activation_bytes``)."""
    depths = shape.mtp_kinds()
    if not depths:
        return 0.0
    s, b, h = a.seq_length, a.micro_batch_size, shape.hidden_size
    seq_div = tp if a.sequence_parallel and tp > 1 else 1
    hidden = 2 * s * b * h / seq_div  # one bf16 [s, b, h] tensor on this rank
    parts = [mtp_depth_bytes(shape, kinds, a, tp=tp, etp=etp) for kinds in depths]
    d = len(depths)
    total = sum(outside for outside, _ in parts) + (d - 1) * hidden + (1 + d) * hidden
    checkpointed = a.recompute_granularity == "full" and a.recompute_method != "block"
    total += max(inside for _, inside in parts) if checkpointed else sum(inside for _, inside in parts)
    return total + d * mtp_loss_saved_bytes(shape, a, tp=tp)


def mamba_unfused_extra_bytes(s: int, b: int, d_inner: int, bc: int) -> float:
    """What a Mamba layer on megatron-core's unfused path (``use_mamba_mem_eff_path`` false,
    ssm/mamba_mixer.py:502 -> ``_ssm_prefill``) saves for backward beyond the fused kernel's set
    (``zxBCdt``, the scan output, the gated norm's input, out_proj's input: 5 d + BC + heads per token).

    The unfused path keeps, per token, bf16: conv1d's input (the ``b d l`` copy of ``xBC``, d + BC)
    and SiLU's input (the conv output, d + BC) (mamba_mixer.py:914), the scan's contiguous x, B, C
    (d + BC) and dt (heads), z's contiguous copy (d) and the norm's y (d, the scan output itself when
    the micro-batch is 1: ``rearrange(y, "b l h p -> l b (h p)").contiguous()`` is then no copy) and
    out_proj's input (d): 6 d + 3 BC + heads, so d + 2 BC more (2 d + 2 BC with micro-batch > 1, where
    y is copied). Measured on H200 rehearsals of Bridge's Nemotron-H 4B and Nemotron 3 Nano 4B recipes.
    """
    extra = d_inner + 2 * bc + (d_inner if b > 1 else 0)
    return 2.0 * s * b * extra


# The decoder linears a LoRA target name adapts in a GPT layer (Bridge peft/lora.py: linear_fc1/linear_fc2 also
# match routed and shared experts' linears).
DECODER_LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
# A gated delta net mixer's linears (ssm/gated_delta_net/common.py:204, :267): frozen under PEFT unless targeted.
GDN_LINEARS = ("in_proj", "out_proj")
# A Mamba mixer's linears (ssm/mamba_mixer.py:279 in_proj, :430 out_proj; TELayerNormColumnParallelLinear and
# TERowParallelLinear in models/hybrid/hybrid_layer_specs.py:111-113): the same names, frozen under PEFT unless
# targeted (Bridge's LoRA matches a module by its last name, peft/lora.py).
MAMBA_LINEARS = ("in_proj", "out_proj")
# The linears of each layer kind a LoRA target name can adapt (peft_frozen_prefix).
LAYER_LINEARS = {
    "attention": ("linear_qkv", "linear_proj"),
    "mlp": ("linear_fc1", "linear_fc2"),
    "moe": ("linear_fc1", "linear_fc2"),
    "mamba": MAMBA_LINEARS,
    "gdn": GDN_LINEARS,
}
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
    bare: bool | None = None,
    lora_targets: tuple | None = None,
) -> ActivationSettings:
    """The activation switches of ``cfg``. ``lora_targets``: under PEFT, the linear module names the adapters wrap
    (``estimate.lora_from_config``); every other decoder linear is frozen and saves no input."""
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
    # ``bare``: the config is only the user's KEY=VALUE overrides (no file, no recipe), which counts as none.
    llama = builtin and (cfg is None if bare is None else bare)
    if lora_targets is None and shape is not None and shape.freeze_language_model:
        # A VLM whose language model is frozen (Shape.freeze_language_model) has every decoder linear and the
        # output layer frozen, as PEFT with no adapter in the decoder: Transformer Engine saves no linear input
        # (ActivationSettings.peft above), while the gradient that reaches a trainable vision projection still
        # runs back through the decoder, so the attention, norm and activation-function inputs stay counted.
        lora_targets = ()
    return ActivationSettings(
        seq_length=seq or 0,
        micro_batch_size=mbs,
        hidden_dropout=float(_get(cfg, "model.hidden_dropout", 0.0 if llama else MCORE_HIDDEN_DROPOUT)),
        bias_activation_fusion=_bool(_get(cfg, "model.bias_activation_fusion"), llama),
        gradient_accumulation_fusion=_bool(_get(cfg, "model.gradient_accumulation_fusion"), llama),
        te_cross_entropy=_bool(_get(cfg, "model.cross_entropy_loss_fusion"))
        and _get(cfg, "model.cross_entropy_fusion_impl") == "te",
        # Said nowhere: on, as Bridge's GPTModelProvider sets it (and the larger of the two losses).
        fused_cross_entropy=_bool(_get(cfg, "model.cross_entropy_loss_fusion"), True),
        peft=lora_targets is not None,
        logit_softcap=float(_get(cfg, "model.final_logit_softcapping") or 0) > 0,
        frozen_linears=tuple(m for m in _linears(shape) if m not in lora_targets) if lora_targets is not None else (),
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
        fp8=_fp8_from_config(cfg)[0],
        recompute_modules=_recompute_modules(cfg),
        mamba_mem_eff_path=_bool(_get(cfg, "model.use_mamba_mem_eff_path"), True),
        moe_activation_clamp=_get(cfg, "model.activation_func_clamp_value") is not None,
    )


def _linears(shape: Shape | None) -> tuple:
    """The linears a LoRA target list can leave frozen: GPT's decoder linears, a gated delta net or Mamba mixer's
    (in_proj, out_proj) when the model has one, and the MTP depths' eh_proj when it has those."""
    kinds = shape.layer_kinds() if shape is not None else ()
    gdn = any("gdn" in k for k in kinds)
    mamba = any("mamba" in k for k in kinds)
    mtp = shape is not None and bool(shape.mtp_kinds())
    mixers = tuple(dict.fromkeys((GDN_LINEARS if gdn else ()) + (MAMBA_LINEARS if mamba else ())))
    return DECODER_LINEARS + mixers + (MTP_LINEARS if mtp else ())


def _recompute_modules(cfg) -> tuple:
    mods = _get(cfg, "model.recompute_modules")
    if mods is None:
        return ("core_attn",)  # transformer_config.py:1763-1764
    if isinstance(mods, str):
        mods = [mods]
    if not isinstance(mods, (list, tuple)) or not all(isinstance(x, str) for x in mods):
        raise ModelError(f"model.recompute_modules must be a list of module names, got {mods!r}")
    return tuple(mods)


# --------------------------------------------------------------------------- rotary-embedding caches

# Tables Gemma 3's rotary embedding keeps between steps, each [sequence, 1, 1, head dim] in fp32 (one angle per
# position and channel, the half-width frequencies concatenated twice: RotaryEmbedding.get_emb). Traced:
# * megatron-core models/common/embeddings/rotary_pos_embedding.py::RotaryEmbedding.forward is an
#   ``lru_cache(maxsize=32)`` method, so the table it returns stays referenced by the cache. Gemma 3's
#   embedding calls it twice per forward: on itself (global base) and on its ``rope_local`` (local base).
# * Bridge models/gemma/gemma3_provider.py::Gemma3RotaryEmbedding._forward_cached, again ``lru_cache(maxsize=32)``,
#   caches ``torch.stack([rope_local, rope_global])``: a third allocation, two tables wide.
# Four tables in all, allocated at the first forward and held until the process ends. A plain RoPE model holds one
# (RotaryEmbedding.forward's), at most a few MiB at the measured lengths, inside calibration.FRAMEWORK_BYTES.
# Measured (Bridge's Gemma 3 1B recipes rehearsed on an H200, head dim 256): the first step leaves 195.25 MiB
# (sequence 32768, pretrain) and 101.25 MiB (4096, SFT) allocated beyond Adam's two moments and the fp32 gradient
# copy, where Llama 3.2 1B's recipes leave 65-66 MiB; the four tables are 128 MiB and 16 MiB.
GEMMA3_ROPE_TABLES = 4


# torch.topk's indices are int64: the PyTorch DSA path's top-k (dsa.py:602, fused_qk_topk_naive). The fused
# (cudnn/flash_mla) kernels come from outside megatron-core (dsa_kernels.py resolves them as hooks), so their index
# dtype is not traced here: int64 for every backend, the safe side.
DSA_TOPK_INDEX_BYTES = 8


def dsa_topk_holder_bytes(
    shape: Shape, seq_length: int, micro_batch_size: int, cp: int, layers_on_gpu: int, last_stage: bool
) -> float:
    """Bytes of DSA top-k indices held between steps when layers share their top-k (0 otherwise).

    With ``dsa_indexer_topk_freq`` > 1 each layer that computes its top-k stores it in a dict keyed by
    layer number, for the layers after it to reuse (dsa.py:2214-2216; the skipping ones read it at :1961-1974).
    The dict hangs on a carrier (dsa.py:1593-1611 ``_get_index_share_carrier``): the forward's
    ``packed_seq_params`` when given, else its attention mask, else the model's ``TransformerConfig``. Bridge
    passes no attention mask unless the dataset asks for one (``skip_getting_attention_mask_from_dataset``,
    default True: training/config.py:251, gpt_step.py:247), so without packed sequences the carrier is the
    config, which lives as long as the model: each computing layer's ``[b, s / CP, min(topk, s)]`` indices
    of the last forward stay allocated between steps, replaced (not freed) by the next forward. With packed
    sequences the holder dies with its step; it is counted anyway, the safe side. Keys are layer numbers, so
    an MTP depth (numbered from 1, multi_token_prediction.py:1036-1043) adds a tensor only where its number
    is not a computing layer of this stage."""
    if shape.experimental_attention_variant != "dsa" or (shape.dsa_indexer_topk_freq or 1) <= 1:
        return 0.0
    n = shape.num_layers
    first = 1 if not last_stage or layers_on_gpu >= n else n - layers_on_gpu + 1
    numbers = {i for i in range(first, first + layers_on_gpu) if dsa_computes_topk(shape, i)}
    if last_stage:
        numbers |= {d for d in range(1, len(shape.mtp_kinds()) + 1) if dsa_computes_topk(shape, d)}
    topk = min(shape.dsa_indexer_topk or seq_length, seq_length)
    rows = micro_batch_size * math.ceil(seq_length / max(cp, 1))
    return float(len(numbers) * rows * topk * DSA_TOPK_INDEX_BYTES)


def rope_cache_bytes(shape: Shape, seq_length: int) -> float:
    """Bytes of rotary tables a Gemma 3 model keeps cached between steps (0 for every other model).

    Sized at the whole sequence: ``GPTModel._preprocess`` asks for the full length (``get_rotary_seq_len``
    multiplies the local length back by CP). With context parallelism the cache keeps this rank's slice of it
    (``get_pos_emb_on_this_cp_rank``), so the full length over-counts there: the safe side."""
    if not shape.rope_local_global or shape.position_embedding_type != "rope":
        return 0.0
    return float(GEMMA3_ROPE_TABLES * seq_length * shape.head_dim * FP32_BYTES)
