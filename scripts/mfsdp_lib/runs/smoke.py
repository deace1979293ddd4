"""Launcher logic behind ``mfsdp.py smoke``: build the torchrun (or srun) command, run it, judge the result.

The smoke test must use the real launcher - ``python -m torch.distributed.run`` - so
that what it proves (rank set-up, NCCL, Megatron FSDP's wrapper, the ``fsdp_dtensor``
save/resume) is what a user's job goes through. This module therefore only *builds*
that command (a pure function, tested on CPU machines), runs it with the output teed
into ``train.log``, and merges the per-rank ``rank<R>.json`` records that
``scripts/smoke_train.py`` writes into one summary:

* final loss, finite, median step time, tokens/s, per-rank peak memory;
* the checkpoint format found on disk, by ``mfsdp.py ckpt`` when that command is
  present and by the small marker test in :func:`checkpoint_format` otherwise;
* ``mfsdp.py log`` over the run's own log; the save/resume loss delta; pass/fail.

Multi-node: torchrun's own flags (``--nnodes --node-rank --master-addr --master-port``)
on every node, or under Slurm ``srun`` once per node with a c10d rendezvous, so no
per-node rank needs shell expansion.

The command is an argument list and is run without a shell, so nothing the user passes
(``--out 'o;touch M'``, ``--master-addr '$(...)'``) is ever interpreted. The one place a
shell is needed, finding the rendezvous host under srun when ``--master-addr`` is not
given, runs a constant script (``SLURM_FIRST_HOST_SCRIPT``) through ``bash -c`` with the
real command as its positional arguments (``"$@"``), which bash never re-parses.
``--dry-run`` prints the list with ``shlex.join``: pasting it runs exactly this list.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from . import engine

SCRIPTS_DIR = Path(__file__).resolve().parents[2]  # scripts/mfsdp_lib/runs -> scripts
TRAIN_ENTRY = SCRIPTS_DIR / "smoke_train.py"
MFSDP = SCRIPTS_DIR / "mfsdp.py"

# Megatron FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS is unset or > 1 (Bridge 0.6.2
# config.py, _validate_and_apply_megatron_fsdp_configs); many Megatron launch scripts
# export 1 for tensor-parallel overlap, so the launcher refuses it up front.
BAD_MAX_CONNECTIONS = "1"
DEFAULT_MASTER_PORT = 29500  # torchrun's own default
RDZV_ID = "mfsdp-smoke"
# Under srun without --master-addr: every node computes the same first host of the allocation and hands it to
# torchrun through PET_RDZV_ENDPOINT (torchrun reads each option from PET_<NAME> when it is not on the command
# line). Constant text: the port arrives as $0 and the command as "$@", neither is ever parsed by the shell.
SLURM_FIRST_HOST_SCRIPT = (
    'PET_RDZV_ENDPOINT="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1):$0" && '
    'export PET_RDZV_ENDPOINT && exec "$@"'
)


def build_command(opts, python: str | None = None) -> list[str]:
    """The exact launcher command for ``opts`` (argparse namespace of ``smoke``)."""
    python = python or sys.executable
    torchrun = [python, "-m", "torch.distributed.run", f"--nproc-per-node={opts.nproc_per_node}"]
    if opts.launcher == "srun":
        torchrun += [f"--nnodes={opts.nnodes}", "--rdzv-backend=c10d"]
        if opts.master_addr:
            torchrun.append(f"--rdzv-endpoint={opts.master_addr}:{int(opts.master_port)}")
        torchrun.append(f"--rdzv-id={RDZV_ID}")
        prefix = ["srun", f"--nodes={opts.nnodes}", "--ntasks-per-node=1"]
        if not opts.master_addr:
            prefix += ["bash", "-c", SLURM_FIRST_HOST_SCRIPT, str(int(opts.master_port))]
    else:
        prefix = []
        if opts.nnodes > 1:
            torchrun += [
                f"--nnodes={opts.nnodes}",
                f"--node-rank={opts.node_rank}",
                f"--master-addr={opts.master_addr}",
                f"--master-port={opts.master_port}",
            ]
        else:
            torchrun += ["--standalone"]
    entry = [
        str(TRAIN_ENTRY),
        "--strategy",
        opts.strategy,
        "--model",
        opts.model,
        "--iters",
        str(opts.iters),
        "--seq-length",
        str(opts.seq_length),
        "--global-batch-size",
        str(opts.global_batch_size),
        "--micro-batch-size",
        str(opts.micro_batch_size),
        "--out",
        str(opts.out),
    ]
    if opts.save_resume:
        entry.append("--save-resume")
    return prefix + torchrun + entry


def preflight(opts, env: Mapping[str, str] | None = None) -> str | None:
    """Why the run cannot start here, in one line; None when it can."""
    import importlib.util

    if env is None:
        env = os.environ
    if opts.nnodes > 1 and opts.launcher == "torchrun" and not opts.master_addr:
        return "--nnodes > 1 needs --master-addr (the node-rank-0 host) or --launcher srun"
    if env.get("CUDA_DEVICE_MAX_CONNECTIONS") == BAD_MAX_CONNECTIONS and opts.strategy not in ("ddp", "distopt"):
        return (
            "CUDA_DEVICE_MAX_CONNECTIONS=1 is set; Megatron FSDP asserts it is unset or > 1 "
            "(unset CUDA_DEVICE_MAX_CONNECTIONS)"
        )
    if importlib.util.find_spec("torch") is None:
        return (
            "torch is not installed in this Python; run the smoke on a GPU machine with PyTorch and "
            "Megatron-Bridge (tests/gpu/setup_device.sh installs them from a wheel folder)"
        )
    from ..integrity.installed import module_outside_skill

    if not module_outside_skill("megatron") or not module_outside_skill("torch"):
        return (
            "a 'megatron' or 'torch' package inside the skill folder would be imported instead of the installed "
            "one; remove it"
        )
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.bridge") is None:
        return "Megatron-Bridge is not installed in this Python (pip install megatron-bridge==0.6.2)"
    return None


def checkpoint_format(root: str | os.PathLike | None) -> dict:
    """The format of the checkpoint under ``root``: the checkpoint reader (``runs.checkpoints``), else the marker test."""
    try:
        from ..runs import checkpoints
    except ImportError:
        return marker_format(root)
    if not root or not os.path.isdir(root):
        return {"format": None, "why": f"no checkpoint folder at {root}"}
    rep = checkpoints.inspect(str(root))
    out = {
        "format": rep.format,
        "by": "mfsdp_lib.runs.checkpoints",
        "latest": rep.latest,
        "findings": [f.to_dict() for f in rep.findings],
    }
    out.update({k: v for k, v in marker_format(root).items() if k not in ("format",)})
    return out


def marker_format(root: str | os.PathLike | None) -> dict:
    """Marker test for the format of the newest iteration under ``root`` (no tensors read).

    ``fsdp_dtensor``: PyTorch DCP ``.metadata`` with ``*.distcp`` shards and no
    Megatron ``metadata.json``; ``torch_dist``/``zarr``: Megatron's ``metadata.json``
    names its ``sharded_backend``. The saved ``run_config.yaml`` says what was asked.
    """
    if not root or not os.path.isdir(root):
        return {"format": None, "why": f"no checkpoint folder at {root}"}
    iters = sorted(p for p in Path(root).glob("iter_*") if p.is_dir())
    if not iters:
        return {"format": None, "why": "no iter_* folder"}
    it = iters[-1]
    files = sorted(p.name for p in it.iterdir())
    fmt = None
    if "metadata.json" in files:
        try:
            fmt = json.loads((it / "metadata.json").read_text()).get("sharded_backend")
        except (OSError, ValueError):
            fmt = "unreadable metadata.json"
    elif ".metadata" in files and any(f.endswith(".distcp") for f in files):
        fmt = "fsdp_dtensor"
    recorded = None
    if "run_config.yaml" in files:
        import yaml

        try:
            recorded = (
                (yaml.safe_load((it / "run_config.yaml").read_text()) or {}).get("checkpoint", {}).get("ckpt_format")
            )
        except (OSError, yaml.YAMLError):
            recorded = None
    return {
        "format": fmt,
        "recorded_ckpt_format": recorded,
        "iteration_dir": it.name,
        "files": [f for f in files if not f.endswith(".distcp")],
        "distcp_files": sum(f.endswith(".distcp") for f in files),
    }


def _run_cli_json(*args: str) -> dict | None:
    """``mfsdp.py ARGS --format json`` when that command exists in this checkout."""
    proc = subprocess.run([sys.executable, str(MFSDP), *args, "--format", "json"], capture_output=True, text=True)
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        return {"available": False, "exit_code": proc.returncode, "stderr": proc.stderr.strip()[-500:]}
    out["exit_code"] = proc.returncode
    return out


def launch(cmd: list[str], log_path: Path, env: dict | None = None) -> int:
    """Run ``cmd``, echoing its output and keeping it in ``log_path``."""
    from .. import config_io

    log_path.parent.mkdir(parents=True, exist_ok=True)
    # Only a regular file (or a new one) is written, never through a symbolic link: a FIFO would hang the
    # launch and a link would send the log over another file.
    real, _ = config_io.writable_target(str(log_path), follow_links=False)
    fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w") as log:
        # a group of its own, stopped whole on Ctrl-C, SIGTERM or SIGHUP (runs.engine): torchrun's workers
        # hold the GPU, and a signal to the CLI alone would leave them running
        proc = engine.start(
            list(cmd),  # an argument list, never a shell: see the module docstring
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            bufsize=1,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stderr.write(line)
                log.write(line)
            return proc.wait()
        except KeyboardInterrupt:
            sys.stderr.write("smoke: stopping the launcher's process group\n")
            engine.stop_group(proc)
            raise


def summarise(out: Path, exit_code: int, cmd: list[str], save_resume: bool) -> dict:
    """Merge ``rank*.json`` into the smoke summary and judge it."""
    ranks = []
    for p in sorted(out.glob("rank*.json"), key=lambda p: int(p.stem[4:] or 0)):
        try:
            ranks.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            ranks.append({"rank": p.stem, "error": "unreadable rank record"})
    r0 = next((r for r in ranks if r.get("rank") == 0), ranks[0] if ranks else {})
    errors = [f"rank {r.get('rank')}: {r['error']}" for r in ranks if r.get("error")]
    final = r0.get("final_loss")
    finite = bool(r0.get("finite")) and final is not None and math.isfinite(final)
    ckpt = checkpoint_format(r0.get("ckpt_dir")) if save_resume else None
    sr = r0.get("save_resume") if save_resume else None
    summary = {
        "command": shlex.join(cmd),
        "exit_code": exit_code,
        "strategy": r0.get("strategy"),
        "world_size": r0.get("world_size"),
        "final_loss": final,
        "finite": finite,
        "iterations": r0.get("iterations"),
        "step_time_s": r0.get("step_time_s_median"),
        "tokens_per_s": r0.get("tokens_per_s"),
        "peak_memory_bytes": {str(r.get("rank")): r.get("peak_allocated_bytes") for r in ranks},
        "bridge_validate": r0.get("bridge_validate"),
        "check": r0.get("check"),
        "checkpoint": ckpt,
        "save_resume": sr,
        "versions": r0.get("versions"),
        "device": r0.get("device"),
        "errors": errors,
    }
    if save_resume and r0.get("ckpt_dir"):
        summary["ckpt_cli"] = _run_cli_json("ckpt", r0["ckpt_dir"])
    if (out / "train.log").is_file():
        summary["log_cli"] = _run_cli_json("log", str(out / "train.log"))
    ok = exit_code == 0 and not errors and finite and bool(ranks) and bool((r0.get("bridge_validate") or {}).get("ok"))
    if save_resume:
        ok = (
            ok
            and bool(sr and sr.get("equal"))
            and bool(ckpt and ckpt.get("format") == "fsdp_dtensor" or r0.get("strategy") in ("ddp", "distopt"))
        )
    summary["pass"] = ok
    return summary
