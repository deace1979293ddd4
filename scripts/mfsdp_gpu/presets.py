"""The built-in model shapes the GPU runs build, and whether a model must start on the meta device.

Pure Python: the command lines take their choices from here without torch.
"""

from __future__ import annotations

from .mamba import MAMBA_EXPAND
from .report import GIB

# NullTokenizer needs an explicit vocabulary size. The presets are trunks: a Llama 2
# sized vocabulary keeps the embedding from dominating small models (and matches the
# earlier fake-backend measurements, which used the same size).
NULL_TOKENIZER_VOCAB = 32000

# Model presets. Llama shapes: RMSNorm, SwiGLU, RoPE, GQA, untied embeddings.
# "llama-1b" is Llama 3.2 1B's trunk (1.1 B parameters with the 32000 vocabulary).
# "qwen3-moe-16l" is Qwen3-30B-A3B's layer shape (128 experts, top-8, expert FFN 768,
# QK layernorm) with 16 layers instead of 48 (10.1 B parameters) and EP 8.
# "nemotronh-small" is Nemotron-H 4B's layer shapes (Bridge's nemotronh_4b recipe: hidden 3072,
# 112 Mamba-2 heads of 64, state 128, 8 groups; 32 attention heads, 8 query groups; squared-ReLU
# MLP 12288) with the first 26 of its 52 layers (12 Mamba, 2 attention, 12 MLP): 2.0 B parameters
# with the 32000 vocabulary.
NEMOTRONH_4B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"


PRESETS = {
    "tiny": dict(
        kind="gpt", num_layers=2, hidden_size=256, ffn_hidden_size=688, num_attention_heads=4, num_query_groups=2
    ),
    "llama-1b": dict(
        kind="gpt", num_layers=16, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=32, num_query_groups=8
    ),
    "llama3-8b": dict(
        kind="gpt", num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_query_groups=8
    ),
    "llama3-70b": dict(
        kind="gpt", num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64, num_query_groups=8
    ),
    "qwen3-moe-16l": dict(
        kind="gpt",
        num_layers=16,
        hidden_size=2048,
        ffn_hidden_size=6144,
        num_attention_heads=32,
        num_query_groups=4,
        kv_channels=128,
        qk_layernorm=True,
        num_moe_experts=128,
        moe_ffn_hidden_size=768,
        moe_router_topk=8,
        moe_grouped_gemm=True,
        moe_token_dispatcher_type="alltoall",
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=1e-3,
        expert_model_parallel_size=8,
    ),
    "nemotronh-small": dict(
        kind="hybrid",
        hybrid_layer_pattern=NEMOTRONH_4B_PATTERN[:26],
        hidden_size=3072,
        ffn_hidden_size=12288,
        num_attention_heads=32,
        num_query_groups=8,
        kv_channels=128,
        mamba_num_heads=112,
        mamba_head_dim=64,
        mamba_state_dim=128,
        mamba_num_groups=8,
    ),
}


# A model whose unsharded bf16 weights take more than this share of the GPU is built
# on the meta device (only this rank's shard is ever materialised): the full weights,
# their fp32 main copies and the activations would not fit beside them.
META_INIT_SHARE = 0.35


def estimate_params(shape: dict, vocab: int = NULL_TOKENIZER_VOCAB) -> int:
    """Rough parameter count of a GPT-style or hybrid trunk (for the meta-init decision only)."""
    if shape.get("hybrid_layer_pattern"):
        return _estimate_hybrid_params(shape, vocab)
    h = shape["hidden_size"]
    heads = shape["num_attention_heads"]
    kv = shape.get("kv_channels") or h // heads
    groups = shape.get("num_query_groups") or heads
    attn = h * (heads * kv + 2 * groups * kv) + heads * kv * h
    if shape.get("num_moe_experts"):
        mlp = shape["num_moe_experts"] * 3 * h * shape["moe_ffn_hidden_size"] + h * shape["num_moe_experts"]
    else:
        mlp = 3 * h * shape["ffn_hidden_size"]
    layers = shape.get("num_layers") or len((shape.get("hybrid_layer_pattern") or "").replace("|", ""))
    return layers * (attn + mlp) + 2 * vocab * h


def _estimate_hybrid_params(shape: dict, vocab: int) -> int:
    """Per layer symbol: Mamba-2 in/out projections, attention, non-gated MLP (norms left out)."""
    h = shape["hidden_size"]
    heads = shape["num_attention_heads"]
    kv = shape.get("kv_channels") or h // heads
    groups = shape.get("num_query_groups") or heads
    m_heads = shape.get("mamba_num_heads") or h * MAMBA_EXPAND // shape.get("mamba_head_dim", 64)
    d_inner = m_heads * shape.get("mamba_head_dim", 64)
    gn = shape.get("mamba_num_groups", 8) * shape.get("mamba_state_dim", 128)
    per = {
        "M": h * (2 * d_inner + 2 * gn + m_heads) + d_inner * h,
        "*": h * (heads * kv + 2 * groups * kv) + heads * kv * h,
        "-": 2 * h * shape["ffn_hidden_size"],
    }
    return sum(per.get(c, 0) for c in shape["hybrid_layer_pattern"]) + 2 * vocab * h


def decide_meta_init(requested, fsdp: bool, param_count: int | None, gpu_bytes: int | None) -> tuple[bool, str]:
    if requested is not None:
        if requested and not fsdp:
            return False, "meta-device init needs Megatron FSDP (DDP materialises full weights); not used"
        return bool(requested), "requested"
    if not fsdp or not param_count or not gpu_bytes:
        return False, "not needed"
    need = 2 * param_count  # bf16 weights, unsharded
    if need > META_INIT_SHARE * gpu_bytes:
        return True, (
            f"unsharded bf16 weights ({need / GIB:.1f} GiB) exceed {META_INIT_SHARE:.0%} of the GPU: "
            "built on the meta device, only this rank's shard is materialised"
        )
    return False, f"unsharded bf16 weights ({need / GIB:.1f} GiB) fit"


def _trunk(name: str) -> dict:
    return {k: v for k, v in PRESETS[name].items() if k != "kind"}


# The smoke test's shapes (Llama 3 style). "small" is the shape of Bridge's own Megatron FSDP
# functional test (2 layers, hidden 768); "tiny" and "llama-1b" are the presets of the same name,
# so that model state, not activations, dominates memory in the larger one.
SMOKE_SHAPES = {
    "tiny": _trunk("tiny"),
    "small": dict(num_layers=2, hidden_size=768, ffn_hidden_size=2688, num_attention_heads=16, num_query_groups=8),
    "llama-1b": _trunk("llama-1b"),
}


def wants_mamba_ssm(a) -> bool:
    """Whether this run may build Mamba layers: a hybrid preset, or any YAML or recipe (its
    model is known only after Bridge is imported, and mamba-ssm must be prepared before)."""
    return not a.model_preset or PRESETS[a.model_preset]["kind"] == "hybrid"
