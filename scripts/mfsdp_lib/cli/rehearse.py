"""``mfsdp.py rehearse``: find a job's failure and its memory on ONE GPU before it spends a cluster.

Thin command layer: arguments, the refusal (one line, exit 2) where CUDA or
Megatron-Bridge is missing, ``--dry-run`` to print the exact engine commands, then one
engine process (``scripts/rehearse_train.py``) per distinct rank position, run one after
the other on this GPU, with their progress lines passed through. The verdict, the
memory table and the failure explanations come from :mod:`mfsdp_lib.runs.rehearse`;
``--perf`` and ``--compare`` (step time, throughput, communication and the predicted
step-time range) from :mod:`mfsdp_lib.perf`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import subprocess
import sys
import threading

from .. import config_io
from ..findings import InputError
from ..perf import predict as perf_predict
from ..perf import report as perf_report
from ..runs import engine
from ..runs import rehearse as rh
from .check import allow_intermixed

PRESETS = ("tiny", "llama-1b", "llama3-8b", "llama3-70b", "qwen3-moe-16l", "nemotronh-small")
STRATEGIES = ("ddp", "distopt", "optim", "optim_grads", "optim_grads_params")  # the engine's choices
DEFAULT_ITERS = 3  # step 1 allocates the optimizer state; steps 2+ show the steady state
DEFAULT_PERF_ITERS = 5  # --perf: timed steps after warm-up (median and spread need a few)
# --perf-micro-batches alone: micro-batches run per step, the rest scaled. The first micro-batch of a
# step also gathers the weights outside the layers and the last one reduces the gradients; 4 keeps
# two plain ones between them, and 2 warm-up + 5 timed steps of 4 keep a 32-micro-batch step of a
# 30 B MoE recipe (about 3.6 s per micro-batch on one H100) inside one 10-minute GPU call.
DEFAULT_PERF_MICRO_BATCHES = 4
# --moe-dispatcher: megatron-core's token dispatchers that need no package beyond megatron-core
# (transformer_config.py :: moe_token_dispatcher_type "allgather" | "alltoall" | "flex"; flex needs DeepEP,
# HybridEP or TE's ep module, moe/fused_a2a.py).
MOE_FALLBACK_DISPATCHERS = ("alltoall", "allgather")
DEFAULT_WARMUP = 2  # --perf: step 1 allocates the optimizer state and initialises kernels; step 2 settles
# --compare: every strategy the engine can apply, cheapest communication first
COMPARE_STRATEGIES = ("ddp", "distopt", "optim", "optim_grads", "optim_grads_params")
DEFAULT_TIMEOUT_S = 1800  # one rank: importing Bridge (~30 s) plus building a 70 B trunk on meta and 3 steps

DESCRIPTION = """\
Rehearse a Megatron-Bridge training job on ONE GPU as rank R of a world of N.

The job's real ConfigContainer is built, validated, set up and trained for a few steps
with PyTorch's 'fake' process-group backend: collectives return at once and move no
data, while every allocation is real. Rank R of the fake world builds the same process
groups, shards the same tensors and allocates the same buffers as rank R of the real job,
so a failure at model wrapping, in the optimizer or in the first step shows up here, with
the memory this rank will need.

CONFIG is a Bridge YAML (a run_config.yaml that ConfigContainer.to_yaml() wrote, or a
full recipe dump); or give --recipe MODULE:FUNCTION or --model-preset NAME. KEY=VALUE are
Bridge dotted overrides applied on top.

