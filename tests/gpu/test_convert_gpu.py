"""``mfsdp.py convert`` for real, each path on a tiny random Llama, checked weight for weight.

    python3 -m pytest tests/gpu/test_convert_gpu.py -v -s

A tiny Llama is made with ``transformers`` (random weights, bf16, ``save_pretrained``); then, as a user runs
it (a subprocess of ``scripts/mfsdp.py convert``; world size 1, one GPU):

* hf -> fsdp_dtensor -> hf and hf -> torch_dist -> hf: every exported tensor must equal the original bit for
  bit (the conversions only move and reshape bf16 tensors), which fails on any wrong mapping;
* torch_dist -> fsdp_dtensor -> torch_dist -> hf: the same, through both Megatron formats and both copies
  (plain model -> Megatron FSDP model, gathered DTensors -> plain model);
* each output is what ``ckpt --expect FORMAT`` accepts, and carries the iteration of its source.

Resuming training from a converted checkpoint and the MoE model are covered by
``benchmarks/bench_ckpt_migration.py`` (losses against an uninterrupted run, logits against transformers).
Skipped, with the reason, where CUDA, transformers or Megatron-Bridge is missing (CI machines).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MFSDP = ROOT / "scripts" / "mfsdp.py"
CONVERT_TIMEOUT_S = 300  # Bridge's import (~30 s) and a tiny model, with room for a busy machine


def _skip_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device visible"
    for mod in ("transformers", "megatron.bridge"):
        if importlib.util.find_spec(mod.split(".")[0]) is None or importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed (tests/gpu/setup_device.sh installs Megatron-Bridge offline)"
    return None


pytestmark = [pytest.mark.gpu]
SKIP = _skip_reason()


def _convert(src: Path, dst: Path, to: str, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, str(MFSDP), "convert", str(src), str(dst), "--to", to, *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=CONVERT_TIMEOUT_S,
    )
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = subprocess.run(
        [sys.executable, str(MFSDP), "ckpt", str(dst), "--expect", to, "--format", "json"],
        capture_output=True,
        text=True,
    )
    assert check.returncode in (0, 1) and json.loads(check.stdout)["format"] == to
    assert not [f for f in json.loads(check.stdout)["findings"] if f["severity"] == "error"], check.stdout
    return proc


@pytest.fixture(scope="module")
def hf0(tmp_path_factory):
    if SKIP:
        pytest.skip(SKIP)
    import torch
    import transformers

    path = tmp_path_factory.mktemp("convert") / "hf0"
    cfg = transformers.LlamaConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(path)
    return path


def _tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _same_weights(a: Path, b: Path) -> None:
    import torch

    ta, tb = _tensors(a), _tensors(b)
    assert set(ta) == set(tb), set(ta) ^ set(tb)
    for k in ta:
        assert ta[k].shape == tb[k].shape, k
        assert torch.equal(ta[k].to(torch.float32), tb[k].to(torch.float32)), k


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_hf_fsdp_dtensor_hf_round_trip(hf0, tmp_path):
    _convert(hf0, tmp_path / "fsdp", "fsdp_dtensor")
    _convert(tmp_path / "fsdp", tmp_path / "hf", "hf", "--hf-config", str(hf0))
    _same_weights(hf0, tmp_path / "hf")


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_hf_torch_dist_hf_round_trip(hf0, tmp_path):
    _convert(hf0, tmp_path / "td", "torch_dist")
    _convert(tmp_path / "td", tmp_path / "hf", "hf", "--hf-config", str(hf0))
    _same_weights(hf0, tmp_path / "hf")


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_torch_dist_fsdp_dtensor_torch_dist_keeps_weights(hf0, tmp_path):
    _convert(hf0, tmp_path / "td", "torch_dist")
    _convert(tmp_path / "td", tmp_path / "fsdp", "fsdp_dtensor")
    _convert(tmp_path / "fsdp", tmp_path / "td2", "torch_dist")
    _convert(tmp_path / "td2", tmp_path / "hf", "hf", "--hf-config", str(hf0))
    _same_weights(hf0, tmp_path / "hf")
    assert (tmp_path / "fsdp" / "iter_0000000").is_dir() and (tmp_path / "td2" / "iter_0000000").is_dir()
