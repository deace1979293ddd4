#!/usr/bin/env python3
"""Check that this GPU machine can run the rehearsals: the import order and what each part found.

Run by ``setup_device.sh`` at its end, and on its own after installing a wheel by hand:
``python3 tests/gpu/check_device.py``. Prints one ``ready:`` line with the versions and the CUDA
device count, and, where mamba-ssm is installed, one line on what hybrid (Mamba) rehearsals will
meet. Exit status 0 when torch, Transformer Engine, megatron-core and Megatron-Bridge import; a
mamba-ssm that does not import is reported but does not fail the check (dense runs are unaffected).

Order matters: torch first (it loads libnccl.so.2, which Transformer Engine's core library links
against); mamba-ssm before megatron (megatron-core's Mamba mixer binds mamba-ssm's kernels when it
is imported, megatron/core/ssm/mamba_mixer.py:61-79), prepared the way a rehearsal does (scripts/mfsdp_gpu/mamba.py).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from importlib import metadata, util

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts")
# mamba-ssm's wheel is installed without its dependencies: these must come with the image
MAMBA_RUNTIME = ("triton", "einops", "transformers")


def main() -> int:
    import torch

    mamba = None
    if util.find_spec("mamba_ssm") is not None:
        sys.path.insert(0, SCRIPTS)
        from mfsdp_gpu.mamba import prepare_mamba_ssm

        missing = [m for m in MAMBA_RUNTIME if util.find_spec(m) is None]
        if missing:
            print("mamba-ssm: this image lacks", ", ".join(missing), "(its wheel is installed without dependencies)")
        if not (os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")):
            print(
                "mamba-ssm: no C compiler (gcc, clang or CC): Triton cannot build its launcher, hybrid runs will fail"
            )
        mamba = prepare_mamba_ssm()
    importlib.import_module("transformer_engine.pytorch")  # after torch, before megatron
    import megatron.bridge  # noqa: F401
    import megatron.core  # noqa: F401

    dists = ("torch", "transformer-engine", "megatron-core", "megatron-bridge", "megatron-fsdp")
    print(
        "ready:",
        ", ".join(f"{d} {metadata.version(d)}" for d in dists),
        "| CUDA devices:",
        torch.cuda.device_count(),
    )
    if mamba is None:
        return 0
    if not mamba["importable"]:
        print(f"mamba-ssm {mamba['version']}: NOT importable: {mamba['error']} (hybrid rehearsals will fail)")
        return 0
    import megatron.core.ssm.mamba_mixer as mixer

    path = (
        "available"
        if mamba["mem_eff_kernels"]
        else "unavailable (no causal-conv1d): rehearsals run the unfused path, reported as a deviation"
    )
    print(
        f"mamba-ssm {mamba['version']}: Triton kernels import; megatron-core's Mamba mixer sees them: "
        f"{mixer.HAVE_MAMBA_SSM} | Mamba-1 kernel: {mamba['mamba1_kernel']} | memory-efficient path: {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
