"""Dense peak Tensor Core throughput per GPU, and MFU against it.

Model FLOPs per step come from the engine, which calls Bridge's own formula on the job's
config (``megatron/bridge/training/utils/flop_utils.py`` :: ``num_floating_point_operations``,
the figure Bridge's training log prints as ``MODEL_TFLOP/s/GPU`` and its performance
summary publishes): ``num_floating_point_operations(cfg, batch_size=global_batch_size)`` per
step for the whole job, divided by the world size per GPU (``megatron/bridge/training/utils/train_utils.py``
:: ``training_log``). Nothing here recomputes it.

Peaks are NVIDIA's datasheet figures for dense math. The datasheets print Tensor Core
throughput "with sparsity" (2:4 structured sparsity doubles it); dense is half of that:

* H100 SXM5 and H200 SXM (same Hopper GH100 compute at 700 W; NVIDIA H100 Tensor Core GPU
  datasheet, NVIDIA H200 Tensor Core GPU datasheet): BF16 1,979 TFLOP/s with sparsity, so
  989.4 dense (NVIDIA's Hopper whitepaper gives 989.4 for dense BF16 on H100 SXM5); FP8
  3,958 with sparsity, 1,978.9 dense.
* H100 PCIe: BF16 1,513 / FP8 3,026 with sparsity (756 / 1,513 dense).
* H100 NVL and H200 NVL: BF16 1,671 / FP8 3,341 with sparsity (835 / 1,671 dense).
* A100 SXM / PCIe (NVIDIA A100 datasheet): BF16 312 dense; no FP8.

MFU is the model's TFLOP/s per GPU over the peak of the precision the job's matrix
multiplications run in (FP8 recipes: the FP8 peak). Against the BF16 peak an FP8 job's
figure doubles; both are given so that a reader can match NVIDIA's or anyone's convention.
"""

from __future__ import annotations

import re

# name pattern (matched on the device name's words) -> {precision: dense TFLOP/s}, source
PEAKS: tuple[tuple[str, dict[str, float], str], ...] = (
    (r"\bH200\b.*\bNVL\b", {"bf16": 835.5, "fp8": 1670.5}, "NVIDIA H200 NVL datasheet (with-sparsity figures / 2)"),
    (r"\bH200\b", {"bf16": 989.4, "fp8": 1978.9}, "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM (sparsity / 2)"),
    (r"\bH100\b.*\bNVL\b", {"bf16": 835.5, "fp8": 1670.5}, "NVIDIA H100 datasheet, H100 NVL (sparsity / 2)"),
    (r"\bH100\b.*\bPCIe\b", {"bf16": 756.5, "fp8": 1513.0}, "NVIDIA H100 datasheet, H100 PCIe (sparsity / 2)"),
    (r"\bH100\b", {"bf16": 989.4, "fp8": 1978.9}, "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM (sparsity / 2)"),
    (r"\bA100\b", {"bf16": 312.0}, "NVIDIA A100 Tensor Core GPU datasheet (dense BF16)"),
)


def peak(device_name: str | None, precision: str) -> dict | None:
    """{tflops, precision, source, matched} for a device name, or None when unknown."""
    if not device_name:
        return None
    for pattern, table, source in PEAKS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            value = table.get(precision)
            if value is None:
                return None
            return {"tflops": value, "precision": precision, "source": source, "matched": pattern}
    return None


def precision_of(model_fp8) -> str:
    """``fp8`` when the job's GEMMs run in FP8 (``model.fp8`` is set, e.g. "e4m3" or "hybrid"), else ``bf16``."""
    return "fp8" if model_fp8 not in (None, False, "", "none", "None") else "bf16"


def mfu(model_tflops_per_gpu: float | None, device_name: str | None, precision: str) -> dict:
    """MFU against the precision's peak and against the BF16 peak (see the module docstring)."""
    out: dict = {"precision": precision, "device": device_name}
    p = peak(device_name, precision)
    b = peak(device_name, "bf16")
    out["peak_tflops"] = p["tflops"] if p else None
    out["peak_source"] = p["source"] if p else None
    if model_tflops_per_gpu is None or p is None:
        out["mfu"] = None
        out["why"] = "no peak for this device and precision" if p is None else "no model FLOPs recorded"
    else:
        out["mfu"] = round(model_tflops_per_gpu / p["tflops"], 4)
    out["mfu_vs_bf16_peak"] = (
        round(model_tflops_per_gpu / b["tflops"], 4) if (b and model_tflops_per_gpu is not None) else None
    )
    return out
