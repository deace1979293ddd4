"""Gated delta net (linear attention) layers: Qwen3-Next and Qwen3.5 (``experimental_attention_variant``
``gated_delta_net``). The parameter count against the mixer's shapes in the pinned Megatron-Core source, the
layer pattern from ``linear_attention_freq``, the activation terms against the lines of megatron-core and
flash-linear-attention (fla-core 0.4.2) that save them, public totals, the calibration choice, and the Bridge
recipes that now get a prediction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mfsdp_lib import memory as m
from mfsdp_lib.memory import calibration, hf, terms

HF = Path(__file__).resolve().parent.parent / "fixtures" / "memory" / "hf_configs"
RECIPES = Path(__file__).resolve().parent.parent / "fixtures" / "recipes" / "yaml"
MCORE = "megatron/core"
GDN_SRC = f"{MCORE}/ssm/gated_delta_net"
SPECS = f"{MCORE}/models/gpt/experimental_attention_variant_module_specs.py"

# A small hybrid: 8 layers, every 4th full attention; GDN with 4 key heads of 16, 8 value heads of 32.
SMALL = dict(
    hidden_size=64,
    num_layers=8,
    num_attention_heads=4,
    num_query_groups=2,
    kv_channels=16,
    ffn_hidden_size=128,
    vocab_size=512,
    normalization="RMSNorm",
    gated_linear_unit=True,
    add_bias_linear=False,
    share_embeddings_and_output_weights=False,
    position_embedding_type="rope",
    qk_layernorm=True,
    attention_output_gate=True,
    experimental_attention_variant="gated_delta_net",
    linear_attention_freq=4,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=32,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    seq_length=256,
)


def _recipe(name: str) -> dict:
    return yaml.safe_load((RECIPES / f"{name}.yaml").read_text())


# ----------------------------------------------------------------------------- layer pattern


def test_linear_attention_freq_decides_the_layer_kinds(mcore_src):
    src = (mcore_src / SPECS).read_text()
    # int N: every N-th layer (1-indexed) is full attention; a list is the pattern (1 linear, 0 full)
    assert "0 if ((i + 1) % config.linear_attention_freq == 0) else 1" in src
    assert "linear_attention_pattern = config.linear_attention_freq" in src
    shape = m.shape_from_config(SMALL)
    assert shape.layer_kinds() == ["gdn+mlp"] * 3 + ["attention+mlp"] + ["gdn+mlp"] * 3 + ["attention+mlp"]
    listed = m.shape_from_config(dict(SMALL, linear_attention_freq=[1, 0, 1, 1, 0, 0, 1, 1]))
    assert [k.split("+")[0] for k in listed.layer_kinds()] == ["gdn", "attention", "gdn", "gdn"] + [
        "attention",
        "attention",
        "gdn",
        "gdn",
    ]
    moe = m.shape_from_config(dict(SMALL, num_moe_experts=4, moe_ffn_hidden_size=32, moe_layer_freq=[0, 1] * 4))
    assert moe.layer_kinds()[:4] == ["gdn+mlp", "gdn+moe", "gdn+mlp", "attention+moe"]  # orthogonal patterns
    assert "Invalid length of linear_attention_pattern" in src
    with pytest.raises(m.ModelError, match="3 entries for 8 layers"):
        m.shape_from_config(dict(SMALL, linear_attention_freq=[1, 1, 0]))
    assert (
        "linear_attention_freq must be set for linear gated_delta_net"
        in (mcore_src / MCORE / "transformer/transformer_config.py").read_text()
    )
    with pytest.raises(m.ModelError, match="needs model.linear_attention_freq"):
        m.shape_from_config(dict(SMALL, linear_attention_freq=None))
    with pytest.raises(m.ModelError, match="multiple of model.linear_num_key_heads"):
        m.shape_from_config(dict(SMALL, linear_num_value_heads=6))


def test_hybrid_pattern_gdn_symbol_is_the_same_mixer(mcore_src):
    spec = (mcore_src / MCORE / "models/hybrid/hybrid_layer_specs.py").read_text()
    assert "gdn_layer=ModuleSpec(" in spec and "module=GatedDeltaNet" in spec
    base = {k: v for k, v in SMALL.items() if k not in ("experimental_attention_variant", "linear_attention_freq")}
    shape = m.shape_from_config(dict(base, hybrid_layer_pattern="G-G-*-G-", num_layers=8))
    assert shape.layer_kinds().count("gdn") == 3
    c = m.count_parameters(shape)
    assert c.terms["gdn"] == 3 * _gdn_by_hand()["gdn"]


# ----------------------------------------------------------------------------- parameters


def _gdn_by_hand() -> dict[str, int]:
    h, qk, v, nv, kernel = 64, 4 * 16, 8 * 32, 8, 4
    return {
        "gdn": h * (2 * qk + 2 * v + 2 * nv) + (2 * qk + v) * kernel + 2 * nv + v * h,
        "norms": h + 32,  # in_proj's fused input norm, the output norm over value_head_dim
    }


def test_gdn_mixer_parameters_by_hand(mcore_src):
    common = (mcore_src / GDN_SRC / "common.py").read_text()
    gdn = (mcore_src / GDN_SRC / "gdn.py").read_text()
    for line in (
        "self.in_proj_qkvg_dim = self.qk_dim * 2 + self.v_dim * 2",
        "self.in_proj_dim = self.in_proj_qkvg_dim + self.in_proj_extra_dim",
        "self.conv_dim = self.qk_dim * 2 + self.v_dim",
        "groups=self.conv_dim_local_tp,",
        "bias=conv_bias,",
        "conv_bias: bool = False,",
        "hidden_size=self.value_head_dim,",
        "self.v_dim,\n            self.hidden_size,",
    ):
        assert line in common, line
    assert "self.in_proj_extra_dim = self.num_value_heads * 2" in gdn
    assert "self.dt_bias_dim = self.num_v_heads_local_tp" in gdn and "self.a_log_dim = self.num_v_heads_local_tp" in gdn
    shape = m.shape_from_config(SMALL)
    c = m.count_parameters(shape)
    by_hand = _gdn_by_hand()
    assert c.terms["gdn"] == 6 * by_hand["gdn"]
    # gated attention: linear_qkv also projects a gate per query channel (attention.py:1679-1680)
    attention = (mcore_src / MCORE / "transformer/attention.py").read_text()
    assert "self.linear_qkv_out_dim += self.config.kv_channels * self.config.num_attention_heads" in attention
    att = 64 * (2 * 4 + 2 * 2) * 16 + 4 * 16 * 64
    assert c.terms["attention"] == 2 * att
    plain = m.count_parameters(m.shape_from_config(dict(SMALL, attention_output_gate=False)))
    assert c.terms["attention"] - plain.terms["attention"] == 2 * 64 * 4 * 16
    # everything of the mixer but its two norms splits over TP; the norms stay whole
    tp4 = m.count_parameters(shape, tp=4)
    assert tp4.gpu_terms["gdn"] == pytest.approx(c.terms["gdn"] / 4)
    norms_gdn = 6 * by_hand["norms"]
    assert tp4.gpu_terms["norms"] - c.gpu_terms["norms"] == 0 and c.terms["norms"] >= norms_gdn


def test_gdn_heads_must_split_over_tp_and_cp():
    cfg = {"model": dict(SMALL, num_attention_heads=8, kv_channels=8, tensor_model_parallel_size=8)}
    with pytest.raises(m.ModelError, match=r"divisible by TP x CP \(8 x 1\)"):
        m.estimate(cfg, dp=1)
    assert m.estimate({"model": dict(SMALL, tensor_model_parallel_size=2)}, dp=1).counts.total > 0


def test_published_totals():
    # Qwen3-Next-80B-A3B: the Hub's safetensors total, 81,324,862,720, includes the checkpoint's MTP module
    # (mtp.fc, its norms and one attention + MoE layer), which Bridge maps onto Megatron's MTP block.
    section, _ = hf.model_section_from_hf(hf.load_hf_config(HF / "Qwen/Qwen3-Next-80B-A3B-Instruct"))
    main = m.count_parameters(m.shape_from_config(section))
    assert main.total == 79_674_391_296 and main.kinds.count("gdn+moe") == 36
    with_mtp = m.count_parameters(m.shape_from_config(dict(section, mtp_num_layers=1)))
    assert with_mtp.total == 81_324_862_720
    recipe = m.count_parameters(m.shape_from_config(_recipe("qwen3_next_80b_a3b_pretrain_32gpu_h100_bf16")["model"]))
    assert recipe.total == 81_324_862_720
    # Qwen3.5-27B (Bridge's recipe config: language model, MTP layer and the vision tower from vision_config):
    # the Hub's safetensors total of the 27B qwen3_5 checkpoint, 27,781,427,952.
    vl = m.shape_from_config(_recipe("qwen35_vl_27b_pretrain_16gpu_h100_bf16_mock")["model"])
    assert vl.vision_params == 460_730_096
    assert m.count_parameters(vl).total == 27_781_427_952


# ----------------------------------------------------------------------------- activations


def _settings(**kw) -> terms.ActivationSettings:
    base: dict[str, Any] = dict(seq_length=256, micro_batch_size=2, hidden_dropout=0.0)
    base.update(kw)
    return terms.ActivationSettings(**base)


def test_gdn_activation_terms_trace_to_the_source(mcore_src, fla_src):
    gdn = (mcore_src / GDN_SRC / "gdn.py").read_text()
    common = (mcore_src / GDN_SRC / "common.py").read_text()
    conv = (fla_src / "fla/modules/conv/triton/ops.py").read_text()
    chunk = (fla_src / "fla/ops/gated_delta_rule/chunk.py").read_text()
    l2 = (fla_src / "fla/modules/l2norm.py").read_text()
    # the conv saves its input as given, a strided view of the whole in_proj output
    assert "qkvzba = qkvzba.transpose(0, 1)" in gdn and "torch.split(qkvzba, self.feat_dim_split" in gdn
    assert '@input_guard(no_guard_contiguous=["x"])' in conv and "ctx.save_for_backward(x, weight, bias" in conv
    assert "ctx.save_for_backward(y, rstd)" in l2 and "query_key = l2norm(query_key.contiguous())" in common
    assert "query = query.repeat_interleave(repeat_factor, dim=2)" in common and "gate = gate.contiguous()" in common
    assert "ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g, beta, A, initial_state" in chunk
    assert "g = chunk_local_cumsum(g, chunk_size=64" in chunk and "output_dtype=k.dtype" in chunk
    assert "h, v_new, _ = chunk_gated_delta_rule_fwd_h(" in chunk  # chunk states recomputed in backward
    assert 'self.recompute_norm_out = "gdn_norm_out" in self.config.recompute_modules' in common
    assert terms.GDN_CHUNK == 64

    shape = m.shape_from_config(SMALL)
    a = _settings()
    s, b, h = 256, 2, 64
    qk, v, nk, nv, dk = 64, 256, 4, 8, 16
    per_token = (
        2 * (2 * qk + 2 * v + 2 * nv)  # in_proj output
        + 2 * 2 * qk
        + 4 * 2 * nk  # l2norm y, rstd
        + 2 * 2 * nv * dk
        + 2 * v  # q, k repeated; v
        + 4 * nv
        + 2 * nv
        + 2 * 64 * nv  # g cumsum, beta, A
        + 4 * nv  # softplus input
        + 2 * v
        + 4 * nv
        + 2 * v
        + 2 * v  # kernel output, rstd, norm output, z
        + 2 * v  # out_proj input
    )
    norm = (2 + 2) * s * b * h  # in_proj's fused norm: input, output
    assert terms.layer_activation_bytes(shape, "gdn+mlp", a) == pytest.approx(
        norm + s * b * per_token + terms.layer_activation_bytes(shape, "attention+mlp", a) - _attention(a)
    )
    # TP splits every mixer tensor (sequence parallelism off: the norm stays whole)
    tp2 = terms.gdn_layer_bytes(shape, a, tp=2)
    assert tp2 == pytest.approx(s * b * per_token / 2)
    # selective recompute of the gated norm keeps only its inputs
    rec = _settings(recompute_granularity="selective", recompute_modules=("gdn_norm_out",))
    saved = terms.gdn_layer_bytes(shape, a) - terms.gdn_layer_bytes(shape, rec)
    assert saved == pytest.approx(s * b * (4 * nv + 2 * v + 2 * v))
    # FP8 saves out_proj's input in one byte; PEFT with out_proj frozen saves none
    assert terms.gdn_layer_bytes(shape, a) - terms.gdn_layer_bytes(shape, _settings(fp8=True)) == s * b * v
    peft = terms.activation_settings({"model": dict(SMALL)}, shape, lora_targets=("linear_qkv",))
    assert "in_proj" in peft.frozen_linears and "out_proj" in peft.frozen_linears
    frozen = terms.gdn_layer_bytes(shape, dict_replace(a, frozen_linears=("out_proj",)))
    assert terms.gdn_layer_bytes(shape, a) - frozen == s * b * 2 * v


def _attention(a) -> float:
    """The attention piece of SMALL's full-attention layer (norm, Q, K, V, output; the output gate's two tensors)."""
    s, b, h = a.seq_length, a.micro_batch_size, 64
    return (2 + 2) * s * b * h + s * b * (2 * 64 + 2 * 2 * 32 + 2 * 64) + s * b * 4 * 64


def dict_replace(a, **kw):
    from dataclasses import replace

    return replace(a, **kw)


def test_attention_output_gate_saves_the_gate_and_the_ungated_output(mcore_src):
    src = (mcore_src / MCORE / "transformer/attention.py").read_text()
    assert "core_attn_out = self._apply_output_gate(core_attn_out, gate)" in src
    a = _settings()
    gated = m.shape_from_config(SMALL)
    plain = m.shape_from_config(dict(SMALL, attention_output_gate=False))
    diff = terms.layer_activation_bytes(gated, "attention+mlp", a) - terms.layer_activation_bytes(
        plain, "attention+mlp", a
    )
    assert diff == 256 * 2 * (2 + 2) * 4 * 16


def test_gdn_backward_working_set_meets_the_stack_where_the_loss_is_gone():
    shape = m.shape_from_config(dict(SMALL, vocab_size=64))
    a = _settings()
    s, b, nv, dk, dv = 256, 2, 8, 16, 32
    expected = s * b * (2 * (5 * nv * dk + 5 * nv * dv + 2 * nv * dk * dv / 64) + 4 * 4 * nv)
    assert terms.gdn_backward_bytes(shape, a) == pytest.approx(expected)
    plain = m.shape_from_config({k: v for k, v in SMALL.items() if k != "experimental_attention_variant"})
    assert terms.gdn_backward_bytes(plain, a) == 0
    # PP 1: the larger of the loss buffers and the working set (the loss is freed before the layers' backward);
    # with this small vocabulary the working set is the larger
    stack = sum(terms.layer_activation_bytes(shape, k, a) for k in shape.layer_kinds())
    loss_forward, start_backward = terms._loss_bytes(shape, a, 1)
    assert terms.gdn_backward_bytes(shape, a) > max(loss_forward, start_backward)
    assert terms.activation_bytes(shape, a) == pytest.approx(
        stack + 8 * s * b + 4 * s * b * 64 + terms.gdn_backward_bytes(shape, a)
    )


# ----------------------------------------------------------------------------- calibration and recipes


def test_gdn_models_take_the_most_conservative_measured_calibration():
    for g in ("whole", "sharded"):
        measured = [calibration.ACTIVATION_FACTOR[(f, g)] for f in calibration.MEASURED_FAMILIES]
        assert calibration.ACTIVATION_FACTOR[("gdn", g)] == max(measured)
        fixed = [calibration.PEAK_FIXED_BYTES.get((f, g), 0.0) for f in calibration.MEASURED_FAMILIES]
        assert calibration.PEAK_FIXED_BYTES[("gdn", g)] == max(fixed) > 0
    est = m.estimate({"model": dict(SMALL)}, dp=1)
    assert calibration.family(est) == "gdn"
    assert any("not yet measured on a GPU" in n for n in est.notes)


SIX = {
    "qwen3_next_80b_a3b_pretrain_32gpu_h100_bf16": 32,
    "qwen3_next_80b_a3b_sft_16gpu_h100_bf16": 16,
    "qwen35_vl_27b_pretrain_16gpu_h100_bf16_mock": 16,
    "qwen35_vl_27b_sft_16gpu_h100_bf16": 16,
    "qwen35_vl_27b_peft_2gpu_h100_bf16": 2,
    "qwen35_text_35b_a3b_pretrain_8gpu_gb200_bf16": 8,
}


@pytest.mark.parametrize("name,gpus", sorted(SIX.items()))
def test_bridge_gdn_recipes_get_a_prediction(name, gpus):
    cfg = _recipe(name)
    rep = m.report(cfg, gpus=gpus, gpu_mem_gib=140)
    rows = {r["name"]: r for r in rep["strategies"]}
    assert all(r["total_gib"] > r["after_step_gib"] > 0 for r in rows.values())
    assert any("gdn" in k for k in rep["model"]["layer_kinds"])
    assert any("gated delta net" in n for n in rep["assumptions"]["notes"])
    # the output says what is counted and assumed for MTP depths where the model has them (test_mtp.py)
    has_mtp = bool(cfg["model"].get("mtp_num_layers"))
    assert has_mtp == any(n.startswith("MTP depths") for n in rep["assumptions"]["notes"])
