"""``mfsdp.py convert SRC DST --to FORMAT``: move a checkpoint between torch_dist, fsdp_dtensor and Hugging Face.

Mechanism, in the order it runs, and why:

1. Everything that can be refused is refused first, with the standard library only (so it holds on a
   machine without torch): an unknown ``--to``; a SRC that ``ckpt``'s reader does not recognise as a
   checkpoint, or whose newest iteration it flags as incomplete or unsafe to unpickle; a SRC already in the
   target format; a DST that exists and is not an empty folder, that is SRC, or that lies inside SRC; an
   export to Hugging Face with no Hugging Face config to name the architecture. Exit 2, one line,
   nothing written.
2. The conversion itself runs in ``mfsdp_gpu/ckpt_convert.py`` (imported only now: it needs torch and
   Megatron-Bridge 0.6.2) at world size 1 on one GPU, through the public APIs of the pinned packages:
   Bridge's model providers and ``AutoBridge`` for Hugging Face weights, Bridge's ``load_megatron_model`` /
   ``load_checkpoint`` / ``save_checkpoint`` for the Megatron formats, PyTorch distributed checkpointing
   underneath. It writes into a temporary folder beside DST.
3. The temporary folder is checked with ``ckpt``'s own reader (format, payload, trackers, run config),
   then renamed to DST in one step: DST either appears complete or not at all.

Optimizer state is never carried (the weights and, between Megatron formats, the iteration and consumed
samples are): the next run resumes with ``checkpoint.load_optim=false checkpoint.load_rng=false`` and Adam's
moments start from zero. ``references/checkpoints.md`` gives the measured cost.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

from ..findings import InputError
from ..runs import checkpoints, migration
from ..shell import mfsdp_command

TARGETS = migration.FORMATS

# Findings on the source that make a conversion pointless or dangerous: it would read missing shards, or
# unpickle code (train_state.pt and .metadata are unpickled by torch when loaded).
BLOCKING_SOURCE_RULES = {
    "MFSDP-CKPT-NO-PAYLOAD": "its payload is missing",
    "MFSDP-CKPT-SHARDS-INCOMPLETE": "shard files are missing or short",
    "MFSDP-CKPT-UNSAFE-PICKLE": "a pickle in it would run code when loaded",
    "MFSDP-CKPT-SHARD-OUTSIDE": "its .metadata names shard files outside the folder",
    "MFSDP-CKPT-DCP-METADATA-BAD": "its .metadata is damaged",
    "MFSDP-CKPT-ZARR": "zarr checkpoints need an older Megatron-Core first",
    "MFSDP-CKPT-INCOMPLETE-SAVE": "it is a torch_dist save without its metadata.json (incomplete)",
    "MFSDP-CKPT-NO-ITERATION": "the root holds no iteration folder",
    "MFSDP-CKPT-TRACKER-MISSING": "its tracker points at a missing iteration",
}

STAGE_PREFIX = ".mfsdp-convert-"  # the temporary folder beside DST: .mfsdp-convert-<name>-<pid>

DESCRIPTION = """\
Convert a checkpoint between the formats `ckpt` reports: torch_dist (Megatron-Core distributed checkpoint:
DDP / distributed-optimizer runs), fsdp_dtensor (PyTorch DCP with Megatron FSDP's DTensors: the only format
a Megatron FSDP run loads and saves) and hf (Hugging Face config.json + safetensors).

How: at world size 1 on one GPU, with the installed Megatron-Bridge 0.6.2 (its model providers and
AutoBridge) and PyTorch distributed checkpointing; no repository checkout, no torchrun. SRC is a checkpoint
root (its newest iteration is converted) or one iteration folder or a Hugging Face folder. DST must not
exist (or be an empty folder); it is written in a temporary folder beside it, checked with the same reader
as `ckpt`, then renamed, so it appears complete or not at all.

What is carried: the model weights; between torch_dist and fsdp_dtensor also the iteration, consumed
samples and FLOP count (train_state.pt), so a resumed run continues the same data order. What is dropped:
optimizer state (Adam moments, fp32 main weights), the LR scheduler state and RNG state. Resume the
converted checkpoint with checkpoint.load_optim=false checkpoint.load_rng=false; Adam restarts from zero
moments, which costs a short re-warm-up (references/checkpoints.md: measured loss difference).
Parallelism: written at TP=PP=CP=EP=1; torch_dist and fsdp_dtensor both reshard on load.

