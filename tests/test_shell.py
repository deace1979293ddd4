"""mfsdp_lib.shell: printed commands run from the user's project and survive paths with spaces."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from conftest import MFSDP
from mfsdp_lib import shell


def test_script_is_the_running_entry_point_by_absolute_path():
    assert Path(shell.SCRIPT).is_absolute() and Path(shell.SCRIPT).resolve() == Path(MFSDP).resolve()


def test_a_path_with_a_space_stays_one_word():
    cmd = shell.mfsdp_command("ckpt", "/data/my ckpts/iter_0000010", "--expect", "fsdp_dtensor")
    words = shlex.split(cmd)
    assert words == ["python3", shell.SCRIPT, "ckpt", "/data/my ckpts/iter_0000010", "--expect", "fsdp_dtensor"]


def test_placeholders_stay_visible():
    cmd = shell.mfsdp_command("convert", "/a b", "<output_dir>", "--to", "hf")
    assert "<output_dir>" in cmd and "'/a b'" in cmd


def test_printed_command_runs_from_another_folder(tmp_path):
    """Pasted into a shell in the user's project (not the skill folder), the command reaches the skill."""
    cmd = shell.mfsdp_command("rules", "MFSDP-CKPT-FORMAT").replace("python3", shlex.quote(sys.executable), 1)
    proc = subprocess.run(cmd, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "MFSDP-CKPT-FORMAT" in proc.stdout, proc.stderr
