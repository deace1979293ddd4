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

# Fixed workspace present at every peak (cuBLAS / Transformer Engine workspaces), added to the peak
# whichever moment decides it.
PEAK_FIXED_BYTES = 0.0
# Activation scale per (family, strategy group): 1 + the measured excess of the activation peak over
# the modelled one. Megatron FSDP's optim_grads_params (weights sharded, gathered layer by layer) is
# its own group: its measured peaks need less than the strategies that keep whole weights.
ACTIVATION_FACTOR = {
    ("dense", "whole"): 1.18,
    ("dense", "sharded"): 1.04,
    ("moe", "whole"): 1.08,
    ("moe", "sharded"): 1.0,
    ("hybrid", "whole"): 1.2,
    ("hybrid", "sharded"): 1.2,
}


def group(strategy: str) -> str:
    return "sharded" if strategy == "optim_grads_params" else "whole"


def family(est) -> str:
    """``hybrid`` (Mamba layers), ``moe`` (routed experts) or ``dense``."""
    kinds = getattr(est.counts, "kinds", ()) or ()
    if any("mamba" in k for k in kinds):
        return "hybrid"
    if any("moe" in k for k in kinds) or est.counts.gpu_experts:
        return "moe"
    return "dense"


def _total(est, strategy: str, dp: int, factor: float, fixed: float = 0.0) -> float:
    from .strategies import strategy_memory

    par = est.parallel
    row = est.rows.get(strategy) if dp == par.dp else None
    if row is None:
        row = strategy_memory(
            strategy, est.counts, est.precision, dp=dp, cp=par.cp, tp=par.tp, ep=par.ep, etp=par.etp, peft=est.peft
        )
    act = est.activations or 0.0
    return row.total(act * factor) + fixed


def peak_margin_bytes(est, strategy: str, dp: int) -> float:
    """Calibrated bytes added to the modelled peak (0 when the peak is not the activation moment)."""
    if est.activations is None:
        return PEAK_FIXED_BYTES
    factor = ACTIVATION_FACTOR[(family(est), group(strategy))]
    return _total(est, strategy, dp, factor, PEAK_FIXED_BYTES) - _total(est, strategy, dp, 1.0, 0.0)


def needed_factor(est, strategy: str, measured_peak: float, fixed: float = PEAK_FIXED_BYTES) -> float:
    """Smallest activation factor (>= 1) at which the predicted peak reaches ``measured_peak``."""
    dp = est.parallel.dp
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
