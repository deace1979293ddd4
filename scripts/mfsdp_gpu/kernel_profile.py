"""Where a timed step's GPU time goes: the kernels of the timed steps, summed by name and by kind.

``rehearse --perf --profile`` runs the timed steps under ``torch.profiler`` with the CUDA activity only
(CUPTI's kernel, copy and memset records: no CPU-side operator tracing, whose overhead would slow the
host's kernel launches), then sums each kernel's device time over those steps. The report keeps the
per-step totals by kind (``KINDS``) and the longest kernels by name, a few kilobytes where a trace file
would take hundreds of megabytes. Comparing two strategies' profiles of the same job shows which kernels
or copies one of them adds.

Kinds are read from the kernel's name with the ordered token lists below: the first kind with a token in
the lower-cased name wins. A name no list matches is "other"; the report shows the longest kernels by name,
so what "other" holds stays visible. The token lists are kept to library kernel families (cuBLAS/CUTLASS
GEMMs, cuDNN and flash attention, Transformer Engine's casts, megatron-core's MoE permutation, PyTorch's
copy and elementwise kernels, NCCL).

The summary functions are pure Python (tested without a GPU); torch is imported only in :class:`StepProfiler`.
"""

from __future__ import annotations

# (kind, tokens): the first kind with a token found in the lower-cased kernel name. Order matters:
# cuDNN's fused attention names hold "sdpa"/"flash" and GEMM-like tile words, and are attention; a PyTorch
# copy that converts dtypes (``direct_copy_kernel_cuda``) is a copy, not a cast; Transformer Engine's FP8
# kernels name their format or operation (quantize, amax, cast_transpose). PyTorch's elementwise kernels
# carry the operation's functor in their template arguments (``CUDAFunctor_add``, ``silu_kernel``), which is
# what is matched; the implementation word ``gpu_kernel_impl_nocast`` is dropped first (see ``kind_of``).
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("nccl", ("nccl",)),
    ("memcpy", ("memcpy",)),
    ("memset", ("memset",)),
    ("attention", ("flash", "fmha", "attn", "sdpa", "softmax")),
    ("gemm", ("gemm", "cutlass", "nvjet", "xmma", "cublas")),
    (
        "moe_permute",
        ("permut", "moe", "topk", "sort", "histogram", "index_select", "indexselect", "indexfunc", "scatter", "gather"),
    ),
    ("optimizer", ("adam", "multi_tensor", "multitensor")),
    ("copy", ("direct_copy", "copy_kernel", "catarray")),
    ("fp8_cast", ("quantize", "amax", "cast_transpose", "fp8", "e4m3", "e5m2")),
    ("norm", ("norm",)),
    ("add", ("functor_add", "functoronself_add")),  # elementwise adds: gradient accumulation among them
    ("reduce", ("reduce_kernel", "reduceop", "sum_kernel")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "fill")),
)
# Words of PyTorch's kernel implementation that name no operation and would match a token ("nocast").
IMPLEMENTATION_WORDS = ("gpu_kernel_impl_nocast",)
TOP_KERNELS = 40  # kernels kept by name, longest first: enough to see what a kind holds


def kind_of(name: str) -> str:
    """The kind of a kernel (or copy/memset record) from its name (``KINDS``); "other" when none matches."""
    low = name.lower()
    for word in IMPLEMENTATION_WORDS:
        low = low.replace(word, "")
    for kind, tokens in KINDS:
        if any(t in low for t in tokens):
            return kind
    return "other"


def summarise(kernels: list[dict], steps: int) -> dict:
    """Per-step totals by kind and the longest kernels, from ``[{"name", "count", "device_us"}, ...]``
    summed over ``steps`` profiled steps. Times are milliseconds per step."""
    steps = max(int(steps), 1)
    by_kind: dict[str, float] = {}
    calls_by_kind: dict[str, int] = {}
    total = 0.0
    for k in kernels:
        us = float(k.get("device_us") or 0.0)
        if us <= 0:
            continue
        kind = kind_of(str(k.get("name", "")))
        by_kind[kind] = by_kind.get(kind, 0.0) + us
        calls_by_kind[kind] = calls_by_kind.get(kind, 0) + int(k.get("count") or 0)
        total += us
    top = sorted((k for k in kernels if float(k.get("device_us") or 0) > 0), key=lambda k: -float(k["device_us"]))
    return {
        "steps": steps,
        "device_ms_per_step": round(total / 1e3 / steps, 3),
        "by_kind_ms_per_step": {
            kind: round(us / 1e3 / steps, 3) for kind, us in sorted(by_kind.items(), key=lambda kv: -kv[1])
        },
        "calls_by_kind_per_step": {kind: round(n / steps, 1) for kind, n in calls_by_kind.items()},
        "top_kernels": [
            {
                "name": str(k["name"])[:160],
                "kind": kind_of(str(k["name"])),
                "calls_per_step": round(int(k.get("count") or 0) / steps, 1),
                "ms_per_step": round(float(k["device_us"]) / 1e3 / steps, 3),
            }
            for k in top[:TOP_KERNELS]
        ],
        "kinds_from": "kernel names (mfsdp_gpu.kernel_profile.KINDS)",
    }


def difference(a: dict, b: dict) -> dict:
    """Per kind, ``a``'s milliseconds per step minus ``b``'s (two :func:`summarise` results), largest first."""
    ka, kb = a.get("by_kind_ms_per_step") or {}, b.get("by_kind_ms_per_step") or {}
    diff = {k: round(float(ka.get(k, 0.0)) - float(kb.get(k, 0.0)), 3) for k in set(ka) | set(kb)}
    return dict(sorted(diff.items(), key=lambda kv: -abs(kv[1])))


class StepProfiler:
    """``torch.profiler`` over the timed steps, CUDA activity only; :meth:`summary` sums the kernels."""

    def __init__(self):
        self.prof = None
        self.steps = 0

    def step_started(self) -> None:
        """Called at the start of each timed step: the profiler starts with the first one."""
        if self.prof is None:
            import torch

            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            self.prof.start()
        self.steps += 1

    def summary(self) -> dict | None:
        """Stop the profiler (after the GPU finished) and sum its kernels; None when it never started."""
        if self.prof is None:
            return None
        import torch

        torch.cuda.synchronize()
        self.prof.stop()
        records = []
        for e in self.prof.events():
            # device-side records only (kernels, copies, memsets); CUDA runtime calls are host-side records
            if str(getattr(e, "device_type", "")).rsplit(".", 1)[-1] != "CUDA":
                continue
            records.append((e.name, float(e.time_range.elapsed_us())))
        self.prof = None
        return summarise(group_by_name(records), self.steps)


def group_by_name(records) -> list[dict]:
    """``[(name, microseconds), ...]`` summed per name: ``[{"name", "count", "device_us"}, ...]``."""
    out: dict[str, dict] = {}
    for name, us in records:
        row = out.setdefault(name, {"name": name, "count": 0, "device_us": 0.0})
        row["count"] += 1
        row["device_us"] += us
    return list(out.values())
