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

With ``--format json`` the same refusal is also one JSON object on stdout,
``{"ok": false, "error": "<the stderr line>", "exit": 2}`` (3 for an internal
error), so an agent that parses stdout always gets an object, never nothing.
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
    """argparse that keeps the description's line breaks and examples, and remembers its usage error."""

    usage_error: str | None = None

    def __init__(self, *a, **kw):
        kw.setdefault("formatter_class", _Formatter)
        super().__init__(*a, **kw)

    def error(self, message):  # argparse prints usage + message on stderr and exits 2; keep it for --format json
        self.usage_error = message
        super().error(message)


JSON_OUTPUT = "json"


def wants_json(argv: list[str]) -> bool:
    """True when ARGV asks for ``--format json`` (also ``--format=json`` and argparse's unique prefixes such as
    ``--form json``), read from the words themselves so it is known even when argparse refuses the line."""
    for i, word in enumerate(argv):
        if word == "--":
            return False
        opt, eq, value = word.partition("=")
        if len(opt) < len("--fo") or not "--format".startswith(opt):
            continue
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        if value == JSON_OUTPUT:
            return True
    return False


def json_error(message: str, code: int) -> None:
    """The refusal as the one JSON object an agent parsing stdout expects."""
    import json

    _flush_quietly()
    try:
        sys.stdout.write(json.dumps({"ok": False, "error": message, "exit": code}) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):  # stdout closed: the stderr line is all there is
        pass


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
    parser = None
    as_json = wants_json(argv)
    try:
        module, parser = build_parser(prog, name, spec)
        args = parser.parse_args(argv)
        as_json = getattr(args, "format", None) == JSON_OUTPUT
        with engine.stop_signals_raise():
            return int(module.run(args) or 0)
    except InputError as exc:
        _flush_quietly()
        line = f"{prog} {name}: error: {exc}"
        sys.stderr.write(line + "\n")
        if as_json:
            json_error(line, EXIT_INPUT)
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
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_INPUT)
        usage_error = getattr(parser, "usage_error", None)
        if as_json and code == EXIT_INPUT and usage_error:
            json_error(f"{prog} {name}: error: {usage_error}", EXIT_INPUT)
        return code
    except Exception as exc:  # a bug in the skill: say so in one line
        if os.environ.get("MFSDP_DEBUG") == "1":
            raise
        line = (
            f"{prog} {name}: internal error: {type(exc).__name__}: {exc} "
            f"(this is a bug in the skill; rerun with MFSDP_DEBUG=1 for the traceback)"
        )
        sys.stderr.write(line + "\n")
        if as_json:
            json_error(line, EXIT_INTERNAL)
        return EXIT_INTERNAL


def _flush_quietly() -> None:
    try:
        sys.stdout.flush()
    except Exception:
        pass
