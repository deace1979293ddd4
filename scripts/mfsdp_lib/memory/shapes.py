"""Model shapes and parameter counting, per model family.

A ``Shape`` comes from the ``model`` section of a Bridge config, a built-in shape
(``BUILTIN_SHAPES``: public Hugging Face configs) or ``--params``; ``count_parameters``
turns it into the parameters each model-parallel rank holds (dense layers, MoE experts,
embeddings with Megatron's vocabulary padding, tied output layer).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
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

# Megatron-Core defaults a partial config may leave out (megatron/core/transformer/transformer_config.py).
MLA_DEFAULTS = dict(q_lora_rank=512, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128)
MAMBA_EXPAND = 2  # MambaMixer(expand=2): d_inner = 2 x hidden unless mamba_num_heads is set (ssm/mamba_mixer.py)
MAMBA_CONV_KERNEL = 4  # MambaMixer(d_conv=4): conv1d weight [conv_dim, 1, 4] (ssm/mamba_mixer.py)
# Hybrid layer symbols (megatron/core/models/hybrid/hybrid_layer_allocation.py, class Symbols).
HYBRID_SYMBOLS = {"M": "mamba", "*": "attention", "+": "mla", "-": "mlp", "E": "moe", "G": "gdn", "D": "dsa"}
HYBRID_UNSUPPORTED = {"D": "DeepSeek sparse attention"}
# ``model.experimental_attention_variant`` (transformer_config.py:294; Bridge's DeepSeek-V4 provider
# adds "dsv4_hybrid", models/model_provider.py:173): sized ones, and a name for the refusal of the rest.
SIZED_ATTENTION_VARIANTS = ("dsa", "gated_delta_net")
UNSIZED_ATTENTION_VARIANTS = {
    "dsv4_hybrid": "DeepSeek-V4's hybrid attention",
}
# Gated delta net (linear attention) defaults of Megatron-Core's TransformerConfig (transformer_config.py:356-368):
# conv kernel, query/key head dim, value head dim, query/key heads, value heads.
GDN_DEFAULTS = dict(
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
)


@dataclass(frozen=True)
class Shape:
    """A model's shape, with Megatron-Core ``TransformerConfig`` / Bridge provider field names and defaults."""

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
    moe_latent_size: int | None = None
    # Multi-latent attention (MLATransformerConfig, transformer_config.py:2909-2921).
    multi_latent_attention: bool = False
    q_lora_rank: int | None = MLA_DEFAULTS["q_lora_rank"]  # None: queries are not compressed
    kv_lora_rank: int = MLA_DEFAULTS["kv_lora_rank"]
    qk_head_dim: int = MLA_DEFAULTS["qk_head_dim"]
    qk_pos_emb_head_dim: int = MLA_DEFAULTS["qk_pos_emb_head_dim"]
    v_head_dim: int = MLA_DEFAULTS["v_head_dim"]
    # Multi-token prediction depths (transformer_config.py:68, multi_token_prediction.py).
    mtp_num_layers: int = 0
    mtp_hybrid_override_pattern: str | None = None
    # Hybrid (Mamba) models: one symbol per layer (HybridModelProvider.hybrid_layer_pattern).
    hybrid_layer_pattern: str | None = None
    mamba_state_dim: int = 128  # transformer_config.py:1179
    mamba_head_dim: int = 64  # transformer_config.py:1182
    mamba_num_groups: int = 8  # transformer_config.py:1185
    mamba_num_heads: int | None = None  # transformer_config.py:1188: None = hidden x expand / head_dim
    # Extra norms per layer: Gemma 2/3 add post-attention and post-feed-forward norms
    # (Bridge models/gemma: Gemma2/Gemma3 layer specs); read from the provider's ``_target_``.
    layer_post_norms: int = 0
    # Gemma 3's rotary embedding: a local (sliding-window layers) and a global table, both kept in lru caches
    # between steps (Bridge models/gemma/gemma3_provider.py: Gemma3RotaryEmbedding); read from the provider's
    # ``_target_`` (``terms.rope_cache_bytes`` sizes the caches).
    rope_local_global: bool = False
    # "learnable": one softmax offset (attention sink) per head (dot_product_attention.py:126-136).
    softmax_type: str = "vanilla"
    # OLMoE's attention (Bridge models/olmoe/olmoe_provider.py:120-135, OLMoESelfAttention): q/k norms
    # over all heads (heads x head_dim) instead of Megatron-Core's per-head norms; read from ``_target_``.
    qk_layernorm_full_width: bool = False
    # DeepSeek sparse attention (experimental_attention_variant="dsa", transformer_config.py:294-316):
    # an MLA layer whose core attention carries a lightning indexer, built on the layers that compute
    # their own top-k (dsa.py:1578-1584; the others reuse an earlier layer's, is_dsa_skip_topk_layer).
    experimental_attention_variant: str | None = None
    dsa_indexer_n_heads: int | None = None
    dsa_indexer_head_dim: int | None = None
    dsa_indexer_topk: int | None = None  # keys each query keeps (None: unknown, sized at the sequence)
    dsa_indexer_topk_freq: int = 1
    dsa_indexer_skip_topk_offset: int = 0
    # Gated delta net (experimental_attention_variant="gated_delta_net", ssm/gated_delta_net/): which layers are
    # linear attention (``linear_attention_freq``: an int N, every N-th layer full attention, or a 0/1 list),
    # and the mixer's head sizes.
    linear_attention_freq: Any = None
    linear_conv_kernel_dim: int = GDN_DEFAULTS["linear_conv_kernel_dim"]
    linear_key_head_dim: int = GDN_DEFAULTS["linear_key_head_dim"]
    linear_value_head_dim: int = GDN_DEFAULTS["linear_value_head_dim"]
    linear_num_key_heads: int = GDN_DEFAULTS["linear_num_key_heads"]
    linear_num_value_heads: int = GDN_DEFAULTS["linear_num_value_heads"]
    # Gated attention (Qwen3-Next, Qwen3.5): linear_qkv also projects one sigmoid gate per query channel
    # (attention.py:1678-1680), applied to the attention output before linear_proj (attention.py:1605-1628).
    attention_output_gate: bool = False
    # A vision tower's parameters (VLMs), counted whole on the first pipeline stage's ranks.
    vision_params: int = 0
    vision_params_tp: int = 0  # of vision_params, the part split over TP
    # Of vision_params, the mergers (patch merger + deepstack mergers: the "vision projection"), and their TP part.
    vision_merger_params: int = 0
    vision_merger_params_tp: int = 0
    # The vision tower's linear layers as (module, in, out, count), which LoRA's target_modules also match.
    vision_linears: tuple = ()
    # Bridge's VLM freeze flags (Qwen3VLModelProvider and the other VL providers): Qwen3VLModel.freeze sets
    # requires_grad=False on the language model, the vision tower without its mergers, and the mergers
    # (qwen_vl/modelling_qwen3_vl/model.py:464-497; a frozen vision model keeps its mergers trainable unless
    # freeze_vision_projection is set too). Applied by the provider's provide (qwen3_vl_provider.py:167-172).
    freeze_language_model: bool = False
    freeze_vision_model: bool = False
    freeze_vision_projection: bool = False

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
        return self.norm(self.hidden_size)

    def norm(self, width: int) -> int:
        return width * (1 if self.normalization == "RMSNorm" else 2)

    @property
    def hybrid(self) -> bool:
        return bool(self.hybrid_layer_pattern)

    def padded_vocab(self, tp: int) -> int:
        """Megatron's padding: up to a multiple of make_vocab_size_divisible_by * TP."""
        if not self.should_pad_vocab:
            return self.vocab_size
        multiple = self.make_vocab_size_divisible_by * tp
        return int(math.ceil(self.vocab_size / multiple) * multiple)

    def moe_layers(self) -> list[bool]:
        if self.hybrid:
            return [k == "moe" for k in self.layer_kinds()]
        if not self.num_moe_experts:
            return [False] * self.num_layers
        freq = self.moe_layer_freq
        if isinstance(freq, str):  # Megatron-LM's "([0]*3+[1]*58)" spelling
            freq = _parse_layer_freq(freq, self.num_layers)
        if isinstance(freq, (list, tuple)):
            if len(freq) != self.num_layers:
                raise ModelError(f"model.moe_layer_freq has {len(freq)} entries for {self.num_layers} layers")
            return [bool(x) for x in freq]
        every = _int(freq, "model.moe_layer_freq", default=1)  # Megatron's default: every layer is MoE
        return [i % every == 0 for i in range(self.num_layers)]

    @property
    def gated_delta_net(self) -> bool:
        return self.experimental_attention_variant == "gated_delta_net"

    def linear_attention_layers(self) -> list[bool]:
        """Per decoder layer, whether it is a gated delta net (linear attention) layer.

        Megatron-Core's ``get_linear_attention_pattern`` (models/gpt/experimental_attention_variant_module_specs.py:
        402-436): an int N makes every N-th layer (1-indexed) full attention and the rest linear; a list is the
        pattern itself (1 linear, 0 full) and must have one entry per layer; unset is an error for this variant.
        """
        if not self.gated_delta_net:
            return [False] * self.num_layers
        freq = self.linear_attention_freq
        if isinstance(freq, str):  # Megatron-LM's "([1]*3+[0]*1)" spelling
            freq = _parse_layer_freq(freq, self.num_layers, "model.linear_attention_freq")
        if isinstance(freq, (list, tuple)):
            if len(freq) != self.num_layers:
                raise ModelError(
                    f"model.linear_attention_freq has {len(freq)} entries for {self.num_layers} layers "
                    "(experimental_attention_variant_module_specs.py:416-420 asserts they agree)"
                )
            return [bool(x) for x in freq]
        every = _int(freq, "model.linear_attention_freq")
        if not every:
            raise ModelError(
                "model.experimental_attention_variant='gated_delta_net' needs model.linear_attention_freq "
                "(transformer_config.py:1348-1350)"
            )
        return [(i + 1) % every != 0 for i in range(self.num_layers)]

    def layer_kinds(self) -> list[str]:
        """One kind per decoder layer: ``attention+mlp``/``attention+moe``/``mla+...`` for GPT
        models, ``gdn+...`` for a gated delta net layer; a hybrid model's layers are single-purpose
        (``mamba``, ``attention``, ``mla``, ``gdn``, ``mlp``, ``moe``), one per pattern symbol
        (models/hybrid/hybrid_block.py:150-200)."""
        if self.hybrid:
            return [HYBRID_SYMBOLS[c] for c in _hybrid_main(self.hybrid_layer_pattern or "")]
        mixer = "mla" if self.multi_latent_attention else "attention"
        return [
            f"{'gdn' if linear else mixer}+{'moe' if m else 'mlp'}"
            for linear, m in zip(self.linear_attention_layers(), self.moe_layers(), strict=True)
        ]

    def mtp_kinds(self) -> list[list[str]]:
        """Layer kinds inside each MTP depth: a GPT model repeats its last decoder layer
        (gpt_layer_specs.py get_gpt_mtp_block_spec: ``spec.layer_specs[-1]``); a hybrid model
        its MTP pattern (the part after ``/``, or ``mtp_hybrid_override_pattern``)."""
        if self.hybrid:
            pattern = self.hybrid_layer_pattern or ""
            depths = pattern.split("/")[1:]
            if not depths and self.mtp_hybrid_override_pattern and self.mtp_num_layers:
                depths = [self.mtp_hybrid_override_pattern] * self.mtp_num_layers
            return [[HYBRID_SYMBOLS[c] for c in _hybrid_main(d)] for d in depths]
        if not self.mtp_num_layers:
            return []
        return [[self.layer_kinds()[-1]] for _ in range(self.mtp_num_layers)]


