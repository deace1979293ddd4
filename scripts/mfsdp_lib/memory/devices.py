"""How much of a GPU a training process gets, and how close to it an estimate may come.

Two facts turn a predicted peak into a verdict:

* **Usable memory.** A card sold as "80 GB" gives a process what the CUDA driver manages, which is
  less: ``--gpu-mem-gib h100`` and ``h200`` use the totals measured on this project's machines
  (``GPU_PRESETS``: the figure, the card, and the file that recorded it).
* **Headroom.** The estimate predicts ``torch.cuda.max_memory_allocated()``. A process also holds
  its CUDA context, NCCL's buffers and the caching allocator's fragmentation (reserved but not
  allocated), none of which the estimate counts. Above ``TIGHT_FRACTION`` of the card a
  prediction that fits is reported "tight", not "yes".

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from .common import ModelError


@dataclass(frozen=True)
class GpuPreset:
    gib: float  # what a process can allocate, GiB (2^30 bytes)
    card: str  # the product name the driver reports
    source: str  # where the figure was measured (a file in this repository)


# Measured totals, never the marketing size:
# - H100: cuDeviceTotalMem (= cuMemGetInfo's total) of an "NVIDIA H100 80GB HBM3" is 85,017,493,504 B =
#   79.18 GiB; nvidia-smi says 81,559 MiB (79.65 GiB), which includes memory the driver keeps for itself.
#   A bare CUDA context already takes 0.51 GiB of it (benchmarks/gpu_memory_total.py wrote the file).
# - H200: torch.cuda.mem_get_info()'s total on an "NVIDIA H200" is 150,109,880,320 B = 139.80 GiB (every
#   rehearsal report's device_total_bytes); nvidia-smi says 143,771 MiB (140.40 GiB).
GPU_PRESETS = {
    "h100": GpuPreset(
        85_017_493_504 / 2**30,
        "NVIDIA H100 80GB HBM3",
        "cuDeviceTotalMem, benchmarks/results/raw/gpu_memory_total_1xh100/gpu_memory_total.json",
    ),
    "h200": GpuPreset(
        150_109_880_320 / 2**30,
        "NVIDIA H200",
        "torch.cuda.mem_get_info total, benchmarks/results/raw/gpu_pkg_reverify_1xh200/rehearse/"
        "A_llama1b_n1_ddp/report.json (device_total_bytes)",
    ),
}

# Nominal sizes users type for these cards (80 GB, 141 GB): the estimate then points at the preset.
NOMINAL_GIB = {80.0: "h100", 141.0: "h200"}

# Above this fraction of the card a predicted peak is "tight": what the estimate does not count must fit in
# the rest. Measured on the H200 rehearsals (benchmarks/results/raw/memory_rehearsal_1xh200/*/report.json):
# the largest run (Llama 3 70B, optim_grads_params, DP 64) allocated at most 84.38 GiB while the driver
# charged the process 89.63 GiB (process_used_bytes_nvml): 6.2 % more, of which 4.44 GiB was the
# allocator's fragmentation (peak reserved - peak allocated) and 0.81 GiB the CUDA context and library
# workspaces; a multi-node job adds NCCL's buffers on top. Ten per cent of the card covers that.
TIGHT_FRACTION = 0.90

NOT_COUNTED = (
    "the CUDA context (0.5 GiB bare), NCCL buffers and allocator fragmentation (5.3 % of the largest measured peak)"
)

# The ``fit`` values of a report row.
FIT_YES, FIT_TIGHT, FIT_NO = "yes", "tight", "no"
FIT_PP = "n/a (PP > 1)"


def parse_gpu_mem(text) -> tuple[float, str | None]:
    """``--gpu-mem-gib``: a number of GiB, or a preset name (``h100``, ``h200``) -> (GiB, preset or None)."""
    if isinstance(text, (int, float)):
        return float(text), None
    raw = str(text).strip().lower()
    if raw in GPU_PRESETS:
        return GPU_PRESETS[raw].gib, raw
    try:
        return float(raw), None
    except ValueError:
        raise ModelError(
            f"--gpu-mem-gib must be a number of GiB or one of {', '.join(GPU_PRESETS)} (the memory a process "
            f"gets on that card), got {text!r}"
        ) from None


def fit(total_gib: float, gpu_mem_gib: float) -> str:
    """ "yes" below the headroom line, "tight" between it and the card, "no" above the card."""
    if total_gib > gpu_mem_gib:
        return FIT_NO
    return FIT_TIGHT if total_gib > TIGHT_FRACTION * gpu_mem_gib else FIT_YES


def gpu_info(gpu_mem_gib: float, preset: str | None) -> dict:
    """The ``gpu`` object of the report: the figure used, where it comes from, and the headroom line."""
    info = {
        "gib": round(gpu_mem_gib, 3),
        "preset": preset,
        "card": GPU_PRESETS[preset].card if preset else None,
        "source": GPU_PRESETS[preset].source if preset else "--gpu-mem-gib",
        "tight_above_gib": round(TIGHT_FRACTION * gpu_mem_gib, 3),
        "tight_fraction": TIGHT_FRACTION,
        "not_counted": NOT_COUNTED,
    }
    nominal = NOMINAL_GIB.get(float(gpu_mem_gib)) if preset is None else None
    if nominal:
        p = GPU_PRESETS[nominal]
        info["note"] = (
            f"{gpu_mem_gib:g} GiB is the card's nominal size; an {p.card} gives a process {p.gib:.2f} GiB "
            f"(--gpu-mem-gib {nominal})"
        )
    return info
