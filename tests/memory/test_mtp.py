"""Multi-token-prediction (MTP) depths' activations: the lines of megatron-core 0.19.2 the term is traced from, its
value for small shapes worked out by hand, how it scales with the depths and recompute, where it is added (beside
the main loss, on the last pipeline stage), and what the output says about it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mfsdp_lib import memory as m
from mfsdp_lib.memory import terms
from mfsdp_lib.memory.estimate import MTP_NOTE, MTP_RECOMPUTE_NOTE

MCORE = "megatron/core"
MTP_SRC = f"{MCORE}/transformer/multi_token_prediction.py"

# A dense GPT shape small enough to work out by hand: MHA (8 heads of 64 = h), gated FFN, a vocabulary that needs no
# padding at TP 1 or 2.
S, B, H, FFN, V = 64, 1, 512, 1536, 1024
DENSE = dict(
    hidden_size=H,
    num_layers=2,
    num_attention_heads=8,
    ffn_hidden_size=FFN,
    vocab_size=V,
    gated_linear_unit=True,
    seq_length=S,
)
SBH = S * B * H
PLAIN = m.ActivationSettings(seq_length=S, micro_batch_size=B, bias_activation_fusion=True)


def _shape(depths: int = 1, **kw):
    return m.shape_from_config(dict(DENSE, mtp_num_layers=depths or None, **kw))


def _line(src: str, number: int) -> str:
    return src.splitlines()[number - 1]


# ----------------------------------------------------------------------------- the source


def test_mtp_terms_trace_to_the_lines_cited(mcore_src):
    """Every line the term's docstrings cite says what the term takes from it."""
    mtp = (mcore_src / MTP_SRC).read_text()
    cited = {
        654: "is_pipeline_last_stage(",  # mtp_on_this_rank: the last stage without a layout
        708: "num_layers_to_build = config.mtp_num_layers",  # get_mtp_num_layers_to_build
        730: "ctx.save_for_backward(mtp_loss)",  # MTPLossAutoScaler keeps each depth's loss graph
        804: "torch.chunk(hidden_states, 1 + config.mtp_num_layers, dim=0)",  # views of the block's concatenation
        841: "mtp_logits, _ = output_layer(",  # the shared output layer, per depth
        855: "compute_language_model_loss(mtp_labels, mtp_logits)",  # the main loss's implementation
        1112: "decoder_input = embedding(",  # the shifted tokens' embedding
        1132: "apply_module(self.enorm)(decoder_input)",
        1134: "apply_module(self.hnorm)(hidden_states)",
        1138: "torch.cat((decoder_input, hidden_states), -1)",  # 2h wide: eh_proj's saved input
        1139: "self.eh_proj(hidden_states)",
        1152: "scatter_to_sequence_parallel_region(hidden_states",
        1198: "self.mtp_model_layer(",  # a hybrid pattern's stack
        1208: "self.mtp_model_layer(",  # a GPT layer
        1233: "apply_module(self.final_layernorm)(hidden_states)",
        1415: "if self.config.recompute_method == 'uniform':",
        1420: "self.config.recompute_num_layers == 1",
        1424: "elif self.config.recompute_method == 'block':",
        1499: "if self.config.recompute_granularity == 'full' and self.training:",
        1825: "for iteration in range(self.config.mtp_num_layers):",
        1848: "hidden_states = torch.cat(hidden_states_list, dim=0)",
    }
    for number, text in cited.items():
        assert text in _line(mtp, number), (number, _line(mtp, number))
    # uniform recompute checkpoints the whole projection + layer + final norm: the final norm is inside it
    body = mtp[mtp.index("def _proj_and_transformer_layer(") : mtp.index("def _postprocess(")]
    assert "hidden_states = self._concat_embeddings(" in body and "self._postprocess(hidden_states)" in body
    assert "recompute_method == 'block' is not supported for MTP yet." in _line(mtp, 1427)

    gpt = (mcore_src / MCORE / "models/gpt/gpt_model.py").read_text()
    order = [
        (667, "hidden_states = self.mtp("),
        (701, "process_mtp_loss("),
        (762, "self.output_layer("),
        (794, "loss = "),
    ]
    for number, text in order:
        assert text in _line(gpt, number), (number, _line(gpt, number))
    # MTP runs before the main logits and loss, in the same _postprocess: its saved tensors meet the main loss
    hybrid = (mcore_src / MCORE / "models/hybrid/hybrid_model.py").read_text()
    assert "hidden_states = self.mtp(" in _line(hybrid, 540) and "process_mtp_loss(" in _line(hybrid, 573)
    layers = (mcore_src / MCORE / "tensor_parallel/layers.py").read_text()
    assert "ctx.save_for_backward(input, weight)" in _line(layers, 548)  # the output layer keeps its input view
    fused = (mcore_src / MCORE / "fusions/fused_cross_entropy.py").read_text()
    assert "ctx.save_for_backward(exp_logits" in _line(fused, 119)  # the fp32 softmax each depth's loss keeps
    eager = (mcore_src / MCORE / "tensor_parallel/cross_entropy.py").read_text()
    assert "ctx.save_for_backward(exp_logits" in _line(eager, 181)


