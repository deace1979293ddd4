"""``memory.devices``: the GPU presets and the headroom line are the measured figures, read back from the runs."""

from __future__ import annotations

import json

import pytest

import raw_store
from mfsdp_lib.memory import devices

GIB = 2**30
LARGEST_REHEARSAL = "benchmarks/results/raw/memory_rehearsal_1xh200/B_llama70b_n64_optim_grads_params/report.json"


def _raw(logical: str):
    """A raw file by the path the code cites (``benchmarks/results/raw/...``), read from the archive."""
    return raw_store.path(*logical.removeprefix("benchmarks/results/raw/").split("/"))


def test_h100_preset_is_the_measured_driver_total(root):
    raw = json.loads(_raw("benchmarks/results/raw/gpu_memory_total_1xh100/gpu_memory_total.json").read_text())
    (gpu,) = raw["driver"]
    assert gpu["name"] == devices.GPU_PRESETS["h100"].card
    assert devices.GPU_PRESETS["h100"].gib == gpu["device_total_bytes"] / GIB
    assert "gpu_memory_total_1xh100/gpu_memory_total.json" in devices.GPU_PRESETS["h100"].source
    # nvidia-smi's total is more than a process can have: the preset is not it
    smi_mib = int(raw["nvidia_smi"].splitlines()[1].split(",")[1].split()[0])
    assert smi_mib / 1024 > devices.GPU_PRESETS["h100"].gib + 0.3


def test_h200_preset_is_the_measured_device_total(root):
    path = devices.GPU_PRESETS["h200"].source.split(", ", 1)[1].split(" ")[0]
    report = json.loads(_raw(path).read_text())
    assert devices.GPU_PRESETS["h200"].gib == report["memory"]["device_total_bytes"] / GIB


def test_headroom_covers_what_the_largest_rehearsal_used_beyond_its_peak(root):
    """The process took 6.2 % more than its peak allocation (fragmentation, context): 'yes' must leave that."""
    mem = json.loads(_raw(LARGEST_REHEARSAL).read_text())["memory"]
    beyond = mem["process_used_bytes_nvml"] - mem["peak_allocated_bytes"]
    assert beyond > 0
    # a peak at the headroom line plus what this run used beyond its peak still fits the card
    line = devices.TIGHT_FRACTION * mem["device_total_bytes"]
    assert line * (1 + beyond / mem["peak_allocated_bytes"]) <= mem["device_total_bytes"]
    frag = (mem["peak_reserved_bytes"] - mem["peak_allocated_bytes"]) / mem["peak_allocated_bytes"]
    assert f"{frag:.1%}".replace("%", " %") in devices.NOT_COUNTED


@pytest.mark.parametrize(
    "text,gib,preset", [("h100", 79.18, "h100"), ("H200", 139.80, "h200"), ("80", 80.0, None), (64, 64.0, None)]
)
def test_parse_gpu_mem(text, gib, preset):
    value, name = devices.parse_gpu_mem(text)
    assert value == pytest.approx(gib, abs=0.005) and name == preset


def test_fit_states():
    assert devices.fit(71.9, 80) == "yes"
    assert devices.fit(72.1, 80) == "tight"
    assert devices.fit(80.0, 80) == "tight"
    assert devices.fit(80.1, 80) == "no"
