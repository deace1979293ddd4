"""Parameter counts per model family, Hugging Face configs, impossible layouts, and the memory
terms beyond dense Adam (PEFT, Muon, FP8, MoE activations), each against a worked example.

Worked examples are written out by hand from the module shapes in the pinned Megatron-Core
source (the file:line each ``_*_parts`` docstring cites); totals of public models are the
parameter counts their owners publish for the checkpoint (Hugging Face model cards /
safetensors totals), which Megatron's build matches when nothing is padded or tied.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from mfsdp_lib import config_io
from mfsdp_lib import memory as m
from mfsdp_lib.memory import calibration, hf

HF = Path(__file__).resolve().parent.parent / "fixtures" / "memory" / "hf_configs"
GIB = 1024**3
MCORE = "megatron/core"


def hf_counts(model_id: str, **kw) -> m.Counts:
    section, _ = hf.model_section_from_hf(hf.load_hf_config(HF / model_id / "config.json"))
    return m.count_parameters(m.shape_from_config(section, model_id), **kw)


# ----------------------------------------------------------------------------- worked examples


def test_mla_layer_by_hand():
    """DeepSeek-V3's attention: q down 7168x1536 and kv down 7168x(512+64) duplicated, q up
    1536x128x192, kv up 512x128x(128+128), out 128x128x7168, norms 7168 + 1536 + 512."""
    s = m.Shape(
        name="mla",
        hidden_size=7168,
        num_layers=1,
        num_attention_heads=128,
        vocab_size=1000,
        normalization="RMSNorm",
        add_bias_linear=False,
        multi_latent_attention=True,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_head_dim=128,
        qk_pos_emb_head_dim=64,
        v_head_dim=128,
        qk_layernorm=True,
        ffn_hidden_size=8,
        gated_linear_unit=True,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    )
    attention = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    norms = 7168 + 1536 + 512
    mlp = 7168 * 16 + 8 * 7168 + 7168  # SwiGLU of width 8, pre-MLP norm
    c = m.count_parameters(s)
    assert c.terms["attention"] == attention == 187_105_280
    assert c.layer_dense == [attention + norms + mlp]
    # TP 8 splits the up-projections and the output; the down-projections stay whole.
    c8 = m.count_parameters(s, tp=8)
    whole = 7168 * 1536 + 7168 * 576
    assert c8.gpu_terms["attention"] == pytest.approx(whole + (attention - whole) / 8)


def test_mamba_layer_by_hand():
    """Mamba-2 mixer of hidden 2048, 64 heads x 64, 8 groups, state 128 (ssm/mamba_mixer.py)."""
    s = m.Shape(
        name="h",
        hidden_size=2048,
        num_layers=1,
        num_attention_heads=16,
        vocab_size=1000,
        normalization="RMSNorm",
        add_bias_linear=False,
        hybrid_layer_pattern="M",
        mamba_num_heads=64,
        mamba_head_dim=64,
        mamba_state_dim=128,
        mamba_num_groups=8,
        position_embedding_type="none",
        share_embeddings_and_output_weights=False,
    )
    d_inner, bc, heads = 4096, 2 * 8 * 128, 64
    in_proj = 2048 * (2 * d_inner + bc + heads)
    conv = (d_inner + bc) * 4 + (d_inner + bc)
    layer = 2048 + in_proj + conv + 3 * heads + d_inner + d_inner * 2048
    c = m.count_parameters(s)
    assert c.layer_dense == [layer]
    assert c.total == layer + 2 * 1000 * 2048 + 2048


def test_mamba_unfused_path_saves_more(mcore_src):
    """model.use_mamba_mem_eff_path=false runs megatron-core's unfused Mamba path: beyond the fused
    kernel's set it keeps conv1d's and SiLU's (d + BC)-wide inputs and the scan's own x, B, C copies, but
    not the zxBCdt projection: d + 2 BC bf16 elements per token more (2 d + 2 BC at micro-batch > 1, where
    the scan output is copied once more). Nemotron-H 4B's Mamba shapes (112 heads x 64 = 7168, BC =
    2 x 8 x 128) at seq 8192, MBS 1: 2 x 8192 x (7168 + 4096) bytes = 176 MiB per Mamba layer."""
    s = m.Shape(
        name="h",
        hidden_size=3072,
        num_layers=1,
        num_attention_heads=32,
        vocab_size=1000,
        normalization="RMSNorm",
        add_bias_linear=False,
        hybrid_layer_pattern="M",
        mamba_num_heads=112,
        mamba_head_dim=64,
        mamba_num_groups=8,
        mamba_state_dim=128,
    )
    fused = m.ActivationSettings(seq_length=8192, micro_batch_size=1)
    unfused = replace(fused, mamba_mem_eff_path=False)
    extra = m.layer_activation_bytes(s, "mamba", unfused) - m.layer_activation_bytes(s, "mamba", fused)
    assert extra == 2 * 8192 * (7168 + 2 * 2048) == 176 * 2**20
    two = replace(unfused, micro_batch_size=2)
    extra2 = m.layer_activation_bytes(s, "mamba", two) - m.layer_activation_bytes(
        s, "mamba", replace(fused, micro_batch_size=2)
    )
    assert extra2 == 2 * 8192 * 2 * (2 * 7168 + 2 * 2048)
    extra_tp2 = m.layer_activation_bytes(s, "mamba", unfused, tp=2) - m.layer_activation_bytes(s, "mamba", fused, tp=2)
    assert extra_tp2 == extra / 2  # split over TP with the mixer's channels
    cfg = {"model": {"hidden_size": 3072, "num_layers": 1, "num_attention_heads": 32, "vocab_size": 1000,
                     "hybrid_layer_pattern": "M", "mamba_num_heads": 112, "use_mamba_mem_eff_path": False}}  # fmt: skip
    assert m.activation_settings(cfg, None).mamba_mem_eff_path is False
    assert m.activation_settings({"model": {}}, None).mamba_mem_eff_path is True
    src = (mcore_src / MCORE / "ssm/mamba_mixer.py").read_text()
    assert "if in_inference_mode or not self.use_mem_eff_path:" in src
    assert "xBC = self.act(self.cp.conv1d(xBC)[..., :seqlen])" in src
    assert 'y = rearrange(y, "b l h p -> l b (h p)").contiguous()' in src


def test_hybrid_pattern_kinds_and_mtp():
    s = m.shape_from_config(
        {
            "hidden_size": 256,
            "num_attention_heads": 4,
            "vocab_size": 512,
            "hybrid_layer_pattern": "M-M*E/*E",
            "num_moe_experts": 4,
            "moe_ffn_hidden_size": 64,
            "ffn_hidden_size": 512,
            "mamba_num_heads": 8,
            "mamba_head_dim": 32,
            "mamba_num_groups": 2,
            "normalization": "RMSNorm",
            "add_bias_linear": False,
        }
    )
    assert s.num_layers == 5
    assert s.layer_kinds() == ["mamba", "mlp", "mamba", "attention", "moe"]
    assert s.mtp_kinds() == [["attention", "moe"]]
    c = m.count_parameters(s)
    assert (
        c.mtp > 0
        and c.total == sum(c.layer_dense) + sum(c.layer_experts) + c.mtp + c.embedding + c.output_layer + c.final_norm
    )


def test_mtp_depth_by_hand():
    """One MTP depth = enorm + hnorm + eh_proj (2h x h) + a copy of the last layer + final norm."""
    base = dict(
        name="g",
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        vocab_size=100,
        normalization="RMSNorm",
        add_bias_linear=False,
        position_embedding_type="rope",
    )
    plain = m.count_parameters(m.Shape(**base))
    with_mtp = m.count_parameters(m.Shape(**base, mtp_num_layers=1))
    assert with_mtp.mtp == 3 * 64 + 2 * 64 * 64 + plain.layer_dense[-1]
    assert with_mtp.total - plain.total == with_mtp.mtp


def test_gemma_post_norms_from_provider_target():
    model = {
        "_target_": "megatron.bridge.models.gemma.gemma2_provider.Gemma2ModelProvider",
        "hidden_size": 64,
        "num_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "normalization": "RMSNorm",
    }
    with_post = m.count_parameters(m.shape_from_config(model))
    without = m.count_parameters(m.shape_from_config({k: v for k, v in model.items() if k != "_target_"}))
    assert with_post.total - without.total == 2 * 2 * 64  # two extra norms per layer


def test_olmoe_qk_norms_span_all_heads(bridge_src):
    """OLMoE's q/k norms are over heads x head_dim (16 x 128 = 2048), not head_dim: 2 x 2048 norm
    weights per layer where Megatron-Core's per-head norms have 2 x 128 (16 layers: 61,440 more)."""
    model = {
        "_target_": "megatron.bridge.models.olmoe.olmoe_provider.OlMoEModelProvider",
        "hidden_size": 2048,
        "num_layers": 16,
        "num_attention_heads": 16,
        "kv_channels": 128,
        "vocab_size": 100,
        "normalization": "RMSNorm",
        "qk_layernorm": True,
    }
    full = m.count_parameters(m.shape_from_config(model))
    per_head = m.count_parameters(m.shape_from_config({k: v for k, v in model.items() if k != "_target_"}))
    assert full.terms["norms"] - per_head.terms["norms"] == 16 * 2 * (2048 - 128) == 61_440
    # the layer spec alone says the same; TP does not split them (built whole on every rank)
    spec = dict(model, _target_="x", transformer_layer_spec={"_target_": "m.olmoe_provider.olmoe_layer_spec"})
    assert m.count_parameters(m.shape_from_config(spec)).total == full.total
    assert m.count_parameters(m.shape_from_config(model), tp=4).gpu_terms["norms"] == full.gpu_terms["norms"]
    src = (bridge_src / "megatron/bridge/models/olmoe/olmoe_provider.py").read_text()
    assert src.count("* self.config.num_attention_heads,  # Main difference between Mcore QK Layernorm") == 2