# ----------------------------------------------------------------------------- by hand


def test_one_depth_by_hand():
    """One dense depth, TP 1, fused loss, no recompute, no dropout, per microbatch:

    outside: the embedding 2sbh + the int64 ids 8sb; inside: eh_proj's input 2 x 2sbh, the final norm's input 2sbh and
    the layer (attention 12 sbh: norm in/out 4, Q K V O 8; gated MLP 4sbh + 6 sb ffn); the concatenation of the
    decoder output and the depth's output 2 x 2sbh; the loss's fp32 softmax 4 sbV."""
    shape = _shape(1)
    assert shape.mtp_kinds() == [["attention+mlp"]] and shape.padded_vocab(1) == V
    layer = 12 * SBH + 4 * SBH + 6 * S * B * FFN
    assert m.layer_activation_bytes(shape, "attention+mlp", PLAIN) == layer
    by_hand = 28 * SBH + 6 * S * B * FFN + 8 * S * B + 4 * S * B * V
    assert terms.mtp_activation_bytes(shape, PLAIN) == by_hand
    assert terms.mtp_depth_bytes(shape, ["attention+mlp"], PLAIN) == (2 * SBH + 8 * S * B, 6 * SBH + layer)
    assert terms.mtp_loss_saved_bytes(shape, PLAIN) == 4 * S * B * V


def test_sequence_parallel_and_te_loss_by_hand():
    """TP 2 with sequence parallelism and Transformer Engine's cross-entropy: the [s, b, h] tensors are the rank's
    s/2 shard, the logits s b V/2 at 2 bytes (TE's saved bf16 copy)."""
    shape = _shape(1)
    a = replace(PLAIN, sequence_parallel=True, te_cross_entropy=True)
    layer = m.layer_activation_bytes(shape, "attention+mlp", a, tp=2)
    rest = (2 * SBH + 2 * 2 * SBH + 2 * SBH + 2 * 2 * SBH) / 2 + 8 * S * B + 2 * S * B * V / 2
    assert terms.mtp_activation_bytes(shape, a, tp=2) == layer + rest


