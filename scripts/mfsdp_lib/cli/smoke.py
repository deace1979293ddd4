"""``mfsdp.py smoke``: the real GPU smoke test, launched with torchrun (or srun).

Thin command layer: argument parsing, the preflight message (one line, exit 2) when
torch or Megatron-Bridge is missing, ``--dry-run`` to print the exact launcher
command, then :mod:`mfsdp_lib.runs.smoke` runs it and judges the result. The training
entry it launches is ``scripts/smoke_train.py``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from ..findings import InputError

DESCRIPTION = """\
Train a small Llama with Megatron-Bridge under torchrun and prove it works: finite loss,
and with --save-resume an fsdp_dtensor checkpoint saved, loaded into a fresh model and
giving the same forward loss. The config is built with the settings 'mfsdp.py enable'
applies and checked with 'mfsdp.py check' and Bridge's ConfigContainer.validate().
Needs CUDA GPUs, PyTorch and Megatron-Bridge 0.6.x (tests/gpu/setup_device.sh sets up a
bare GPU machine from a wheel folder).

examples:
  mfsdp.py smoke --save-resume                          # 1 GPU, optim_grads_params
  mfsdp.py smoke --nproc-per-node 8 --save-resume --format json
  mfsdp.py smoke --strategy ddp --iters 20              # the same model without FSDP
  mfsdp.py smoke --nnodes 2 --node-rank 0 --master-addr node0 --nproc-per-node 8
  mfsdp.py smoke --launcher srun --nnodes 2 --nproc-per-node 8   # inside a Slurm allocation
  mfsdp.py smoke --dry-run                              # print the launcher command only
"""

EPILOG = """\
Pass criteria: launcher exit 0, Bridge accepted the config, a finite loss at the last
iteration, and with --save-resume an fsdp_dtensor checkpoint on disk and equal forward
loss before save and after load (bf16 tolerance). Exit 0 on pass, 1 on fail, 2 when the
run cannot start here (no torch / Megatron-Bridge, bad options).
With one GPU the data-parallel size is 1, so Megatron FSDP shards nothing: the run proves
the code path and the checkpoint round trip, not the memory saving.
"""

STRATEGY_CHOICES = ("ddp", "distopt", "optim", "optim_grads", "optim_grads_params")
MODEL_CHOICES = ("tiny", "small", "llama-1b")  # kept equal to mfsdp_gpu.presets.SMOKE_SHAPES (a test checks)
MAX_PORT = 65535  # TCP ports are 16-bit


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def configure(parser) -> None:
    parser.add_argument("--nproc-per-node", type=_positive, default=1, help="GPUs per node (default 1)")
    parser.add_argument("--nnodes", type=_positive, default=1, help="number of nodes (default 1)")
    parser.add_argument("--node-rank", type=_non_negative, default=0, help="this node's rank (torchrun launcher)")
    parser.add_argument("--master-addr", default=None, help="host of node rank 0 (needed with --nnodes > 1)")
    parser.add_argument("--master-port", type=_positive, default=29500, help="rendezvous port (default 29500)")
    parser.add_argument(
        "--launcher",
        choices=("torchrun", "srun"),
        default="torchrun",
        help="torchrun on this node, or srun (one torchrun per node, c10d rendezvous)",
    )
    parser.add_argument(
        "--strategy",
        choices=STRATEGY_CHOICES,
        default="optim_grads_params",
        help="ddp, distopt, or a Megatron FSDP sharding strategy (default optim_grads_params)",
    )
    parser.add_argument(
        "--model",
        choices=MODEL_CHOICES,
        default="small",
        help="model shape: tiny, small (Bridge's FSDP test shape), llama-1b",
    )
    parser.add_argument("--iters", type=_positive, default=10, help="training iterations (default 10)")
    parser.add_argument("--seq-length", type=_positive, default=512, help="sequence length (default 512)")
    parser.add_argument("--global-batch-size", type=_positive, default=8)
    parser.add_argument("--micro-batch-size", type=_positive, default=1)
    parser.add_argument(
        "--save-resume",
        action="store_true",
        help="save an fsdp_dtensor checkpoint, load it into a fresh model, compare forward loss",
    )
    parser.add_argument("--out", default="mfsdp-smoke-out", help="output folder (default ./mfsdp-smoke-out)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--dry-run", action="store_true", help="print the launcher command and exit")


def run(args) -> int:
    from ..runs import smoke

    if args.global_batch_size % args.micro_batch_size:
        raise InputError(
            f"--global-batch-size {args.global_batch_size} is not a multiple of "
            f"--micro-batch-size {args.micro_batch_size}"
        )
    if args.node_rank >= args.nnodes:
        raise InputError(f"--node-rank {args.node_rank} must be below --nnodes {args.nnodes}")
    # Checked before --dry-run too, so a dry run never prints a command that cannot work
    # (--master-addr=None, a port torchrun cannot bind, an output "folder" that is a file).
    if args.nnodes > 1 and args.launcher == "torchrun" and not args.master_addr:
        raise InputError("--nnodes > 1 needs --master-addr (the node-rank-0 host) or --launcher srun")
    if args.master_port > MAX_PORT:
        raise InputError(f"--master-port {args.master_port} is not a TCP port (1-{MAX_PORT})")
    out = Path(args.out).resolve()
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: is a file; give a folder for the logs, checkpoint and summary")
    args.out = str(out)
    cmd = smoke.build_command(args)
    if args.dry_run:
        print(shlex.join(cmd))  # every argument quoted: pasting the line runs exactly this list
        return 0
    why = smoke.preflight(args)
    if why:
        raise InputError(why)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("rank*.json"):
        stale.unlink()
    code = smoke.launch(cmd, out / "train.log")
    summary = smoke.summarise(out, code, cmd, args.save_resume)
    from .. import config_io

    # atomic, and never through a link or onto a FIFO/device planted under that name
    config_io.write_atomic(str(out / "summary.json"), json.dumps(summary, indent=1, default=str), follow_links=False)
    if args.format == "json":
        json.dump(summary, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        _print_text(summary, out)
    return 0 if summary["pass"] else 1


def _gib(n) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GiB"


def _print_text(s: dict, out: Path) -> None:
    w = sys.stdout.write
    w(f"smoke: {'PASS' if s['pass'] else 'FAIL'}  (strategy {s['strategy']}, world size {s['world_size']})\n")
    w(f"  final loss {s['final_loss']}  finite={s['finite']}  iterations {s['iterations']}\n")
    if s.get("step_time_s"):
        w(f"  step time {s['step_time_s'] * 1e3:.1f} ms  tokens/s {s['tokens_per_s']:.0f}\n")
    w("  peak memory: " + ", ".join(f"rank {r} {_gib(b)}" for r, b in s["peak_memory_bytes"].items()) + "\n")
    if s.get("checkpoint"):
        w(f"  checkpoint format on disk: {s['checkpoint'].get('format')}\n")
    if s.get("save_resume"):
        sr = s["save_resume"]
        w(
            f"  save/resume: loss {sr.get('loss_before_save')} -> {sr.get('loss_after_load')} "
            f"(|delta| {sr.get('abs_delta')}, equal={sr.get('equal')})\n"
        )
    for e in s["errors"]:
        w(f"  error: {e}\n")
    w(f"  files: {out}/summary.json, {out}/train.log\n")
