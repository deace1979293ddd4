#!/usr/bin/env python3
"""mfsdp: enable, check and verify Megatron FSDP in Megatron-Bridge jobs.

This is the one entry point the skill's agent calls (``python3 scripts/mfsdp.py
COMMAND ...`` from the skill folder). It is deliberately thin: it knows the
command names and one line about each, and imports the module behind a command
only when that command runs. Two reasons:

* speed: ``check`` must start in a few interpreter start-ups, so nothing heavy
  (jsonschema, the checkpoint reader, the memory model) is imported for it, and the
  library's bytecode is cached per user outside the skill folder (``mfsdp_lib/bytecode_cache.py``);
* isolation: a broken optional part (say, the GPU smoke launcher) cannot stop
  the offline commands from working.

Each command module under ``mfsdp_lib/cli/`` provides ``configure(parser)`` (adds its
arguments to an ``argparse`` parser) and ``run(args) -> int`` (the exit code).
Errors in the user's input are raised as ``mfsdp_lib.findings.InputError`` and
become one line on stderr with exit code 2, never a traceback.

Runs on Python 3.10+ with the standard library and PyYAML.
"""

from __future__ import annotations

import os
import sys

# Never write bytecode into the skill folder (a .pyc there is a file the signature does not cover, and
# `skill_signature.py verify` reports it), and never read it from there. Until the library's cache folder is
# chosen (mfsdp_lib/bytecode_cache.py: per user, outside the skill folder), the prefix is one that cannot
# exist, so the first imports compile the signed source instead of loading a __pycache__ entry beside it.
# The prefix the interpreter started with (PYTHONPYCACHEPREFIX) is kept: the user's choice wins.
_STARTUP_PYCACHE_PREFIX = sys.pycache_prefix
sys.dont_write_bytecode = True
sys.pycache_prefix = os.path.join(os.devnull, "no-bytecode")

# The library lives next to this file; make it importable however we are run
# (from the skill root, from an installed copy, through a symlink).
_HERE = os.path.dirname(os.path.realpath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def _refuse_unsigned_bytecode(here: str) -> None:
    """Exit 2 when a sourceless ``.pyc`` sits among the skill's scripts (see SECURITY.md).

    Python imports a ``name.pyc`` found on sys.path when no ``name.py`` comes first, and the signature does
    not cover it. (``__pycache__`` bytecode beside the sources is never read: ``sys.pycache_prefix`` points
    elsewhere.)
    """
    for dirpath, dirnames, filenames in os.walk(here):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        bad = [os.path.join(dirpath, f) for f in filenames if f.endswith((".pyc", ".pyo"))]
        if bad:
            sys.stderr.write(
                f"{os.path.basename(sys.argv[0] or 'mfsdp.py')}: error: compiled bytecode in the skill folder "
                f"({bad[0]}) is not covered by the signature and could run instead of the signed source; "
                f"remove it (find {here} -name '*.py[co]' -delete) and check the folder with "
                "skill_signature.py verify\n"
            )
            sys.exit(2)


if os.path.basename(_HERE) == "scripts":  # inside a skill folder (an installed mfsdp-verify has nothing to guard)
    _refuse_unsigned_bytecode(_HERE)

from mfsdp_lib import bytecode_cache  # noqa: E402  (after the guards above; compiled from source every time)

# The skill folder is the parent of scripts/ (or this folder, for an installed copy): no bytecode inside it.
bytecode_cache.enable(
    os.path.dirname(_HERE) if os.path.basename(_HERE) == "scripts" else _HERE, _STARTUP_PYCACHE_PREFIX
)

MIN_PYTHON = (3, 10)  # NVIDIA's PyTorch containers ship 3.10 and newer.

# name -> (module under mfsdp_lib/cli, one-line summary). The order is the order
# of --help, which follows the enablement workflow in SKILL.md.
COMMANDS = {
    "check": ("check", "check a Bridge config against every Megatron FSDP rule at once"),
    "enable": ("enable", "apply the Megatron FSDP overrides to a config and say what changed"),
    "memory": ("memory", "estimate per-GPU memory for DDP, distributed optimizer and each FSDP strategy"),
    "ckpt": ("ckpt", "tell a checkpoint's real format and whether it matches its run config"),
    "convert": ("convert", "convert a checkpoint: torch_dist, fsdp_dtensor, hf (one GPU, weights carried)"),
    "log": ("log", "judge a training log: finite loss, skipped/NaN iterations, known failures"),
    "anchors": ("anchors", "verify the skill's code anchors against the installed Megatron-Bridge"),
    "rules": ("rules", "list the rule table, or write references/rules.md from it"),
    "smoke": ("smoke", "run the GPU smoke test (torchrun + Megatron-Bridge pretrain)"),
    "rehearse": ("rehearse", "rehearse a job on one GPU as rank R of a world of N: failures, memory, --perf step time"),
}

EPILOG = """\
Typical flow:
  mfsdp.py check my_run_config.yaml          # every problem, with its fix
  mfsdp.py enable my_run_config.yaml -o fsdp.yaml
  mfsdp.py memory fsdp.yaml --gpu-mem-gib 80  # will it fit, per strategy
  mfsdp.py rehearse fsdp.yaml --world-size 64 # one GPU plays rank 0 of 64: failures, memory
  mfsdp.py rehearse fsdp.yaml --world-size 64 --perf --compare  # step time range, comm bytes, per strategy
  mfsdp.py smoke --nproc-per-node 2           # real run on GPUs
  mfsdp.py log train.log; mfsdp.py ckpt /path/to/checkpoints
  mfsdp.py convert /ckpts/ddp_run /ckpts/fsdp_run --to fsdp_dtensor

Exit codes: 0 ok, 1 findings of error severity, 2 unusable input.
Run 'mfsdp.py COMMAND --help' for a command's options.
"""


def _top_help(prog: str) -> str:
    width = max(len(n) for n in COMMANDS)
    lines = [
        f"usage: {prog} COMMAND [ARGS ...]",
        "",
        "Enable, check and verify Megatron FSDP in Megatron-Bridge training jobs.",
        "",
        "commands:",
    ]
    for name, (_, summary) in COMMANDS.items():
        lines.append(f"  {name:<{width}}  {summary}")
    lines.append("")
    lines.append(EPILOG)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "mfsdp.py"
    if sys.version_info < MIN_PYTHON:
        sys.stderr.write(f"{prog}: needs Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer\n")
        return 2
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(_top_help(prog))
        return 0 if argv else 2
    if argv[0] == "--version":
        from mfsdp_lib import __version__

        print(f"{prog} {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        line = f"{prog}: unknown command '{name}'{hint}; run '{prog} --help'"
        sys.stderr.write(line + "\n")
        from mfsdp_lib.cli import common

        if common.wants_json(rest):  # an agent parsing stdout gets the refusal as JSON too
            common.json_error(line, 2)
        return 2

    from mfsdp_lib.cli import common

    try:
        return common.run_command(prog, name, COMMANDS[name], rest)
    finally:
        bytecode_cache.store()  # the modules this command imported, for the next call


if __name__ == "__main__":
    sys.exit(main())
