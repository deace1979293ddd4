"""A Hugging Face ``config.json`` as a Bridge ``model`` section, for ``memory --hf-config PATH``.

Why: the model a user wants to size is often only a ``config.json`` on disk (a checkpoint
download, a colleague's fork) before any Bridge recipe exists for it. Bridge's own bridges
(``megatron/bridge/models/<family>/*_bridge.py``, ``provider_bridge``) turn these fields into
a model provider; this module maps the same fields onto the provider names the memory model
reads (``shapes.Shape``), family by family, and refuses what it cannot map, naming the field.

Only what decides parameter counts and activation sizes is read. Nothing is downloaded;
the file is read as JSON with the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .common import ModelError

# Sequence length to size activations with when the user gives none: the HF field
# ``max_position_embeddings`` is the longest context the model supports (often 128 K), not
# what a training job uses; Bridge's pretraining recipes use 4096 or 8192.
HF_DEFAULT_SEQ_LENGTH = 4096
HF_MAX_BYTES = 4 * 1024 * 1024  # a config.json is a few KB; refuse anything that is clearly not one

# model_type -> family handled below. Families whose layers the memory model does not size
# yet are refused by name (``UNSUPPORTED``) rather than guessed.
DENSE = {"llama", "mistral", "qwen2", "qwen3", "qwen3_vl_text", "olmo2", "ministral3", "mistral3_text"}
GEMMA = {"gemma2", "gemma3_text", "gemma3"}
MOE = {"qwen3_moe", "qwen2_moe", "mixtral", "qwen3_vl_moe_text", "olmoe", "gpt_oss", "qwen3_next"}
# Hybrid gated delta net + gated attention (Bridge qwen/qwen3_next_bridge.py provider_bridge).
GATED_DELTA_NET = {"qwen3_next"}
MLA = {"deepseek_v2", "deepseek_v3", "kimi_k2"}
HYBRID = {"nemotron_h"}
WRAPPERS = {  # vision-language configs: the language model sits in text_config
    "qwen3_vl": "qwen3_vl_text",
    "qwen3_vl_moe": "qwen3_vl_moe_text",
    "mistral3": "mistral3_text",
    "gemma3": "gemma3_text",
}
UNSUPPORTED = {
    "qwen3_5": "its config.json is not mapped yet; a Bridge Qwen3.5 config is sized",
    "qwen3_5_moe": "its config.json is not mapped yet; a Bridge Qwen3.5 config is sized",
    "deepseek_v4": "DeepSeek V4's attention and hyper-connections",
    "glm_moe_dsa": "DeepSeek sparse attention layers",
    "minimax_m3": "its attention variant",
    "gemma4": "its per-layer embeddings",
    "kimi_k25": "its vision tower (use the text model's config)",
    "step3p7": "its attention variant",
}


def supported_model_types() -> list[str]:
    return sorted(DENSE | GEMMA | MOE | MLA | HYBRID | set(WRAPPERS))


def load_hf_config(path: str | Path) -> dict:
    """Read a ``config.json`` (or the folder holding one); ModelError names what is wrong."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
        if not p.exists():
            raise ModelError(
                f"--hf-config {str(path)!r}: no config.json in {path} (give a Hugging Face model folder, or the "
                "config.json itself)"
            )
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise ModelError(f"--hf-config {str(path)!r}: cannot read ({exc.strerror or exc})") from None
    if not p.is_file():
        raise ModelError(f"--hf-config {str(path)!r}: not a file")
    if size > HF_MAX_BYTES:
        raise ModelError(
            f"--hf-config {str(p)!r}: {size} bytes is too large for a config.json (the limit is {HF_MAX_BYTES} bytes)"
        )
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelError(f"--hf-config {str(p)!r}: not a JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise ModelError(f"--hf-config {str(p)!r}: the top level is not a JSON object")
    return data


def _need(cfg: Mapping, key: str, where: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise ModelError(f"{where} lacks {key!r}, needed to size the model")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value <= 0:
        raise ModelError(f"{where}: {key!r} must be a positive integer, got {value!r}")
    return int(value)


def _opt_int(cfg: Mapping, key: str, where: str) -> int | None:
    if cfg.get(key) is None:
        return None
    return _need(cfg, key, where)


def qwen3_vl_vision_params(vision, split: bool | str = False):
    """Parameters of Qwen3-VL's vision tower from its ``vision_config`` (None when a field is missing).

    Conv3d patch embedding ``in x temporal x patch^2 x h`` + bias, learned positions
    ``num_position_embeddings x h``, ``depth`` ViT blocks (two LayerNorms, QKV ``h x 3h`` and
    output ``h x h`` with biases, GELU MLP ``h x ffn x h`` with biases), the patch merger
    (LayerNorm over h, ``4h x 4h`` and ``4h x out`` with biases, for a 2 x 2 merge) and one
    more merger per ``deepstack_visual_indexes`` entry with its norm over ``4h``. Equals the
    published total of Qwen3-VL-8B (8,767,123,696 with its language model). ``split``: return
    ``(total, tensor-parallel part)``: the linear weights and column-parallel biases split over TP;
    norms, row-parallel biases, the patch and position embeddings stay whole (matches the built
    Qwen3-VL-30B-A3B at TP 4, counted on the GPU). ``split="mergers"``: ``(total, tensor-parallel part)`` of the
    mergers alone (the patch merger and the deepstack mergers: Bridge's "vision projection", which
    ``freeze_vision_projection`` freezes, qwen_vl/modelling_qwen3_vl/model.py ``Qwen3VLModel.freeze``).
    ``split="linears"``: the tower's linear layers as ``(module, in, out, count)``, for LoRA adapters.
    """
    if not isinstance(vision, Mapping):
        return None
    try:
        h = int(vision["hidden_size"])
        ffn = int(vision["intermediate_size"])
        depth = int(vision["depth"])
        patch = int(vision["patch_size"])
        temporal = int(vision.get("temporal_patch_size", 2))
        chans = int(vision.get("in_channels", 3))
        positions = int(vision.get("num_position_embeddings", 0))
        merge = int(vision.get("spatial_merge_size", 2))
        out = int(vision["out_hidden_size"])
        deepstack = len(vision.get("deepstack_visual_indexes") or [])
    except (KeyError, TypeError, ValueError):
        return None
    block_tp = (h * 3 * h + 3 * h) + h * h + (h * ffn + ffn) + ffn * h
    block = block_tp + 2 * 2 * h + h + h  # + two LayerNorms, the row-parallel biases
    merged = h * merge * merge
    merger_tp = (merged * merged + merged) + merged * out
    merger_linears = merger_tp + out
    mergers = (2 * h + merger_linears) + deepstack * (2 * merged + merger_linears)
    total = chans * temporal * patch * patch * h + h + positions * h + depth * block + mergers
    if split == "mergers":
        return mergers, (1 + deepstack) * merger_tp
    if split == "linears":
        # (module name, in, out, how many): what Bridge's LoRA matches by module name (peft/lora.py target_modules):
        # each ViT block's linear_qkv, linear_proj, linear_fc1, linear_fc2 and each merger's linear_fc1, linear_fc2.
        return (
            ("linear_qkv", h, 3 * h, depth),
            ("linear_proj", h, h, depth),
            ("linear_fc1", h, ffn, depth),
            ("linear_fc2", ffn, h, depth),
            ("linear_fc1", merged, merged, 1 + deepstack),
            ("linear_fc2", merged, out, 1 + deepstack),
        )
    if split:
        return total, depth * block_tp + (1 + deepstack) * merger_tp
    return total


_BLOCK_SYMBOLS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def _pattern_from_types(types: list, where: str, key: str) -> str:
    bad = [t for t in types if t not in _BLOCK_SYMBOLS]
    if bad:
        raise ModelError(
            f"{where}: {key} has block type(s) {sorted(set(map(str, bad)))} (known: {', '.join(_BLOCK_SYMBOLS)})"
        )
    return "".join(_BLOCK_SYMBOLS[t] for t in types)


def model_section_from_hf(hf: Mapping, where: str = "config.json") -> tuple[dict, list[str]]:
    """``(model section with Bridge provider names, notes)`` for a Hugging Face config."""
    notes: list[str] = []
    mtype = hf.get("model_type")
    if not isinstance(mtype, str) or not mtype:
        raise ModelError(f"{where} lacks 'model_type': cannot tell the model family")
    if mtype in UNSUPPORTED:
        raise ModelError(
            f"{where}: model_type {mtype!r} is not sized yet ({UNSUPPORTED[mtype]}); "
            "use --params N for a model-state-only estimate"
        )
    if mtype in WRAPPERS or (isinstance(hf.get("text_config"), Mapping) and "hidden_size" not in hf):
        text = hf.get("text_config")
        if not isinstance(text, Mapping):
            raise ModelError(f"{where}: model_type {mtype!r} needs a 'text_config' object (the language model)")
        vision = hf.get("vision_config")
        vision_split = qwen3_vl_vision_params(vision, split=True) if mtype in ("qwen3_vl", "qwen3_vl_moe") else None
        vision_params = vision_split[0] if vision_split else None
        if vision is not None and vision_params is None:
            notes.append(
                f"{mtype}: the language model is sized from text_config; the vision tower is not counted "
                "(it is small next to the language model and usually frozen)"
            )
        inner = dict(text)
        inner.setdefault("model_type", WRAPPERS.get(mtype, mtype))
        if "tie_word_embeddings" not in inner and "tie_word_embeddings" in hf:
            inner["tie_word_embeddings"] = hf["tie_word_embeddings"]
        section, more = model_section_from_hf(inner, f"{where} text_config")
        if vision_split:
            section["vision_params"], section["vision_params_tp"] = vision_split
            notes.append(f"{mtype}: vision tower counted from vision_config ({vision_params:,} parameters)")
        return section, notes + more
    known = DENSE | GEMMA | MOE | MLA | HYBRID
    if mtype not in known:
        raise ModelError(
            f"{where}: model_type {mtype!r} is not known to --hf-config (known: {', '.join(supported_model_types())}); "
            "pass a Bridge config, or --params N"
        )

    if mtype in HYBRID and hf.get("num_hidden_layers") is None and isinstance(hf.get("layers_block_type"), list):
        hf = dict(hf)  # newer Nemotron-H configs list block types instead of a pattern string
        hf["hybrid_override_pattern"] = _pattern_from_types(hf["layers_block_type"], where, "layers_block_type")
        hf["num_hidden_layers"] = len(hf["layers_block_type"])
        if isinstance(hf.get("mtp_layers_block_type"), list):
            hf["mtp_hybrid_override_pattern"] = _pattern_from_types(
                hf["mtp_layers_block_type"], where, "mtp_layers_block_type"
            )
    h = _need(hf, "hidden_size", where)
    heads = _need(hf, "num_attention_heads", where)
    m: dict[str, Any] = {
        "hidden_size": h,
        "num_layers": _need(hf, "num_hidden_layers", where),
        "num_attention_heads": heads,
        "vocab_size": _need(hf, "vocab_size", where),
        "num_query_groups": _opt_int(hf, "num_key_value_heads", where) or heads,
        "normalization": "RMSNorm",
        "gated_linear_unit": True,
        "add_bias_linear": False,
        # Absent: untied, the default of every family's transformers config class here but Gemma's
        "share_embeddings_and_output_weights": bool(hf.get("tie_word_embeddings", mtype in GEMMA)),
        "position_embedding_type": "rope",
        "seq_length": HF_DEFAULT_SEQ_LENGTH,
        "hidden_dropout": 0.0,
        "bias_activation_fusion": True,
        "gradient_accumulation_fusion": True,
    }
    notes.append(
        f"sequence length {HF_DEFAULT_SEQ_LENGTH} for activations (config.json holds only the maximum, "
        f"{hf.get('max_position_embeddings')}); pass --seq-length for your job's"
    )
    if hf.get("head_dim") is not None:
        m["kv_channels"] = _need(hf, "head_dim", where)
    if hf.get("intermediate_size") is not None:
        m["ffn_hidden_size"] = _need(hf, "intermediate_size", where)
    if hf.get("attention_bias"):
        m["add_qkv_bias"] = True
        notes.append("attention_bias: the output projection's bias is not counted (Bridge maps QKV biases only)")
    if mtype == "qwen2":
        m["add_qkv_bias"] = True  # Qwen2 has q/k/v biases and no attention_bias field (qwen2 bridge)
    if mtype in (
        "qwen3",
        "qwen3_moe",
        "qwen3_vl_text",
        "qwen3_vl_moe_text",
        "gemma3_text",
        "olmo2",
        "olmoe",
        "qwen3_next",
    ):
        m["qk_layernorm"] = True
    if mtype == "olmoe":
        m["qk_layernorm_full_width"] = True  # q_norm/k_norm over all heads (Bridge olmoe_provider.py:120-135)

    if mtype in GEMMA:
        m["layer_post_norms"] = 2  # post-attention and post-feed-forward norms (Gemma 2/3 layer specs)
        m["share_embeddings_and_output_weights"] = True
        if mtype == "gemma3_text":
            m["qk_layernorm"] = True
            m["rope_local_global"] = True  # Gemma3RotaryEmbedding: local and global tables

    if mtype == "gpt_oss":
        # gpt-oss (Bridge gpt_oss provider): biases on QKV, output, router and experts; one learnable
        # softmax offset (attention sink) per head; gated experts of width intermediate_size.
        m["add_bias_linear"] = True
        m["softmax_type"] = "learnable"
        m["moe_ffn_hidden_size"] = _need(hf, "intermediate_size", where)
    if mtype in MOE:
        experts = _opt_int(hf, "num_experts", where) or _opt_int(hf, "num_local_experts", where)
        if not experts:
            raise ModelError(f"{where} lacks 'num_experts' (or 'num_local_experts') for a {mtype} model")
        m["num_moe_experts"] = experts
        m["moe_router_topk"] = _need(hf, "num_experts_per_tok", where)
        ffn = _opt_int(hf, "moe_intermediate_size", where) or _need(hf, "intermediate_size", where)
        m["moe_ffn_hidden_size"] = ffn
        shared = _opt_int(hf, "shared_expert_intermediate_size", where)
        if shared:
            m["moe_shared_expert_intermediate_size"] = shared
            m["moe_shared_expert_gate"] = mtype == "qwen2_moe"
        layers = m["num_layers"]
        step = _opt_int(hf, "decoder_sparse_step", where) or 1
        dense_only = set(hf.get("mlp_only_layers") or [])
        m["moe_layer_freq"] = [0 if (i in dense_only or (i + 1) % step) else 1 for i in range(layers)]

    if mtype in GATED_DELTA_NET:
        # Bridge's Qwen3-Next provider_bridge: gated attention, a gated shared expert, and the gated delta net's
        # sizes as HF names them; the layer pattern from full_attention_interval (or transformers >= 5.5's
        # layer_types), conversion/transformers_compat.py full_attention_interval_from_hf.
        m["attention_output_gate"] = True
        m["moe_shared_expert_gate"] = True
        m["experimental_attention_variant"] = "gated_delta_net"
        types = hf.get("layer_types")
        if isinstance(types, list) and types:
            kinds = {"linear_attention": 1, "full_attention": 0}
            bad = sorted({str(t) for t in types if t not in kinds})
            if bad:
                raise ModelError(f"{where}: layer_types has {bad} (known: linear_attention, full_attention)")
            m["linear_attention_freq"] = [kinds[t] for t in types]
        else:
            m["linear_attention_freq"] = _opt_int(hf, "full_attention_interval", where) or 4
        for key in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                    "linear_num_key_heads", "linear_num_value_heads"):  # fmt: skip
            m[key] = _need(hf, key, where)

    if mtype in MLA:
        m["multi_latent_attention"] = True
        m["q_lora_rank"] = _opt_int(hf, "q_lora_rank", where)
        m["kv_lora_rank"] = _need(hf, "kv_lora_rank", where)
        m["qk_head_dim"] = _need(hf, "qk_nope_head_dim", where)
        m["qk_pos_emb_head_dim"] = _need(hf, "qk_rope_head_dim", where)
        m["v_head_dim"] = _need(hf, "v_head_dim", where)
        m["qk_layernorm"] = True  # q_a_layernorm / kv_a_layernorm (deepseek bridges)
        m.pop("kv_channels", None)
        experts = _opt_int(hf, "n_routed_experts", where)
        if experts:
            m["num_moe_experts"] = experts
            m["moe_router_topk"] = _need(hf, "num_experts_per_tok", where)
            moe_ffn = _need(hf, "moe_intermediate_size", where)
            m["moe_ffn_hidden_size"] = moe_ffn
            shared = _opt_int(hf, "n_shared_experts", where) or 0
            if shared:
                m["moe_shared_expert_intermediate_size"] = shared * moe_ffn
            first_dense = int(hf.get("first_k_dense_replace") or 0)
            freq = _opt_int(hf, "moe_layer_freq", where) or 1
            m["moe_layer_freq"] = [1 if (i >= first_dense and i % freq == 0) else 0 for i in range(m["num_layers"])]
        mtp = int(hf.get("num_nextn_predict_layers") or 0)
        if mtp:
            m["mtp_num_layers"] = mtp

    if mtype in HYBRID:
        pattern = hf.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ModelError(f"{where} lacks 'hybrid_override_pattern' (one symbol per layer) for a nemotron_h model")
        m["hybrid_layer_pattern"] = pattern
        m["position_embedding_type"] = "none"
        m["gated_linear_unit"] = False  # squared ReLU (mlp_hidden_act relu2)
        m["mamba_num_heads"] = _opt_int(hf, "mamba_num_heads", where)
        m["mamba_head_dim"] = _need(hf, "mamba_head_dim", where)
        m["mamba_state_dim"] = _need(hf, "ssm_state_size", where)
        m["mamba_num_groups"] = _need(hf, "n_groups", where)
        experts = _opt_int(hf, "n_routed_experts", where)
        if experts:
            m["num_moe_experts"] = experts
            m["moe_router_topk"] = _need(hf, "num_experts_per_tok", where)
            m["moe_ffn_hidden_size"] = _need(hf, "moe_intermediate_size", where)
            shared = _opt_int(hf, "moe_shared_expert_intermediate_size", where)
            if shared:
                m["moe_shared_expert_intermediate_size"] = shared * int(hf.get("n_shared_experts") or 1)
            latent = _opt_int(hf, "moe_latent_size", where)
            if latent:
                m["moe_latent_size"] = latent
        mtp = int(hf.get("num_nextn_predict_layers") or 0)
        if mtp and hf.get("mtp_hybrid_override_pattern"):
            m["mtp_num_layers"] = mtp
            m["mtp_hybrid_override_pattern"] = str(hf["mtp_hybrid_override_pattern"])
    return m, notes
