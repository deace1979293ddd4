"""The part of the measured peak that the modelled terms leave out, fitted on measured runs.

Why: the terms in ``terms``/``strategies`` are what the code allocates on purpose, traced to
the line that does it. A real peak (``torch.cuda.max_memory_allocated``) also holds what no
config field describes: autograd's temporaries inside fused kernels, TE and cuBLAS workspaces,
torch.compile's buffers in the loss, the MoE dispatcher's transient copies. A prediction below
the measured peak turns "fits" into an out-of-memory error, so the modelled activations are
scaled up by a factor fitted on measured runs (one per model family, because their
activations differ in kind), plus a fixed workspace.

How: ``fit`` takes measured runs (``benchmarks/bench_memory.py``'s raw rehearsal runs) and,
per family, finds the smallest activation factor that puts every run's predicted peak at or
above its measured peak (a bisection: the peak grows with the factor). The constants below
are those factors, rounded up; ``tests/test_memory_evidence.py`` re-fits them on the committed
runs and fails when a constant is below what the evidence needs. The model state (between
steps) is never calibrated: it is computed.
"""

from __future__ import annotations

from collections.abc import Iterable

from .terms import dsa_topk_holder_bytes, rope_cache_bytes

# Allocated between steps beyond the model state in every measured run (cuBLAS and Transformer
# Engine workspaces, RNG states, the batch, loss and logging tensors): 0.10-0.14 GiB on H200
# rehearsals of 1.1 B to 70 B models, whatever the strategy. Counted between steps and at the peak.
FRAMEWORK_BYTES = 0.1 * 2**30
# MoE layers leave about one bf16 s x b x h tensor each allocated between steps (router and token
# dispatcher state): measured 0.13-0.15 GiB beyond the dense case on a 16-layer MoE at EP 8, N 8 and 64.
# Sized at the rank's tokens: context parallelism splits the sequence before the decoder (Bridge gpt_step.py:336,
# get_batch_on_this_cp_rank) and only attention exchanges keys and values across CP, so s is s / CP there. Tensor
# parallelism is left as fitted: the measured MoE rows with TP > 1 (DeepSeek-V3, Qwen3-30B-A3B, GPT-OSS) are sized
# at the whole s. GLM-5.2's SFT recipe at CP 16 (rank 0 of 416, H200) lands 3.5 % over its measured state at the
# whole s, 0.6 % under at s / CP.
MOE_STATE_BYTES_PER_TOKEN_HIDDEN = 2
# Multi-latent attention layers leave more allocated between steps than any modelled term: on Bridge's MoE + MLA
# recipes rehearsed on an H200 under optim_grads_params (rank 0 of the recipe's world), DeepSeek-V2-Lite (27 MLA
# layers, 4096 tokens a rank) held 1.240 GiB beyond the modelled state and DeepSeek-V3 (61 layers, TP 2 with sequence
# parallelism: 2048 tokens a rank) 0.61 GiB, while the GQA MoE recipes (Qwen3-30B-A3B, OLMoE) need nothing more. Per
# MLA layer and token this rank holds: 12,039 bytes for V2-Lite, rounded up; V3 then lands 2.3 % over. Fitted: the
# allocation sites are not traced to lines, beyond YarnRotaryEmbedding's cos/sin caches (2 x 4096 positions x 64 x
# fp32 = 2 MiB per layer, yarn_rotary_pos_embedding.py __init__ -> _set_cos_sin_cache), which is part of it.
# Counted between steps and at the peak.
MLA_STATE_BYTES_PER_TOKEN = 12 * 1024
# Gemma's layers leave more allocated than the traced terms (terms.rope_cache_bytes included), in two places. Bridge's
# Gemma 3 1B recipes rehearsed on an H200 (pretrain, SFT, LoRA; optim_grads_params, one GPU): after the model is built,
# 53.53 MiB beyond its bf16 weights in all three (vocabulary 32,000 or 262,144, sequence 32768 or 4096), where Llama's
# recipes hold 32-33 MiB; and between steps the SFT recipe another 17 MiB beyond the pretrain and LoRA ones. Once the
# rotary tables are counted, the memory between steps is still 18.7 (pretrain), 37.0 (SFT) and 20.7 MiB (LoRA) above
# the prediction. Fitted, rounded up; the allocation sites are not traced to lines. Given to every model with Gemma's
# post-attention and post-feed-forward norms (Gemma 2 and 3, Shape.layer_post_norms): Gemma 2 is not measured, and
# too high a prediction only wastes memory. Counted between steps and at the peak.
GEMMA_STATE_BYTES = 0.04 * 2**30
# Activation scale per (family, strategy group): 1 + the measured excess of the activation peak over
# the modelled one (fused-kernel temporaries, unfused RoPE copies, allocator rounding), fitted with
# ``fit`` on the measured runs (tests/test_memory_evidence.py re-fits it). Megatron FSDP's
# optim_grads_params (weights sharded, gathered layer by layer) is its own group.
ACTIVATION_FACTOR = {
    # Fitted (rounded up) on the committed runs: dense Llama 1.1 B at N = 1 to 64 under all five
    # strategies needs up to 1.165 ("whole") and, with the 8 B and 70 B trunks, 1.225 ("sharded").
    ("dense", "whole"): 1.17,
    ("dense", "sharded"): 1.23,
    # MoE (16-layer Qwen3-30B-A3B-like trunk, EP 8): 1.0400 sharded (N = 8 and 64); with whole weights
    # (the distributed optimizer, N = 64) the modelled peak already covers the measured one (1.0). Bridge's OLMoE
    # recipes (pretrain and SFT, EP 8, selective recompute; rehearsed on an H200 as rank 0 of 8) need 1.0744 and
    # 1.0776 sharded: 1.08, and the whole-weights factor kept at the sharded one, the larger.
    ("moe", "whole"): 1.08,
    ("moe", "sharded"): 1.08,
    # MoE whose experts clamp their gated activation (model.activation_func_clamp_value: GPT-OSS). Bridge's GPT-OSS
    # 20B pretrain recipe (TP 2 with sequence parallelism, EP 4; rehearsed on an H100 as rank 0 of 16) needs 1.1471
    # sharded, its SFT recipe (TP 1, EP 8, rank 0 of 8) 1.0: 1.15. The MoE factor cannot take it: at 1.15 the
    # 16-layer MoE trunk at N = 64 lands 6.3 % over. Fitted, not traced. The traced candidate, the clamped copy of
    # the FC1 output this activation keeps (moe/experts.py:836-844 -> fusions/fused_bias_geglu.py:424-432 torch.cat
    # of the clamped halves, saved for backward at :379, beside the FC1 output that autograd's clamp keeps), is one
    # FC1 output per routed token: 2.1 GiB on each GPT-OSS row, which would put all three 6-7 % over (the SFT and
    # LoRA rows peak 1.0-1.2 GiB below the terms without it), so it is not counted as a term. No whole-weights run
    # is measured: the sharded factor, the larger.
    ("moe_clamped", "whole"): 1.15,
    ("moe_clamped", "sharded"): 1.15,
    # LoRA on the 1.1 B model, N = 8 and 64, with PEFT_FIRST_STEP_BYTES as its fixed part: 1.1571 (1.294 without
    # it). No whole-weights LoRA run is measured: the dense model's whole factor, which is the larger.
    ("peft", "whole"): 1.17,
    ("peft", "sharded"): 1.16,
    # Hybrid Mamba on megatron-core's unfused Mamba path. Sharded: Bridge's Nemotron 3 Nano 4B recipe at
    # N = 8 and 64, Nemotron-H 4B at N = 8 and the 26-layer Nemotron-H 4B preset at N = 8 and 64: with
    # HYBRID_SHARDED_FIXED_BYTES below the modelled activations cover every measured peak (1.0). Whole
    # weights (the distributed optimizer, the preset at N = 8 and 64): 1.0026, rounded up.
    ("hybrid", "whole"): 1.01,
    ("hybrid", "sharded"): 1.0,
}
# Families fitted on measured runs (above); models with gated delta net layers are not among them.
MEASURED_FAMILIES = ("dense", "moe", "moe_clamped", "peft", "hybrid")
# A fixed part of the hybrid peak under optim_grads_params that does not scale with the activations:
# the 26-layer preset at sequence 2048 (4.7 GiB of modelled activations) peaks 0.25-0.28 GiB above its
# modelled peak, while the recipe trunks (19-35 GiB of activations) peak 0.1-0.5 GiB below theirs, so
# no activation factor fits both within the 5 % target. Fitted, rounded up; its allocation site is not
# traced to a line. Added to the peak only, never to the memory between steps.
HYBRID_SHARDED_FIXED_BYTES = 0.3 * 2**30
# LoRA's first step peaks higher than its later ones by a fixed amount, whatever the sharding: 0.456 GiB at N = 8 and
# 0.467 GiB at N = 64 on the 1.1 B preset (peak_fwd_bwd_bytes of step 1 less that of steps 2 and 3), while the dense
# model's later steps peak as high as its first. Measured, rounded up; its allocation site is not traced to a line. A
# fixed part rather than a larger activation factor, because a factor fitted on it (1.3) over-predicts the long-sequence
# LoRA recipes (their activations 3-6 times the preset's) by up to 17 % (Llama 3.1 8B's, H100).
PEFT_FIRST_STEP_BYTES = 0.47 * 2**30
# LoRA on a hybrid (Mamba) trunk is of the hybrid family (its activations are Mamba's), yet its first step peaks
# above its later ones as LoRA's does: Bridge's Nemotron 3 Nano 4B LoRA recipe (rank 0 of 8, optim_grads_params, H100)
# peaks 1.01 GiB higher in step 1 than in steps 2 and 3. With the traced terms (terms.peft_frozen_prefix, the frozen
# Mamba projections) the prediction for the job as run is 1.4 % under the first step without it, 3.4 % over with it.
# So the hybrid family takes PEFT_FIRST_STEP_BYTES too when it trains LoRA adapters (peak_fixed_bytes).
PEAK_FIXED_BYTES = {
    ("hybrid", "sharded"): HYBRID_SHARDED_FIXED_BYTES,
    ("peft", "sharded"): PEFT_FIRST_STEP_BYTES,
    ("peft", "whole"): PEFT_FIRST_STEP_BYTES,
}
# Gated delta net layers (Qwen3-Next, Qwen3.5): their activation terms are traced from megatron-core's and
# flash-linear-attention's source (terms.gdn_layer_bytes), and no run with them is measured yet. Without evidence of
# how far their real peak exceeds the traced terms, they take, per strategy group, the largest factor and the largest
# fixed part of the measured families: a prediction too low turns "fits" into an out-of-memory error, one too high
# only wastes a GPU. Replace with a fit once measured runs exist (tests/test_memory_evidence.py then checks it).
ACTIVATION_FACTOR.update(
    {("gdn", g): max(ACTIVATION_FACTOR[(f, g)] for f in MEASURED_FAMILIES) for g in ("whole", "sharded")}
)
PEAK_FIXED_BYTES.update(
    {("gdn", g): max(PEAK_FIXED_BYTES.get((f, g), 0.0) for f in MEASURED_FAMILIES) for g in ("whole", "sharded")}
)


