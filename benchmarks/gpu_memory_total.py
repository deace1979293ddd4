"""What a GPU exposes to a training process: the figure behind ``memory --gpu-mem-gib h100|h200``.

A card sold as "80 GB" does not give a process 80 GiB. This script asks the CUDA driver directly
(``libcuda`` through ctypes, so it needs no PyTorch): ``cuDeviceTotalMem`` is the memory the driver
manages, and ``cuMemGetInfo`` right after a context is created gives the same total and what is
still free, so ``total - free`` is the cost of the bare CUDA context (before PyTorch, NCCL or
cuBLAS add theirs). ``nvidia-smi``'s ``memory.total`` (MiB) is recorded beside it: it counts memory
the driver reserves for itself, so it reads a few hundred MiB more than a process can have.

Run on the GPU machine: ``python3 benchmarks/gpu_memory_total.py > OUT.json``; the committed results
live under ``benchmarks/results/raw/gpu_memory_total_*/`` and ``scripts/mfsdp_lib/memory/devices.py``
quotes them.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

GIB = 2**30


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise SystemExit(f"{what} failed with CUDA error {rc}")


def driver_figures() -> list[dict]:
    cuda = ctypes.CDLL("libcuda.so.1")
    _check(cuda.cuInit(0), "cuInit")
    count = ctypes.c_int()
    _check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    out = []
    for index in range(count.value):
        dev = ctypes.c_int()
        _check(cuda.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        name = ctypes.create_string_buffer(256)
        _check(cuda.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
        total = ctypes.c_size_t()
        _check(cuda.cuDeviceTotalMem_v2(ctypes.byref(total), dev), "cuDeviceTotalMem_v2")
        ctx = ctypes.c_void_p()
        _check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate_v2")
        free, total_ctx = ctypes.c_size_t(), ctypes.c_size_t()
        _check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total_ctx)), "cuMemGetInfo_v2")
        _check(cuda.cuCtxDestroy_v2(ctx), "cuCtxDestroy_v2")
        out.append(
            {
                "index": index,
                "name": name.value.decode(),
                "device_total_bytes": total.value,
                "mem_get_info_total_bytes": total_ctx.value,
                "free_after_bare_context_bytes": free.value,
                "device_total_gib": round(total.value / GIB, 3),
                "bare_context_gib": round((total_ctx.value - free.value) / GIB, 3),
            }
        )
    return out


def nvidia_smi() -> str | None:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def main() -> int:
    json.dump({"driver": driver_figures(), "nvidia_smi": nvidia_smi()}, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