def test_depths_scale_and_recompute_by_hand():
    """Without recompute every depth costs the same: D depths are D times one (each but the last keeps its output
    for the next depth's hnorm, the concatenation grows by one output per depth). Full uniform recompute keeps a
    depth's embedding and output and rematerialises one depth's inside part; block recompute is skipped for MTP."""
    one = terms.mtp_activation_bytes(_shape(1), PLAIN)
    for depths in (2, 3):
        assert terms.mtp_activation_bytes(_shape(depths), PLAIN) == pytest.approx(depths * one, rel=1e-12)
    inside = 6 * SBH + 16 * SBH + 6 * S * B * FFN
    full = replace(PLAIN, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    by_hand = 2 * (2 * SBH + 8 * S * B) + inside + 2 * SBH + 3 * 2 * SBH + 2 * 4 * S * B * V
    assert terms.mtp_activation_bytes(_shape(2), full) == by_hand
    block = replace(full, recompute_method="block")
    assert terms.mtp_activation_bytes(_shape(2), block) == 2 * one


def test_selective_recompute_fp8_and_peft_follow_the_inner_layer_and_eh_proj():
    shape = _shape(1)
    plain = terms.mtp_activation_bytes(shape, PLAIN)
    # selective recompute of the MLP: the inner layer drops what it drops in the decoder
    sel = replace(PLAIN, recompute_granularity="selective", recompute_modules=("mlp",))
    dropped = m.layer_activation_bytes(shape, "attention+mlp", PLAIN) - m.layer_activation_bytes(
        shape, "attention+mlp", sel
    )
    assert dropped > 0 and plain - terms.mtp_activation_bytes(shape, sel) == dropped
    # FP8: eh_proj keeps its 2h-wide input in 1 byte
    fp8 = replace(PLAIN, fp8=True)
    layer_saving = m.layer_activation_bytes(shape, "attention+mlp", PLAIN) - m.layer_activation_bytes(
        shape, "attention+mlp", fp8
    )
    assert plain - terms.mtp_activation_bytes(shape, fp8) == layer_saving + 2 * SBH
    # PEFT without an adapter on eh_proj: frozen, it keeps no input
    cfg = {"model": {"bias_activation_fusion": True, "hidden_dropout": 0.0}}
    peft = m.activation_settings(cfg, shape, seq_length=S, micro_batch_size=B, lora_targets=m.Lora().target_modules)
    assert "eh_proj" in peft.frozen_linears
    assert plain - terms.mtp_activation_bytes(shape, peft) == 2 * 2 * SBH
    targeted = m.activation_settings(
        cfg, shape, seq_length=S, micro_batch_size=B, lora_targets=(*m.Lora().target_modules, "eh_proj")
    )
    assert terms.mtp_activation_bytes(shape, targeted) == plain
    # the embedding dropout keeps a 1-byte mask, beside the inner layer's own masks
    dropout = replace(PLAIN, hidden_dropout=0.1)
    extra = terms.mtp_activation_bytes(shape, dropout) - plain
    masks = m.layer_activation_bytes(shape, "attention+mlp", dropout) - m.layer_activation_bytes(
        shape, "attention+mlp", PLAIN
    )
    assert masks > 0 and extra == SBH + masks


def test_inner_kinds_come_from_mtp_kinds():
    """A GPT model's depth repeats its last decoder layer (MoE here); a hybrid model's depth is its pattern after ``/``
    (attention then MoE): the inside part holds each kind once, as a decoder layer of that kind."""
    moe = _shape(1, num_moe_experts=4, moe_ffn_hidden_size=256, moe_router_topk=2, moe_layer_freq=[0, 1])
    assert moe.mtp_kinds() == [["attention+moe"]]
    _, inside = terms.mtp_depth_bytes(moe, moe.mtp_kinds()[0], PLAIN)
    assert inside == 6 * SBH + m.layer_activation_bytes(moe, "attention+moe", PLAIN)
    hybrid = m.shape_from_config(
        dict(
            DENSE,
            num_layers=4,
            hybrid_layer_pattern="M*-M/*E",
            num_moe_experts=4,
            moe_ffn_hidden_size=128,
            moe_router_topk=2,
            mamba_num_groups=2,
            mamba_state_dim=16,
            mamba_head_dim=32,
        )
    )
    assert hybrid.mtp_kinds() == [["attention", "moe"]]
    _, inside = terms.mtp_depth_bytes(hybrid, ["attention", "moe"], PLAIN)
    kinds = sum(m.layer_activation_bytes(hybrid, k, PLAIN) for k in ("attention", "moe"))
    assert inside == 6 * SBH + kinds
    assert terms.mtp_activation_bytes(hybrid, PLAIN) == 2 * SBH + 8 * S * B + inside + 2 * 2 * SBH + 4 * S * B * V


# ----------------------------------------------------------------------------- where it is added


def test_zero_without_mtp_and_added_beside_the_main_loss():
    """No depths: nothing. With them, PP 1: the whole term joins the activations (over CP); PP 2: the last stage's
    side, which with this vocabulary is the larger."""
    without, with_mtp = _shape(0), _shape(1)
    assert without.mtp_kinds() == [] and terms.mtp_activation_bytes(without, PLAIN) == 0.0
    mtp = terms.mtp_activation_bytes(with_mtp, PLAIN)
    for cp in (1, 2):
        delta = m.activation_bytes(with_mtp, PLAIN, cp=cp) - m.activation_bytes(without, PLAIN, cp=cp)
        assert delta == pytest.approx(mtp / cp, rel=1e-12)
    big_vocab = dict(vocab_size=65536)
    first = m.activation_bytes(_shape(0, **big_vocab), PLAIN, pp=2)
    last = m.activation_bytes(_shape(1, **big_vocab), PLAIN, pp=2)
    assert last - first == pytest.approx(terms.mtp_activation_bytes(_shape(1, **big_vocab), PLAIN), rel=1e-12)


def test_estimate_reports_the_term_and_notes_it():
    cfg = {"model": dict(DENSE, mtp_num_layers=2), "train": {"micro_batch_size": 1}}
    est = m.estimate(cfg, dp=1)
    assert est.mtp_activations == terms.mtp_activation_bytes(est.shape, est.activation) > 0
    assert MTP_NOTE in est.notes
    assert "activations counted" in MTP_NOTE and "are not" not in MTP_NOTE
    rep = m.report(cfg, dp=1)
    assert rep["assumptions"]["mtp_activations_gib"] == round(est.mtp_activations / 2**30, 3)
    assert any("MTP depths and their losses" in t for t in rep["strategies"][0]["modelled"])
    assert MTP_RECOMPUTE_NOTE not in est.notes
    plain = m.estimate({"model": dict(DENSE)}, dp=1)
    assert plain.mtp_activations == 0.0 and MTP_NOTE not in plain.notes
    assert not any("MTP" in t for t in m.report({"model": dict(DENSE)}, dp=1)["strategies"][0]["modelled"])


@pytest.mark.parametrize("num_layers,noted", [(1, False), (2, True)])
def test_full_uniform_recompute_of_more_than_one_layer_is_noted(num_layers, noted):
    """MultiTokenPredictionLayer._checkpointed_forward asserts recompute_num_layers == 1 under uniform recompute."""
    model = dict(
        DENSE,
        mtp_num_layers=1,
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=num_layers,
    )
    est = m.estimate({"model": model}, dp=1)
    assert (MTP_RECOMPUTE_NOTE in est.notes) is noted