def group(strategy: str) -> str:
    return "sharded" if strategy == "optim_grads_params" else "whole"


def family(est) -> str:
    """``gdn`` (gated delta net layers, unmeasured), ``hybrid`` (Mamba layers), ``peft`` (LoRA on a GPT model, dense
    or MoE), ``moe_clamped`` (routed experts with a clamped activation: GPT-OSS), ``moe`` (routed experts) or
    ``dense``.

    LoRA on a MoE model is ``peft``: with its experts frozen and unadapted they keep no inputs (``terms``), so the
    MoE factor, fitted where expert activations dominate, would scale a total that LoRA has shrunk while what it
    leaves out (the rotated Q and K copies beside the QKV projection, the backward pass's working set) has not
    shrunk. Measured once (Qwen3-30B-A3B's LoRA recipe, TP 4, EP 4, H100): 1.14 beyond the modelled terms."""
    kinds = getattr(est.counts, "kinds", ()) or ()
    if any("gdn" in k for k in kinds):
        return "gdn"  # not measured: the most conservative of the measured families (see ACTIVATION_FACTOR)
    if any("mamba" in k for k in kinds):
        return "hybrid"
    if est.peft:
        return "peft"
    if any("moe" in k for k in kinds) or est.counts.gpu_experts:
        a = getattr(est, "activation", None)
        return "moe_clamped" if a is not None and a.moe_activation_clamp else "moe"
    return "dense"