Memory: the whole model at world size 1 (weights in their training dtype; torch_dist <-> fsdp_dtensor holds
two copies while it copies); a model that does not fit one GPU needs the upstream tools instead.
"""

EPILOG = """\
examples:
  mfsdp.py convert /ckpts/llama_ddp /ckpts/llama_fsdp --to fsdp_dtensor      # resume a DDP run under Megatron FSDP
  mfsdp.py convert /ckpts/llama_fsdp /exports/llama_hf --to hf --hf-config meta-llama/Llama-3.1-8B
  mfsdp.py convert /ckpts/llama_fsdp/iter_0001000 /ckpts/llama_td --to torch_dist
  mfsdp.py convert /models/Llama-3.1-8B /ckpts/llama_start --to fsdp_dtensor   # start a fine-tune under FSDP
  mfsdp.py convert SRC DST --to fsdp_dtensor --dry-run                         # checks and the plan only

then resume with:  checkpoint.load=DST checkpoint.ckpt_format=fsdp_dtensor checkpoint.load_optim=false
                   checkpoint.load_rng=false   (hf -> fsdp_dtensor: checkpoint.pretrained_checkpoint=DST)

exit codes: 0 converted and checked, 1 the conversion or its check failed (DST not written),
2 unusable input (nothing written).
"""


def configure(parser) -> None:
    parser.add_argument("src", metavar="SRC", help="checkpoint root, iteration folder, or Hugging Face folder")
    parser.add_argument("dst", metavar="DST", help="new folder to write (must not exist, or be empty)")
    parser.add_argument(
        "--to",
        required=True,
        metavar="FORMAT",
        help="target format: " + ", ".join(TARGETS) + " (the names `ckpt` prints)",
    )
    parser.add_argument(
        "--hf-config",
        metavar="ID_OR_DIR",
        help="Hugging Face model id or folder whose config.json names the architecture (needed to write or "
        "read hf from a Megatron checkpoint when run_config.yaml records no model.hf_model_id)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="run every check and print the plan; load and write nothing"
    )
    parser.add_argument(
        "--keep-failed",
        action="store_true",
        help="keep the temporary folder when the conversion or its check fails (for a bug report)",
    )


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def _inside(child: str, parent: str) -> bool:
    try:
        return os.path.commonpath([child, parent]) == parent
    except ValueError:  # different drives
        return False


def _looks_local(ref: str) -> bool:
    return ref.startswith((".", "/", "~")) or os.path.exists(ref)


def plan(args) -> dict:
    """Every check that needs no torch; raises InputError (exit 2) on the first refusal. Returns the plan."""
    to = args.to
    if to not in TARGETS:
        raise InputError(f"--to {to!r} is not a format convert writes; use one of: {', '.join(TARGETS)}")
    report = checkpoints.inspect(args.src)  # InputError when SRC is missing / not a folder / not a checkpoint
    info = report.inspected
    fmt = report.format
    blocking = [f for f in report.findings if f.rule in BLOCKING_SOURCE_RULES and f.severity == "error"]
    if blocking:
        f = blocking[0]
        raise InputError(
            f"{args.src}: refusing to convert: {BLOCKING_SOURCE_RULES[f.rule]} ({f.rule}); "
            f"for details run: {mfsdp_command('ckpt', args.src)}"
        )
    if info is None or fmt is None:
        raise InputError(f"{args.src}: no checkpoint iteration to convert; run: {mfsdp_command('ckpt', args.src)}")
    if fmt not in TARGETS:
        raise InputError(
            f"{args.src}: format {fmt!r} cannot be converted here (convert reads {', '.join(TARGETS)}); "
            f"for the route run: {mfsdp_command('ckpt', args.src)}"
        )
    if fmt == to:
        raise InputError(f"{args.src}: already {fmt}; nothing to convert (copy the folder instead)")
    src_real, dst_real = _real(args.src), _real(args.dst)
    iter_real = _real(info.path)
    if dst_real == src_real or _inside(dst_real, src_real) or _inside(dst_real, iter_real):
        raise InputError(f"{args.dst}: is the source or inside it; choose a folder outside {args.src}")
    if os.path.lexists(args.dst):
        if not os.path.isdir(args.dst) or os.path.islink(args.dst):
            raise InputError(f"{args.dst}: exists and is not a folder; choose a new folder")
        try:
            if os.listdir(args.dst):
                raise InputError(f"{args.dst}: exists and is not empty; choose a new or empty folder")
        except OSError as exc:
            raise InputError(f"{args.dst}: cannot list it ({exc.strerror})") from None
    parent = os.path.dirname(dst_real)
    if not os.path.isdir(parent):
        raise InputError(f"{args.dst}: its parent folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{args.dst}: cannot write in {parent}")
    hf_ref = args.hf_config or report.config.get("model.hf_model_id")
    needs_hf = to == "hf" and fmt != "hf"
    if needs_hf and not hf_ref:
        raise InputError(
            f"--to hf from {fmt} needs the Hugging Face architecture: pass --hf-config ID_OR_DIR (the model "
            "the checkpoint was trained from); run_config.yaml records no model.hf_model_id"
        )
    local_ref = bool(args.hf_config) and _looks_local(args.hf_config)
    if local_ref and not os.path.isfile(os.path.join(os.path.expanduser(args.hf_config), "config.json")):
        raise InputError(f"--hf-config {args.hf_config}: no config.json there")
    carried = ["model weights"]
    if fmt != "hf" and to != "hf":
        carried.append("iteration, consumed samples and FLOP count (train_state.pt)")
    dropped = ["optimizer state (Adam moments, fp32 main weights)", "LR scheduler state", "RNG state"]
    if fmt == "hf":
        dropped = []  # a Hugging Face folder holds weights only
    if to == "hf":
        dropped.append("everything but the weights (Hugging Face holds weights and config only)")
    return {
        "src": args.src,
        "src_iteration_dir": info.path,
        "src_format": fmt,
        "iteration": info.iteration,
        "to": to,
        "dst": args.dst,
        "hf_ref": hf_ref if (needs_hf or fmt == "hf") else None,
        "carried": carried,
        "dropped": dropped,
        "payload_bytes": _payload_bytes(info),
        "recorded_passing": (fmt, to) in migration.passing_paths(),
    }


def _payload_bytes(info) -> int | None:
    total = 0
    for name in info.entries:
        p = os.path.join(info.path, name)
        try:
            st = os.stat(p)
        except OSError:
            continue
        if os.path.isfile(p):
            total += st.st_size
    return total or None


def _say(msg: str) -> None:
    sys.stderr.write(f"convert: {msg}\n")
    sys.stderr.flush()


def _print_plan(p: dict) -> None:
    size = f" ({p['payload_bytes'] / 2**30:.2f} GiB in its folder)" if p["payload_bytes"] else ""
    it = f" iteration {p['iteration']}" if p["iteration"] is not None else ""
    print(f"source:      {p['src_iteration_dir']} ({p['src_format']}{it}){size}")
    print(f"target:      {p['dst']} ({p['to']})")
    if p["hf_ref"]:
        print(f"hf config:   {p['hf_ref']}")
    print(f"carried:     {'; '.join(p['carried'])}")
    if p["dropped"]:
        print(f"dropped:     {'; '.join(p['dropped'])}")
    verdict = "recorded as passing" if p["recorded_passing"] else "not yet recorded as passing"
    print(f"evidence:    {p['src_format']} -> {p['to']} {verdict} ({migration.REFERENCE})")


def _stage_dir(dst: str) -> str:
    parent = os.path.dirname(_real(dst))
    name = os.path.basename(os.path.normpath(dst)) or "dst"
    return os.path.join(parent, f"{STAGE_PREFIX}{name}-{os.getpid()}")


def _load_backend():
    """The torch/Bridge side, imported only after every check passed; exit 2 when it cannot be imported."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        import megatron.bridge  # noqa: F401
        import torch  # noqa: F401  (first: it preloads the NCCL library Transformer Engine needs)
    except Exception as exc:  # absent or broken: one line, nothing written
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise InputError(
            f"convert needs torch and Megatron-Bridge 0.6.2 (with a CUDA GPU): {type(exc).__name__}: {first}; "
            "run it where your training runs, or use --dry-run for the checks alone"
        ) from None
    from mfsdp_gpu import ckpt_convert  # noqa: WPS433 (heavy, optional)

    return ckpt_convert


