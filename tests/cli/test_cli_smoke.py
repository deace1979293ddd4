"""CPU side of ``mfsdp.py smoke``: options, the exact launcher command, preflight, result judging.

The GPU run itself is ``tests/gpu/test_smoke_gpu.py``; everything here runs without
torch: the launcher command is a pure function of the options, and the judging of a
run reads the per-rank JSON records ``smoke_train.py`` (``mfsdp_gpu.smoke``) writes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from mfsdp_gpu import bridge, presets
from mfsdp_lib.cli import smoke as cli_smoke
from mfsdp_lib.runs import smoke

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _opts(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_smoke.configure(parser)
    return parser.parse_args(list(argv))


def test_single_node_command_is_torchrun_standalone():
    o = _opts("--nproc-per-node", "2", "--save-resume", "--out", "/tmp/x")
    cmd = smoke.build_command(o, python="/py")
    assert cmd[:5] == ["/py", "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone"]
    assert cmd[5] == str(smoke.TRAIN_ENTRY) and cmd[5].endswith("scripts/smoke_train.py")
    assert cmd[6:] == [
        "--strategy",
        "optim_grads_params",
        "--model",
        "small",
        "--iters",
        "10",
        "--seq-length",
        "512",
        "--global-batch-size",
        "8",
        "--micro-batch-size",
        "1",
        "--out",
        "/tmp/x",
        "--save-resume",
    ]


def test_multi_node_torchrun_flags():
    o = _opts(
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "node0",
        "--master-port",
        "6000",
        "--nproc-per-node",
        "8",
        "--strategy",
        "ddp",
    )
    cmd = smoke.build_command(o, python="/py")
    assert cmd[3:8] == [
        "--nproc-per-node=8",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=node0",
        "--master-port=6000",
    ]
    assert "--standalone" not in cmd and "--save-resume" not in cmd
    assert cmd[cmd.index("--strategy") + 1] == "ddp"


def test_srun_runs_one_torchrun_per_node_with_c10d_rendezvous():
    o = _opts("--launcher", "srun", "--nnodes", "4", "--nproc-per-node", "8", "--master-addr", "head")
    cmd = smoke.build_command(o, python="/py")
    assert cmd[:3] == ["srun", "--nodes=4", "--ntasks-per-node=1"]
    assert cmd[3:6] == ["/py", "-m", "torch.distributed.run"]
    assert "--rdzv-backend=c10d" in cmd and "--rdzv-endpoint=head:29500" in cmd and "--nnodes=4" in cmd
    assert not any(c.startswith("--node-rank") for c in cmd)  # c10d assigns node ranks itself


def test_srun_without_master_addr_asks_slurm_for_the_first_host():
    cmd = smoke.build_command(_opts("--launcher", "srun", "--nnodes", "2"), python="/py")
    # a constant bash script finds the host and passes it as PET_RDZV_ENDPOINT; the command follows as "$@"
    assert cmd[3:5] == ["bash", "-c"] and cmd[5] == smoke.SLURM_FIRST_HOST_SCRIPT and cmd[6] == "29500"
    assert "SLURM_JOB_NODELIST" in cmd[5] and cmd[7:10] == ["/py", "-m", "torch.distributed.run"]
    assert not any(c.startswith("--rdzv-endpoint=") for c in cmd)


def test_dry_run_prints_the_command(cli, tmp_path):
    r = cli("smoke", "--dry-run", "--nproc-per-node", "4", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert "-m torch.distributed.run --nproc-per-node=4 --standalone" in line
    assert line.endswith(f"--out {tmp_path / 'o'}")
    assert not (tmp_path / "o").exists()  # a dry run creates nothing


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--nproc-per-node", "0"], "positive integer"),
        (["--iters", "x"], "positive integer"),
        (["--strategy", "zero3"], "invalid choice"),
        (["--node-rank", "2", "--nnodes", "2"], "must be below --nnodes"),
        (["--global-batch-size", "6", "--micro-batch-size", "4"], "not a multiple"),
        (["--nnodes", "2"], "--master-addr"),
    ],
)
def test_bad_options_exit_2_with_one_line(cli, argv, needle):
    r = cli("smoke", *argv)
    assert r.returncode == 2
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_max_connections_1_refused_for_fsdp(cli):
    r = cli("smoke", env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert r.returncode == 2
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(HAVE_TORCH, reason="torch is installed here; the message for its absence cannot show")
def test_without_torch_one_clear_line(cli, tmp_path):
    r = cli("smoke", "--out", str(tmp_path / "o"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "torch is not installed" in lines[0]
    assert "Traceback" not in r.stderr


def test_cli_choices_match_the_training_entry():
    assert set(cli_smoke.STRATEGY_CHOICES) == set(bridge.STRATEGIES)
    assert set(cli_smoke.MODEL_CHOICES) == set(presets.SMOKE_SHAPES)


# ----------------------------------------------------------------- checkpoint markers


def test_checkpoint_format_fsdp_dtensor_on_real_metadata(tmp_path):
    real = Path(__file__).parents[1] / "fixtures" / "gpu-run" / "checkpoints"  # this repo's own H200 smoke run
    ck = tmp_path / "ck"
    shutil.copytree(real, ck)
    it = ck / "iter_0000010"
    assert smoke.marker_format(ck)["format"] is None  # tensors removed: the marker test wants a shard
    (it / "__0_0.distcp").write_bytes(b"")  # the shard file name Bridge's fsdp_dtensor save writes
    got = smoke.marker_format(ck)
    assert got["format"] == "fsdp_dtensor" and got["recorded_ckpt_format"] == "fsdp_dtensor"
    assert got["iteration_dir"] == "iter_0000010" and got["distcp_files"] == 1
    full = smoke.checkpoint_format(ck)  # the checkpoint reader, with the marker details beside it
    assert full["format"] == "fsdp_dtensor" and full["by"] == "mfsdp_lib.runs.checkpoints" and full["latest"] == 10


def test_checkpoint_format_reads_megatron_metadata_json(tmp_path):
    it = tmp_path / "iter_0000004"
    it.mkdir()
    (it / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))
    (it / "__0_0.distcp").write_bytes(b"")
    assert smoke.marker_format(tmp_path)["format"] == "torch_dist"
    assert smoke.marker_format(tmp_path / "missing")["format"] is None
    assert smoke.checkpoint_format(tmp_path / "missing")["format"] is None


# ----------------------------------------------------------------- judging a run


def _rank(out: Path, rank: int, **kw) -> None:
    rec = {
        "rank": rank,
        "world_size": 2,
        "strategy": "optim_grads_params",
        "final_loss": 9.9,
        "finite": True,
        "iterations": 10,
        "step_time_s_median": 0.1,
        "tokens_per_s": 40960.0,
        "peak_allocated_bytes": 2**30 + rank,
        "bridge_validate": {"ok": True},
        "ckpt_dir": None,
        "error": None,
    }
    rec.update(kw)
    (out / f"rank{rank}.json").write_text(json.dumps(rec))


def test_summary_passes_and_lists_every_rank(tmp_path):
    _rank(tmp_path, 0)
    _rank(tmp_path, 1)
    s = smoke.summarise(tmp_path, 0, ["torchrun"], save_resume=False)
    assert s["pass"] is True
    assert s["peak_memory_bytes"] == {"0": 2**30, "1": 2**30 + 1}


@pytest.mark.parametrize(
    "exit_code, kw, save_resume",
    [
        (1, {}, False),
        (0, {"finite": False, "final_loss": float("nan")}, False),
        (0, {"bridge_validate": {"ok": False, "error": "x"}}, False),
        (0, {"error": "RuntimeError: boom"}, False),
        (0, {"save_resume": {"equal": False}}, True),
    ],
)
def test_summary_fails(tmp_path, exit_code, kw, save_resume):
    _rank(tmp_path, 0, **kw)
    assert smoke.summarise(tmp_path, exit_code, ["torchrun"], save_resume=save_resume)["pass"] is False


def test_summary_with_save_resume_needs_fsdp_dtensor_on_disk(tmp_path):
    ck = tmp_path / "checkpoints" / "iter_0000010"
    ck.mkdir(parents=True)
    _rank(tmp_path, 0, ckpt_dir=str(tmp_path / "checkpoints"), save_resume={"equal": True, "abs_delta": 0.0})
    assert smoke.summarise(tmp_path, 0, ["torchrun"], save_resume=True)["pass"] is False  # nothing saved
    (ck / ".metadata").write_bytes(b"\x80")
    (ck / "__0_0.distcp").write_bytes(b"")
    s = smoke.summarise(tmp_path, 0, ["torchrun"], save_resume=True)
    assert s["checkpoint"]["format"] == "fsdp_dtensor" and s["pass"] is True


def test_gpu_harness_skips_with_reason_here():
    sys.path.insert(0, str(Path(__file__).parents[1] / "gpu"))
    import test_smoke_gpu  # type: ignore[import-not-found]  # tests/gpu, put on sys.path above

    reason = test_smoke_gpu._skip_reason()
    if not HAVE_TORCH:
        assert reason == "torch is not installed"
    else:
        assert reason is None or "CUDA" in reason or "Megatron-Bridge" in reason


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--nnodes", "2"], "--master-addr"),  # printed '--master-addr=None' before
        (["--nnodes", "2", "--master-addr", "n0", "--master-port", "99999"], "not a TCP port"),
        (["--out", __file__], "is a file"),
    ],
)
def test_dry_run_refuses_a_command_that_cannot_work(cli, argv, needle):
    r = cli("smoke", "--dry-run", *argv)
    assert r.returncode == 2, r.stdout
    assert needle in r.stderr and r.stdout == "" and "Traceback" not in r.stderr
