"""The GPU runs' command lines: parsers, argument checks and ``KEY=VALUE`` overrides. Pure Python.

``rehearse_parser`` is ``rehearse_train.py``'s (``mfsdp.py rehearse`` and the rehearsal
benchmark build its argument lists), ``smoke_parser`` is ``smoke_train.py``'s (``mfsdp.py smoke``
and the strategy benchmark). Bad input raises :class:`InputError`: one clear line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re

from .report import InputError  # noqa: F401  (re-exported: the entry points and tests name args.InputError)
from .targets import TorchTarget

# A flat Hydra dict naming a torch attribute, uncalled: {_target_:torch.float32,_call_:false}, spaces allowed,
# keys in either order. Field-scoped: only these two keys, only a torch.NAME target.
_TORCH_TARGET = re.compile(
    r"^\{\s*(?:_target_\s*:\s*torch\.(?P<a>[A-Za-z_][A-Za-z0-9_]*)\s*,\s*_call_\s*:\s*false"
    r"|_call_\s*:\s*false\s*,\s*_target_\s*:\s*torch\.(?P<b>[A-Za-z_][A-Za-z0-9_]*))\s*\}$",
    re.IGNORECASE,
)


def parse_value(text: str):
    """A KEY=VALUE value: JSON/YAML-like scalars and lists, the ``{_target_: torch.X, _call_: false}`` form
    (a :class:`TorchTarget`); anything else is a string."""
    t = text.strip()
    m = _TORCH_TARGET.match(t)
    if m:
        return TorchTarget(m.group("a") or m.group("b"))
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    # Hydra's override grammar (Bridge's override path) reads only "null", in any case, as None: "none" is
    # the string megatron-core's enum-like fields take (model.dsa_kernel_backend=none, the router's
    # load-balancing type), as scripts/mfsdp_lib/config_io.parse_value reads it on the CPU side.
    if low == "null":
        return None
    try:
        return int(t)
    except ValueError:
        pass
    try:
        f = float(t)
        if math.isfinite(f):
            return f
    except ValueError:
        pass
    if t[:1] in '[{"':
        try:
            return json.loads(t)
        except ValueError:
            pass
    # Hydra's list of unquoted words ([core_attn,attn_proj]) is not JSON: it is still a list, its items read as
    # values (scripts/mfsdp_lib/config_io.parse_value reads it the same way on the CPU side). Read as the string
    # "[core_attn,attn_proj]", a list field would hold text and a membership test would match substrings.
    if t[:1] == "[" and t[-1:] == "]":
        inner = t[1:-1].strip()
        return [parse_value(x) for x in inner.split(",")] if inner else []
    return t


def parse_overrides(items) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise InputError(f"override {item!r} is not KEY=VALUE")
        key, _, val = item.partition("=")
        key = key.strip().lstrip("+")
        if not key or any(not part.isidentifier() for part in key.split(".")):
            raise InputError(f"override key {key!r} is not a dotted attribute name")
        out[key] = parse_value(val)
    return out


def rehearse_parser() -> argparse.ArgumentParser:
    """``rehearse_train.py``'s arguments (parse with ``parse_intermixed_args``: overrides may sit
    between options)."""
    from .bridge import STRATEGIES
    from .parity import PARITY_ATOL
    from .presets import PRESETS

    p = argparse.ArgumentParser(
        prog="rehearse_train.py",
        description="Run K real Megatron-Bridge training steps on one GPU as rank R of a world of N "
        "(PyTorch's fake process group), and record what passed and the memory of every phase.",
        epilog="Examples:\n"
        "  rehearse_train.py --model-preset llama-1b --world-size 8 --strategy optim_grads_params --out r/1b_n8\n"
        "  rehearse_train.py --yaml run_config.yaml --world-size 64 train.micro_batch_size=1 --out r/job\n"
        "  rehearse_train.py --model-preset llama-1b --parity --iters 5 --out r/parity\n"
        "Exit status: 0 all phases passed, 1 a phase failed (see report.json), 2 refused (bad input, no CUDA, "
        "no Megatron-Bridge).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--yaml", metavar="FILE", help="a Bridge ConfigContainer YAML (e.g. a run's to_yaml() output)")
    src.add_argument("--recipe", metavar="MODULE:FUNCTION", help="a recipe function returning a ConfigContainer")
    src.add_argument("--model-preset", choices=sorted(PRESETS), help="a built-in model trunk on mock data")
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="Bridge dotted overrides, e.g. train.global_batch_size=64"
    )
    p.add_argument("--world-size", type=int, default=1, help="N: the world this process is one rank of (default 1)")
    p.add_argument("--rank", type=int, default=0, help="R: which rank this process plays (default 0)")
    p.add_argument("--iters", type=int, default=3, help="training steps to run (default 3)")
    p.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default=None,
        help="data-parallel strategy; default: optim_grads_params for presets, the config's own for --yaml/--recipe",
    )
    p.add_argument(
        "--fake-pg", dest="fake_pg", action="store_true", default=None, help="use the fake backend (default when N > 1)"
    )
    p.add_argument("--no-fake-pg", dest="fake_pg", action="store_false", help="a real NCCL world (N must be 1)")
    p.add_argument(
        "--meta-init", dest="meta_init", action="store_true", default=None, help="build the model on the meta device"
    )
    p.add_argument("--no-meta-init", dest="meta_init", action="store_false", help="never build on the meta device")
    p.add_argument("--balanced-routing", action="store_true", help="MoE: force balanced routing")
    p.add_argument(
        "--comm-overlap-section",
        action="store_true",
        help="give a config without one Bridge's CommOverlapConfig(tp_comm_overlap=False), as the large recipes "
        "carry, so that comm_overlap.KEY=VALUE overrides apply (a preset has none)",
    )
    p.add_argument(
        "--mirror-collectives",
        dest="mirror",
        action="store_true",
        default=None,
        help="make every rank look like this one in all-gathers/all-to-alls (default: on for MoE)",
    )
    p.add_argument("--no-mirror-collectives", dest="mirror", action="store_false")
    p.add_argument("--peft", choices=("lora",), default=None, help="presets: add LoRA adapters (base weights random)")
    p.add_argument(
        "--save-load", action="store_true", help="save a checkpoint at the last step, load it into a fresh model"
    )
    p.add_argument("--parity", action="store_true", help="real world of 1: DDP vs Megatron FSDP, compare losses")
    p.add_argument("--parity-atol", type=float, default=PARITY_ATOL)
    p.add_argument("--seq-length", type=int, default=2048, help="presets: sequence length (default 2048)")
    p.add_argument("--micro-batch-size", type=int, default=1, help="presets: micro-batch size (default 1)")
    p.add_argument(
        "--global-batch-size",
        type=int,
        default=None,
        help="presets: global batch (default: N x micro-batch / (TP x PP x CP), one micro-batch per step)",
    )
    p.add_argument(
        "--perf",
        action="store_true",
        help="time the steps after --warmup with CUDA events and record every collective (then --iters K "
        "counts the timed steps)",
    )
    p.add_argument("--warmup", type=int, default=2, metavar="W", help="--perf: untimed steps first (default 2)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="--perf: run the timed steps under torch.profiler (GPU kernels only) and record their device time "
        "by kernel and by kind (the report's kernel_profile); the profiler slows the steps, so time and "
        "profile in separate runs",
    )
    p.add_argument(
        "--perf-micro-batches",
        type=int,
        default=None,
        metavar="K",
        help="--perf: run K of the step's M micro-batches (the global batch cut to K x DP x micro-batch) and "
        "scale the forward/backward time by M/K (the report's perf.scaling says how)",
    )
    p.add_argument(
        "--moe-dispatcher",
        choices=("alltoall", "allgather"),
        default=None,
        help="MoE: this token dispatcher in place of a flex one whose package (DeepEP, HybridEP) is missing "
        "(a labelled deviation)",
    )
    p.add_argument(
        "--te-grad-accum-fusion",
        action="store_true",
        help="without APEX, keep a config's gradient_accumulation_fusion=true for Transformer Engine's layers "
        "(which fuse it themselves) and turn it off only in megatron-core's own linear layers (the output "
        "layer), in place of turning it off everywhere (a labelled deviation)",
    )
    p.add_argument(
        "--hf-config",
        action="append",
        default=None,
        metavar="[MODEL_ID=]PATH",
        help="a Hugging Face config.json for a model id the recipe reads, laid out as an offline hub cache",
    )
    p.add_argument("--out", required=True, help="folder for report.json (created)")
    return p


def check_args(a) -> None:
    """The combinations argparse cannot refuse."""
    if a.world_size < 1:
        raise InputError("--world-size must be at least 1")
    if not 0 <= a.rank < a.world_size:
        raise InputError(f"--rank {a.rank} is outside a world of {a.world_size}")
    if a.iters < 1:
        raise InputError("--iters must be at least 1")
    if a.fake_pg is False and a.world_size > 1 and "TORCHELASTIC_RUN_ID" not in os.environ:
        raise InputError("--no-fake-pg needs --world-size 1 (or a launch by torchrun)")
    if a.parity and a.world_size != 1:
        raise InputError("--parity runs a real world of 1: use --world-size 1")
    if a.peft and not a.model_preset:
        raise InputError("--peft applies to --model-preset; a YAML or recipe brings its own peft section")
    if getattr(a, "perf", False) and a.parity:
        raise InputError("--perf and --parity are separate runs")
    if getattr(a, "warmup", 0) < 0:
        raise InputError("--warmup must be 0 or more")
    k = getattr(a, "perf_micro_batches", None)
    if k is not None and (k < 1 or not a.perf):
        raise InputError("--perf-micro-batches K needs --perf and K >= 1")
    if getattr(a, "profile", False) and not a.perf:
        raise InputError("--profile needs --perf")
    for spec in getattr(a, "hf_config", None) or []:
        path = spec.partition("=")[2] if "=" in spec else spec
        if not (os.path.isfile(path) or os.path.isfile(os.path.join(path, "config.json"))):
            raise InputError(f"--hf-config {spec!r}: no config.json there")


def use_fake_pg(a) -> bool:
    """The fake backend unless asked otherwise: by default for worlds larger than one."""
    if a.fake_pg is not None:
        return a.fake_pg
    return a.world_size > 1


def smoke_parser() -> argparse.ArgumentParser:
    """``smoke_train.py``'s arguments."""
    from .bridge import STRATEGIES
    from .presets import SMOKE_SHAPES

    p = argparse.ArgumentParser(
        prog="smoke_train.py",
        description="Megatron-Bridge pretrain of a small Llama on mock data; run under torchrun.",
    )
    p.add_argument("--strategy", choices=STRATEGIES, default="optim_grads_params")
    p.add_argument("--model", choices=sorted(SMOKE_SHAPES), default="small")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--seq-length", type=int, default=512)
    p.add_argument("--global-batch-size", type=int, default=8)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument(
        "--save-resume",
        action="store_true",
        help="save at the last iteration, reload into a fresh model, compare forward loss",
    )
    p.add_argument("--out", required=True, help="folder for rank<R>.json, run_config.yaml and checkpoints")
    return p
