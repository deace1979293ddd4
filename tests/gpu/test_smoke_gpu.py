"""The GPU smoke test, the seed's way: every rank runs this file under torchrun.

    python -m torch.distributed.run --nproc_per_node=<GPUs> -m pytest tests/gpu/test_smoke_gpu.py -v -s

Each rank calls ``mfsdp_gpu.smoke.run`` (what ``smoke_train.py``, the entry ``mfsdp.py smoke`` launches, runs) with
Megatron FSDP ``optim_grads_params`` and ``--save-resume``. The test passes when, on
every rank: Bridge's ``runtime_config_update``/``validate()`` accepted the config built
through ``mfsdp_lib.enable``; the loss at the last iteration is finite; the checkpoint
written is an ``fsdp_dtensor`` one (PyTorch DCP ``.metadata`` plus ``.distcp`` shards,
and the saved run config says so); and the forward loss after loading it into a fresh
model equals the loss before saving, within bf16 tolerance.

Skipped, with the reason, where CUDA or Megatron-Bridge is missing (CI machines), so
the file is harmless in a plain ``pytest`` run. ``MFSDP_SMOKE_OUT`` keeps the run's
files (logs, rank JSON, checkpoint) for inspection; otherwise a temporary folder is used.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import tempfile
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))


def _skip_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device visible"
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.bridge") is None:
        return "Megatron-Bridge is not installed (tests/gpu/setup_device.sh installs it offline)"
    return None


pytestmark = [pytest.mark.gpu]
SKIP = _skip_reason()


def _out_dir() -> str:
    """One folder shared by all ranks (they agree on it without a collective)."""
    base = os.environ.get("MFSDP_SMOKE_OUT")
    if base:
        return base
    job = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    return os.path.join(tempfile.gettempdir(), f"mfsdp-smoke-{job}")


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_fsdp_smoke_save_resume():
    from mfsdp_gpu import args as smoke_args
    from mfsdp_gpu import smoke
    from mfsdp_lib.runs import smoke as smoke_lib

    args = smoke_args.smoke_parser().parse_args(
        [
            "--strategy",
            "optim_grads_params",
            "--iters",
            os.environ.get("MFSDP_SMOKE_ITERS", "10"),
            "--seq-length",
            "512",
            "--save-resume",
            "--out",
            _out_dir(),
        ]
    )
    rec = smoke.run(args)

    assert rec["bridge_validate"]["ok"], rec["bridge_validate"]
    assert rec["iterations"] == args.iters
    assert rec["final_loss"] is not None and math.isfinite(rec["final_loss"]), rec["steps"][-3:]
    assert rec["finite"], "a non-finite loss appeared during training"
    assert not any(s["skipped"] for s in rec["steps"]), "an iteration was skipped"

    sr = rec["save_resume"]
    assert rec["resumed_iteration"] == args.iters, "the fresh model did not resume from the saved iteration"
    assert sr["equal"], f"forward loss changed across save/load: {sr}"

    fmt = smoke_lib.checkpoint_format(rec["ckpt_dir"])
    assert fmt["format"] == "fsdp_dtensor", fmt