def run(args) -> int:
    p = plan(args)
    _print_plan(p)
    if args.dry_run:
        print("dry run: nothing loaded, nothing written")
        return 0
    backend = _load_backend()
    stage = _stage_dir(args.dst)
    if os.path.lexists(stage):
        raise InputError(f"{stage}: a temporary folder of another convert is in the way; remove it")
    os.mkdir(stage, 0o755)
    t0 = time.monotonic()
    ok = False
    try:
        _say(f"converting {p['src_format']} -> {p['to']} at world size 1 into {stage}")
        try:
            result = backend.convert(
                src_iter=p["src_iteration_dir"],
                src_format=p["src_format"],
                to=p["to"],
                out=stage,
                hf_ref=p["hf_ref"],
                say=_say,
            )
        except Exception as exc:  # the conversion failed: say why in one line; DST is not written
            if os.environ.get("MFSDP_DEBUG") == "1":
                raise
            _say(
                f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                "(DST not written; MFSDP_DEBUG=1 shows the traceback)"
            )
            return 1
        _say(f"written in {time.monotonic() - t0:.1f} s; checking it with the ckpt reader")
        problems = _check_written(stage, p["to"], starting_point=p["src_format"] == "hf")
        if problems:
            _say("the written checkpoint failed its check: " + "; ".join(problems))
            return 1
        if os.path.isdir(args.dst):  # an empty folder: rename over it (POSIX replaces an empty directory)
            os.rmdir(args.dst)
        os.rename(stage, args.dst)
        ok = True
    finally:
        if not ok and os.path.isdir(stage):
            if args.keep_failed:
                _say(f"kept the temporary folder {stage}")
            else:
                shutil.rmtree(stage, ignore_errors=True)
    print(f"converted:   {args.dst} ({p['to']}) in {time.monotonic() - t0:.1f} s")
    for k, v in sorted((result or {}).items()):
        print(f"  {k}: {v}")
    if p["to"] == "fsdp_dtensor" and p["src_format"] != "hf":
        print(
            "resume it:   checkpoint.load=" + args.dst + " checkpoint.ckpt_format=fsdp_dtensor "
            "checkpoint.load_optim=false checkpoint.load_rng=false (optimizer state was not carried)"
        )
    elif p["to"] == "fsdp_dtensor":
        print("fine-tune:   checkpoint.pretrained_checkpoint=" + args.dst + " checkpoint.ckpt_format=fsdp_dtensor")
    elif p["to"] == "torch_dist" and p["src_format"] != "hf":
        print(
            "resume it:   checkpoint.load=" + args.dst + " checkpoint.ckpt_format=torch_dist "
            "checkpoint.load_optim=false checkpoint.load_rng=false (optimizer state was not carried)"
        )
    return 0