def _parse_layer_freq(text: str, layers: int, key: str = "model.moe_layer_freq") -> list[int]:
    """``([0]*3+[1]*58)`` -> a list, without eval: terms ``[x]*n`` joined by ``+``."""
    body = text.strip().strip("()").replace(" ", "")
    out: list[int] = []
    for term in body.split("+"):
        m = re.fullmatch(r"\[([01](?:,[01])*)\](?:\*(\d+))?", term)
        if not m:
            raise ModelError(f"{key} {text!r} is not an integer, a list, or '[0]*k+[1]*m'")
        out += [int(x) for x in m.group(1).split(",")] * int(m.group(2) or 1)
    if len(out) != layers:
        raise ModelError(f"{key} {text!r} gives {len(out)} entries for {layers} layers")
    return out


def _hybrid_main(pattern: str) -> str:
    """The decoder part of a hybrid pattern: before the first ``/``, pipeline ``|`` removed."""
    main = pattern.split("/")[0].replace("|", "")
    bad = sorted({c for c in main if c not in HYBRID_SYMBOLS})
    if bad:
        raise ModelError(
            f"model.hybrid_layer_pattern has unknown symbol(s) {''.join(bad)!r} "
            f"(known: {''.join(HYBRID_SYMBOLS)}; models/hybrid/hybrid_layer_allocation.py Symbols)"
        )
    unsupported = sorted({HYBRID_UNSUPPORTED[c] for c in main if c in HYBRID_UNSUPPORTED})
    if unsupported:
        raise ModelError(f"model.hybrid_layer_pattern: {', '.join(unsupported)} layers are not sized yet")
    return main


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
    "moe_latent_size",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "mamba_state_dim",
    "mamba_head_dim",
    "mamba_num_groups",
    "mamba_num_heads",
    "dsa_indexer_n_heads",
    "dsa_indexer_head_dim",
    "dsa_indexer_topk",
    "dsa_indexer_topk_freq",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
)
_SHAPE_ZERO_OK = (
    "mtp_num_layers",
    "layer_post_norms",
    "vision_params",
    "vision_params_tp",
    "vision_merger_params",
    "vision_merger_params_tp",
    "dsa_indexer_skip_topk_offset",
)
_SHAPE_BOOLS = (
    "gated_linear_unit",
    "add_bias_linear",
    "add_qkv_bias",
    "qk_layernorm",
    "rope_local_global",
    "share_embeddings_and_output_weights",
    "should_pad_vocab",
    "moe_shared_expert_gate",
    "multi_latent_attention",
    "qk_layernorm_full_width",
    "attention_output_gate",
    "freeze_language_model",
    "freeze_vision_model",
    "freeze_vision_projection",
)
FREEZE_KEYS = ("freeze_language_model", "freeze_vision_model", "freeze_vision_projection")
_REQUIRED = ("hidden_size", "num_layers", "num_attention_heads", "vocab_size")


