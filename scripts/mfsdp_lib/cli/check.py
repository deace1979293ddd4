"""``mfsdp.py check``: every Megatron FSDP problem of a Bridge config, in one pass.

Glue only: ``config_io`` builds the effective config (Bridge defaults, then the base a
partial CONFIG is merged over (``config_io.choose_base``: the embedded Llama 3 8B recipe
unless ``--base``), then CONFIG or the embedded recipe, then ``KEY=VALUE`` overrides),
``rules.evaluate`` runs the whole rule table against it and the environment,
``runs.resume`` reads the checkpoint it resumes from when that is a local folder, and
``findings`` renders the result. The job's environment is an explicit input: the
``--env`` variables, plus this shell's only with ``--shell-env`` (a verdict must not
change with the terminal it runs in); the config's own ``env_vars`` are applied over it
with ``setdefault``, as Bridge does.

Kept light on purpose (imports yaml and the rule table only): the agent runs it after
every edit, so it must start in a few interpreter start-ups.
"""

from __future__ import annotations

import os

from .. import config_io, rules, what_works
from .. import schema as S
from ..findings import exit_code, render_json, render_text

DESCRIPTION = """\
Check a Megatron-Bridge config against every Megatron FSDP rule at once.

CONFIG is a run_config.yaml (as Bridge writes into each checkpoint; a checkpoint's
iter_* folder stands for the run_config.yaml in it), a partial override file (ddp:, checkpoint:, ... sections) or nothing (the embedded Llama 3 8B
pretrain recipe of Bridge 0.6.2). A partial file is a --config-file that a recipe launcher
merges over its recipe, so it is judged over one: the embedded Llama 3 8B recipe, or your
recipe's run_config.yaml with --base FILE; --base defaults judges the file alone. KEY=VALUE arguments are Hydra-style overrides
(section.key=value) applied on top, coerced like Bridge's OmegaConf loading.

Each finding has a stable rule id, a severity, the dotted key to change, the value
found and a concrete fix. 'mfsdp.py rules' lists the table with the source of each
rule in Megatron-Bridge / Megatron-Core.

The job's environment is an input, never this shell's by accident: --env NAME=VALUE
(repeatable), or --shell-env when the job is launched from this shell; the config's
env_vars apply either way.

""" + rules.coverage_text(88)

EPILOG = """\
examples:
  mfsdp.py check                                   # the embedded recipe as shipped
  mfsdp.py check dist.use_megatron_fsdp=true ddp.use_megatron_fsdp=true
        # -> MFSDP-CKPT-FORMAT: the recipe saves checkpoints, so fsdp_dtensor is required
  mfsdp.py check run_config.yaml --format json     # a checkpoint's config, machine-readable
  mfsdp.py check my.yaml --env CUDA_DEVICE_MAX_CONNECTIONS=1 --gpu-arch hopper
        # judge against the launcher's environment (this shell's is ignored without --shell-env)
  mfsdp.py check fsdp.yaml --gpus 64
        # batch sizes and layout judged at the job's 64 GPUs (DP = 64 / (TP x PP x CP))
  mfsdp.py check fsdp_overrides.yaml --base /results/ckpt/iter_0000100/run_config.yaml
        # a partial --config-file over your recipe's config (default: the embedded recipe)

exit codes: 0 no error-severity finding, 1 at least one error, 2 unusable input
(missing file, YAML syntax error, unknown section/key, wrong type, unknown enum value
such as a misspelt sharding strategy, malformed KEY=VALUE)."""