# A small MLA model with one MTP depth, and the same with DeepSeek sparse attention: top-k computed by layers
# 1, 2, 3 and 7 of 10 (topk_freq 4, offset 3) and the MTP depth.
SMALL_MLA = dict(
    hidden_size=64,
    num_layers=10,
    num_attention_heads=4,
    vocab_size=100,
    normalization="RMSNorm",
    multi_latent_attention=True,
    q_lora_rank=32,
    kv_lora_rank=16,
    qk_head_dim=8,
    qk_pos_emb_head_dim=4,
    v_head_dim=8,
    mtp_num_layers=1,
)
SMALL_DSA = dict(
    SMALL_MLA,
    experimental_attention_variant="dsa",
    dsa_indexer_n_heads=4,
    dsa_indexer_head_dim=8,
    dsa_indexer_topk_freq=4,
    dsa_indexer_skip_topk_offset=3,
)


def test_dsa_indexer_by_hand(mcore_src):
    """DeepSeek sparse attention: each layer that computes its own top-k builds an indexer of
    wq_b q_lora x (heads x dim) + wk h x dim + a LayerNorm (weight, bias) over dim + weights_proj h x heads,
    all whole on every TP rank. With topk_freq 4 and offset 3, layers 1, 2, 3, 7 of 10 and the MTP
    layer (numbered 1 again) compute; GLM-5.2 (78 layers + 1 MTP) has 22 indexers of 9,371,904."""
    base, dsa = SMALL_MLA, SMALL_DSA
    one = 32 * 4 * 8 + 64 * 8 + 2 * 8 + 64 * 4
    plain, sparse = m.count_parameters(m.shape_from_config(base)), m.count_parameters(m.shape_from_config(dsa))
    assert sparse.total - plain.total == 5 * one
    assert sparse.terms["dsa_indexer"] == 4 * one  # the MTP layer's is in its "mtp" term
    assert [m.shapes.dsa_computes_topk(m.shape_from_config(dsa), n) for n in range(1, 12)] == [
        True, True, True, False, False, False, True, False, False, False, True,
    ]  # fmt: skip
    every = m.count_parameters(m.shape_from_config(dict(dsa, dsa_indexer_topk_freq=1)))
    assert every.total - plain.total == 11 * one
    tp4 = m.count_parameters(m.shape_from_config(dsa), tp=4)
    assert tp4.gpu_terms["dsa_indexer"] == sparse.gpu_terms["dsa_indexer"]  # duplicated, not split
    glm = 2048 * 32 * 128 + 6144 * 128 + 2 * 128 + 6144 * 32
    assert 22 * glm == 206_181_888
    with pytest.raises(m.ModelError, match="multi_latent_attention"):
        m.shape_from_config(dict(dsa, multi_latent_attention=False))
    with pytest.raises(m.ModelError, match="dsa_indexer_head_dim"):
        m.shape_from_config(dict(dsa, dsa_indexer_head_dim=None))
    src = (mcore_src / MCORE / "transformer/experimental_attention_variant/dsa.py").read_text()
    assert "return (max(layer_number - skip_topk_offset, 0) % topk_freq) != 0" in src
    assert src.count('parallel_mode="duplicated"') >= 3 and 'k_norm_config.normalization = "LayerNorm"' in src