# Shape keys a partial model section commonly leaves out, whose Bridge default changes the parameter count a lot
# (GPTModelProvider / TransformerConfig defaults: a plain GPT with a 4h non-gated MLP, tied embeddings, biases,
# LayerNorm and learned positions). A Llama-shaped section without gated_linear_unit and
# share_embeddings_and_output_weights counts 5.6 B instead of 8.0 B. Named when they come from the default.
DEFAULT_NOTED_KEYS = (
    "gated_linear_unit",
    "share_embeddings_and_output_weights",
    "ffn_hidden_size",
    "num_query_groups",
    "kv_channels",
    "add_bias_linear",
    "normalization",
    "position_embedding_type",
)
DEFAULT_NOTED_MOE_KEYS = ("moe_ffn_hidden_size", "moe_router_topk", "moe_shared_expert_intermediate_size")
DEFAULT_NOTED_MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
DEFAULT_NOTED_MAMBA_KEYS = ("mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads")
DEFAULT_NOTED_GDN_KEYS = tuple(GDN_DEFAULTS)


def defaulted_keys(model: Mapping, shape: Shape, given: Collection[str] | None = None) -> dict[str, Any]:
    """``{"model.KEY": value used}`` for the ``DEFAULT_NOTED_*`` keys the model section did not set.

    ``given``: the dotted keys the user wrote (file and overrides); None takes the section's own keys as given.
    Derived defaults are given their value (``ffn_hidden_size``: 4 x hidden, ``num_query_groups``: the heads).
    """
    keys = list(DEFAULT_NOTED_KEYS)
    if shape.num_moe_experts:
        keys += DEFAULT_NOTED_MOE_KEYS
    if shape.multi_latent_attention:
        keys += DEFAULT_NOTED_MLA_KEYS
    if shape.hybrid:
        keys += DEFAULT_NOTED_MAMBA_KEYS
    if any("gdn" in k for k in shape.layer_kinds()):
        keys += DEFAULT_NOTED_GDN_KEYS
    derived = {"ffn_hidden_size": shape.ffn, "num_query_groups": shape.groups, "kv_channels": shape.head_dim}
    out: dict[str, Any] = {}
    for key in keys:
        if (f"model.{key}" in given) if given is not None else (key in model):
            continue
        if shape.multi_latent_attention and key in ("num_query_groups", "kv_channels"):
            continue  # MLA sizes its heads from its own ranks
        out[f"model.{key}"] = derived.get(key, getattr(shape, key))
    return out


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


# Bridge's diffusion models (Wan, FLUX: megatron/bridge/diffusion/models/): a GPT-shaped count at model.seq_length
# would size their activations at a sequence the model never sees (wan_provider.py: "unused for images/videos").
DIFFUSION_PACKAGE = "megatron.bridge.diffusion."