def configure(parser) -> None:
    parser.add_argument(
        "items",
        nargs="*",
        metavar="[CONFIG] [KEY=VALUE ...]",
        help="optional config file, then section.key=value overrides",
    )
    add_env_arguments(parser)
    parser.add_argument(
        "--gpu-arch",
        type=_arch,
        default=None,
        metavar="ARCH",
        help=f"GPU architecture of the job ({', '.join(rules.KNOWN_ARCHS)}, or a product name "
        "such as h100, gb200); enables architecture-specific advice",
    )
    parser.add_argument(
        "--gpus",
        type=gpu_count,
        default=None,
        metavar="N",
        help="the job's world size (number of GPUs): batch sizes and the layout are judged at this world, with "
        "DP = N / (TP x PP x CP) as Bridge computes it (default: the smallest world the config's layout allows, "
        "where a batch that does not divide divides at no world; a batch can still fail at a larger world)",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    add_base_argument(parser)
    allow_intermixed(parser)


def gpu_count(text: str) -> int:
    """``--gpus N``: a whole number of GPUs, at least one (argparse turns the error into exit 2)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of GPUs, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 GPU, got {value}")
    return value


def add_env_arguments(parser) -> None:
    """The job's environment is an explicit input: a verdict must not change with the terminal it runs in."""
    parser.add_argument(
        "--env",
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help="a variable of the training job's environment (repeatable). Default: no variables besides "
        "the config's env_vars, whatever this shell exports",
    )
    parser.add_argument(
        "--shell-env",
        action="store_true",
        help="judge against this shell's environment too (when it is the job's: you launch from it); "
        "--env values win over it",
    )


def job_env(args) -> dict:
    """``--env`` items, over this process's environment only with ``--shell-env``."""
    env = dict(os.environ) if getattr(args, "shell_env", False) else {}
    if args.env is not None:
        env.update(config_io.parse_env(args.env))
    return env


def allow_intermixed(parser) -> None:
    """Let KEY=VALUE items follow options (``check a.yaml --base embedded ddp.x=1``).

    Plain argparse stops filling a ``nargs="*"`` positional at the first option; the
    intermixed parser (standard library, Python 3.7+) collects the items wherever they are.
    """
    parser.parse_args = parser.parse_intermixed_args


def add_base_argument(parser) -> None:
    parser.add_argument(
        "--base",
        metavar="BASE",
        help="full config that a partial CONFIG (one without every section a ConfigContainer needs: train, "
        "model, optimizer, scheduler, dataset, logger, tokenizer, checkpoint) is layered on, as a recipe launcher "
        "does with --config-file: a run_config.yaml of your recipe, 'embedded' for the embedded Llama 3 8B recipe "
        "(the default for a partial CONFIG), or 'defaults' to judge the file alone over Bridge's dataclass "
        "defaults. A full CONFIG needs no base",
    )


def _arch(text: str) -> str:
    import argparse

    arch = rules.normalize_arch(text)
    if arch is None:
        raise argparse.ArgumentTypeError(
            f"unknown GPU architecture {text!r}; use one of "
            f"{', '.join(rules.KNOWN_ARCHS)} or a product name (h100, b200, ...)"
        )
    return arch


def split_items(items: list[str]) -> tuple[str | None, list[str]]:
    """First item is CONFIG unless it looks like KEY=VALUE (and is not an existing file)."""
    if not items:
        return None, []
    for item in items:  # ~KEY (Hydra's deletion), section.key without =VALUE: say so before guessing a file
        config_io.refuse_unusable_override(item)
    first = items[0]
    if "=" not in first and not os.path.exists(first) and first.split(".", 1)[0] in S.CONTAINER_KEYS:
        raise config_io.input_error(
            f"{first!r}: no such file; for an override write it as section.key=value (e.g. {first}=true)"
        )
    if "=" not in first or os.path.isfile(first):
        rest = items[1:]
    else:
        return None, list(items)
    for r in rest:
        if "=" not in r:
            raise config_io.input_error(
                f"{r!r}: expected section.key=value after CONFIG (only one config file is read)"
            )
    return first, rest


def _resume_findings(cfg: dict) -> list:
    """The checkpoint the job resumes from, when it is a folder on this machine (``runs.resume``)."""
    folders = [
        (key, value)
        for key in ("checkpoint.load", "checkpoint.pretrained_checkpoint")
        for value in [config_io.get(cfg, key)]
        if isinstance(value, str) and value.strip() and os.path.isdir(value)
    ]
    if not folders:
        return []
    from ..runs import resume  # reads checkpoint metadata: imported only when there is a folder to read

    return resume.findings(folders, config_io.get(cfg, "checkpoint.ckpt_format"))


def _base_name(base: str) -> str:
    return "the " + config_io.EMBEDDED_NAME if base == config_io.EMBEDDED_BASE else base


def run(args) -> int:
    path, overrides = split_items(args.items)
    if path:
        path = config_io.resolve_config_path(path)
    data, shown = config_io.load_file_data(path)
    base = config_io.choose_base(args.base, data)
    cfg = config_io.apply_overrides(config_io.merge_file(config_io.base_config(base), data, shown), overrides)
    base_info, base_note = config_io.base_summary(args.base, data, os.path.basename(shown) if path else shown)
    env = job_env(args)
    if args.gpus is not None:
        found = rules.evaluate(cfg, env, args.gpu_arch, args.gpus, "given with --gpus")
    else:
        found = rules.evaluate(cfg, env, args.gpu_arch)
    found += _resume_findings(cfg)
    name = path or config_io.EMBEDDED_NAME
    fsdp = bool(config_io.get(cfg, "dist.use_megatron_fsdp")) or bool(config_io.get(cfg, "ddp.use_megatron_fsdp"))
    if args.format == "json":
        render_json(found, config=name, overrides=list(overrides), megatron_fsdp=fsdp, base=base_info)
    else:
        extra = f" + {len(overrides)} override(s)" if overrides else ""
        if base_info["partial"]:
            extra = (" (partial, judged alone)" if base is None else f" (partial, over {_base_name(base)})") + extra
        header = f"check {name}{extra}: Megatron FSDP {'on' if fsdp else 'off'}"
        render_text(found, header=header + (f"\nnote: {base_note}" if base_note else ""))
    what_works.show(cfg, args.format)
    return exit_code(found)