# An import from Hugging Face is a starting point, not a resume: it is written at iteration 0 (as Bridge's
# own importer writes it, AutoBridge.import_ckpt -> save_megatron_model) and loaded through
# checkpoint.pretrained_checkpoint. Its legacy tracker then holds 0, which checkpoint.load would refuse
# (checkpointing.py :: read_metadata asserts iteration > 0 when latest_train_state.pt is absent).
STARTING_POINT_TRACKER = "0"


def _check_written(path: str, to: str, starting_point: bool = False) -> list[str]:
    """What ``ckpt --expect TO`` would call an error on the written folder (an import's iteration-0 tracker
    excepted: see STARTING_POINT_TRACKER)."""
    try:
        report = checkpoints.inspect(path, expect=to)
    except InputError as exc:
        return [str(exc)]
    tracker_is_zero = False
    if starting_point:
        try:
            with open(os.path.join(path, checkpoints.TRACKER_TXT)) as fh:
                tracker_is_zero = fh.read().strip() == STARTING_POINT_TRACKER
        except OSError:
            tracker_is_zero = False
    return [
        f"{f.rule}: {f.message}"
        for f in report.findings
        if f.severity == "error" and not (tracker_is_zero and f.rule == "MFSDP-CKPT-TRACKER-BAD")
    ]