def shape_from_config(model: Mapping, name: str = "config") -> Shape:
    """Read a ``Shape`` from a Bridge ``model`` section (GPT, MLA and hybrid provider field names)."""
    model = dict(model)
    target = str(model.get("_target_") or "")
    if target.startswith(DIFFUSION_PACKAGE):
        raise ModelError(
            f"model._target_ {target.rsplit('.', 1)[-1]}: diffusion models are not sized yet: their layers see "
            "the dataset's latent tokens (frames x height x width latents over the patch size, e.g. 37,440 per "
            "micro-batch for Bridge's Wan recipes), not model.seq_length, which Bridge leaves unused for them "
            "(pass --params N for a count-only estimate)"
        )
    if "layer_post_norms" not in model and re.search(r"Gemma[23]", target):
        model["layer_post_norms"] = 2
    if "rope_local_global" not in model and re.search(r"\.Gemma3\w*ModelProvider$", target):
        model["rope_local_global"] = True  # Gemma3ModelProvider.provide, and Gemma3VLModelProvider (a subclass)
    spec = model.get("transformer_layer_spec")
    spec_target = str(spec.get("_target_") or "") if isinstance(spec, Mapping) else str(spec or "")
    if "qk_layernorm_full_width" not in model and (
        target.endswith("OlMoEModelProvider") or spec_target.endswith("olmoe_layer_spec")
    ):
        model["qk_layernorm_full_width"] = True
    if not re.search(r"Qwen3VL|Qwen35VL", target):
        # The freeze flags are read for the providers that build Qwen3VLModel (its freeze is traced, Shape.freeze_*).
        # Other VL providers carry flags of the same names with their own freeze; ignored there, they leave every
        # parameter trainable, which can only over-predict.
        for key in FREEZE_KEYS:
            model.pop(key, None)
    vision = model.get("vision_config")
    if "vision_params" not in model and isinstance(vision, Mapping) and re.search(r"Qwen3VL|Qwen35VL", target):
        # Bridge's Qwen3-VL and Qwen3.5-VL providers carry the HF vision_config; both build the same
        # Qwen3VLVisionModel from it (qwen_vl/qwen35_vl_provider.py:502-527, _qwen35_build_vision_encoder_spec).
        from .hf import qwen3_vl_vision_params

        model["vision_params"], model["vision_params_tp"] = qwen3_vl_vision_params(vision, split=True) or (0, 0)
        if "vision_merger_params" not in model:
            merger = qwen3_vl_vision_params(vision, split="mergers") or (0, 0)
            model["vision_merger_params"], model["vision_merger_params_tp"] = merger
        if "vision_linears" not in model:
            model["vision_linears"] = qwen3_vl_vision_params(vision, split="linears") or ()
    pattern = model.get("hybrid_layer_pattern") or model.get("hybrid_override_pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise ModelError(f"model.hybrid_layer_pattern must be a string of layer symbols, got {pattern!r}")
        model["hybrid_layer_pattern"] = pattern
        if model.get("num_layers") in (None, 0):  # HybridModelProvider.finalize derives it from the pattern
            model["num_layers"] = len(_hybrid_main(pattern))
    missing = [f"model.{k}" for k in _REQUIRED if model.get(k) in (None, 0)]
    if missing:
        raise ModelError(
            f"config lacks {', '.join(missing)}: cannot count parameters (set it, e.g. model.vocab_size=N for "
            "the tokenizer's size, or pass --hf-config PATH, --model NAME or --params N)"
        )
    kwargs: dict[str, Any] = {}
    for key in _SHAPE_FIELDS:
        if key not in model:
            continue
        value = model[key]
        if value is None:
            if key == "q_lora_rank" and "q_lora_rank" in model:
                kwargs[key] = None  # explicitly uncompressed queries (DeepSeek-V2-Lite)
            continue
        if key in _SHAPE_INTS:
            value = _int(value, f"model.{key}")
        elif key in _SHAPE_ZERO_OK:
            value = _int(value, f"model.{key}", minimum=0)
        elif key in _SHAPE_BOOLS:
            value = _bool(value)
        elif key in (
            "normalization",
            "position_embedding_type",
            "hybrid_layer_pattern",
            "mtp_hybrid_override_pattern",
            "softmax_type",
            "experimental_attention_variant",
        ):
            value = str(value)
        kwargs[key] = value
    shape = Shape(name=name, **kwargs)
    variant = shape.experimental_attention_variant
    if variant is not None and variant not in SIZED_ATTENTION_VARIANTS:
        what = UNSIZED_ATTENTION_VARIANTS.get(variant, "its")
        raise ModelError(
            f"model.experimental_attention_variant={variant!r}: {what} layers are not sized yet "
            "(pass --params N for a count-only estimate)"
        )
    if variant == "dsa":
        if not shape.multi_latent_attention:
            raise ModelError(
                "model.experimental_attention_variant='dsa' needs model.multi_latent_attention=true "
                "(experimental_attention_variant_module_specs.py:85: only MLA supports sparse attention)"
            )
        lacking = [f"model.{k}" for k in ("dsa_indexer_n_heads", "dsa_indexer_head_dim") if not kwargs.get(k)]
        if lacking:
            raise ModelError(f"config lacks {', '.join(lacking)}: the DSA indexer's size (dsa.py:1122-1123)")
    if variant == "gated_delta_net" or "gdn" in (shape.layer_kinds() if shape.hybrid else ()):
        _check_gdn(shape)
    if shape.hybrid and len(_hybrid_main(shape.hybrid_layer_pattern or "")) != shape.num_layers:
        raise ModelError(
            f"model.num_layers ({shape.num_layers}) does not match the {len(_hybrid_main(shape.hybrid_layer_pattern or ''))}"
            " layers of model.hybrid_layer_pattern (HybridModelProvider.finalize asserts they agree)"
        )
    return shape


def _check_gdn(shape: Shape) -> None:
    """What Megatron-Core's TransformerConfig asserts of a gated delta net model (transformer_config.py:1347-1371):
    the layer pattern is set (hybrid models set it with ``G`` symbols instead) and the value heads are a
    multiple of the query/key heads (GatedDeltaNet repeats q and k to the value heads, common.py:417-421)."""
    if not shape.hybrid:
        shape.linear_attention_layers()  # raises on an unset or mis-sized linear_attention_freq
    if shape.linear_num_value_heads % shape.linear_num_key_heads:
        raise ModelError(
            f"model.linear_num_value_heads ({shape.linear_num_value_heads}) must be a multiple of "
            f"model.linear_num_key_heads ({shape.linear_num_key_heads}) (transformer_config.py:1368-1371)"
        )


# --------------------------------------------------------------------------- parameter counting


@dataclass(frozen=True)
class Part:
    """One parameter tensor (or a group of equal ones) of a layer.

    ``split``: how it is divided among ranks: ``tp`` over tensor parallelism (column/row
    parallel weights, Mamba's per-head tensors), ``rep`` whole on every rank (norms,
    row-parallel biases, routers, ``parallel_mode='duplicated'`` linears), ``ep`` over
    EP x ETP (routed experts). ``matrix``: a 2-D weight outside the embedding and output
    layer, which Muon optimizes (everything else goes to its scalar optimizer,
    optimizer/emerging_optimizers.py:128 ``_is_nonlinear_or_embedding``). ``module``/``fan``:
    the Megatron module name and (in, out) per copy, for LoRA adapters.
    """

    term: str
    numel: int
    split: str
    matrix: bool = False
    module: str = ""
    fan: tuple[int, int] = (0, 0)
    copies: int = 1


def _linear(term: str, module: str, n_in: int, n_out: int, split: str, copies: int = 1) -> Part:
    return Part(term, n_in * n_out * copies, split, True, module, (n_in, n_out), copies)


def _attention_parts(s: Shape) -> list[Part]:
    """Self-attention (attention.py SelfAttention): fused QKV (column parallel, its input norm
    fused in by TELayerNormColumnParallelLinear), output projection (row parallel), QK norms."""
    h, hd, heads, groups = s.hidden_size, s.head_dim, s.num_attention_heads, s.groups
    # With attention_output_gate, linear_qkv also projects a gate per query channel (attention.py:1678-1680).
    qkv_out = (heads * (2 if s.attention_output_gate else 1) + 2 * groups) * hd
    parts = [
        Part("norms", s.norm(h), "rep"),
        _linear("attention", "linear_qkv", h, qkv_out, "tp"),
        _linear("attention", "linear_proj", heads * hd, h, "tp"),
    ]
    if s.add_bias_linear or s.add_qkv_bias:
        parts.append(Part("attention", qkv_out, "tp"))  # column-parallel bias: split with the output
    if s.add_bias_linear:
        parts.append(Part("attention", h, "rep"))  # row-parallel bias: whole on every rank
    if s.qk_layernorm:
        # q_layernorm, k_layernorm over head_dim (attention.py); OLMoE's over heads x head_dim, whole
        # on every rank (Bridge olmoe_provider.py:120-135).
        width = heads * hd if s.qk_layernorm_full_width else hd
        parts.append(Part("norms", 2 * s.norm(width), "rep"))
    if s.softmax_type == "learnable":
        parts.append(Part("attention", heads, "tp"))  # softmax_offset, one per head
    return parts


def _mla_parts(s: Shape, layer_number: int = 1) -> list[Part]:
    """Multi-latent attention (transformer/multi_latent_attention.py:477-630): query
    projection (direct, or down ``h x q_lora`` duplicated + up ``q_lora x heads x q_head_dim``
    column parallel), KV down ``h x (kv_lora + rope dim)`` duplicated, KV up
    ``kv_lora x heads x (qk + v)`` column parallel, q/kv norms when ``qk_layernorm``, output
    ``heads x v_head_dim x h`` row parallel (attention.py, ``query_projection_size``); with DeepSeek
    sparse attention, the indexer on the layers that compute their top-k (``dsa_computes_topk``)."""
    h, heads = s.hidden_size, s.num_attention_heads
    q_head = s.qk_head_dim + s.qk_pos_emb_head_dim
    parts = [Part("norms", s.norm(h), "rep")]
    if s.q_lora_rank is None:
        parts.append(_linear("attention", "linear_q_proj", h, heads * q_head, "tp"))
    else:
        parts.append(_linear("attention", "linear_q_down_proj", h, s.q_lora_rank, "rep"))
        parts.append(_linear("attention", "linear_q_up_proj", s.q_lora_rank, heads * q_head, "tp"))
        if s.qk_layernorm:
            parts.append(Part("norms", s.norm(s.q_lora_rank), "rep"))
    parts.append(_linear("attention", "linear_kv_down_proj", h, s.kv_lora_rank + s.qk_pos_emb_head_dim, "rep"))
    parts.append(
        _linear("attention", "linear_kv_up_proj", s.kv_lora_rank, heads * (s.qk_head_dim + s.v_head_dim), "tp")
    )
    if s.qk_layernorm:
        parts.append(Part("norms", s.norm(s.kv_lora_rank), "rep"))
    parts.append(_linear("attention", "linear_proj", heads * s.v_head_dim, h, "tp"))
    if s.add_bias_linear:
        parts.append(Part("attention", h, "rep"))
    if s.experimental_attention_variant == "dsa" and dsa_computes_topk(s, layer_number):
        parts += _dsa_indexer_parts(s)
    return parts


def dsa_computes_topk(s: Shape, layer_number: int) -> bool:
    """Whether 1-indexed ``layer_number`` computes its own DSA top-k, and so builds an indexer.

    Megatron-Core (transformer/experimental_attention_variant/dsa.py:37-47 ``is_dsa_skip_topk_layer``,
    used at dsa.py:1574-1584): with ``dsa_indexer_topk_freq`` f > 1, a layer reuses an earlier layer's
    top-k (and builds no indexer) unless ``max(layer - max(offset, 1), 0) % f == 0``. MTP layers count
    from 1 again (multi_token_prediction.py:1036-1043, transformer_layer.py:343-344).
    """
    freq = s.dsa_indexer_topk_freq or 1
    if freq <= 1:
        return True
    offset = max(s.dsa_indexer_skip_topk_offset or 0, 1)
    return max(layer_number - offset, 0) % freq == 0


def _dsa_indexer_parts(s: Shape) -> list[Part]:
    """The DSA lightning indexer (dsa.py:1159-1205), every linear ``parallel_mode="duplicated"``
    (whole on each TP rank): ``linear_wq_b`` ``q_lora x (n_heads x head_dim)`` (``q_lora`` is
    ``hidden`` without query compression, dsa.py:1116-1120), ``linear_wk`` ``h x head_dim``, ``k_norm``
    a LayerNorm (weight and bias) over ``head_dim`` whatever ``normalization`` says (dsa.py:1183-1192),
    ``linear_weights_proj`` ``h x n_heads``; no biases."""
    h = s.hidden_size
    heads, dim = s.dsa_indexer_n_heads or 0, s.dsa_indexer_head_dim or 0
    q_in = s.q_lora_rank if s.q_lora_rank is not None else h
    return [
        _linear("dsa_indexer", "linear_wq_b", q_in, heads * dim, "rep"),
        _linear("dsa_indexer", "linear_wk", h, dim, "rep"),
        Part("dsa_indexer", 2 * dim, "rep"),
        _linear("dsa_indexer", "linear_weights_proj", h, heads, "rep"),
    ]


def _mlp_parts(
    s: Shape, ffn: int, term: str, split: str = "tp", copies: int = 1, width: int | None = None
) -> list[Part]:
    """FC1 ``in x ffn`` (x2 gated), FC2 ``ffn x out`` (mlp.py MLP, experts.py TEGroupedMLP)."""
    w = width or s.hidden_size
    glu = 2 if s.gated_linear_unit else 1
    parts = [
        _linear(term, "linear_fc1", w, ffn * glu, split, copies),
        _linear(term, "linear_fc2", ffn, w, split, copies),
    ]
    if s.add_bias_linear:
        parts.append(Part(term, ffn * glu * copies, split))
        parts.append(Part(term, w * copies, "rep" if split == "tp" else split))
    return parts


def _moe_parts(s: Shape) -> list[Part]:
    """MoE block (transformer/moe/moe_layer.py): pre-MLP norm, router ``E x h`` (+ bias,
    router.py:61-67), routed experts split over EP x ETP (experts.py:205-250; inputs of
    ``moe_latent_size`` with latent projections, moe_layer.py:265-295), shared expert
    (shared_experts.py, column/row parallel) and its gate ``1 x h`` (shared_experts.py:134)."""
    h, experts = s.hidden_size, s.num_moe_experts or 0
    parts = [Part("norms", s.norm(h), "rep"), Part("router", experts * h, "rep", True, "router", (h, experts))]
    if s.add_bias_linear:
        parts.append(Part("router", experts, "rep"))
    latent = s.moe_latent_size
    if latent:
        parts.append(_linear("experts_latent", "fc1_latent_proj", h, latent, "rep"))
        parts.append(_linear("experts_latent", "fc2_latent_proj", latent, h, "rep"))
        if s.add_bias_linear:
            parts.append(Part("experts_latent", latent + h, "rep"))
    parts += _mlp_parts(s, s.moe_ffn_hidden_size or s.ffn, "experts", "ep", experts, latent)
    shared = s.moe_shared_expert_intermediate_size or 0
    if shared:
        parts += _mlp_parts(s, shared, "shared_experts")
        if s.moe_shared_expert_gate:
            parts.append(Part("shared_experts", h, "rep", True))
    return parts


def _mamba_parts(s: Shape) -> list[Part]:
    """Mamba-2 mixer (ssm/mamba_mixer.py:279-460): in_proj ``h x (2 d_inner + 2 groups x
    state + heads)`` with its norm fused (TELayerNormColumnParallelLinear), depthwise conv1d
    weight ``[conv_dim, 1, 4]`` and bias, ``dt_bias``, ``A_log``, ``D`` per head, the gated
    RMSNorm over ``d_inner``, out_proj ``d_inner x h``; all split over TP but the input norm."""
    h = s.hidden_size
    if s.mamba_num_heads:
        heads, d_inner = s.mamba_num_heads, s.mamba_num_heads * s.mamba_head_dim
    else:
        d_inner = MAMBA_EXPAND * h
        if d_inner % s.mamba_head_dim:
            raise ModelError(
                f"Mamba d_inner = 2 x hidden_size ({d_inner}) must be divisible by model.mamba_head_dim "
                f"({s.mamba_head_dim}) (ssm/mamba_mixer.py:248)"
            )
        heads = d_inner // s.mamba_head_dim
    bc = 2 * s.mamba_num_groups * s.mamba_state_dim
    conv_dim = d_inner + bc
    return [
        Part("norms", s.norm(h), "rep"),
        _linear("mamba", "in_proj", h, 2 * d_inner + bc + heads, "tp"),
        Part("mamba", conv_dim * MAMBA_CONV_KERNEL + conv_dim, "tp"),
        Part("mamba", 3 * heads, "tp"),  # dt_bias, A_log, D
        Part("mamba", d_inner, "tp"),  # gated RMSNorm weight
        _linear("mamba", "out_proj", d_inner, h, "tp"),
    ]


def _gdn_parts(s: Shape) -> list[Part]:
    """Gated delta net mixer (ssm/gated_delta_net/common.py:_GDNBase.__init__, gdn.py:_setup_variant_attrs), built
    with its defaults ``bias=False``, ``conv_bias=False`` (the layer spec passes neither, transformer_layer.py:375):
    in_proj ``h x (2 qk + 2 v + 2 nv)`` (q, k, v, z, then beta and alpha, one per value head; common.py:195-217)
    column parallel with its input norm fused (TELayerNormColumnParallelLinear, experimental_attention_variant_
    module_specs.py:72); depthwise conv1d ``[conv_dim/TP, 1, kernel]`` over q, k, v (common.py:219-237); ``dt_bias``
    and ``A_log``, one per value head (common.py:239-253); the gated output norm over ``value_head_dim``, whole on
    every rank (common.py:256-261); out_proj ``v x h`` row parallel (common.py:267-280). Everything but the two
    norms is split over TP (``partition_dim`` 0 or the parallel linears)."""
    h = s.hidden_size
    qk = s.linear_num_key_heads * s.linear_key_head_dim
    v = s.linear_num_value_heads * s.linear_value_head_dim
    nv = s.linear_num_value_heads
    conv_dim = 2 * qk + v
    return [
        Part("norms", s.norm(h), "rep"),
        _linear("gdn", "in_proj", h, 2 * qk + 2 * v + 2 * nv, "tp"),
        Part("gdn", conv_dim * s.linear_conv_kernel_dim, "tp"),  # conv1d weight (3-D: not a Muon matrix)
        Part("gdn", 2 * nv, "tp"),  # dt_bias, A_log
        Part("norms", s.norm(s.linear_value_head_dim), "rep"),  # out_norm
        _linear("gdn", "out_proj", v, h, "tp"),
    ]


def _layer_parts(s: Shape, kind: str, layer_number: int = 1) -> list[Part]:
    parts: list[Part] = []
    if "+" in kind and s.layer_post_norms:
        parts.append(Part("norms", s.layer_post_norms * s.norm(s.hidden_size), "rep"))
    for piece in kind.split("+"):
        if piece == "attention":
            parts += _attention_parts(s)
        elif piece == "mla":
            parts += _mla_parts(s, layer_number)
        elif piece == "mlp":
            parts += [Part("norms", s.norm(s.hidden_size), "rep")] + _mlp_parts(s, s.ffn, "mlp")
        elif piece == "moe":
            parts += _moe_parts(s)
        elif piece == "mamba":
            parts += _mamba_parts(s)
        elif piece == "gdn":
            parts += _gdn_parts(s)
        else:  # pragma: no cover - layer_kinds only yields the kinds above
            raise ModelError(f"unknown layer kind {piece!r}")
    return parts


def _mtp_parts(s: Shape, kinds: list[str], depth: int = 1) -> list[Part]:
    """One MTP depth (transformer/multi_token_prediction.py:983-1055): enorm, hnorm,
    eh_proj ``2h x h`` (column parallel), its inner layer(s), final_layernorm. Its inner layer is
    numbered by depth from 1 (multi_token_prediction.py:949, 1036-1043)."""
    h = s.hidden_size
    parts = [Part("mtp", 3 * s.norm(h), "rep"), _linear("mtp", "eh_proj", 2 * h, h, "tp")]
    for kind in kinds:
        parts += [replace(p, term="mtp") for p in _layer_parts(s, kind, depth)]
    return parts


def _mtp_non_unit_items(s: Shape, tp: int) -> list[tuple[float, int]]:
    """One MTP depth's parameters outside its FSDP unit (its inner layer), in registration order
    (multi_token_prediction.py:983-1055): enorm and hnorm, eh_proj (a column-parallel ``[h / TP, 2h]``
    weight, rows of ``2h``), final_layernorm. As ``(numel on the GPU, numel of shape[1:])``
    items: Megatron FSDP puts them in the group of the embedding and output layer."""
    h = s.hidden_size
    norm = float(s.norm(h))
    return [(norm, 1), (norm, 1), (2 * h * h / tp, 2 * h), (norm, 1)]


@dataclass(frozen=True)
class Lora:
    """LoRA adapters (Bridge ``peft/lora.py`` LoRA: ``target_modules``, ``dim``): each targeted
    linear ``in x out`` gets ``linear_in`` ``in x dim`` and ``linear_out`` ``dim x out``
    (peft/utils.py ParallelLinearAdapter), split like the layer it adapts."""

    target_modules: tuple[str, ...] = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
    dim: int = 32
    # Routed experts' linears in one grouped GEMM (model.moe_grouped_gemm) with peft.share_expert_adapters (Bridge's
    # default True) get ONE adapter shared by the EP rank's local experts (peft/lora.py LoRA.transform:
    # use_per_expert_adapter is False, so a ParallelLinearAdapter of the per-expert in x out); otherwise one per expert.
    shared_expert_adapter: bool = False
    expert_dim: int | None = None  # peft.normalize_moe_lora: dim // moe_router_topk on expert linears (utils.py)


def _lora_numel(part: Part, lora: Lora | None, ep: int = 1) -> int:
    """Adapter parameters of ``part`` in the whole model. A shared expert adapter exists once per EP rank, so the
    model holds ``ep`` of them; divided by EP x ETP (``div["ep"]``) that leaves each GPU its one adapter's share."""
    if lora is None or not part.module or part.module not in lora.target_modules:
        return 0
    expert = part.split == "ep"
    dim = (lora.expert_dim or lora.dim) if expert else lora.dim
    copies = ep if expert and lora.shared_expert_adapter else part.copies
    return dim * (part.fan[0] + part.fan[1]) * copies


@dataclass(frozen=True)
class UnitGroup:
    """One Megatron FSDP parameter group of an FSDP unit (a decoder layer) on this rank.

    megatron_fsdp/param_and_grad_buffer.py:1786-1816 (``_get_parameter_groups``) groups a unit's
    parameters by dtype, expert or not, and ``requires_grad``: a layer is one group, plus one for its
    routed experts; with PEFT the frozen base weights and the trainable adapters are separate groups.
    ``elements``: the group's parameters laid out in ``chunk``-sized rows (``chunk_size_factor``,
    :1873-1905; ``build_data_parallel_buffer_index`` rounds an item that is not a whole number of
    rows up to one, :323-331); the bucket is then padded to a multiple of DP x ``chunk`` (:284-286).
    """

    expert: bool
    lora: bool
    elements: float
    chunk: int

    def bucket(self, dp: int) -> float:
        """Elements of the group's bucket (its all-gathered size) for a data-parallel group of ``dp``."""
        if dp <= 1:
            return self.elements
        step = dp * self.chunk
        return math.ceil(self.elements / step) * step


def fsdp_chunk_factor(items: list[tuple[float, int]]) -> int:
    """``chunk_size_factor`` of a group of ``(numel, numel of shape[1:])`` items, by Megatron FSDP's
    rule (param_and_grad_buffer.py:1873-1905): items sorted by row size, largest first; an item
    whose row neither equals nor divides the factor (with whole rows) widens it to the lcm."""
    rows = sorted(items, key=lambda x: -x[1])
    if not rows:
        return 1
    chunk = max(1, rows[0][1])
    for numel, row in rows:
        row = max(1, row)
        if row == chunk or (chunk % row == 0 and numel % chunk == 0) or numel < chunk:
            continue
        chunk = math.lcm(chunk, row)
    return chunk


def _group_elements(items: list[tuple[float, int]], chunk: int) -> float:
    """Elements of a bucket before padding: items of at least one row rounded up to whole rows
    (an upper bound: Megatron FSDP may pair two remainders in one row), smaller ones as they are."""
    total = 0.0
    for numel, _ in items:
        total += math.ceil(numel / chunk) * chunk if numel >= chunk else numel
    return total


def _unit_groups(parts: list[Part], lora: Lora | None, div: dict[str, int]) -> tuple[UnitGroup, ...]:
    """The Megatron FSDP parameter groups of one layer on this rank (see ``UnitGroup``). A weight
    ``in x out`` is a ``[out, in]`` tensor (rows of ``in``); per copy for grouped experts; LoRA's
    ``linear_in`` is ``[dim, in]`` and ``linear_out`` ``[out, dim]`` (peft/utils.py:1862-1865)."""
    groups: dict[tuple[bool, bool], list[tuple[float, int]]] = {}
    for p in parts:
        expert = p.split == "ep"
        share = div[p.split]
        # copies on this rank: EP hands each rank whole experts; other copies are all local
        n = max(1, round(p.copies / share)) if expert else max(1, round(p.copies))
        part_share = share / (p.copies / n) if expert else share  # what is left to split per copy (ETP)
        if p.matrix and p.fan[0]:
            groups.setdefault((expert, False), []).extend([(p.numel / p.copies / part_share, p.fan[0])] * n)
        else:
            groups.setdefault((expert, False), []).append((p.numel / share, 1))
        if lora is not None and _lora_numel(p, lora):
            dim = (lora.expert_dim or lora.dim) if expert else lora.dim
            k, split = n, part_share
            if expert and lora.shared_expert_adapter:  # one adapter for the local experts, split over ETP only
                k, split = 1, share / div.get("ep_ranks", share)
            adapters = groups.setdefault((expert, True), [])
            adapters.extend([(dim * p.fan[0] / split, p.fan[0])] * k)
            adapters.extend([(dim * p.fan[1] / split, dim)] * k)
    out = []
    for (expert, is_lora), items in groups.items():
        chunk = fsdp_chunk_factor(items)
        out.append(UnitGroup(expert, is_lora, _group_elements(items, chunk), chunk))
    return tuple(out)


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
    mtp: int = 0  # multi-token-prediction layers, whole
    terms: dict = field(default_factory=dict)  # global parameters per term (attention, mlp, experts, mamba ...)
    gpu_terms: dict = field(default_factory=dict)  # the same on the most-loaded GPU
    gpu_matrix: float = 0.0  # 2-D weights outside embedding/output on the GPU (what Muon optimizes)
    lora_total: int = 0  # LoRA adapter parameters, whole model (trainable)
    gpu_lora: float = 0.0  # LoRA adapter parameters on the most-loaded GPU
    gpu_lora_experts: float = 0.0  # of which on routed experts (sharded over the expert-data-parallel group)
    # Base parameters on the most-loaded GPU that the model's freeze flags set requires_grad=False on
    # (Shape.freeze_*): they keep no gradient, main weight or optimizer state (see strategies.strategy_memory).
    gpu_frozen_dense: float = 0.0
    gpu_frozen_experts: float = 0.0
    frozen_total: int = 0  # the same, whole model
    stage: str = "first"  # the most-loaded pipeline stage: "first" (with the embedding) or "last"
    kinds: tuple = ()  # the decoder's layer kinds, in order
    gpu_largest_matrix: float = 0.0  # largest 2-D weight on the GPU (Muon's orthogonalisation works on one)
    first_stage_total: float = 0.0  # parameters on a rank of the first pipeline stage (global rank 0)
    gpu_unit_experts: float = 0.0  # of gpu_unit, the routed experts (sharded over the expert-data-parallel group)
    # Megatron FSDP's parameter groups of the largest layer (``fsdp_unit_groups``) and the parameters
    # outside the FSDP units in module order (``nonunit_items``), for its bucket layout.
    unit_groups: tuple = ()
    stage_unit_groups: tuple = ()  # per decoder layer of the most-loaded stage, in order
    nonunit_items: tuple = ()

    @property
    def gpu_total(self) -> float:
        return self.gpu_dense + self.gpu_experts


def count_parameters(
    shape: Shape,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    lora: Lora | None = None,
    stages: tuple[int, int] | None = None,
) -> Counts:
    """Exact parameter count of a Megatron GPT, MLA, MoE or hybrid model, and the most-loaded GPU's share.

    Every layer is a list of ``Part`` (see each ``_*_parts`` for the module it mirrors).
    Embedding ``padded_vocab x h`` split over TP (+ learned positions ``seq x h``, whole); an
    untied output layer as much again; a final norm. The pipeline splits the decoder layers
    evenly (``ceil(layers / PP)`` per stage); the first stage adds the embedding, the last
    the final norm, the output layer (a tied one keeps its own copy of the word embedding
    when PP > 1, gpt_model.py ``setup_embeddings_and_output_layer``) and the MTP layers; the
    most-loaded stage is the larger of the two.
    """
    etp = etp or tp
    h = shape.hidden_size
    if not shape.multi_latent_attention and shape.num_attention_heads % shape.groups:
        raise ModelError(
            f"num_attention_heads ({shape.num_attention_heads}) must be a multiple of num_query_groups ({shape.groups})"
        )
    kinds = shape.layer_kinds()
    div = {"tp": tp, "rep": 1, "ep": ep * etp, "ep_ranks": ep}  # ep_ranks: EP alone, for shared expert adapters

    def tally(parts: list[Part]) -> tuple[int, int, float, float, float, float, float, dict, dict]:
        dense = expert = 0
        g_dense = g_expert = g_matrix = g_lora = g_lora_exp = 0.0
        terms: dict[str, int] = {}
        g_terms: dict[str, float] = {}
        for p in parts:
            share = p.numel / div[p.split]
            terms[p.term] = terms.get(p.term, 0) + p.numel
            g_terms[p.term] = g_terms.get(p.term, 0.0) + share
            if p.split == "ep":
                expert += p.numel
                g_expert += share
            else:
                dense += p.numel
                g_dense += share
            if p.matrix:
                g_matrix += share
            extra = _lora_numel(p, lora, ep)
            if extra:
                g_lora += extra / div[p.split]
                if p.split == "ep":
                    g_lora_exp += extra / div[p.split]
                terms["lora"] = terms.get("lora", 0) + extra
        return dense, expert, g_dense, g_expert, g_matrix, g_lora, g_lora_exp, terms, g_terms

    layers = [tally(_layer_parts(shape, k, i + 1)) for i, k in enumerate(kinds)]
    mtp_layers = [tally(_mtp_parts(shape, ks, d + 1)) for d, ks in enumerate(shape.mtp_kinds())]
    mtp_items = [item for _ in shape.mtp_kinds() for item in _mtp_non_unit_items(shape, tp)]
    largest = 0.0
    for k in set(kinds):
        for p in _layer_parts(shape, k):
            if p.matrix:
                largest = max(largest, p.numel / p.copies / div[p.split])

    vocab = shape.padded_vocab(tp)
    word = vocab * h
    position = shape.seq_length * h if shape.position_embedding_type == "learned_absolute" else 0
    embedding = word + position
    output = 0 if shape.share_embeddings_and_output_weights else word
    final_norm = shape.norm_params
    mtp_total = sum(x[0] + x[1] for x in mtp_layers)
    layer_dense = [x[0] for x in layers]
    layer_experts = [x[1] for x in layers]
    lora_total = sum(x[7].get("lora", 0) for x in layers + mtp_layers)
    vision = shape.vision_params
    vision_gpu = vision - shape.vision_params_tp + shape.vision_params_tp / tp
    merger_gpu = shape.vision_merger_params - shape.vision_merger_params_tp + shape.vision_merger_params_tp / tp
    # LoRA on the vision tower: Bridge's LoRA matches target_modules by module name anywhere in the model
    # (peft/lora.py LoRA.transform via ModuleMatcher), so the ViT blocks' and the mergers' linears get adapters too.
    # Measured: Qwen3-VL 8B's LoRA recipe (dim 32) trains 90,831,872 parameters, 73,138,176 in the language model and
    # 17,693,696 in the vision tower (rehearsal report params.local_trainable_numel). Split over TP like their layers.
    vision_lora = 0
    if lora is not None:
        vision_lora = sum(
            lora.dim * (fan_in + fan_out) * n
            for module, fan_in, fan_out, n in shape.vision_linears
            if module in lora.target_modules
        )
    lora_total += vision_lora
    total = embedding + output + final_norm + sum(layer_dense) + sum(layer_experts) + mtp_total + vision

    n = shape.num_layers
    if stages is not None and pp > 1:
        first_idx = list(range(0, stages[0]))
        last_idx = list(range(n - stages[1], n))
    else:
        per_stage = math.ceil(n / pp)
        if per_stage * (pp - 1) >= n:
            raise ModelError(
                f"pipeline size {pp} leaves a stage without layers ({n} layers, {per_stage} per stage): "
                "use a PP that divides num_layers"
            )
        first_idx = list(range(0, min(per_stage, n)))
        last_idx = list(range((pp - 1) * per_stage, n))

    def stage(idx: list[int], first: bool, last: bool) -> dict:
        chosen = [layers[i] for i in idx] + (mtp_layers if last else [])
        non_unit = 0.0
        out_grads = 0.0
        terms: dict[str, float] = {}
        if first:
            non_unit += word / tp + position + vision_gpu
            terms["embedding"] = word / tp + position
            if vision:
                terms["vision"] = vision_gpu
        if last:
            head = (output or (word if pp > 1 else 0)) / tp
            non_unit += head + final_norm
            out_grads = (output or word) / tp
            if head:
                terms["output_layer"] = head
            terms["norms"] = terms.get("norms", 0.0) + final_norm
        # MTP's own projection and norms are not FSDP units; its inner layers are
        # (``_mtp_non_unit_items``). They are counted in ``dense`` with their depth already.
        mtp_non_unit = sum(x[0] for x in mtp_items) if last else 0.0
        for x in chosen:
            for t, v in x[8].items():
                terms[t] = terms.get(t, 0.0) + v
        dense = sum(x[2] for x in chosen) + non_unit
        experts = sum(x[3] for x in chosen)
        on_vision = vision_gpu if first else 0.0
        mergers = merger_gpu if first else 0.0
        # Qwen3VLModel.freeze: the language model (everything but the vision tower), the tower less its mergers,
        # the mergers; each frozen set keeps only its weights.
        frozen_dense = (dense - on_vision) * shape.freeze_language_model
        frozen_dense += (on_vision - mergers) * shape.freeze_vision_model + mergers * shape.freeze_vision_projection
        return {
            "dense": dense,
            "experts": experts,
            "frozen_dense": frozen_dense,
            "frozen_experts": experts * shape.freeze_language_model,
            "matrix": sum(x[4] for x in chosen),
            "lora": sum(x[5] for x in chosen) + (vision_lora / tp if first else 0.0),
            "lora_experts": sum(x[6] for x in chosen),
            "non_unit": non_unit + mtp_non_unit,
            "first_grads": out_grads,
            "terms": terms,
            "layers": len(idx),
            "mtp_non_unit": mtp_non_unit,
        }

    first = stage(first_idx, True, pp == 1)
    chosen, where = first, "first"
    if pp > 1:
        last = stage(last_idx, False, True)
        if last["dense"] + last["experts"] > first["dense"] + first["experts"]:
            chosen, where = last, "last"
    biggest = max(layers + mtp_layers, key=lambda x: x[2] + x[3])
    big_idx = (layers + mtp_layers).index(biggest)
    if big_idx < len(layers):
        big_parts = _layer_parts(shape, kinds[big_idx], big_idx + 1)
    else:
        depth = big_idx - len(layers)  # an MTP depth: its inner layer is the FSDP unit
        big_parts = [p for k in shape.mtp_kinds()[depth] for p in _layer_parts(shape, k, depth + 1)]
    unit_groups = _unit_groups(big_parts, lora, div)
    # The FSDP units of the chosen stage, in order (hybrid and dense-then-MoE models have layers of
    # different sizes); the parts of a kind are the same for every layer but DSA's computing ones.
    cache: dict[tuple, tuple[UnitGroup, ...]] = {}
    stage_groups = []
    for i in first_idx if where == "first" else last_idx:
        key = (kinds[i], shape.experimental_attention_variant == "dsa" and dsa_computes_topk(shape, i + 1))
        if key not in cache:
            cache[key] = _unit_groups(_layer_parts(shape, kinds[i], i + 1), lora, div)
        stage_groups.append(cache[key])
    # Parameters outside the FSDP units, in module order (word and position embeddings, final norm,
    # output layer): Megatron FSDP puts them in one group and cuts it into buckets (see strategies).
    nonunit: list[tuple[float, int]] = []
    if where == "first":
        nonunit.append((word / tp, h))
        if position:
            nonunit.append((float(position), h))
    if pp == 1 or where == "last":
        nonunit.append((float(final_norm), 1))
        nonunit.extend(mtp_items)  # GPTModel registers decoder, then mtp, then output_layer (gpt_model.py:227-269)
        head = (output or (word if pp > 1 else 0)) / tp
        if head:
            nonunit.append((head, h))
    unit = biggest[2] + biggest[3]
    return Counts(
        total=total,
        embedding=embedding,
        output_layer=output,
        layer_dense=layer_dense,
        layer_experts=layer_experts,
        final_norm=final_norm,
        gpu_dense=chosen["dense"],
        gpu_experts=chosen["experts"],
        gpu_non_unit=chosen["non_unit"],
        gpu_unit=unit,
        gpu_unit_experts=biggest[3],
        unit_groups=unit_groups,
        stage_unit_groups=tuple(stage_groups),
        nonunit_items=tuple(nonunit),
        gpu_first_grads=chosen["first_grads"],
        layers_on_gpu=max(first["layers"], chosen["layers"]),
        padded_vocab=vocab,
        mtp=mtp_total,
        terms={
            "embedding": embedding,
            "output_layer": output,
            **{
                t: sum(x[7].get(t, 0) for x in layers + mtp_layers)
                for t in sorted({t for x in layers + mtp_layers for t in x[7]})
                if t != "lora"
            },
            "final_norm": final_norm,
            **({"vision": vision} if vision else {}),
        },
        gpu_terms={t: v for t, v in chosen["terms"].items()},
        gpu_matrix=chosen["matrix"],
        lora_total=lora_total,
        gpu_lora=chosen["lora"],
        gpu_lora_experts=chosen["lora_experts"],
        gpu_frozen_dense=chosen["frozen_dense"],
        gpu_frozen_experts=chosen["frozen_experts"],
        frozen_total=(total - vision) * shape.freeze_language_model
        + (vision - shape.vision_merger_params) * shape.freeze_vision_model
        + shape.vision_merger_params * shape.freeze_vision_projection,
        stage=where,
        kinds=tuple(kinds),
        gpu_largest_matrix=largest,
        first_stage_total=first["dense"] + first["experts"],
    )


def pipeline_stages(model: Mapping, num_layers: int, pp: int) -> tuple[int, int] | None:
    """(layers on the first stage, layers on the last) for an uneven split, None for an even one.

    Megatron-Core's rules (transformer/transformer_config.py:1990-2095): explicit
    ``num_layers_in_first/last_pipeline_stage``, the rest even over the middle stages; or
    ``account_for_embedding/loss_in_pipeline_split``, which count the embedding and the loss as a
    layer of the first and last stage. Raises ``ModelError`` quoting the rule a layout breaks.
    """
    if pp <= 1:
        return None
    layout = model.get("pipeline_model_parallel_layout")
    if layout:
        return _stages_from_layout(layout, pp, num_layers)
    first = model.get("num_layers_in_first_pipeline_stage")
    last = model.get("num_layers_in_last_pipeline_stage")
    if first is not None or last is not None:
        middle_layers = num_layers - (first or 0) - (last or 0)
        middle_stages = pp - (first is not None) - (last is not None)
        if bool(middle_layers) != bool(middle_stages) or (middle_stages and middle_layers % middle_stages):
            raise ModelError(
                f"{middle_layers} middle layers do not split evenly over {middle_stages} middle pipeline stages "
                "(transformer_config.py:2034-2046)"
            )
        even = middle_layers // middle_stages if middle_stages else 0
        return (first if first is not None else even), (last if last is not None else even)
    emb = bool(model.get("account_for_embedding_in_pipeline_split"))
    loss = bool(model.get("account_for_loss_in_pipeline_split"))
    if emb or loss:
        total = num_layers + emb + loss
        if total % pp:
            raise ModelError(
                f"num_layers ({num_layers}) plus the embedding/loss stages ({emb + loss}) must be divisible by PP "
                f"({pp}) (transformer_config.py:2082-2095)"
            )
        per = total // pp
        return per - emb, per - loss
    return None


def _stages_from_layout(layout, pp: int, num_layers: int) -> tuple[int, int]:
    """Decoder layers of the first and last pipeline rank from ``pipeline_model_parallel_layout``
    (a list of stages of names, or a string with ``|`` between stages and ``t`` per decoder layer,
    transformer/pipeline_parallel_layer_layout.py); with virtual stages a rank holds every PP-th one.
    A layout this cannot read (repetition syntax) falls back to the even split, rounded up."""
    stages: list[int] | None = None
    if isinstance(layout, (list, tuple)) and all(isinstance(st, (list, tuple)) for st in layout):
        stages = [sum(1 for x in st if str(x) == "decoder") for st in layout]
    elif isinstance(layout, str) and not any(c in layout for c in "()*"):
        stages = [st.count("t") for st in layout.split("|")]
    if not stages or len(stages) % pp:
        even = math.ceil(num_layers / pp)
        return even, even
    first = sum(n for i, n in enumerate(stages) if i % pp == 0)
    last = sum(n for i, n in enumerate(stages) if i % pp == pp - 1)
    return first, last
