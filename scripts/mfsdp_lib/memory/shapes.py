"""Model shapes and parameter counting, per model family.

A ``Shape`` comes from the ``model`` section of a Bridge config, a built-in shape
(``BUILTIN_SHAPES``: public Hugging Face configs) or ``--params``; ``count_parameters``
turns it into the parameters each model-parallel rank holds (dense layers, MoE experts,
embeddings with Megatron's vocabulary padding, tied output layer).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .common import ModelError, _bool, _int

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
_LLAMA_COMMON: dict[str, Any] = dict(
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
        every = _int(freq, "model.moe_layer_freq", default=1)  # Megatron's default: every layer is MoE
        return [i % every == 0 for i in range(self.num_layers)]


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