The report, per rehearsed rank: each phase (import, config, validate, initialize,
model_build, model_wrap, optimizer, data, train; save and load with --save-load) passed
or failed; the first failure's exception, where in Megatron it came from, and the fix
under the same rule id 'check' uses; memory after setup, between steps, peak allocated and
reserved, beside what 'mfsdp.py memory' predicts; and an NCCL allowance on its own line
(the fake backend creates no communicators, so their buffers are never allocated: the
allowance is the number of communicators this rank joins times NCCL's default buffers).

--perf adds performance: the training steps after warm-up are timed with CUDA events
(median and spread over --iters), and every collective the rank issues is recorded with
its size, its parallel group (dp, dp_outer, tp, cp, ep, pp, by the group's ranks) and its
phase. The fake backend moves no data, so the time measured is the job's compute; the
communication is priced on a link model (NVLink inside a node, InfiniBand across) and the
step time is given as a range: perfect overlap (max of compute and the busiest link) to
no overlap (compute + communication). Throughput (tokens/s/GPU), model TFLOP/s/GPU (Bridge's
own FLOP formula) and MFU against the GPU's dense peak come with it.

--compare runs the same job under DDP, the distributed optimizer and each Megatron FSDP
strategy (and each VARIANT of KEY=VALUE overrides you give, e.g. recompute off or a larger
micro-batch that only FSDP's memory allows) and prints one table: memory, compute time,
communication per step, predicted step time and tokens/s/GPU.

When to use it: before a large job; after 'mfsdp.py enable'; when 'mfsdp.py memory' says
a strategy is close to the GPU's size; with --perf or --compare, to choose a strategy and
predict a job's speed at its real world size."""

EPILOG = """\
examples:
  mfsdp.py rehearse run_config.yaml --world-size 64
  mfsdp.py rehearse run_config.yaml model.pipeline_model_parallel_size=2 --world-size 512
        # two processes: the first and the last pipeline stage
  mfsdp.py rehearse --model-preset llama-1b --world-size 8 --strategy optim_grads_params
  mfsdp.py rehearse --model-preset qwen3-moe-16l --world-size 64 --balanced-routing
  mfsdp.py rehearse --model-preset llama-1b --parity --save-load
        # real world of 1: DDP and Megatron FSDP losses must agree; checkpoint round trip
  mfsdp.py rehearse run_config.yaml --world-size 64 --dry-run   # the exact commands only
  mfsdp.py rehearse run_config.yaml --world-size 64 --perf --iters 5
        # step time, tokens/s/GPU, MFU, bytes per step per group, predicted step-time range
  mfsdp.py rehearse --model-preset llama-1b --world-size 64 --perf --inter-node-gbps 40
  mfsdp.py rehearse run_config.yaml --world-size 64 --compare model.recompute_granularity=null
        # every strategy, then every strategy with recompute off; one table (put --compare last)
  mfsdp.py rehearse --recipe megatron.bridge.perf_recipes.llama.h100.llama3:llama3_8b_pretrain_8gpu_h100_fp8cs_config \
        --hf-config meta-llama/Meta-Llama-3-8B=./Meta-Llama-3-8B/config.json --world-size 8 --perf

link model (--perf): bandwidths are GB/s = 1e9 bytes/s per GPU in one direction, the bus
bandwidth nccl-tests reports (a 400 Gb/s InfiniBand port is 50 GB/s). Defaults are a DGX
H100: 8 GPUs per node, NVLink 900 GB/s bidirectional (450 one way), one 400 Gb/s ConnectX-7
port per GPU (50 GB/s). A group inside one node uses NVLink; a group spanning nodes with r
ranks per node gets min(NVLink, r x network). Measured bus bandwidths of your cluster
(nccl-tests all_gather_perf / reduce_scatter_perf) give tighter ranges.

Hugging Face configs: recipes build their model from a model id's config.json. On a
machine without internet give it with --hf-config MODEL_ID=PATH (a config.json or the
folder holding it); the rehearsal lays it out as an offline hub cache for the run
(HF_HUB_OFFLINE=1). A missing one is named in one line before any network retry.

rank positions (--rank-position, repeatable): 'auto' rehearses one rank per distinct
role (rank 0; with pipeline parallelism also the first rank of the last stage); 'first',
'last' or a rank number pick ranks yourself.

Mixture of experts: collectives are mirrored (every rank looks like this one, so the
token dispatcher sizes its buffers from consistent counts); --balanced-routing forces the
router to spread tokens evenly (the worst case is not a balanced one; say which you ran).

Limits: losses mean nothing under the fake backend, and time per step is compute only
(--perf prices the communication separately); communicator
memory is an allowance, not a measurement; hybrid (Mamba) models need mamba-ssm on this
machine, and without causal-conv1d they run megatron-core's unfused Mamba path (a
deviation the report labels, with its memory effect: references/rehearse.md); save/load
at N > 1 runs with torch's global-plan coverage check waived (this process holds one
rank's shards), so --parity (a real world of 1) is the save/load proof that compares
values.

Exit codes: 0 every phase passed (and the parity, if asked; with --compare: every row ran
or did not fit in memory), 1 a phase or the parity failed, 2 the rehearsal cannot run
here (no CUDA or Megatron-Bridge, a missing Hugging Face config, bad options)."""


def configure(parser) -> None:
    parser.add_argument(
        "items", nargs="*", metavar="[CONFIG] [KEY=VALUE ...]", help="a Bridge YAML, then section.key=value overrides"
    )
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--recipe", metavar="MODULE:FUNCTION", help="a recipe function returning a ConfigContainer")
    src.add_argument("--model-preset", choices=PRESETS, help="a built-in model trunk on mock data")
    parser.add_argument("--world-size", type=int, default=None, metavar="N", help="the world size of the real job")
    parser.add_argument(
        "--rank-position",
        action="append",
        default=None,
        metavar="P",
        help="auto (default), first, last or a rank number; repeatable",
    )
    parser.add_argument(
        "--iters",
        type=int,
        default=None,
        metavar="K",
        help=f"training steps (default {DEFAULT_ITERS}); with --perf the timed steps after warm-up "
        f"(default {DEFAULT_PERF_ITERS})",
    )
    parser.add_argument(
        "--strategy", choices=STRATEGIES, default=None, help="override the config's data-parallel strategy"
    )
    parser.add_argument("--balanced-routing", action="store_true", help="MoE: force balanced routing")
    parser.add_argument(
        "--no-mirror-collectives",
        action="store_true",
        help="plain fake collectives where the rehearsal mirrors them (MoE, --perf): token counts and gathered "
        "weights are then read from memory nobody wrote",
    )
    parser.add_argument(
        "--save-load",
        action="store_true",
        help="also save a checkpoint and load it into a new model (at N > 1 the load runs but restores no tensor: "
        "one process stands for the world; --world-size 1 compares the loss across the round trip)",
    )
    parser.add_argument(
        "--parity", action="store_true", help="also run a real world of 1 under DDP and Megatron FSDP; compare losses"
    )
    perf = parser.add_argument_group("performance (--perf, --compare)")
    perf.add_argument("--perf", action="store_true", help="time the steps, count the communication, predict the step")
    perf.add_argument(
        "--warmup",
        type=int,
        default=DEFAULT_WARMUP,
        metavar="W",
        help=f"--perf: untimed steps first (default {DEFAULT_WARMUP})",
    )
    perf.add_argument(
        "--perf-micro-batches",
        nargs="?",
        type=int,
        const=DEFAULT_PERF_MICRO_BATCHES,
        default=None,
        metavar="K",
        help="--perf on a step of many micro-batches: run K of them per step (the flag alone: "
        f"{DEFAULT_PERF_MICRO_BATCHES}) and scale the forward/backward time to the step's M "
        "(step = optimizer + forward/backward x M/K; stated in the report)",
    )
    perf.add_argument(
        "--moe-dispatcher",
        choices=MOE_FALLBACK_DISPATCHERS,
        default=None,
        help="MoE: rehearse with this token dispatcher in place of the config's flex (DeepEP/HybridEP) one when "
        "that package is not installed here; labelled a deviation in the report (memory and time of the "
        "dispatch differ from the production run's)",
    )
    perf.add_argument(
        "--profile",
        action="store_true",
        help="--perf: also run the timed steps under torch.profiler (GPU kernels only) and report their device "
        "time by kind of kernel (GEMM, attention, MoE permutation, copies, casts...); the profiler slows "
        "the steps, so take throughput from a run without it",
    )
    perf.add_argument(
        "--te-grad-accum-fusion",
        action="store_true",
        help="where APEX is missing and the config sets model.gradient_accumulation_fusion=true: keep it on for "
        "Transformer Engine's layers (they fuse the weight-gradient accumulation themselves) and off only "
        "in megatron-core's own linear layers (the output layer); without this flag it is turned off "
        "everywhere. Labelled a deviation in the report",
    )
    perf.add_argument(
        "--intra-node-gbps",
        type=float,
        default=perf_predict.DGX_NVLINK_GBPS,
        metavar="GB/s",
        help="bus bandwidth inside a node, GB/s per GPU one way (default 450: DGX H100 NVLink)",
    )
    perf.add_argument(
        "--inter-node-gbps",
        type=float,
        default=perf_predict.DGX_IB_GBPS,
        metavar="GB/s",
        help="network bandwidth per GPU, GB/s one way (default 50: one 400 Gb/s InfiniBand port per GPU)",
    )
    perf.add_argument(
        "--gpus-per-node",
        type=int,
        default=perf_predict.DGX_GPUS_PER_NODE,
        metavar="G",
        help="GPUs per node; ranks r // G share a node (default 8)",
    )
    perf.add_argument(
        "--compare",
        nargs="*",
        default=None,
        metavar="VARIANT",
        help="run every strategy (and each VARIANT: KEY=VALUE[,KEY=VALUE...]) with --perf; one table. "
        "Put it last: the words after it are variants",
    )
    perf.add_argument(
        "--strategies",
        default=",".join(COMPARE_STRATEGIES),
        metavar="LIST",
        help="--compare: the strategies to run, comma-separated (default all)",
    )
    parser.add_argument(
        "--hf-config",
        action="append",
        default=None,
        metavar="[MODEL_ID=]PATH",
        help="a Hugging Face config.json (or its folder) for a model id the recipe reads, used offline; "
        "repeatable; without MODEL_ID it serves the one id the recipe asks for",
    )
    parser.add_argument("--out", default=None, metavar="DIR", help="folder for the reports (default: a new one here)")
    parser.add_argument(
        "--timeout-s", type=int, default=DEFAULT_TIMEOUT_S, help="per rank (default 1800); the rank then fails"
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter for the engine (default: this one)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    parser.add_argument("--dry-run", action="store_true", help="print the engine commands, run nothing")
    allow_intermixed(parser)


def _source(args) -> tuple[list[str], list[str], dict | None]:
    """(engine source arguments, overrides, the config mapping when a YAML was given)."""
    items = list(args.items)
    for item in items:  # ~KEY (Hydra's deletion), section.key without =VALUE: say so, not "one CONFIG at most"
        config_io.refuse_unusable_override(item)
    overrides = [i for i in items if "=" in i]
    files = [i for i in items if "=" not in i]
    for o in overrides:
        key = o.partition("=")[0]
        if not key or "." not in key or key.startswith("."):
            raise InputError(f"override {o!r}: expected section.key=value")
    if len(files) > 1:
        raise InputError(f"one CONFIG at most, got {len(files)}: {' '.join(files)}")
    given = sum(bool(x) for x in (files, args.recipe, args.model_preset))
    if given == 0:
        raise InputError("give a CONFIG (a Bridge YAML), --recipe MODULE:FUNCTION or --model-preset NAME")
    if given > 1:
        raise InputError("give one of CONFIG, --recipe and --model-preset")
    # The config and the overrides are checked offline first, as `check` reads them (unknown keys, misspelt
    # values, wrong types): a typo is reported as a typo, before the question of a GPU or torch comes up.
    if files:
        path = config_io.resolve_config_path(files[0])
        cfg = config_io.load_yaml(path)
        config_io.load_effective(path, overrides)
        return ["--yaml", os.path.abspath(path)], overrides, cfg
    if overrides:
        config_io.apply_overrides(config_io.base_config(None), overrides)
    if args.recipe:
        if ":" not in args.recipe:
            raise InputError(f"--recipe {args.recipe!r}: expected MODULE:FUNCTION")
        return ["--recipe", args.recipe], overrides, None
    return ["--model-preset", args.model_preset], overrides, None


def _out_dir(args) -> str:
    if args.out:
        out = os.path.abspath(args.out)
        if os.path.isdir(out) and os.listdir(out):
            raise InputError(f"--out {args.out}: folder exists and is not empty; give a new folder")
        if os.path.exists(out) and not os.path.isdir(out):
            raise InputError(f"--out {args.out}: exists and is not a folder")
        return out
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.abspath(f"rehearsal-{stamp}")


def refusal(python: str) -> str | None:
    """Why the engine cannot run here, in one line; None when it can."""
    probe = (
        "import importlib.util as u, sys\n"
        "if u.find_spec('torch') is None: print('torch'); sys.exit(0)\n"
        "if u.find_spec('megatron') is None or u.find_spec('megatron.bridge') is None: print('bridge'); sys.exit(0)\n"
        "import torch\n"
        "print('ok' if torch.cuda.is_available() else 'cuda')\n"
    )
    try:
        got = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {python}: {exc}"
    last = got.splitlines()[-1] if got else ""
    if last == "ok":
        return None
    return {
        "torch": "PyTorch is not installed in this Python; rehearse needs a CUDA GPU, PyTorch and Megatron-Bridge 0.6.x",
        "bridge": "Megatron-Bridge is not installed in this Python (pip install megatron-bridge==0.6.2); "
        "rehearse needs it and a CUDA GPU",
        "cuda": "no CUDA GPU is visible (torch.cuda.is_available() is False); rehearse needs one GPU",
    }.get(last, f"cannot probe {python} for torch/CUDA/Megatron-Bridge")


def hf_configs(items: list[str] | None) -> list[str]:
    """``--hf-config [MODEL_ID=]PATH`` items, checked here and passed on with absolute paths."""
    out = []
    for item in items or []:
        model_id, sep, path = item.rpartition("=") if "=" in item else ("", "", item)
        if sep and (not model_id or model_id.count("/") != 1 or any(not part for part in model_id.split("/"))):
            raise InputError(
                f"--hf-config {item!r}: MODEL_ID must look like owner/name (e.g. meta-llama/Meta-Llama-3-8B)"
            )
        p = os.path.join(path, "config.json") if os.path.isdir(path) else path
        if not os.path.isfile(p):
            raise InputError(f"--hf-config {item!r}: no config.json at {p}")
        try:
            with open(p, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise InputError(f"--hf-config {p}: not a readable JSON file ({type(exc).__name__})") from None
        if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
            raise InputError(f"--hf-config {p}: not a Hugging Face config.json (no model_type)")
        out.append(f"{model_id}={os.path.abspath(p)}" if sep else os.path.abspath(p))
    if sum(1 for x in out if "=" not in x) > 1:
        raise InputError("--hf-config: give MODEL_ID=PATH when there is more than one config")
    return out


def variants(items: list[str] | None) -> list[tuple[str, list[str]]]:
    """``--compare`` variants: each ``KEY=VALUE[,KEY=VALUE...]`` -> (label, overrides)."""
    out = []
    for item in items or []:
        parts = [p for p in re.split(r",(?=[A-Za-z_][\w.]*=)", item) if p]
        for o in parts:
            key = o.partition("=")[0]
            if "=" not in o or not key or "." not in key or key.startswith("."):
                raise InputError(f"--compare variant {item!r}: expected section.key=value[,section.key=value]")
        out.append((item, parts))
    return out


def links_of(args) -> perf_predict.Links:
    try:
        return perf_predict.Links(args.intra_node_gbps, args.inter_node_gbps, args.gpus_per_node)
    except ValueError as exc:
        raise InputError(f"link model: {exc}") from None


def plan(args) -> dict:
    """Every engine command this invocation would run, with the folders they write."""
    source, overrides, cfg = _source(args)
    compare = args.compare is not None
    perf = bool(args.perf or compare)
    iters = args.iters if args.iters is not None else (DEFAULT_PERF_ITERS if perf else DEFAULT_ITERS)
    if iters < 1:
        raise InputError("--iters must be at least 1")
    if perf and args.warmup < 0:
        raise InputError("--warmup must be 0 or more")
    if args.world_size is None and not args.parity:
        raise InputError("--world-size N is required (the world size of the real job)")
    if perf and args.parity:
        raise InputError("--perf/--compare and --parity are separate runs: give one of them")
    if compare and args.strategy:
        raise InputError("--compare runs every strategy itself (choose them with --strategies), not --strategy")
    links = links_of(args)
    extra = []
    if args.balanced_routing:
        extra.append("--balanced-routing")
    if args.no_mirror_collectives:
        extra.append("--no-mirror-collectives")
    if args.save_load:
        extra.append("--save-load")
    if perf:
        # always the fake backend, N = 1 included: compute is measured the same way at every world size
        extra += ["--perf", "--warmup", str(args.warmup), "--fake-pg"]
    if args.perf_micro_batches is not None:
        if not perf:
            raise InputError("--perf-micro-batches applies to --perf and --compare")
        if args.perf_micro_batches < 1:
            raise InputError("--perf-micro-batches must be at least 1")
        extra += ["--perf-micro-batches", str(args.perf_micro_batches)]
    if args.moe_dispatcher:
        extra += ["--moe-dispatcher", args.moe_dispatcher]
    if args.te_grad_accum_fusion:
        extra.append("--te-grad-accum-fusion")
    if args.profile:
        if not perf:
            raise InputError("--profile applies to --perf and --compare")
        extra.append("--profile")
    for h in hf_configs(args.hf_config):
        extra += ["--hf-config", h]
    out = _out_dir(args)
    runs = []
    if compare:
        strategies = [x.strip() for x in str(args.strategies).split(",") if x.strip()]
        bad = [x for x in strategies if x not in STRATEGIES]
        if bad or not strategies:
            raise InputError(f"--strategies {args.strategies!r}: choose from {', '.join(STRATEGIES)}")
        cases: list[tuple[str | None, list[str]]] = [(None, [])] + [(lab, ov) for lab, ov in variants(args.compare)]
        for k, (vlabel, vover) in enumerate(cases):
            for strategy in strategies:
                label = strategy if vlabel is None else f"{strategy} + {vlabel}"
                d = os.path.join(out, strategy if vlabel is None else f"{strategy}+v{k}", "rank_0")
                cmd = rh.engine_command(
                    source=source,
                    world=args.world_size,
                    rank=0,
                    out_dir=d,
                    iters=iters,
                    overrides=[*overrides, *vover],
                    strategy=strategy,
                    extra=extra,
                    python=args.python,
                )
                runs.append(
                    {
                        "rank": 0,
                        "role": "rank 0",
                        "dir": d,
                        "command": cmd,
                        "label": label,
                        "strategy": strategy,
                        "variant": vlabel,
                    }
                )
    elif args.world_size is not None:
        pp = rh.pipeline_size(cfg, overrides)
        try:
            positions = rh.rank_positions(args.world_size, pp, args.rank_position or ["auto"])
        except ValueError as exc:
            raise InputError(str(exc)) from None
        for rank, role in positions:
            d = os.path.join(out, f"rank_{rank}")
            cmd = rh.engine_command(
                source=source,
                world=args.world_size,
                rank=rank,
                out_dir=d,
                iters=iters,
                overrides=overrides,
                strategy=args.strategy,
                extra=extra,
                python=args.python,
            )
            runs.append({"rank": rank, "role": role, "dir": d, "command": cmd})
    parity = None
    if args.parity:
        d = os.path.join(out, "parity")
        cmd = rh.parity_command(source=source, out_dir=d, iters=max(iters, 5), overrides=overrides, python=args.python)
        if args.save_load:
            cmd.insert(-2, "--save-load")
        parity = {"dir": d, "command": cmd}
    return {"out": out, "runs": runs, "parity": parity, "links": links, "perf": perf, "compare": compare}


def engine_refusal(run_dir: str, rc: int) -> str | None:
    """The engine's one-line refusal (exit 2: bad input, a missing Hugging Face config), or None."""
    if rc != 2:
        return None
    rep = rh.read_report(run_dir)
    ff = (rep or {}).get("first_failure") or {}
    if ff.get("type") == "InputError" and ff.get("message"):
        return str(ff["message"]).splitlines()[0]
    try:
        with open(os.path.join(run_dir, "log.txt"), encoding="utf-8", errors="replace") as fh:
            lines = [ln.strip() for ln in fh if ln.strip().startswith("rehearse_train.py:")]
    except OSError:
        lines = []
    return lines[-1].partition(":")[2].strip() if lines else None


def _run_one(cmd: list[str], run_dir: str, timeout_s: int, label: str) -> int:
    """Run one engine process; its progress lines go to stderr, everything to run_dir/log.txt."""
    os.makedirs(run_dir, exist_ok=True)
    log_path = os.path.join(run_dir, "log.txt")
    sys.stderr.write(f"[rehearse] {label}: starting (log: {log_path})\n")
    sys.stderr.flush()
    with open(log_path, "w", encoding="utf-8", errors="replace") as log:
        proc = engine.start(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                if line.startswith("[rehearse"):
                    sys.stderr.write(f"  {label}: {line}")
                    sys.stderr.flush()

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            sys.stderr.write(f"[rehearse] {label}: no result after {timeout_s} s; stopping it\n")
            engine.stop_group(proc)
            rc = 124
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP (engine.Stopped): the whole group goes first
            sys.stderr.write(f"[rehearse] {label}: stopping the engine's process group\n")
            engine.stop_group(proc)
            raise
        t.join(timeout=10)
    return rc


def run(args) -> int:
    p = plan(args)
    if args.dry_run:
        for r in p["runs"]:
            print(f"# {r.get('label') or 'rank ' + str(r['rank'])} ({r['role']})")
            print(rh.quoted(r["command"]))
        if p["parity"]:
            print("# parity: a real world of 1, DDP and Megatron FSDP")
            print(rh.quoted(p["parity"]["command"]))
        return 0
    why = refusal(args.python)
    if why:
        raise InputError(why)
    os.makedirs(p["out"], exist_ok=True)
    total = len(p["runs"]) + (1 if p["parity"] else 0)
    for i, r in enumerate(p["runs"], 1):
        name = r.get("label") or f"rank {r['rank']}"
        rc = _run_one(r["command"], r["dir"], args.timeout_s, f"{name} [{i}/{total}]")
        refused = engine_refusal(r["dir"], rc)
        if refused:  # bad input the engine found (a missing HF config...): the same for every other run
            raise InputError(refused)
    if p["parity"]:
        _run_one(p["parity"]["command"], p["parity"]["dir"], args.timeout_s * 2, f"parity [{total}/{total}]")
    summary = rh.summarize(
        [(r["dir"], r["role"]) for r in p["runs"]],
        parity_dir=p["parity"]["dir"] if p["parity"] else None,
        command=[rh.quoted(r["command"]) for r in p["runs"]]
        + ([rh.quoted(p["parity"]["command"])] if p["parity"] else []),
        links=p["links"] if p["perf"] else None,
    )
    summary["out"] = p["out"]
    if p["compare"]:
        rows = [
            perf_report.compare_row(r["label"], r["strategy"], r["variant"], rank)
            for r, rank in zip(p["runs"], summary["ranks"], strict=True)
        ]
        summary["compare"] = {"rows": rows, "links": p["links"].describe()}
        summary["result"] = (
            "passed" if all(x["result"] == "passed" or x.get("fits") is False for x in rows) else "failed"
        )
    config_io.write_atomic(os.path.join(p["out"], "rehearsal.json"), json.dumps(summary, indent=1) + "\n")
    if args.format == "json":
        print(json.dumps(summary, indent=1))
    elif p["compare"]:
        world = args.world_size
        print(f"compare: rank 0 of a world of {world}, {len(summary['compare']['rows'])} runs")
        print("\n".join(perf_report.render_compare(summary["compare"]["rows"])))
        print(f"reports (each run in full): {p['out']}")
    else:
        sys.stdout.write(rh.render_text(summary))
        print(f"reports: {p['out']}")
    return rh.exit_code(summary)