# ----------------------------------------------------------------------------- public checkpoints


@pytest.mark.parametrize(
    "model_id,published",
    [
        ("meta-llama/Llama-3.2-1B", 1_235_814_400),  # tied embeddings
        ("Qwen/Qwen3-8B", 8_190_735_360),  # QK norms
        ("Qwen/Qwen3-30B-A3B", 30_532_122_624),  # MoE, 128 experts
        ("deepseek-ai/DeepSeek-V2-Lite", 15_706_484_224),  # MLA without q compression, shared experts
        ("google/gemma-2-2b", 2_614_341_888),  # post norms, tied embeddings
        ("Qwen/Qwen3-VL-8B-Instruct", 8_767_123_696),
        ("openai/gpt-oss-20b", 20_914_757_184),  # biases everywhere, attention sinks, 32 experts
        ("openai/gpt-oss-120b", 116_829_156_672),  # VLM: text_config + the vision tower from vision_config
    ],
)
def test_hf_config_counts_match_published(model_id, published):
    assert hf_counts(model_id).total == published


def test_deepseek_v3_main_and_mtp():
    c = hf_counts("deepseek-ai/DeepSeek-V3")
    # DeepSeek publishes 671 B main-model parameters and a 14 B MTP module that includes its own
    # copy of the embedding and output head (2 x 129280 x 7168 = 1.85 B): Megatron's MTP shares them.
    assert abs((c.total - c.mtp) - 671.03e9) / 671.03e9 < 1e-4
    assert abs(c.mtp + 2 * 129280 * 7168 - 13.46e9) / 13.46e9 < 0.01
    assert c.kinds.count("mla+mlp") == 3 and c.kinds.count("mla+moe") == 58


