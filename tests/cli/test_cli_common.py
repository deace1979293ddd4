"""``mfsdp_lib.cli.common``: every subcommand's refusal of unusable input (exit 2) is one stderr line, and with
``--format json`` also one JSON object on stdout, so an agent parsing stdout never reads nothing."""

from __future__ import annotations

import json

import pytest

from mfsdp_lib.cli import common

# One unusable input per subcommand that has --format json (what a user or an agent types by mistake).
UNUSABLE = {
    "check": ["{tmp}/missing.yaml"],
    "ckpt": ["{tmp}/no-such-checkpoint"],
    "log": ["{tmp}/missing.log"],
    "memory": [],  # nothing to size
    "rehearse": ["{tmp}/missing.yaml"],
    "anchors": ["--bridge-src", "{tmp}/nothing-here"],
    "rules": ["NO-SUCH-RULE"],
    "smoke": ["--nproc-per-node", "0"],
}


def _json_error(proc) -> dict:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    obj = json.loads(proc.stdout)
    assert obj == {"ok": False, "error": obj["error"], "exit": 2}, obj
    # the same words as the stderr line, which is still printed for a reader of the terminal
    assert obj["error"] in proc.stderr.splitlines(), (obj["error"], proc.stderr)
    return obj


@pytest.mark.parametrize("command", sorted(UNUSABLE))
def test_unusable_input_with_format_json_prints_a_json_error(cli, tmp_path, command):
    args = [a.format(tmp=tmp_path) for a in UNUSABLE[command]]
    obj = _json_error(cli(command, *args, "--format", "json", cwd=tmp_path))
    assert obj["error"].startswith(f"mfsdp.py {command}: error: ")


@pytest.mark.parametrize("spelling", [["--format", "json"], ["--format=json"], ["--form", "json"]])
def test_usage_errors_in_json_mode_are_json_too(cli, tmp_path, spelling):
    obj = _json_error(cli("check", "--no-such-option", *spelling, cwd=tmp_path))
    assert "unrecognized arguments: --no-such-option" in obj["error"]
    obj = _json_error(cli("ckpt", *spelling, cwd=tmp_path))  # PATH missing
    assert "required" in obj["error"]


def test_unknown_command_in_json_mode_is_json(cli, tmp_path):
    obj = _json_error(cli("chekc", "x.yaml", "--format", "json", cwd=tmp_path))
    assert "unknown command 'chekc'" in obj["error"] and "check" in obj["error"]


def test_text_mode_keeps_stdout_empty(cli, tmp_path):
    proc = cli("ckpt", str(tmp_path / "no-such-checkpoint"), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["x.yaml", "--format", "json"], True),
        (["--format=json", "x.yaml"], True),
        (["--fo", "json"], True),
        (["--format", "text"], False),
        (["--format"], False),
        (["--", "--format", "json"], False),  # after "--" it is a positional word
        (["--fit-eval-batch", "json"], False),  # another option that starts with --f
        (["--f", "json"], False),  # too short to be read as --format
    ],
)
def test_wants_json_reads_the_words(argv, expected):
    assert common.wants_json(argv) is expected
