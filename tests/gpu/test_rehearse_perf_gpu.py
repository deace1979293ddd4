"""``mfsdp.py rehearse --perf`` and ``--compare`` for real, on the tiny preset, as rank 0 of a world of 8.

    python3 -m pytest tests/gpu/test_rehearse_perf_gpu.py -v -s

* ``--perf`` under the distributed optimizer: the timed steps have a positive median and spread,
  the recorder patched the collectives and saw the data-parallel group, and the counted volumes
  are the analytic ones: the parameter all-gather per step is the bf16 parameter bytes x (N-1)/N
  and the gradient reduce-scatter the fp32 gradient bytes x (N-1)/N, bucket padding aside
  (``mfsdp_lib.perf.volumes``); the prediction is a range with low <= high;
* ``--compare`` of the distributed optimizer and ``optim_grads_params``: both rows run, and FSDP's
  all-gather volume per step is at least the forward-and-backward gather of the transformer layers.

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
sys.path.insert(0, str(ROOT / "scripts"))
RANK_TIMEOUT_S = 400  # import (~30 s) + a tiny model built and stepped four times, with room for a busy machine
PADDING = 0.02  # buckets are padded to a multiple of the data-parallel size: a relative margin for the tiny model


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
    root = Path(base) if base else Path(tempfile.mkdtemp(prefix="mfsdp-perf-"))
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
        timeout=4 * RANK_TIMEOUT_S,
    )
    sys.stderr.write(out.stderr[-4000:])
    try:
        data = json.loads(out.stdout)
    except ValueError:
        pytest.fail(f"rehearse printed no JSON (exit {out.returncode}): {out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out, data


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_perf_counts_the_distributed_optimizers_volumes_exactly():
    from mfsdp_lib.perf import volumes

    d = _out("tiny_n8_distopt_perf")
    out, data = _rehearse(
        "--model-preset",
        "tiny",
        "--world-size",
        8,
        "--strategy",
        "distopt",
        "--perf",
        "--warmup",
        1,
        "--iters",
        3,
        "--out",
        d,
    )
    assert out.returncode == 0, data
    p = data["ranks"][0]["perf"]
    assert p["available"], p
    step = p["compute"]["step_s"]
    assert step["n"] == 3 and 0 < step["min"] <= step["median"] <= step["max"]
    # every timed step's loss recorded and finite; the model's total beside this rank's partition (no TP/EP: equal)
    assert p["losses_checked"] and p["nonfinite_timed_steps"] == 0 and len(p["timed_losses"]) == 3
    assert p["params"] == p["local_params"] and p["params_scope"] == "the whole model"
    assert p["tokens_per_s_per_gpu"] > 0 and p["model_tflops_per_gpu"] > 0
    assert "all_gather_into_tensor" in p["recorder"]["patched"] and not p["recorder"]["errors"]
    comm = p["communication"]
    assert comm["available"] and comm["groups"]["dp"] == list(range(8))
    dp = {k: v.get("dp", 0) for k, v in comm["bytes_per_step"].items()}
    job = volumes.Job(params=p["params"], dp=8, micro_batches=p["micro_batches"], param_bytes=2, grad_bytes=4)
    verdict = volumes.compare(dp, volumes.volumes("distopt", job), tolerance=PADDING)
    assert verdict["all_gather"]["within"], verdict  # bf16 parameter bytes x 7/8
    assert verdict["reduce_scatter"]["within"], verdict  # fp32 gradient bytes x 7/8
    pr = p["prediction"]
    assert pr["step_time_s"]["low"] <= pr["step_time_s"]["high"]
    assert pr["step_time_s"]["low"] >= step["median"]


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_compare_runs_both_strategies_and_fsdp_gathers_every_layer_twice():
    d = _out("tiny_n8_compare")
    out, data = _rehearse(
        "--model-preset",
        "tiny",
        "--world-size",
        8,
        "--warmup",
        1,
        "--iters",
        2,
        "--out",
        d,
        "--strategies",
        "distopt,optim_grads_params",
        "--compare",
    )
    assert out.returncode == 0, data
    rows = data["compare"]["rows"]
    assert [r["strategy"] for r in rows] == ["distopt", "optim_grads_params"]
    assert all(r["result"] == "passed" and r["step_time_s"]["low"] <= r["step_time_s"]["high"] for r in rows)
    fsdp = data["ranks"][1]["perf"]
    assert fsdp["nonfinite_timed_steps"] == 0  # the mirror fills every gathered buffer: bf16 FSDP stays finite
    gathered = fsdp["communication"]["bytes_per_step"]["all_gather"].get("dp", 0)
    layers = fsdp["params_in_layers"]
    assert layers and gathered >= 2 * fsdp["micro_batches"] * layers * 2 * 7 / 8 * (1 - PADDING)
