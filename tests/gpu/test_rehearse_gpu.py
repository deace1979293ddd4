"""``mfsdp.py rehearse`` for real: one GPU plays ranks of a fake world of 8.

    python3 -m pytest tests/gpu/test_rehearse_gpu.py -v -s

The command is run as a user runs it (a subprocess of ``scripts/mfsdp.py``), on the
llama 1.1 B preset with mock data:

* Megatron FSDP ``optim_grads_params`` at N = 8 must pass every phase, with the memory of
  rank 0 measured between steps and at the peak, ``memory``'s prediction beside it, and an
  NCCL allowance; exit 0.
* The same with ``pipeline_model_parallel_size=2`` must rehearse two rank positions (the
  first and the last pipeline stage), fail at model wrapping on both, name the rule
  ``check`` uses for it and its fix; exit 1.

Skipped, with the reason, where CUDA or Megatron-Bridge is missing (CI machines).
``MFSDP_REHEARSE_OUT`` keeps the reports; otherwise a temporary folder is used.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MFSDP = ROOT / "scripts" / "mfsdp.py"
RANK_TIMEOUT_S = 400  # import (~30 s) + a 1.1 B model built and stepped twice, with room for a busy machine


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


def _out(name: str) -> Path:
    base = os.environ.get("MFSDP_REHEARSE_OUT")
    root = Path(base) if base else Path(tempfile.mkdtemp(prefix="mfsdp-rehearse-"))
    return root / name


def _rehearse(*args) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    out = subprocess.run(
        [
            sys.executable,
            str(MFSDP),
            "rehearse",
            *map(str, args),
            "--format",
            "json",
            "--timeout-s",
            str(RANK_TIMEOUT_S),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=3 * RANK_TIMEOUT_S,
    )
    sys.stderr.write(out.stderr[-4000:])
    try:
        data = json.loads(out.stdout)
    except ValueError:
        pytest.fail(f"rehearse printed no JSON (exit {out.returncode}): {out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out, data


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_fsdp_world_of_8_passes_with_memory_and_allowance():
    d = _out("llama1b_n8_optim_grads_params")
    out, data = _rehearse(
        "--model-preset", "llama-1b", "--world-size", 8, "--strategy", "optim_grads_params", "--iters", 2, "--out", d
    )
    assert out.returncode == 0, data
    assert data["result"] == "passed" and len(data["ranks"]) == 1
    r = data["ranks"][0]
    assert r["rank"] == 0 and r["world_size"] == 8 and r["strategy"] == "optim_grads_params"
    assert [p["status"] for p in r["phases"]] == ["passed"] * len(r["phases"])
    names = [p["name"] for p in r["phases"]]
    for phase in ("model_build", "model_wrap", "optimizer", "train"):
        assert phase in names
    m = r["memory"]
    assert 0 < m["between_steps_gib"] <= m["peak_allocated_gib"] <= m["peak_reserved_gib"]
    # a 1.1 B model sharded 8 ways: far below the unsharded 18 GiB of DDP
    assert m["between_steps_gib"] < 8
    assert r["predicted"]["available"], r["predicted"]
    assert r["nccl"]["communicators"] >= 1 and r["nccl"]["allowance_gib"] > 0
    assert (d / "rehearsal.json").is_file() and (d / "rank_0" / "report.json").is_file()


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_pipeline_parallel_fails_at_wrap_on_both_stages_with_the_rule():
    d = _out("llama1b_n8_pp2")
    out, data = _rehearse(
        "--model-preset",
        "llama-1b",
        "--world-size",
        8,
        "--strategy",
        "optim_grads_params",
        "--iters",
        2,
        "model.pipeline_model_parallel_size=2",
        "--out",
        d,
    )
    assert out.returncode == 1, data
    assert [r["rank"] for r in data["ranks"]] == [0, 4]
    for r in data["ranks"]:
        f = r["failure"]
        assert r["result"] == "failed" and f["phase"] == "model_wrap" and f["type"] == "EinopsError", f
        assert f["rule"] == "MFSDP-PIPELINE-PARALLEL" and "pipeline_model_parallel_size=1" in f["fix"]
