"""Per-GPU memory model for DDP, the distributed optimizer and each Megatron FSDP strategy.

Why this exists: "will it fit, and why did it OOM after I turned FSDP on?" is the
question behind most Megatron FSDP threads. Bridge's and Megatron-LM's theoretical
estimators know DDP and the distributed optimizer only; DeepSpeed's ZeRO
estimators do not know Megatron's buffers. This model reproduces, term by term,
what the pinned code allocates (Megatron-Bridge 0.6.2, Megatron-Core 0.19.2,
megatron_fsdp 0.6.1), so its numbers can be put beside a measured
``torch.cuda.max_memory_allocated``.

The mechanism, per GPU (the most-loaded model-parallel rank), in six parts:

1. **Parameter count** from the model shape (hidden, layers, heads, query groups,
   FFN size, gated linear unit, padded vocabulary, tied embeddings, biases, norms,
   MoE experts), read from the ``model`` section of a Bridge config, a built-in
   shape (``BUILTIN_SHAPES``) or ``--params``. Megatron pads the vocabulary to a
   multiple of ``make_vocab_size_divisible_by * TP`` only when
   ``should_pad_vocab`` is set (``GPTModelProvider.provide`` and
   ``megatron/training/vocab_utils.py``).
2. **Model state** (params, grads, optimizer) in bytes per parameter, per strategy,
   with ``N = DP * CP`` the sharding degree (Megatron FSDP shards over the
   ``dp_cp`` group, ``mcore_fsdp_adapter._init_dist_index``):

   =====================  ========  ===========  ==========================
   strategy               params    grads        optimizer (master, m, v)
   =====================  ========  ===========  ==========================
   ddp                    2         4 (fp32)     12
   distopt                2         4 (fp32)     12 / N
   no_shard (FSDP)        2         2 (bf16)     12       (not sharded)
   optim                  2         2            12 / N
   optim_grads            2         2 / N        12 / N
   optim_grads_params     2 / N     2 / N        12 / N
   =====================  ========  ===========  ==========================

   DDP and distopt are Megatron-LM's ``18`` and ``6 + 12/N``
   (``theoretical_memory_usage.py``, ``num_bytes_per_parameter``). Megatron FSDP
   lays its buffers out in ``param_and_grad_buffer.py``
   (``ParamAndGradBuffer._init_each_parameter_group_buffers``): the model-weight
   buffer is distributed only for ``optim_grads_params``, the fp32 main-weight
   buffer for every strategy but ``no_shard``, the grad buffer for ``optim_grads``
   and ``optim_grads_params``. Its grad dtype is ``ddp.megatron_fsdp_main_grads_dtype``
   (default None = the parameter dtype, bf16): ``ddp.grad_reduce_in_fp32`` is not
   read by Megatron FSDP. With ``N = 1`` nothing is distributed (``is_data_distributed``
   needs a group larger than one).
3. **Megatron FSDP buffers** (``optim_grads_params``/``optim_grads`` with N > 1):
   modules that are not FSDP units (embedding, output layer, final norm) stay
   all-gathered after first use (``AllGatherPipeline.reset(preserve_non_fsdp_units=True)``)
   - a persistent unsharded copy; the all-gather window is the current
   transformer layer plus prefetch until ``suggested_communication_unit_size // 2``
   elements (default ``max(1e9, 2 * layer)``, ``MegatronFSDP._init_fsdp_param_and_grad_buffer``);
   unsharded gradient buckets wait in the reduce-scatter queue until it holds more
   than ``suggested_communication_unit_size`` elements
   (``GradReducePipeline.wait_for_previous_grad_reduce``); ``fsdp_double_buffer``
   replaces both windows by two persistent layer-sized pools.
4. **Optimizer-step transient**: when the gradient dtype differs from the fp32 main
   weights, a fp32 copy of the (sharded) gradient is made for the step
   (``ParamAndGradBuffer.update_main_grads``, ``Float16OptimizerWithFloat16Params
   ._copy_model_grads_to_main_grads``, ``DistributedOptimizer`` ``.float()``); it is
   freed by ``zero_grad``. Activations are gone by then, so it competes with them
   for the peak instead of adding to it.
5. **Activations**: Korthikanti et al. 2022 (arXiv 2205.05198, Table 2) decompose a
   layer's saved tensors into norm inputs/outputs, Q/K/V/attention output, the MLP's wide
   tensors and dropout masks; ``activation_bytes`` sizes each term for the model (GQA,
   gated FFN, fused or unfused activation, dropout, the loss's fp32 softmax) and reduces
   to the paper's ``34 sbh`` where its assumptions hold. Pipeline in-flight microbatches,
   recomputation, CP and CPU offloading are applied on top. Megatron-LM's own formula
   (``megatron_activation_bytes``, exact) is reported beside it for comparison.
6. **Model construction**: without ``init_model_with_meta_device`` Bridge builds the
   whole model on the GPU before megatron_fsdp shards it: for ``optim_grads_params`` that
   can be the peak.

Totals: ``total = max(model_state + max(activations + buffers alive with them, the late
reduce-scatter queue, step transient), construction peak)``. "Model state" = params +
grads + optimizer + persistent FSDP buffers; ``after_step`` (model state + step transient)
is what ``torch.cuda.memory_allocated()`` reads between training steps, less framework
workspaces (about 0.1 GB). On role gpu's real 1-GPU H200 runs both were within 0.5 %.

Standard library only: this runs inside the agent's own interpreter.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

GIB = 1024**3

STRATEGIES = ("ddp", "distopt", "no_shard", "optim", "optim_grads", "optim_grads_params")
FSDP_STRATEGIES = STRATEGIES[2:]

# Bytes per element for every dtype spelling a Bridge config can carry
# (``torch.bfloat16``, ``{_target_: torch.float32}``, ``bf16``, ``fp32`` ...).
DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8": 1,
    "fp8": 1,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

FP32 = 4
ADAM_STATES = 2  # exp_avg and exp_avg_sq (optimizer 'adam', the Bridge default)

# Megatron FSDP (megatron_fsdp 0.6.1, megatron_fsdp.py): when
# ``suggested_communication_unit_size`` is unset it is
# ``max(1_000_000_000, 2 * elements per FSDP unit)`` for optim_grads_params, else
# ``max(1_000_000_000, bucket_size or 1e9)``; the all-gather prefetch limit is half of it.
FSDP_MIN_COMM_UNIT = 1_000_000_000
FSDP_DOUBLE_BUFFER_SLOTS = 2  # FixedPoolAllocator(size=UB_BUFFER_NUM=2)

# bucket_size when unset: max(40e6, 1e6 x DP x CP) (megatron/training/models/dist_utils.py,
# distributed/distributed_data_parallel.py), so buckets grow with DP.
DDP_MIN_BUCKET = 40_000_000
DDP_BUCKET_PER_DP_RANK = 1_000_000

# How far ``smallest_dp`` searches (data-parallel sizes beyond this are not built today).
MAX_DP_SEARCH = 16384

# Built-in shapes: the public Hugging Face ``config.json`` of each model
# (hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
# intermediate_size, vocab_size, tie_word_embeddings=false), RMSNorm, SwiGLU, RoPE,
# no biases. Sequence length and micro-batch size are those of Bridge 0.6.2's
# Llama 3 pretraining recipe (``recipes/llama/llama3.py``: seq_length 8192, MBS 1).
BUILTIN_SHAPES: dict[str, dict[str, Any]] = {
    "llama3-8b": dict(
        hidden_size=4096,
        num_layers=32,
        num_attention_heads=32,
        num_query_groups=8,
        ffn_hidden_size=14336,
        vocab_size=128256,
    ),
    "llama3-70b": dict(
        hidden_size=8192,
        num_layers=80,
        num_attention_heads=64,
        num_query_groups=8,
        ffn_hidden_size=28672,
        vocab_size=128256,
    ),
    "llama3.1-405b": dict(
        hidden_size=16384,
        num_layers=126,
        num_attention_heads=128,
        num_query_groups=8,
        ffn_hidden_size=53248,
        vocab_size=128256,
    ),
}
_LLAMA_COMMON = dict(
    gated_linear_unit=True,
    normalization="RMSNorm",
    add_bias_linear=False,
    share_embeddings_and_output_weights=False,
    position_embedding_type="rope",
    seq_length=8192,
)
# Accepted spellings, compared after lower-casing and dropping everything but [a-z0-9].
_ALIASES = {
    "llama38b": "llama3-8b",
    "llama318b": "llama3-8b",
    "metallama38b": "llama3-8b",
    "metallama318b": "llama3-8b",
    "llama370b": "llama3-70b",
    "llama3170b": "llama3-70b",
    "metallama370b": "llama3-70b",
    "metallama3170b": "llama3-70b",
    "llama31405b": "llama3.1-405b",
    "metallama31405b": "llama3.1-405b",
}
DEFAULT_MICRO_BATCH = 1


class ModelError(ValueError):
    """The model description cannot be used; the message says which field and why."""


# --------------------------------------------------------------------------- config access


def _get(cfg: Mapping | None, dotted: str, default=None):
    """``cfg['a']['b']`` for ``'a.b'``; ``default`` when any level is missing or None."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def _first(cfg, paths: Iterable[str], default=None):
    for p in paths:
        v = _get(cfg, p)
        if v is not None:
            return v
    return default


