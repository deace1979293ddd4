"""Peak throughput by device name and precision, and MFU."""

from __future__ import annotations

import pytest

from mfsdp_lib.perf import flops


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA H200", "fp8", 1978.9),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "fp8", 1513.0),
        ("NVIDIA H100 NVL", "bf16", 835.5),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ],
)
def test_peaks_follow_the_datasheets_dense_figures(name, precision, tflops):
    assert flops.peak(name, precision)["tflops"] == tflops


def test_unknown_devices_and_precisions_have_no_peak():
    assert flops.peak("NVIDIA GeForce RTX 4090", "bf16") is None
    assert flops.peak("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert flops.peak(None, "bf16") is None


def test_mfu_against_the_precision_peak_and_the_bf16_peak():
    m = flops.mfu(744.0, "NVIDIA H100 80GB HBM3", "fp8")
    assert m["mfu"] == pytest.approx(744.0 / 1978.9, abs=1e-4)
    assert m["mfu_vs_bf16_peak"] == pytest.approx(744.0 / 989.4, abs=1e-4)
    none = flops.mfu(None, "NVIDIA H200", "bf16")
    assert none["mfu"] is None and none["why"]


def test_precision_follows_model_fp8():
    assert flops.precision_of("hybrid") == "fp8"
    assert flops.precision_of("e4m3") == "fp8"
    assert flops.precision_of(None) == "bf16"