def test_nemotron_hybrid_moe_counts_and_ep_split():
    c1 = hf_counts("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    assert abs(c1.total - 31.58e9) / 31.58e9 < 0.001  # published: 31.6 B
    c8 = hf_counts("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", ep=8)
    assert c8.gpu_experts == pytest.approx(c1.gpu_experts / 8)
    assert c8.gpu_dense == pytest.approx(c1.gpu_dense)
    sup = hf_counts("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16")
    assert sup.mtp > 0 and "experts_latent" in sup.terms  # latent MoE projections, MTP "*E"


def test_hf_refuses_unsized_families_by_name(tmp_path):
    with pytest.raises(m.ModelError, match="'qwen3_5' is not sized yet.*Bridge Qwen3.5 config"):
        hf.model_section_from_hf({"model_type": "qwen3_5", "text_config": {}})
    with pytest.raises(m.ModelError, match="'hidden_size'"):
        hf.model_section_from_hf({"model_type": "llama", "num_hidden_layers": 2})
    with pytest.raises(m.ModelError, match="model_type 'mystery'"):
        hf.model_section_from_hf({"model_type": "mystery", "hidden_size": 8})
    with pytest.raises(m.ModelError, match="must be a positive integer"):
        hf.model_section_from_hf(
            {
                "model_type": "llama",
                "hidden_size": "big",
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "vocab_size": 8,
            }
        )
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(m.ModelError, match="not a JSON file"):
        hf.load_hf_config(bad)
    with pytest.raises(m.ModelError, match="cannot read"):
        hf.load_hf_config(tmp_path / "missing.json")


# ----------------------------------------------------------------------------- impossible layouts


@pytest.mark.parametrize(
    "kw,needle,src,text",
    [
        ({"tp": 3}, "num_attention_heads", "transformer/transformer_config.py", "must be a multiple of"),
        ({"pp": 3}, "num_layers", "transformer/transformer_block.py", "should be divisible by"),
        ({"ep": 2, "dp": 2}, "no experts", None, None),
    ],
)
def test_impossible_dense_layouts_are_errors(kw, needle, src, text, mcore_src):
    with pytest.raises(m.ModelError, match=needle):
        m.estimate(model="llama3-8b", **kw)
    if src:
        assert text in (mcore_src / MCORE / src).read_text()


def test_expert_layouts_are_checked(mcore_src):
    moe = "Qwen/Qwen3-30B-A3B"
    cfg_path = HF / moe / "config.json"
    with pytest.raises(m.ModelError, match="num_moe_experts .128. must be divisible by EP .3."):
        m.estimate(hf_config=cfg_path, ep=3, dp=3)
    assert (
        "assert self.config.num_moe_experts % ep_size == 0"
        in (mcore_src / MCORE / "transformer/moe/moe_layer.py").read_text()
    )
    with pytest.raises(m.ModelError, match="DP x CP x TP = 4 x 1 x 1 is not divisible by EP x ETP = 8 x 1"):
        m.estimate(hf_config=cfg_path, ep=8, dp=4)
    assert (
        "is not divisible by expert_tensor_model_pipeline_parallel size"
        in (mcore_src / MCORE / "parallel_state.py").read_text()
    )
    est = m.estimate(hf_config=cfg_path, ep=8, dp=8)
    assert m.dp_step(est.parallel) == 8


def test_params_with_ep_needs_the_expert_share():
    with pytest.raises(m.ModelError, match="--expert-params"):
        m.estimate(params=30e9, ep=8, dp=8)
    est = m.estimate(params=30e9, expert_params=28e9, ep=8, dp=8, strategies=("distopt",))
    assert est.counts.gpu_experts == pytest.approx(28e9 / 8)
    assert est.counts.gpu_dense == pytest.approx(2e9)


def test_smallest_dp_respects_the_expert_grid():
    r = m.report(hf_config=HF / "Qwen/Qwen3-30B-A3B/config.json", ep=8, dp=8, gpu_mem_gib=80, seq_length=2048)
    for row in r["strategies"]:
        if row["smallest_dp_that_fits"] is not None:
            assert row["smallest_dp_that_fits"] % 8 == 0


# ----------------------------------------------------------------------------- PEFT, Muon, FP8


LLAMA_1B = {
    "model": {
        "hidden_size": 2048,
        "num_layers": 16,
        "num_attention_heads": 32,
        "num_query_groups": 8,
        "ffn_hidden_size": 8192,
        "vocab_size": 32000,
        "gated_linear_unit": True,
        "add_bias_linear": False,
        "normalization": "RMSNorm",
        "share_embeddings_and_output_weights": False,
        "position_embedding_type": "rope",
        "seq_length": 2048,
        "bf16": True,
    }
}


def test_lora_adapters_by_hand_and_frozen_base():
    """LoRA dim 32 on QKV (2048 -> 3072), proj (2048 -> 2048), FC1 (2048 -> 16384), FC2 (8192 -> 2048)."""
    cfg = dict(LLAMA_1B, peft={"_target_": "megatron.bridge.peft.lora.LoRA", "dim": 32})
    est = m.estimate(cfg, dp=1, strategies=("ddp", "optim_grads_params"))
    per_layer = 32 * ((2048 + 3072) + (2048 + 2048) + (2048 + 16384) + (8192 + 2048))
    assert est.counts.lora_total == 16 * per_layer == 19_398_656
    ddp = est.rows["ddp"]
    full = est.counts.gpu_total
    # Frozen base: bf16 weights only; adapters: bf16 weight + fp32 grad + 12 bytes Adam.
    assert ddp.params == pytest.approx(2 * (full + est.counts.lora_total))
    assert ddp.grads == pytest.approx(4 * est.counts.lora_total)
    assert ddp.optimizer == pytest.approx(12 * est.counts.lora_total)
    without = m.estimate(LLAMA_1B, dp=1, strategies=("ddp",)).rows["ddp"]
    assert (without.model_state / ddp.model_state) > 7  # counting frozen state as trainable: ~8x too high


def test_lora_on_grouped_experts_shares_one_adapter_per_ep_rank(bridge_src):
    """Bridge's LoRA gives a grouped GEMM's expert linears one adapter shared by the rank's local experts unless
    share_expert_adapters is off (then one per expert); normalize_moe_lora gives expert linears dim // top-k. Checked
    against the built model: OLMoE's LoRA recipe (64 experts, grouped GEMM, world 1) trained 9,961,472 parameters on
    an H200 (the what-works rehearsal's count), which per-expert adapters would put near 280 M."""
    import json

    import raw_store

    src = (bridge_src / "megatron/bridge/peft/lora.py").read_text()
    assert "share_expert_adapters: bool = True" in src
    assert "is_grouped_expert_name and not self.share_expert_adapters and not use_shared_outer_adapter" in src
    row = raw_store.path("what_works_1xh200", "batch_2_6", "rows", "olmoe_7b_peft_1gpu_h100_bf16")
    measured = json.loads((row / "rehearse" / "rank_0" / "report.json").read_text())["params"]
    cfg = config_io.load_effective(str(row / "enabled.yaml"), [])
    assert cfg["model"]["moe_grouped_gemm"] is True and cfg["peft"]["share_expert_adapters"] is True
    est = m.estimate(cfg, dp=1, strategies=("optim_grads_params",))
    assert est.counts.lora_total == measured["local_trainable_numel"] == 9_961_472
    h, ffn, heads, kv, dim = 2048, 1024, 16, 128, 32
    per_layer = dim * ((h + 3 * heads * kv) + (heads * kv + h) + (h + 2 * ffn) + (ffn + h))
    assert est.counts.lora_total == 16 * per_layer
    per_expert = m.estimate(dict(cfg, peft=dict(cfg["peft"], share_expert_adapters=False)), dp=1)
    experts = dim * ((h + 2 * ffn) + (ffn + h))
    assert per_expert.counts.lora_total == est.counts.lora_total + 16 * 63 * experts
    ungrouped = m.estimate(dict(cfg, model=dict(cfg["model"], moe_grouped_gemm=False)), dp=1)
    assert ungrouped.counts.lora_total == per_expert.counts.lora_total  # one linear per expert: one adapter each
    normalized = m.estimate(dict(cfg, peft=dict(cfg["peft"], normalize_moe_lora=True)), dp=1)
    topk = cfg["model"]["moe_router_topk"]
    assert normalized.counts.lora_total == est.counts.lora_total - 16 * (dim - dim // topk) * (
        (h + 2 * ffn) + (ffn + h)
    )
    # At EP 8 each EP rank has its own shared adapter: the model holds eight, each GPU one.
    ep8 = m.estimate(cfg, dp=8, ep=8, strategies=("optim_grads_params",))
    assert ep8.counts.lora_total == est.counts.lora_total + 7 * 16 * experts
    assert ep8.counts.gpu_lora_experts == pytest.approx(16 * experts)


def test_muon_keeps_one_buffer_per_matrix():
    cfg = dict(LLAMA_1B, optimizer={"optimizer": "muon"})
    est = m.estimate(cfg, dp=8, strategies=("distopt",))
    c = est.counts
    matrix, other = c.gpu_matrix, c.gpu_total - c.gpu_matrix
    # Plain Muon: whole fp32 main + momentum for 2-D weights on every rank, and its scalar Adam is not distributed
    # either (built with use_distributed_optimizer=False): whole fp32 main + two moments for the rest.
    expected = 8 * matrix + 12 * other
    assert est.rows["distopt"].optimizer == pytest.approx(expected)
    # The H200 rehearsal of this preset with Muon under the distributed optimizer, rank 0 of 8, counted its
    # optimizer state: momentum for the matrices and two Adam moments for the rest, on every rank, unsharded.
    import json

    import raw_store

    rep = raw_store.path("muon_fsdp_1xh200", "distopt", "rank_0.report.json")
    measured = json.loads(rep.read_text())["optimizer_state"]
    assert measured["state_numel"] == matrix + 2 * other
    assert measured["updated_param_numel"] == c.gpu_total
    layer_wise = m.estimate(dict(LLAMA_1B, optimizer={"optimizer": "dist_muon"}), dp=8, strategies=("distopt",))
    assert layer_wise.rows["distopt"].optimizer == pytest.approx(8 * matrix / 8 + 12 * other / 8)
    adam = m.estimate(LLAMA_1B, dp=1, strategies=("ddp",)).rows["ddp"].optimizer
    muon1 = m.estimate(cfg, dp=1, strategies=("ddp",)).rows["ddp"].optimizer
    assert muon1 < adam  # one state instead of two on the matrices
    fsdp = m.estimate(cfg, dp=8, strategies=("optim_grads_params",)).rows["optim_grads_params"]
    assert any("Muon with Megatron FSDP fails" in n for n in fsdp.notes)


def test_fp8_weights_and_activations():
    cfg = dict(LLAMA_1B, mixed_precision="bf16_with_fp8_current_scaling_mixed")
    p = m.precision_from_config(cfg)
    assert p.fp8 and p.fp8_params
    assert not m.precision_from_config(
        dict(LLAMA_1B, mixed_precision="bf16_with_fp8_subchannel_scaling_mixed")
    ).fp8_params
    bf16 = m.estimate(LLAMA_1B, dp=8, strategies=("optim_grads_params",))
    fp8 = m.estimate(cfg, dp=8, strategies=("optim_grads_params",))
    c = bf16.counts
    # Linear weights 1 byte, everything else 2 (sharded over 8; + Megatron FSDP's bucket padding, < 0.1 %).
    assert fp8.rows["optim_grads_params"].params == pytest.approx(
        (1 * c.gpu_matrix + 2 * (c.gpu_total - c.gpu_matrix)) / 8, rel=1e-3
    )
    # FP8 saves each layer's linear inputs (2 norm outputs, attention output, FC2 input) as 1 byte.
    s = 2048
    saved = 16 * s * (2048 + 2048 + 2048 + 8192)
    assert bf16.activations - fp8.activations == pytest.approx(saved)


def test_moe_activation_terms_by_hand():
    """One MoE layer, top-2 of 4 experts of width 64, h 32, s 16, b 1, gated, fused activation."""
    shape = m.Shape(
        name="moe",
        hidden_size=32,
        num_layers=1,
        num_attention_heads=4,
        vocab_size=64,
        num_moe_experts=4,
        moe_ffn_hidden_size=64,
        moe_router_topk=2,
        gated_linear_unit=True,
        normalization="RMSNorm",
        add_bias_linear=False,
    )
    a = m.ActivationSettings(seq_length=16, micro_batch_size=1, bias_activation_fusion=True)
    moe = m.layer_activation_bytes(shape, "moe", a)
    norm = 4 * 16 * 32
    dispatch = 2 * 16 * (2 * 32 + 2 * 32)  # per routed copy: permuted FC1 input + dispatcher buffers
    experts = 2 * 16 * 6 * 64  # per routed copy: FC1 output (2 x 64 x 2 bytes) + FC2 input (64 x 2)
    router = 16 * 4 * 9  # fp32 logits + fp32 probs + bool map
    assert moe == norm + dispatch + experts + router


def test_breakdown_is_the_api_rehearse_reads():
    est = m.estimate(LLAMA_1B, dp=8, strategies=("optim_grads_params",))
    b = est.breakdown("optim_grads_params")
    assert b["peak"] == pytest.approx(est.total("optim_grads_params"))
    assert b["model_state"] == pytest.approx(b["params"] + b["grads"] + b["optimizer"] + b["buffers_persistent"])
    assert b["peak"] >= b["after_step"]


def test_selective_recompute_modules(mcore_src):
    src = (mcore_src / MCORE / "transformer/transformer_config.py").read_text()
    assert '"moe_act": recompute the MoE MLP activation function.' in src
    shape = m.Shape(
        name="g",
        hidden_size=32,
        num_layers=1,
        num_attention_heads=4,
        vocab_size=64,
        ffn_hidden_size=128,
        gated_linear_unit=True,
        normalization="RMSNorm",
        add_bias_linear=False,
    )
    base = m.ActivationSettings(seq_length=16, micro_batch_size=1, bias_activation_fusion=True)
    sel = replace(base, recompute_granularity="selective", recompute_modules=("mlp", "layernorm"))
    full = m.layer_activation_bytes(shape, "attention+mlp", base)
    less = m.layer_activation_bytes(shape, "attention+mlp", sel)
    # mlp: FC1 output (2 x 128 x 2 bytes) + FC2 input (128 x 2) per token; layernorm: two 2-byte norm outputs
    assert full - less == 16 * (6 * 128) + 2 * 16 * 32 * 2


def test_uneven_pipeline_stages():
    """61 layers over PP 8 is refused evenly, accepted with explicit first/last stages, with
    account_for_*_in_pipeline_split, or with a layout (DeepSeek-V3's recipes use the last)."""
    base = {"model": {"hidden_size": 64, "num_layers": 61, "num_attention_heads": 4, "vocab_size": 100}}
    with pytest.raises(m.ModelError, match="transformer_block.py:150"):
        m.estimate(base, pp=8)
    first_last = {
        "model": dict(base["model"], num_layers_in_first_pipeline_stage=5, num_layers_in_last_pipeline_stage=8)
    }
    assert m.estimate(first_last, pp=8).counts.layers_on_gpu == 8  # middle stages: 48 / 6 = 8
    with pytest.raises(m.ModelError, match="middle pipeline stages"):
        m.estimate({"model": dict(base["model"], num_layers_in_first_pipeline_stage=4)}, pp=8)
    acc = {
        "model": dict(
            base["model"],
            num_layers=62,
            account_for_embedding_in_pipeline_split=True,
            account_for_loss_in_pipeline_split=True,
        )
    }
    assert m.pipeline_stages(acc["model"], 62, 8) == (7, 7)  # (62 + 2) / 8 = 8 per stage, less one each
    layout = [["embedding"] + ["decoder"] * 8] + [["decoder"] * 8] * 6 + [["decoder"] * 5 + ["loss"]]
    assert m.pipeline_stages({"pipeline_model_parallel_layout": layout}, 61, 8) == (8, 5)
    assert m.pipeline_stages({"pipeline_model_parallel_layout": "Et|tt|ttL"}, 5, 3) == (1, 2)


def test_every_corpus_recipe_is_estimated_or_refused_with_a_reason():
    """Each Bridge 0.6.2 recipe's YAML (tests/fixtures/recipes/yaml): an estimate at a data-parallel
    size its layout allows, or a ModelError naming what is missing or impossible; never a traceback."""

    paths = sorted((Path(__file__).resolve().parent.parent / "fixtures" / "recipes" / "yaml").glob("*.yaml"))
    assert len(paths) > 150
    refused = {}
    for p in paths:
        cfg = config_io.load_yaml(str(p))  # as the tools load it (libyaml when present)
        dp = 2 * m.dp_step(m.parallel_from(cfg))
        try:
            est = m.estimate(cfg, dp=dp, strategies=("optim_grads_params",))
            assert est.total("optim_grads_params") > 0
        except m.ModelError as exc:
            refused[p.name] = str(exc)
    unsized = {n for n, why in refused.items() if "layers are not sized yet" in why}
    diffusion = {n for n, why in refused.items() if "diffusion models are not sized yet" in why}
    for name, why in refused.items():
        assert name in unsized | diffusion or "lacks model." in why or "transformer_block.py:150" in why, (
            f"{name}: {why}"
        )
    # DeepSeek-V4's attention is refused by name, never guessed; gated delta net models (Qwen3-Next, Qwen3.5) are sized
    assert all(re.search(r"deepseek_v4", n) for n in unsized) and unsized
    # diffusion models (Wan) are refused: their tokens are the dataset's latents, not model.seq_length
    assert diffusion and all(re.match(r"wan_", n) for n in diffusion)
    gdn_refused = {n: why for n, why in refused.items() if re.search(r"qwen3_next|qwen35", n)}
    assert all("transformer_block.py:150" in why for why in gdn_refused.values()), gdn_refused  # an impossible PP only
    assert len(refused) - len(unsized) - len(diffusion) < 25


def test_dsa_shared_topk_indices_held_between_steps(mcore_src, bridge_src):
    """With index sharing (topk_freq > 1) every layer that computes its top-k stores its int64 indices in a dict on
    the model's TransformerConfig when the forward has neither packed sequences nor an attention mask (Bridge's
    default), so they stay allocated between steps: one [b, s / CP, min(topk, s)] tensor per computing layer number.
    An MTP depth is numbered from 1 and so replaces layer 1's entry instead of adding one."""
    model = dict(SMALL_DSA, dsa_indexer_topk=512)
    shape = m.shape_from_config(model)
    held = m.terms.dsa_topk_holder_bytes
    # layers 1, 2, 3 and 7 of 10 compute (the MTP depth is layer 1 again): 4 tensors of 2 x 1024 x 512 int64
    assert held(shape, 1024, 2, 1, 10, last_stage=True) == 4 * 2 * 1024 * 512 * 8
    assert held(shape, 1024, 2, 4, 10, last_stage=True) == 4 * 2 * 256 * 512 * 8  # the rank's queries under CP
    assert held(shape, 256, 1, 1, 10, last_stage=True) == 4 * 256 * 256 * 8  # top-k capped at the keys there are
    # a later pipeline stage (layers 6-10) holds layer 7's and, with the MTP depth, layer 1's
    assert held(shape, 1024, 1, 1, 5, last_stage=True) == 2 * 1024 * 512 * 8
    assert held(m.shape_from_config(dict(model, dsa_indexer_topk_freq=1)), 1024, 1, 1, 10, last_stage=True) == 0
    src = (mcore_src / MCORE / "transformer/experimental_attention_variant/dsa.py").read_text()
    assert "topk_holder[self.layer_number] = topk_indices" in src
    assert "return attention_mask if attention_mask is not None else self.config" in src
    assert "topk_scores, topk_indices = index_scores.topk(topk_k, dim=-1)" in src  # torch.topk: int64 indices
    gpt_step = (bridge_src / "megatron/bridge/training/gpt_step.py").read_text()
    assert "skip_getting_attention_mask_from_dataset: bool = True" in gpt_step
    # the rank's state between steps counts it (calibration.state_margin_bytes)
    cfg = {"model": dict(model, seq_length=1024), "train": {"micro_batch_size": 1}}
    with_topk = m.estimate(cfg, dp=8, strategies="optim_grads_params")
    without = m.estimate(
        {"model": dict(cfg["model"], dsa_indexer_topk_freq=1), "train": {"micro_batch_size": 1}},
        dp=8,
        strategies="optim_grads_params",
    )
    assert calibration.state_margin_bytes(with_topk) - calibration.state_margin_bytes(without) == 4 * 1024 * 512 * 8


def test_moe_layer_state_is_sized_at_the_rank_tokens(bridge_src):
    """The MoE layers' state between steps (calibration.MOE_STATE_BYTES_PER_TOKEN_HIDDEN, one bf16 tensor of the tokens
    x hidden each) is of the rank's tokens: context parallelism splits the sequence before the decoder, so at CP 4
    each of the 4 MoE layers holds a quarter of what it holds at CP 1. Tensor parallelism leaves it as fitted."""
    model = dict(
        hidden_size=256,
        num_layers=4,
        num_attention_heads=4,
        vocab_size=1000,
        normalization="RMSNorm",
        position_embedding_type="rope",
        num_moe_experts=8,
        moe_ffn_hidden_size=128,
        moe_router_topk=2,
        seq_length=4096,
    )
    cfg = {"model": model, "train": {"micro_batch_size": 1}}
    cp1 = calibration.state_margin_bytes(m.estimate(cfg, dp=8, ep=8, strategies="optim_grads_params"))
    cp4 = calibration.state_margin_bytes(m.estimate(cfg, dp=2, cp=4, ep=8, strategies="optim_grads_params"))
    per_layer = calibration.MOE_STATE_BYTES_PER_TOKEN_HIDDEN * 4096 * 256
    assert cp1 - cp4 == 4 * per_layer * (1 - 1 / 4)
    tp2 = calibration.state_margin_bytes(m.estimate(cfg, dp=4, tp=2, ep=8, etp=1, strategies="optim_grads_params"))
    assert tp2 == cp1
    gpt_step = (bridge_src / "megatron/bridge/training/gpt_step.py").read_text()
    assert "batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=pg_collection.cp)" in gpt_step
