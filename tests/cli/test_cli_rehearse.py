"""``mfsdp.py rehearse``: options, refusal, dry run, and the whole flow over recorded reports.

The GPU work is the engine's (``scripts/rehearse_train.py`` over ``scripts/mfsdp_gpu``; its own tests are in
``tests/gpu_pkg``; ``tests/gpu`` runs this command for real). Here a stub interpreter stands
in for the GPU machine's Python (labelled: it answers the CUDA probe and, instead of
training, copies a report the real engine wrote on an H200 into the rank's folder), so
the command's launching, progress, exit codes and rendering are tested without a GPU.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import raw_store  # benchmarks/: the raw GPU results, extracted from their archive on first use

ROOT = Path(__file__).resolve().parent.parent.parent
MFSDP = ROOT / "scripts" / "mfsdp.py"
RAW = raw_store.path("rehearse_1xh200")


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, str(MFSDP), "rehearse", *map(str, args)], capture_output=True, text=True, cwd=cwd or ROOT
    )


def _stub_python(tmp_path: Path, probe: str, recorded: dict[int, str] | None = None) -> Path:
    """STUB (not the engine): answers the probe with ``probe``; as the engine, copies a recorded report."""
    recorded = recorded or {}
    script = tmp_path / "stub_python"
    cases = "\n".join(f"    {rank}) src={shlex.quote(str(RAW / name))} ;;" for rank, name in recorded.items())
    script.write_text(
        f"""#!/bin/bash
if [ "$1" = "-c" ]; then echo {probe}; exit 0; fi
out=""; rank=0
while [ $# -gt 0 ]; do
  case "$1" in --out) out="$2"; shift;; --rank) rank="$2"; shift;; esac; shift
done
case "$rank" in
{cases}
    *) exit 3 ;;