def _total(est, strategy: str, dp: int, factor: float, fixed: float = 0.0, row=None) -> float:
    from .strategies import strategy_memory

    par = est.parallel
    if row is None and dp == par.dp:
        row = est.rows.get(strategy)
    if row is None:
        row = strategy_memory(
            strategy,
            est.counts,
            est.precision,
            dp=dp,
            cp=par.cp,
            tp=par.tp,
            ep=par.ep,
            etp=par.etp,
            peft=est.peft,
            loss_headroom=getattr(est, "loss_headroom", 0.0),
        )
    act = est.activations or 0.0
    # The margins belong to the training steps (workspaces, MoE layer state, activation excess): none of it exists
    # while the model is built, so they are added to the training peak, not to the construction peak. Measured:
    # DeepSeek-V3's recipe (rank 0 of 256, built unsharded) peaks at 55.09 GiB while Megatron FSDP wraps it, 0.56 GiB
    # under the modelled construction peak; adding its 3.3 GiB MoE state margin there put the prediction 7 % over.
    return max(row.training_total(act * factor) + fixed, row.init_peak)


def state_margin_bytes(est) -> float:
    """Bytes between steps beyond the model state: framework workspaces, MoE layer state, MLA layer state (measured),
    Gemma 3's cached rotary tables and DSA's shared top-k indices (traced: ``terms.rope_cache_bytes``,
    ``terms.dsa_topk_holder_bytes``) and Gemma's build-time excess (measured)."""
    out = FRAMEWORK_BYTES
    if est.shape is not None and est.shape.layer_post_norms:
        out += GEMMA_STATE_BYTES
    a = est.activation
    if a is not None and est.shape is not None:
        out += rope_cache_bytes(est.shape, a.seq_length)
        kinds = est.counts.kinds[: est.counts.layers_on_gpu]
        moe_layers = sum(1 for k in kinds if "moe" in k)
        par = est.parallel
        rank_tokens = a.seq_length * a.micro_batch_size / (par.cp or 1)
        out += MOE_STATE_BYTES_PER_TOKEN_HIDDEN * moe_layers * rank_tokens * est.shape.hidden_size
        out += dsa_topk_holder_bytes(
            est.shape,
            a.seq_length,
            a.micro_batch_size,
            par.cp or 1,
            est.counts.layers_on_gpu,
            last_stage=(par.pp or 1) == 1 or est.counts.stage == "last",
        )
        mla_layers = sum(1 for k in kinds if k.startswith("mla+"))
        if mla_layers:
            tokens = rank_tokens
            if a.sequence_parallel and (par.tp or 1) > 1:
                tokens /= par.tp  # the rank's sequence shard
            out += MLA_STATE_BYTES_PER_TOKEN * mla_layers * tokens
    return out


