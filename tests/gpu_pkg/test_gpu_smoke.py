"""The smoke rank (``mfsdp_gpu.smoke``, run by ``smoke_train.py``): what decides it without torch.

The run itself is ``tests/gpu/test_smoke_gpu.py``; here: the refusal where torch is absent and the
strategy settings a smoke applies (the settings ``mfsdp.py enable`` applies, with their source).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from mfsdp_gpu import bridge, smoke
from mfsdp_lib.enable import MINIMAL_OVERRIDES

ROOT = Path(__file__).resolve().parent.parent.parent
ENTRY = ROOT / "scripts" / "smoke_train.py"
HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.skipif(HAVE_TORCH, reason="torch is installed here")
def test_training_entry_without_torch(capsys, tmp_path):
    assert smoke.main(["--out", str(tmp_path)]) == 2
    assert "smoke_train.py: needs torch and Megatron-Bridge" in capsys.readouterr().err


@pytest.mark.skipif(HAVE_TORCH, reason="torch is installed here")
def test_the_script_refuses_in_one_line_and_exit_2(tmp_path):
    out = subprocess.run([sys.executable, str(ENTRY), "--out", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_fsdp_overrides_pick_the_strategy():
    over = bridge.strategy_settings("optim_grads")
    assert over["ddp.data_parallel_sharding_strategy"] == "optim_grads"
    assert over["ddp.use_megatron_fsdp"] is True
    ddp = bridge.strategy_settings("ddp")
    assert ddp["ddp.use_megatron_fsdp"] is False and ddp["checkpoint.ckpt_format"] == "torch_dist"
    assert bridge.strategy_settings("distopt")["optimizer.use_distributed_optimizer"] is True


def test_fsdp_settings_are_the_ones_enable_applies():
    for strategy in bridge.FSDP_STRATEGIES:
        got = bridge.strategy_settings(strategy)
        assert list(got) == list(MINIMAL_OVERRIDES)
        assert got == {**MINIMAL_OVERRIDES, bridge.SHARDING_KEY: strategy}
        assert bridge.strategy_source(strategy) == "mfsdp_lib.enable.MINIMAL_OVERRIDES"
    assert bridge.strategy_source("ddp") == "plain Bridge settings"
