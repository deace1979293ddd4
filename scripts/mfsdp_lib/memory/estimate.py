"""The estimate and the report: all terms together for a config, per strategy.

``estimate`` combines shape, precision, activations and strategy model state into the
peak per GPU; ``report`` is what ``mfsdp.py memory`` prints; ``model_state`` is the
between-steps figure a measured ``memory_allocated()`` is compared with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .common import FP32, GIB, ModelError, _bool, _first, _get, _int, _positive
from .shapes import Counts, Shape, builtin_shape, count_parameters, shape_from_config
from .strategies import MAX_DP_SEARCH, STRATEGIES, StrategyMemory, strategy_memory
from .terms import (
    ActivationSettings,
    Precision,
    activation_bytes,
    activation_settings,
    megatron_activation_bytes,
    precision_from_config,
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