def peak_fixed_bytes(est, strategy: str) -> float:
    """The fixed part of the peak margin: ``state_margin_bytes`` plus the family's fitted fixed part, and LoRA's
    first-step part (``PEFT_FIRST_STEP_BYTES``) for LoRA on a hybrid trunk."""
    fam = family(est)
    out = state_margin_bytes(est) + PEAK_FIXED_BYTES.get((fam, group(strategy)), 0.0)
    if est.peft and fam == "hybrid":
        out += PEFT_FIRST_STEP_BYTES
    return out


def peak_margin_bytes(est, strategy: str, dp: int, row=None) -> float:
    """Calibrated bytes added to the modelled peak: the activation excess (when activations decide
    the peak) plus ``peak_fixed_bytes``, both on the training peak; where the model-construction peak
    is higher still, only what the training peak with them exceeds it by. Never negative: every factor
    is >= 1 and the fixed parts are >= 0, which lets ``estimate.smallest_dp`` skip it where the
    modelled peak alone does not fit.
    ``row``: the strategy's memory at ``dp`` when the caller has it already (saves two rebuilds)."""
    fixed = peak_fixed_bytes(est, strategy)
    factor = ACTIVATION_FACTOR[(family(est), group(strategy))] if est.activations else 1.0
    return _total(est, strategy, dp, factor, fixed, row=row) - _total(est, strategy, dp, 1.0, row=row)


def needed_factor(est, strategy: str, measured_peak: float) -> float:
    """Smallest activation factor (>= 1) at which the predicted peak reaches ``measured_peak``."""
    dp = est.parallel.dp
    fixed = peak_fixed_bytes(est, strategy)
    if _total(est, strategy, dp, 1.0, fixed) >= measured_peak or not est.activations:
        return 1.0
    lo, hi = 1.0, 2.0
    while _total(est, strategy, dp, hi, fixed) < measured_peak and hi < 64:
        hi *= 2
    for _ in range(50):
        mid = (lo + hi) / 2
        if _total(est, strategy, dp, mid, fixed) >= measured_peak:
            hi = mid
        else:
            lo = mid
    return hi


def fit(runs: Iterable[tuple[object, str, float]]) -> dict[tuple[str, str], float]:
    """Per (family, strategy group), the largest factor any run needs.

    ``runs``: ``(Estimate, strategy, measured peak bytes)`` for each measured run."""
    out: dict[tuple[str, str], float] = {}
    for est, strategy, peak in runs:
        key = (family(est), group(strategy))
        out[key] = max(out.get(key, 1.0), needed_factor(est, strategy, peak))
    return out
