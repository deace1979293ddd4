"""Running one subcommand: parser construction, error handling, output safety.

A command module provides ``configure(parser)`` and ``run(args) -> int``. This
module turns every way a command can fail on the user's input into one stderr
line and exit code 2, so no user ever sees a traceback for bad input:

* ``InputError`` raised anywhere below ``run``;
* argparse's own usage errors (already exit 2);
* a closed stdout (``mfsdp.py check | head``) - quiet exit;
* Ctrl-C - exit 130; SIGTERM (a scheduler, ``timeout``) and SIGHUP (a closed terminal) are raised
  the same way (``runs.engine.Stopped``), so that a command that started an engine stops its whole
  process group first; exit 128 + the signal's number.

An unexpected exception is a bug in the skill, not the user's fault: it is
reported in one line that says so, with the full traceback only when
``MFSDP_DEBUG=1`` is set (exit 3, distinct from the documented 0/1/2).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..findings import EXIT_INPUT, InputError
from ..runs import engine

EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130


def _columns() -> int:
    """Terminal width as ``shutil.get_terminal_size`` finds it ($COLUMNS, the terminal, else 80).

    argparse asks for it on every ``add_argument``; importing ``shutil`` for that pulls in
    ``bz2``, ``lzma`` and ``fnmatch``, a measurable share of the start-up of ``check``.
    """
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and examples; the width as argparse computes it."""

    def __init__(self, prog, indent_increment=2, max_help_position=24, width=None):
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


class _Parser(argparse.ArgumentParser):
    """argparse that keeps the description's line breaks and examples."""

    def __init__(self, *a, **kw):
        kw.setdefault("formatter_class", _Formatter)
        super().__init__(*a, **kw)


def build_parser(prog: str, name: str, spec: tuple[str, str]):
    module_name, summary = spec
    module = importlib.import_module(f"mfsdp_lib.cli.{module_name}")
    parser = _Parser(
        prog=f"{prog} {name}",
        description=getattr(module, "DESCRIPTION", summary),
        epilog=getattr(module, "EPILOG", None),
    )
    module.configure(parser)
    return module, parser


def run_command(prog: str, name: str, spec: tuple[str, str], argv: list[str]) -> int:
    try:
        module, parser = build_parser(prog, name, spec)
        args = parser.parse_args(argv)
        with engine.stop_signals_raise():
            return int(module.run(args) or 0)
    except InputError as exc:
        _flush_quietly()
        sys.stderr.write(f"{prog} {name}: error: {exc}\n")
        return EXIT_INPUT
    except KeyboardInterrupt as exc:
        how = f"stopped by signal {exc.signum}" if isinstance(exc, engine.Stopped) else "interrupted"
        sys.stderr.write(f"{prog} {name}: {how}\n")
        return engine.exit_code_of(exc)
    except BrokenPipeError:
        # The reader went away (e.g. `| head`); silence the flush at exit too.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return 0
    except SystemExit as exc:  # argparse errors and --help
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_INPUT)
    except Exception as exc:  # a bug in the skill: say so in one line
        if os.environ.get("MFSDP_DEBUG") == "1":
            raise
        sys.stderr.write(
            f"{prog} {name}: internal error: {type(exc).__name__}: {exc} "
            f"(this is a bug in the skill; rerun with MFSDP_DEBUG=1 for the traceback)\n"
        )
        return EXIT_INTERNAL


def _flush_quietly() -> None:
    try:
        sys.stdout.flush()
    except Exception:
        pass