esac
mkdir -p "$out"
echo "[rehearse 00:00:00] import ..." >&2
cp "$src/report.json" "$out/report.json"
[ -f "$src/run_config.yaml" ] && cp "$src/run_config.yaml" "$out/run_config.yaml"
python3 -c "import json,sys; sys.exit(0 if json.load(open('$out/report.json'))['result']=='passed' else 1)"
"""
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_help_teaches_when_and_how():
    out = _cli("--help")
    assert out.returncode == 0
    for needle in ("--world-size", "--rank-position", "--parity", "--dry-run", "NCCL allowance", "before a large job"):
        assert needle in out.stdout


def test_listed_in_the_top_level_help():
    out = subprocess.run([sys.executable, str(MFSDP), "--help"], capture_output=True, text=True)
    assert "rehearse" in out.stdout


def test_presets_are_the_engines():
    from mfsdp_gpu import bridge, presets
    from mfsdp_lib.cli import rehearse as cli

    assert set(cli.PRESETS) == set(presets.PRESETS)
    assert set(cli.STRATEGIES) == set(bridge.STRATEGIES)


def test_dry_run_prints_one_quoted_command_per_distinct_rank(tmp_path):
    out_dir = tmp_path / "my results"
    out = _cli(
        "--model-preset",
        "llama-1b",
        "--world-size",
        "8",
        "model.pipeline_model_parallel_size=2",
        "--dry-run",
        "--out",
        out_dir,
    )
    assert out.returncode == 0, out.stderr
    cmds = [shlex.split(ln) for ln in out.stdout.splitlines() if not ln.startswith("#")]
    assert len(cmds) == 2
    for cmd, rank in zip(cmds, ("0", "4"), strict=True):
        assert cmd[1].endswith("scripts/rehearse_train.py")
        assert cmd[cmd.index("--rank") + 1] == rank and cmd[cmd.index("--world-size") + 1] == "8"
        assert "model.pipeline_model_parallel_size=2" in cmd
        assert cmd[cmd.index("--out") + 1] == str(out_dir / f"rank_{rank}")
    assert "# rank 4 (last pipeline stage)" in out.stdout
    assert not out_dir.exists()  # a dry run creates nothing


def test_overrides_may_follow_options_and_a_yaml_is_passed_by_absolute_path(tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text("model:\n  num_layers: 2\n")
    out = _cli(cfg.name, "--world-size", "4", "train.train_iters=5", "--dry-run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    cmd = shlex.split(out.stdout.splitlines()[1])
    assert cmd[cmd.index("--yaml") + 1] == str(cfg) and "train.train_iters=5" in cmd


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--world-size", "8"], "give a CONFIG"),
        (["--model-preset", "tiny"], "--world-size N is required"),
        (["--model-preset", "tiny", "--world-size", "6", "model.pipeline_model_parallel_size=4"], "not a multiple"),
        (["--model-preset", "tiny", "--world-size", "8", "--rank-position", "9"], "outside a world of 8"),
        (["--model-preset", "tiny", "--world-size", "8", "--iters", "0"], "--iters"),
        (["--model-preset", "tiny", "--world-size", "8", "badoverride=1"], "section.key=value"),
        (["missing.yaml", "--world-size", "8"], "missing.yaml"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    out = _cli(*args, "--dry-run")
    assert out.returncode == 2
    assert needle in out.stderr and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_an_existing_results_folder_is_never_overwritten(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    out = _cli("--model-preset", "tiny", "--world-size", "8", "--out", tmp_path, "--dry-run")
    assert out.returncode == 2 and "not empty" in out.stderr
    assert (tmp_path / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "probe, needle",
    [("torch", "PyTorch is not installed"), ("bridge", "Megatron-Bridge is not installed"), ("cuda", "no CUDA GPU")],
)
def test_refuses_without_cuda_or_bridge_in_one_line(tmp_path, probe, needle):
    stub = _stub_python(tmp_path, probe)
    out = _cli("--model-preset", "tiny", "--world-size", "8", "--python", stub, "--out", tmp_path / "o")
    assert out.returncode == 2
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_refuses_here_without_torch():
    # this test environment has no torch: the real probe must say so
    pytest.importorskip("yaml")
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("torch is installed here")
    out = _cli("--model-preset", "tiny", "--world-size", "8", "--out", "/nonexistent/never-created")
    assert out.returncode == 2 and "PyTorch is not installed" in out.stderr


def test_whole_flow_pipeline_failure_exits_1_with_rule_and_fix(tmp_path):
    stub = _stub_python(tmp_path, "ok", {0: "B_pp2_llama1b_n8_optim_grads_params", 4: "C_pp2_llama1b_n8_ddp_rank4"})
    out_dir = tmp_path / "res"
    out = _cli(
        "--model-preset",
        "llama-1b",
        "--world-size",
        "8",
        "model.pipeline_model_parallel_size=2",
        "--python",
        stub,
        "--out",
        out_dir,
    )
    assert out.returncode == 1, out.stderr
    assert "rank 0 [1/2]: starting" in out.stderr and "rank 4 [2/2]: starting" in out.stderr
    assert "[rehearse 00:00:00] import ..." in out.stderr  # the engine's progress is passed through
    assert "rank 0 of 8 (first pipeline stage)" in out.stdout
    assert "[MFSDP-PIPELINE-PARALLEL]" in out.stdout and "fix: model.pipeline_model_parallel_size=1" in out.stdout
    assert "rank 4 of 8 (last pipeline stage)" in out.stdout
    assert "rehearsal: FAILED" in out.stdout
    saved = json.loads((out_dir / "rehearsal.json").read_text())
    assert saved["schema"] == "mfsdp-rehearse/1" and [r["rank"] for r in saved["ranks"]] == [0, 4]
    assert (out_dir / "rank_0" / "log.txt").is_file()


def test_whole_flow_json_pass_exits_0(tmp_path):
    stub = _stub_python(tmp_path, "ok", {0: "A_llama1b_n64_optim_grads_params"})
    out = _cli(
        "--model-preset",
        "llama-1b",
        "--world-size",
        "64",
        "--python",
        stub,
        "--out",
        tmp_path / "r",
        "--format",
        "json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["result"] == "passed"
    r = data["ranks"][0]
    assert r["memory"]["between_steps_gib"] == pytest.approx(1.587, abs=0.001)
    assert r["nccl"]["allowance_gib"] > 0 and r["predicted"]["available"]
    assert os.path.isfile(tmp_path / "r" / "rehearsal.json")


def test_a_typo_in_the_config_is_reported_before_a_missing_gpu(cli, tmp_path):
    """On a machine without torch, `rehearse typo.yaml` checks the config offline first: the misspelt key is
    the answer, not 'PyTorch is not installed'."""
    cfg = tmp_path / "typo.yaml"
    cfg.write_text("ddp:\n  use_megatron_fsdpp: true\n")
    for extra in ([], ["--dry-run"]):
        p = cli("rehearse", str(cfg), "--world-size", "8", *extra, cwd=tmp_path)
        assert p.returncode == 2, (p.stdout, p.stderr)
        assert "unknown key 'ddp.use_megatron_fsdpp'" in p.stderr and "did you mean 'use_megatron_fsdp'" in p.stderr
        assert "PyTorch" not in p.stderr
    # a typo in an override too
    cfg.write_text("ddp:\n  use_megatron_fsdp: true\n")
    p = cli("rehearse", str(cfg), "ddp.data_parallel_sharding_strategy=optim_grad_params", "--world-size", "8")
    assert p.returncode == 2 and "did you mean 'optim_grads_params'" in p.stderr, p.stderr