def dtype_bytes(value, default: int | None = None) -> int | None:
    """Bytes per element of a dtype as a Bridge config spells it; ``default`` for None.

    Accepts ``torch.bfloat16``, ``bfloat16``, ``bf16``, a ``{_target_: torch.float32}``
    mapping (how ``ConfigContainer.to_yaml`` writes dtypes) and the torch dtype's repr.
    """
    if value is None:
        return default
    if isinstance(value, Mapping):
        return dtype_bytes(value.get("_target_"), default)
    name = str(value).strip().lower()
    if name in ("none", "null", ""):
        return default
    name = name.rsplit(".", 1)[-1]
    if name not in DTYPE_BYTES:
        raise ModelError(f"unknown dtype {value!r} (expected one of bf16, fp16, fp32, fp8)")
    return DTYPE_BYTES[name]


def _positive(value, name: str, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ModelError(f"{name} must be {what}, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ModelError(f"{name} must be positive, got {value!r}")
    return number


def _bool(value, default: bool = False) -> bool:
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _int(value, name: str, *, minimum: int = 1, default: int | None = None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool):
        raise ModelError(f"{name} must be an integer, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ModelError(f"{name} must be an integer, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):
        raise ModelError(f"{name} must be an integer, got {value!r}")
    if int(number) < minimum:
        raise ModelError(f"{name} must be >= {minimum}, got {value!r}")
    return int(number)


# --------------------------------------------------------------------------- model shape


@dataclass(frozen=True)
class Shape:
    """A GPT model's shape, with Megatron-Core ``TransformerConfig`` field names and defaults."""

    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    vocab_size: int
    num_query_groups: int | None = None  # None: multi-head attention (= heads)
    ffn_hidden_size: int | None = None  # None: 4 * hidden (TransformerConfig.__post_init__)
    kv_channels: int | None = None  # None: hidden / heads
    gated_linear_unit: bool = False
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    normalization: str = "LayerNorm"
    qk_layernorm: bool = False
    share_embeddings_and_output_weights: bool = True  # GPTModelProvider default
    position_embedding_type: str = "learned_absolute"  # GPTModelProvider default
    seq_length: int = 1024  # GPTModelProvider default
    make_vocab_size_divisible_by: int = 128
    should_pad_vocab: bool = False
    num_moe_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_router_topk: int = 2
    moe_shared_expert_intermediate_size: int | None = None
    moe_shared_expert_gate: bool = False
    moe_layer_freq: Any = 1

    @property
    def groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def norm_params(self) -> int:
        """Parameters per norm: RMSNorm has a weight, LayerNorm a weight and a bias."""
        return self.hidden_size * (1 if self.normalization == "RMSNorm" else 2)

    def padded_vocab(self, tp: int) -> int:
        """Megatron's padding: up to a multiple of make_vocab_size_divisible_by * TP."""
        if not self.should_pad_vocab:
            return self.vocab_size
        multiple = self.make_vocab_size_divisible_by * tp
        return int(math.ceil(self.vocab_size / multiple) * multiple)

    def moe_layers(self) -> list[bool]:
        if not self.num_moe_experts:
            return [False] * self.num_layers
        freq = self.moe_layer_freq
        if isinstance(freq, (list, tuple)):
            if len(freq) != self.num_layers:
                raise ModelError(f"model.moe_layer_freq has {len(freq)} entries for {self.num_layers} layers")
            return [bool(x) for x in freq]
        freq = _int(freq, "model.moe_layer_freq")
        return [i % freq == 0 for i in range(self.num_layers)]


_SHAPE_FIELDS = [f for f in Shape.__dataclass_fields__ if f != "name"]
_SHAPE_INTS = (
    "hidden_size",
    "num_layers",
    "num_attention_heads",
    "vocab_size",
    "num_query_groups",
    "ffn_hidden_size",
    "kv_channels",
    "seq_length",
    "make_vocab_size_divisible_by",
    "num_moe_experts",
    "moe_ffn_hidden_size",
    "moe_router_topk",
    "moe_shared_expert_intermediate_size",
)
_SHAPE_BOOLS = (
    "gated_linear_unit",
    "add_bias_linear",
    "add_qkv_bias",
    "qk_layernorm",
    "share_embeddings_and_output_weights",
    "should_pad_vocab",
    "moe_shared_expert_gate",
)
_REQUIRED = ("hidden_size", "num_layers", "num_attention_heads", "vocab_size")


def builtin_names() -> list[str]:
    return list(BUILTIN_SHAPES)


def builtin_shape(name: str) -> Shape:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    canonical = _ALIASES.get(key) or (name.lower() if name.lower() in BUILTIN_SHAPES else None)
    if canonical is None:
        raise ModelError(
            f"unknown model {name!r}; built-in shapes: {', '.join(BUILTIN_SHAPES)} (or pass a config, or --params N)"
        )
    return Shape(name=canonical, **_LLAMA_COMMON, **BUILTIN_SHAPES[canonical])


def shape_from_config(model: Mapping, name: str = "config") -> Shape:
    """Read a ``Shape`` from a Bridge ``model`` section (GPTModelProvider field names)."""
    missing = [f"model.{k}" for k in _REQUIRED if model.get(k) in (None, 0)]
    if missing:
        raise ModelError(
            f"config lacks {', '.join(missing)}: cannot count parameters (pass --model NAME or --params N instead)"
        )
    kwargs: dict[str, Any] = {}
    for key in _SHAPE_FIELDS:
        if key not in model or model[key] is None:
            continue
        value = model[key]
        if key in _SHAPE_INTS:
            value = _int(value, f"model.{key}")
        elif key in _SHAPE_BOOLS:
            value = _bool(value)
        elif key == "normalization":
            value = str(value)
        kwargs[key] = value
    return Shape(name=name, **kwargs)


@dataclass(frozen=True)
class Counts:
    """Parameter counts: global, and on the most-loaded GPU (one TP/PP/EP shard)."""

    total: int  # whole model
    embedding: int  # word (+ learned position) embeddings, whole
    output_layer: int  # untied output layer, whole (0 when tied)
    layer_dense: list[int]  # per layer, parameters that are not routed experts
    layer_experts: list[int]  # per layer, routed-expert parameters
    final_norm: int
    # on the most-loaded GPU:
    gpu_dense: float  # TP-sharded + replicated parameters, including non-unit ones
    gpu_experts: float  # routed experts (sharded over EP x ETP)
    gpu_non_unit: float  # parameters outside transformer layers (embedding, output, final norm)
    gpu_unit: float  # one transformer layer (the Megatron FSDP unit), largest
    gpu_first_grads: float  # non-unit parameters whose gradients come first in backward (output layer)
    layers_on_gpu: int
    padded_vocab: int


def count_parameters(shape: Shape, tp: int = 1, pp: int = 1, ep: int = 1, etp: int | None = None) -> Counts:
    """Exact parameter count of a Megatron GPT model, and the most-loaded GPU's share.

    Per layer: QKV ``h x (heads + 2 groups) x head_dim`` (+ bias), projection
    ``heads x head_dim x h`` (+ bias), FC1 ``h x ffn x (2 if gated)`` (+ bias), FC2
    ``ffn x h`` (+ bias), two norms (+ QK norms); MoE layers replace the MLP with a
    router ``h x E``, ``E`` experts and an optional shared expert. Embedding
    ``padded_vocab x h``; an untied output layer as much again. Weights of linear
    layers and embeddings are split over TP; norms and row-parallel biases are
    replicated; routed experts are split over EP x ETP. The most-loaded pipeline stage
    holds ``ceil(layers / PP)`` layers plus the embedding, and with PP = 1 also the
    output layer and final norm (Megatron-LM's assumption).
    """
    etp = etp or tp
    h, hd = shape.hidden_size, shape.head_dim
    heads, groups = shape.num_attention_heads, shape.groups
    if heads % groups:
        raise ModelError(f"num_attention_heads ({heads}) must be a multiple of num_query_groups ({groups})")
    bias = shape.add_bias_linear
    glu = 2 if shape.gated_linear_unit else 1
    qkv_out = (heads + 2 * groups) * hd
    attn_tp = h * qkv_out + heads * hd * h + (qkv_out if (bias or shape.add_qkv_bias) else 0)
    attn_rep = (h if bias else 0) + 2 * shape.norm_params
    if shape.qk_layernorm:
        attn_rep += 2 * hd * (1 if shape.normalization == "RMSNorm" else 2)

    def mlp(ffn: int) -> tuple[int, int]:  # (tp-sharded, replicated)
        return h * ffn * glu + ffn * h + (ffn * glu if bias else 0), (h if bias else 0)

    dense_tp, dense_rep = mlp(shape.ffn)
    moe_ffn = shape.moe_ffn_hidden_size or shape.ffn
    experts = shape.num_moe_experts or 0
    exp_tp, exp_rep = mlp(moe_ffn)
    expert_params = experts * (exp_tp + exp_rep)
    router = h * experts + (experts if bias else 0)
    shared = shape.moe_shared_expert_intermediate_size or 0
    shared_tp, shared_rep = mlp(shared) if shared else (0, 0)
    shared_gate = h if (shared and shape.moe_shared_expert_gate) else 0

    moe_pattern = shape.moe_layers()
    layer_dense, layer_experts, gpu_layer_dense, gpu_layer_experts = [], [], [], []
    for is_moe in moe_pattern:
        if is_moe:
            layer_dense.append(attn_tp + attn_rep + router + shared_tp + shared_rep + shared_gate)
            layer_experts.append(expert_params)
            gpu_layer_dense.append((attn_tp + shared_tp) / tp + attn_rep + router + shared_rep + shared_gate)
            gpu_layer_experts.append(expert_params / (ep * etp))
        else:
            layer_dense.append(attn_tp + attn_rep + dense_tp + dense_rep)
            layer_experts.append(0)
            gpu_layer_dense.append((attn_tp + dense_tp) / tp + attn_rep + dense_rep)
            gpu_layer_experts.append(0.0)

    vocab = shape.padded_vocab(tp)
    word = vocab * h
    position = shape.seq_length * h if shape.position_embedding_type == "learned_absolute" else 0
    embedding = word + position
    output = 0 if shape.share_embeddings_and_output_weights else word
    final_norm = shape.norm_params
    total = embedding + output + final_norm + sum(layer_dense) + sum(layer_experts)

    layers_on_gpu = math.ceil(shape.num_layers / pp)
    # Most-loaded stage: the first layers_on_gpu layers of the heaviest kind, plus embeddings.
    order = sorted(range(shape.num_layers), key=lambda i: -(gpu_layer_dense[i] + gpu_layer_experts[i]))
    chosen = order[:layers_on_gpu]
    non_unit = word / tp + position
    if pp == 1:
        non_unit += output / tp + final_norm
    # Backward starts at the output layer (or the tied embedding it reuses) when this stage holds it.
    first_grads = (output or word) / tp if pp == 1 else 0.0
    gpu_dense = sum(gpu_layer_dense[i] for i in chosen) + non_unit
    gpu_experts = sum(gpu_layer_experts[i] for i in chosen)
    unit = max(gpu_layer_dense[i] + gpu_layer_experts[i] for i in range(shape.num_layers))
    return Counts(
        total=total,
        embedding=embedding,
        output_layer=output,
        layer_dense=layer_dense,
        layer_experts=layer_experts,
        final_norm=final_norm,
        gpu_dense=gpu_dense,
        gpu_experts=gpu_experts,
        gpu_non_unit=non_unit,
        gpu_unit=unit,
        gpu_first_grads=first_grads,
        layers_on_gpu=layers_on_gpu,
        padded_vocab=vocab,
    )


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


# --------------------------------------------------------------------------- model state per strategy


@dataclass
class StrategyMemory:
    """Bytes on the most-loaded GPU for one strategy (floats: shards need not be whole)."""

    name: str
    params: float
    grads: float
    optimizer: float
    buffers_persistent: float = 0.0  # kept across iterations: preserved non-unit copies, double buffers
    buffers_at_peak: float = 0.0  # alive with the activation peak (start of backward)
    buffers_late: float = 0.0  # largest later in backward, when activations are mostly freed
    step_transient: float = 0.0  # fp32 gradient copy made for the optimizer step
    init_peak: float = 0.0  # while the model is built unsharded on the GPU, before wrapping
    gathered_after_step: float = 0.0  # layers all-gathered by start_param_sync right after the step
    notes: tuple[str, ...] = ()

    @property
    def model_state(self) -> float:
        return self.params + self.grads + self.optimizer + self.buffers_persistent

    def total(self, activations: float) -> float:
        training = self.model_state + max(
            activations + self.buffers_at_peak, self.buffers_late, self.after_step - self.model_state
        )
        return max(training, self.init_peak)

    @property
    def after_step(self) -> float:
        """What ``memory_allocated()`` reads between two training steps."""
        return self.model_state + self.step_transient + self.gathered_after_step

    def buffers(self, activations: float) -> float:
        """FSDP buffer bytes at the moment that decides the total."""
        peak = activations + self.buffers_at_peak
        moment = self.buffers_at_peak if peak >= self.buffers_late else self.buffers_late
        return self.buffers_persistent + moment


def _adam_bytes(p: Precision, *, fsdp: bool) -> tuple[int, int]:
    """(main-weight bytes, moment bytes) per parameter the optimizer holds."""
    if p.precision_aware:
        if fsdp:
            # FusedAdam receives Megatron FSDP's main weights and its own master weights are
            # switched off (megatron/core/optimizer/__init__.py, get_megatron_optimizer).
            master = p.fsdp_main_bytes
        elif p.store_param_remainders and p.param_bytes == 2 and p.master_bytes == FP32:
            master = 2  # only the 16 bits fp32 adds to the bf16 weight (OptimizerConfig docs)
        else:
            master = p.master_bytes
        return master, p.exp_avg_bytes + p.exp_avg_sq_bytes
    if fsdp:
        # Adam's states are zeros_like(the optimizer's parameter): the main weight, or the
        # model weight when megatron_fsdp_main_params_dtype is None.
        return p.fsdp_main_bytes, ADAM_STATES * (p.fsdp_main_bytes or p.param_bytes)
    master = FP32 if p.param_bytes < FP32 else 0  # fp32 training: the weights are the master
    return master, ADAM_STATES * FP32


def _rs_queue_peak(buckets: list[float], capacity: float) -> float:
    """Largest sum of unsharded gradient buckets alive, by GradReducePipeline's rule.

    A bucket's unsharded storage lives while its gradients accumulate and then in the
    reduce-scatter queue; before a bucket is queued, the oldest are freed while the
    queue holds more than ``capacity`` elements (``wait_for_previous_grad_reduce``).
    """
    queue: deque[float] = deque()
    queued = peak = 0.0
    for size in buckets:
        peak = max(peak, queued + size)  # this bucket accumulating, older ones queued
        while queue and queued > capacity:
            queued -= queue.popleft()
        queue.append(size)
        queued += size
        peak = max(peak, queued)
    return peak


def _buckets(total: float, bucket: int, capacity: float) -> list[float]:
    """``total`` elements cut into gradient buckets of ``bucket`` elements.

    A run of equal buckets reaches the queue's steady state after ``capacity / bucket + 1``
    of them, so longer runs are cut short: the peak is the same, and it stays cheap.
    """
    if total <= 0:
        return []
    n = int(total // bucket)
    rest = total - n * bucket
    n = min(n, int(capacity // bucket) + 3)
    return [float(bucket)] * n + ([rest] if rest > 0 else [])


def strategy_memory(
    strategy: str,
    counts: Counts,
    p: Precision,
    *,
    dp: int = 1,
    cp: int = 1,
    tp: int = 1,
    ep: int = 1,
    etp: int | None = None,
) -> StrategyMemory:
    """Model-state and buffer bytes for one strategy on the most-loaded GPU."""
    if strategy not in STRATEGIES:
        raise ModelError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
    etp = etp or tp
    n_dense = dp * cp
    n_expert = max(1, (dp * cp * tp) // (ep * etp))  # expert data-parallel group
    full = counts.gpu_dense + counts.gpu_experts
    shard = counts.gpu_dense / n_dense + counts.gpu_experts / n_expert
    keep = 1.0 - p.optimizer_offload_fraction  # share of optimizer state left on the GPU
    notes: list[str] = []

    if strategy in ("ddp", "distopt"):
        precision_aware = p.precision_aware and strategy == "distopt"
        if p.precision_aware and strategy == "ddp":
            notes.append("use_precision_aware_optimizer needs the distributed optimizer; not applied to ddp")
        master, moments = _adam_bytes(replace(p, precision_aware=precision_aware), fsdp=False)
        held = full if strategy == "ddp" else shard
        step = 0.0
        if p.ddp_grad_bytes != FP32 and p.param_bytes < FP32 and not precision_aware:
            step = FP32 * held  # main_param.grad = main_grad.float(): a copy unless already fp32
        return StrategyMemory(
            strategy,
            p.param_bytes * full,
            p.ddp_grad_bytes * full,
            (master + moments) * held * keep,
            step_transient=step,
            notes=tuple(notes),
        )

    # Megatron FSDP: a buffer is distributed only when the strategy says so and its group has > 1 rank.
    sharded = n_dense > 1 or n_expert > 1
    w_sharded = strategy == "optim_grads_params" and sharded
    g_sharded = strategy in ("optim_grads", "optim_grads_params") and sharded
    held = full if strategy == "no_shard" else shard  # no_shard keeps whole optimizer state
    master, moments = _adam_bytes(p, fsdp=True)
    mem = StrategyMemory(
        strategy,
        p.param_bytes * (shard if w_sharded else full),
        p.fsdp_grad_bytes * (shard if g_sharded else full),
        (master + moments) * held * keep,
    )
    if p.fsdp_main_bytes and not p.precision_aware and p.fsdp_grad_bytes != p.fsdp_main_bytes:
        mem.step_transient = p.fsdp_main_bytes * held  # update_main_grads: grad.to(main dtype)
    if p.built_on_gpu and w_sharded:
        # megatron_fsdp copies each parameter into its buffer and frees the original as it goes:
        # the peak is the unsharded model plus the current group (ParamAndGradBuffer init).
        mem.init_peak = p.param_bytes * (full + counts.gpu_unit)
    g = p.fsdp_comm_grad_bytes
    bucket = p.bucket_size or max(DDP_MIN_BUCKET, DDP_BUCKET_PER_DP_RANK * dp * cp)
    if w_sharded and counts.gpu_unit > 0:
        unit, layers = counts.gpu_unit, counts.layers_on_gpu
        capacity = p.suggested_communication_unit_size or max(FSDP_MIN_COMM_UNIT, int(2 * unit))
        first = counts.gpu_first_grads  # output layer: the first gradients of the backward pass
        rest = counts.gpu_non_unit - first  # embedding (+ final norm): the last ones
        mem.buffers_persistent = p.param_bytes * counts.gpu_non_unit
        notes.append("non-FSDP-unit modules (embedding, output layer) stay all-gathered after first use")
        if p.fsdp_double_buffer:
            mem.buffers_persistent += FSDP_DOUBLE_BUFFER_SLOTS * unit * (p.param_bytes + g)
            mem.buffers_at_peak = g * first
            mem.buffers_late = g * max(first, rest)
            notes.append("fsdp_double_buffer: two persistent layer-sized pools, for weights and for grads")
        else:
            ag_units = min(layers, 1 + math.ceil((capacity // 2) / unit))
            if p.gather_after_step:
                # start_param_sync gathers the embedding's (preserved) bucket plus prefetch.
                mem.gathered_after_step = p.param_bytes * (ag_units - 1) * unit
            rs = _rs_queue_peak([first] + [unit] * min(layers, int(capacity // unit) + 3) + [rest], capacity)
            mem.buffers_at_peak = p.param_bytes * ag_units * unit + g * (first + unit)
            mem.buffers_late = p.param_bytes * ag_units * unit + g * rs
            notes.append(
                f"all-gather window: {ag_units} layer(s); reduce-scatter queue: up to "
                f"{rs / 1e6:.0f}M unsharded gradient elements"
            )
    elif w_sharded:
        notes.append("no model shape: FSDP all-gather/reduce-scatter buffers not estimated")
    elif g_sharded:
        capacity = p.suggested_communication_unit_size or max(FSDP_MIN_COMM_UNIT, bucket)
        # A parameter larger than a bucket gets one of its own: output layer first, embedding last.
        first, rest = counts.gpu_first_grads, counts.gpu_non_unit - counts.gpu_first_grads
        grads_in_backward = [first] + _buckets(full - first - rest, bucket, capacity) + [rest]
        rs = _rs_queue_peak([x for x in grads_in_backward if x > 0], capacity)
        first = max(first, grads_in_backward[1] if len(grads_in_backward) > 2 else 0.0)
        mem.buffers_at_peak = g * first
        mem.buffers_late = g * rs
        notes.append(f"reduce-scatter queue: up to {rs / 1e6:.0f}M unsharded gradient elements")
    mem.notes = tuple(notes)
    return mem


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
        offload = _int(_get(cfg, "model.cpu_offloading_num_layers", 0), "model.cpu_offloading_num_layers", minimum=0)
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


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class Parallel:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None


def parallel_from(cfg: Mapping | None, *, dp=None, tp=None, pp=None, cp=None, ep=None) -> Parallel:
    """Explicit sizes win; otherwise the config's ``model.*_parallel_size``; otherwise 1.

    A Bridge config does not store the data-parallel size (it follows from the world
    size), so DP is 1 unless given.
    """

    def pick(value, path, name):
        return _int(value, name) or _int(_get(cfg, path), path) or 1

    etp = _get(cfg, "model.expert_tensor_parallel_size")
    return Parallel(
        dp=pick(dp, "", "dp"),
        tp=pick(tp, "model.tensor_model_parallel_size", "tp"),
        pp=pick(pp, "model.pipeline_model_parallel_size", "pp"),
        cp=pick(cp, "model.context_parallel_size", "cp"),
        ep=pick(ep, "model.expert_model_parallel_size", "ep"),
        etp=_int(etp, "model.expert_tensor_parallel_size") if etp is not None else None,
    )


def configured_strategy(cfg: Mapping | None) -> str | None:
    """The strategy a config selects: Megatron FSDP's sharding strategy, else distopt or ddp."""
    if cfg is None:
        return None
    if _bool(_get(cfg, "ddp.use_megatron_fsdp")) or _bool(_get(cfg, "dist.use_megatron_fsdp")):
        return str(_get(cfg, "ddp.data_parallel_sharding_strategy", "no_shard"))
    if _bool(_first(cfg, ("ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"))):
        return "distopt"
    return "ddp"


def _resolve_strategies(strategies: Iterable[str] | str) -> list[str]:
    if isinstance(strategies, str):
        strategies = [strategies]
    chosen: list[str] = []
    for name in strategies:
        names = STRATEGIES if name == "all" else (name,)
        for n in names:
            if n not in STRATEGIES:
                raise ModelError(f"unknown strategy {n!r}; one of {', '.join(STRATEGIES)}, all")
            if n not in chosen:
                chosen.append(n)
    return chosen


@dataclass
class Estimate:
    """Everything ``report`` needs; kept separate so callers can read bytes directly."""

    shape: Shape | None
    counts: Counts
    parallel: Parallel
    precision: Precision
    activation: ActivationSettings | None
    activations: float | None  # bytes; None when there is no shape to compute them from
    megatron_lm_activations: float | None  # Megatron-LM's own formula, for comparison
    rows: dict[str, StrategyMemory]
    configured: str | None
    source: str
    notes: list[str]


def _counts_from_params(params: float, par: Parallel) -> Counts:
    per_gpu = params / (par.tp * par.pp)
    return Counts(
        total=int(round(params)),
        embedding=0,
        output_layer=0,
        layer_dense=[],
        layer_experts=[],
        final_norm=0,
        gpu_dense=per_gpu,
        gpu_experts=0.0,
        gpu_non_unit=0.0,
        gpu_unit=0.0,
        gpu_first_grads=0.0,
        layers_on_gpu=0,
        padded_vocab=0,
    )


def estimate(
    cfg: Mapping | None = None,
    *,
    params=None,
    model=None,
    dp=None,
    tp=None,
    pp=None,
    cp=None,
    ep=None,
    strategies=("all",),
    seq_length=None,
    micro_batch_size=None,
) -> Estimate:
    """Compute every strategy's bytes; raises ``ModelError`` for unusable input."""
    if cfg is not None and not isinstance(cfg, Mapping):
        raise ModelError("config must be a mapping of sections ({'model': {...}, 'ddp': {...}})")
    if params is not None and model is not None:
        raise ModelError("give --model or --params, not both")
    par = parallel_from(cfg, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    notes: list[str] = []
    shape: Shape | None
    if model is not None:
        shape, source = builtin_shape(str(model)), f"built-in shape {builtin_shape(str(model)).name}"
    elif params is not None:
        params = _positive(params, "--params", "a number of parameters (e.g. 8.03e9)")
        shape, source = None, "--params"
        notes.append("--params gives no shape: activations and Megatron FSDP buffers are not estimated")
    elif isinstance(_get(cfg, "model"), Mapping):
        model_section = dict(_get(cfg, "model"))
        tokenizer_vocab = _get(cfg, "tokenizer.vocab_size")
        null_tokenizer = _get(cfg, "tokenizer.tokenizer_type") == "NullTokenizer"
        if tokenizer_vocab is not None and (
            model_section.get("vocab_size") is None
            or (null_tokenizer and _bool(_get(cfg, "tokenizer.use_tokenizer_vocab_size")))
        ):
            # Bridge's setup (_validate_and_set_vocab_size): the tokenizer's size, padded. Only a
            # NullTokenizer's size is known from the config; another tokenizer's comes from its files.
            model_section.update(vocab_size=tokenizer_vocab, should_pad_vocab=True)
            notes.append("model.vocab_size from tokenizer.vocab_size, padded as Bridge's setup does")
        shape, source = shape_from_config(model_section), "config model section"
    else:
        raise ModelError("nothing to size: give a CONFIG with a model section, --model NAME or --params N")
    if shape is not None:
        counts = count_parameters(shape, par.tp, par.pp, par.ep, par.etp)
        if shape.num_layers < par.pp:
            raise ModelError(f"pipeline size {par.pp} exceeds num_layers {shape.num_layers}")
    else:
        counts = _counts_from_params(float(params), par)
    precision = precision_from_config(cfg)
    if precision.param_bytes == FP32:
        notes.append(
            "the config enables neither bf16 nor fp16 (model.bf16, mixed_precision): fp32 training "
            "assumed; if your recipe sets mixed_precision, add model.bf16=true"
        )
    act = activations = megatron_lm = None
    if shape is not None:
        act = activation_settings(
            cfg, shape, seq_length=seq_length, micro_batch_size=micro_batch_size, dp=par.dp, builtin=model is not None
        )
        activations = activation_bytes(shape, act, tp=par.tp, pp=par.pp, cp=par.cp)
        megatron_lm = megatron_activation_bytes(shape, act, tp=par.tp, pp=par.pp, cp=par.cp)
    rows = {
        s: strategy_memory(s, counts, precision, dp=par.dp, cp=par.cp, tp=par.tp, ep=par.ep, etp=par.etp)
        for s in _resolve_strategies(strategies)
    }
    return Estimate(
        shape, counts, par, precision, act, activations, megatron_lm, rows, configured_strategy(cfg), source, notes
    )


def smallest_dp(est: Estimate, strategy: str, gpu_mem_gib: float) -> int | None:
    """Smallest data-parallel size at which ``strategy`` fits in ``gpu_mem_gib`` (None: never).

    Every term but one shrinks or stays as DP grows, so a bisection is exact. The exception
    is ``optim_grads``: its gradient buckets (``max(40e6, 1e6 x DP x CP)`` elements) grow
    with DP, and so does its reduce-scatter queue; it is scanned upwards instead.
    """
    limit = gpu_mem_gib * GIB
    act = est.activations or 0.0
    par = est.parallel

    def fits(dp: int) -> bool:
        row = strategy_memory(strategy, est.counts, est.precision, dp=dp, cp=par.cp, tp=par.tp, ep=par.ep, etp=par.etp)
        return row.total(act) <= limit

    if strategy == "optim_grads":
        return next((dp for dp in range(1, MAX_DP_SEARCH + 1) if fits(dp)), None)
    if not fits(MAX_DP_SEARCH):
        return None
    lo, hi = 1, MAX_DP_SEARCH
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _gib(x: float | None) -> float | None:
    return None if x is None else round(x / GIB, 3)


def _dtype_name(nbytes: int, half: str = "bf16") -> str:
    return {4: "fp32", 2: half, 1: "fp8"}.get(nbytes, f"{nbytes} bytes")


def assumptions(est: Estimate) -> dict:
    p, a = est.precision, est.activation
    half = "fp16" if p.param_dtype == "fp16" else "bf16"
    out = {
        "params_dtype": p.param_dtype,
        "ddp_distopt_grad_dtype": f"{_dtype_name(p.ddp_grad_bytes, half)} (ddp.grad_reduce_in_fp32)",
        "fsdp_grad_dtype": f"{_dtype_name(p.fsdp_grad_bytes, half)} (ddp.megatron_fsdp_main_grads_dtype; "
        "Megatron FSDP does not read grad_reduce_in_fp32)",
        "fsdp_main_params_dtype": _dtype_name(p.fsdp_main_bytes) if p.fsdp_main_bytes else "none",
        "optimizer": (
            "adam, precision-aware (TE FusedAdam): main "
            f"{_dtype_name(p.master_bytes)}, exp_avg {_dtype_name(p.exp_avg_bytes)}, "
            f"exp_avg_sq {_dtype_name(p.exp_avg_sq_bytes)}"
            if p.precision_aware
            else "adam: fp32 main weights + fp32 exp_avg + fp32 exp_avg_sq"
        ),
        "optimizer_cpu_offload_fraction": p.optimizer_offload_fraction,
        "sharding_degree": f"N = DP x CP = {est.parallel.dp * est.parallel.cp} (experts: DP x CP x TP / (EP x ETP))",
        "gpu": "most-loaded rank: first pipeline stage, embedding included",
        "model_state": "params + grads + optimizer + persistent Megatron FSDP buffers (preserved "
        "embedding/output copies, double buffers); memory_allocated() between steps is "
        "after_step = model state + the optimizer-step fp32 gradient copy, freed only when "
        "the next step zeroes gradients",
        "total": "model state + max(activations + buffers alive at the activation peak, "
        "later reduce-scatter queue, optimizer-step fp32 gradient copy); or the model-construction "
        "peak when larger (optim_grads_params without init_model_with_meta_device)",
        "not_counted": "CUDA context and NCCL memory (outside max_memory_allocated), allocator "
        "fragmentation, cuBLAS/TE workspaces (~0.1-0.5 GiB): keep 5-10% headroom",
        "sources": [
            "megatron/training/theoretical_memory_usage.py (18 and 6 + 12/N bytes/param; activations)",
            "megatron/bridge/training/utils/theoretical_memory_utils.py (Bridge's estimator, CP division)",
            "megatron_fsdp/param_and_grad_buffer.py (_init_each_parameter_group_buffers, "
            "AllGatherPipeline, GradReducePipeline, update_main_grads)",
            "megatron_fsdp/megatron_fsdp.py (suggested_communication_unit_size, FSDP units)",
            "megatron/core/optimizer/distrib_optimizer.py, optimizer.py, optimizer_config.py",
            "Korthikanti et al. 2022, arXiv:2205.05198, Table 2",
        ],
    }
    if a is not None:
        out.update(
            {
                "seq_length": a.seq_length,
                "micro_batch_size": a.micro_batch_size,
                "num_microbatches": a.num_microbatches,
                "sequence_parallel": a.sequence_parallel and est.parallel.tp > 1,
                "recompute": a.recompute_granularity or "none (flash attention: no s^2 score matrix stored)",
                "cpu_offloaded_activation_layers": a.offload_layers,
                "activation_formula": "Korthikanti et al. 2022 per-tensor decomposition sized for this model "
                "(GQA, gated FFN, dropout, fp32 loss softmax); see references/memory.md",
                "megatron_lm_activations_gib": _gib(est.megatron_lm_activations),
                "hidden_dropout": a.hidden_dropout,
                "bias_activation_fusion": a.bias_activation_fusion,
                "gradient_accumulation_fusion": a.gradient_accumulation_fusion,
            }
        )
    if est.notes:
        out["notes"] = list(est.notes)
    return out


def report(
    cfg: Mapping | None = None,
    *,
    params=None,
    model=None,
    dp=None,
    tp=None,
    pp=None,
    cp=None,
    ep=None,
    strategies=("all",),
    seq_length=None,
    micro_batch_size=None,
    gpu_mem_gib=None,
) -> dict:
    """The JSON object ``mfsdp.py memory --format json`` prints.

    ``{"model", "parallelism", "gpu_mem_gib", "strategies": [{"name", "params_gib",
    "grads_gib", "optimizer_gib", "buffers_gib", "activations_gib", "total_gib", "fits",
    "model_state_gib", "step_transient_gib", "init_peak_gib", "after_step_gib",
    "smallest_dp_that_fits", "configured", "notes"}], "assumptions": {...}}``.
    ``after_step_gib`` (model state + step copy + the layers ``start_param_sync`` gathers
    right after the step) is what ``torch.cuda.memory_allocated()`` shows between training
    steps: Bridge's ``train_step`` zeroes gradients (and drops the copy) only when the next
    step starts. ``fits`` and ``smallest_dp_that_fits`` are
    None without ``gpu_mem_gib``. Raises ``ModelError`` (a ValueError) for bad input.
    """
    if gpu_mem_gib is not None:
        gpu_mem_gib = _positive(gpu_mem_gib, "--gpu-mem-gib", "a number of GiB")
    est = estimate(
        cfg,
        params=params,
        model=model,
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        strategies=strategies,
        seq_length=seq_length,
        micro_batch_size=micro_batch_size,
    )
    act = est.activations
    rows = []
    for name, row in est.rows.items():
        total = row.total(act or 0.0)
        notes = list(row.notes)
        if row.init_peak and total == row.init_peak:
            notes.append(
                "the peak is model construction: the model is built unsharded on each GPU before "
                "sharding; model.init_model_with_meta_device=true avoids it"
            )
        rows.append(
            {
                "name": name,
                "params_gib": _gib(row.params),
                "grads_gib": _gib(row.grads),
                "optimizer_gib": _gib(row.optimizer),
                "buffers_gib": _gib(row.buffers(act or 0.0)),
                "activations_gib": _gib(act),
                "total_gib": _gib(total),
                "fits": None if gpu_mem_gib is None else total <= gpu_mem_gib * GIB,
                "model_state_gib": _gib(row.model_state),
                "step_transient_gib": _gib(row.step_transient),
                "init_peak_gib": _gib(row.init_peak),
                "after_step_gib": _gib(row.after_step),
                "smallest_dp_that_fits": None if gpu_mem_gib is None else smallest_dp(est, name, gpu_mem_gib),
                "configured": name == est.configured,
                "notes": notes,
            }
        )
    shape = est.shape
    return {
        "model": {
            "name": shape.name if shape else None,
            "source": est.source,
            "params": est.counts.total,
            "params_billions": round(est.counts.total / 1e9, 3),
            "params_per_gpu": round(est.counts.gpu_dense + est.counts.gpu_experts),
            "padded_vocab": est.counts.padded_vocab or None,
        },
        "parallelism": {
            "dp": est.parallel.dp,
            "tp": est.parallel.tp,
            "pp": est.parallel.pp,
            "cp": est.parallel.cp,
            "ep": est.parallel.ep,
        },
        "gpu_mem_gib": gpu_mem_gib,
        "strategies": rows,
        "assumptions": assumptions(est),
    }


def model_state(cfg: Mapping | None = None, **kwargs) -> dict[str, dict[str, float]]:
    """Model-state bytes per strategy, for comparison with a measured ``memory_allocated()``.

    Same arguments as ``report`` (less ``gpu_mem_gib``). Per strategy: ``params``,
    ``grads``, ``optimizer``, ``buffers_persistent``, ``model_state`` (their sum),
    ``step_transient`` (the fp32 gradient copy alive from the optimizer step to the next
    step's ``zero_grad_buffer``), ``gathered_after_step`` (optim_grads_params at DP x CP > 1:
    the layers ``start_param_sync`` all-gathers for the next forward) and ``after_step``
    (their sum with the model state: what ``memory_allocated()`` reads between steps, e.g.
    in a Bridge step-end callback), in bytes.
    """
    est = estimate(cfg, **kwargs)
    return {
        name: {
            "params": row.params,
            "grads": row.grads,
            "optimizer": row.optimizer,
            "buffers_persistent": row.buffers_persistent,
            "model_state": row.model_state,
            "step_transient": row.step_transient,
            "gathered_after_step": row.gathered_after_step,
            "after_step": row.after_step,
        }
        for name, row in est.rows.items()
    }
