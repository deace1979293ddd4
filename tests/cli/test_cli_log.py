"""``mfsdp.py log``: exit codes per the smoke criteria, JSON contract, stdin, bad input without tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from _helpers_ckptlog import LOGS, REAL_LOG, nan_from_40_log, without_read_override
from conftest import MFSDP

FACT_KEYS = {"iterations", "loss", "skipped_iterations", "nan_iterations", "checkpoints", "pytest", "signatures"}


@pytest.mark.parametrize(
    "name,code",
    [
        ("multirank_interleaved.log", 0),
        ("ansi_cr.log", 0),
        ("resume.log", 0),
        ("pytest_pass.log", 0),
        ("truncated.log", 0),
        ("nan_loss.log", 1),
        ("nan_check_raised.log", 1),
        ("oom.log", 1),
        ("ckpt_format_assert.log", 1),
        ("pytest_fail.log", 1),
        ("empty.log", 2),
        ("binary.bin", 2),
    ],
)
def test_fixture_exit_codes(cli, name, code):
    proc = cli("log", str(LOGS / name))
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_real_log_json(cli):
    proc = cli("log", str(REAL_LOG), "--format", "json")
    assert proc.returncode == 0
    obj = json.loads(proc.stdout)
    assert obj["ok"] is True and obj["findings"] == [] and set(obj) >= FACT_KEYS
    assert obj["iterations"]["last"] == 10 and obj["loss"]["last_finite"] is True
    assert obj["checkpoints"]["saves"][0]["format"] == "fsdp_dtensor"


def test_failure_json_shape(cli):
    proc = cli("log", str(LOGS / "ckpt_format_assert.log"), "--format", "json")
    obj = json.loads(proc.stdout)
    assert proc.returncode == 1 and obj["ok"] is False
    f = next(f for f in obj["findings"] if f["rule"] == "MFSDP-LOG-CKPT-FORMAT-ASSERT")
    assert {"rule", "severity", "path", "message", "fix"} <= set(f) and "ckpt_format=fsdp_dtensor" in f["fix"]
    assert obj["signatures"][0]["count"] == 2  # both ranks raised it


def test_stdin(cli):
    proc = cli("log", "-", input=REAL_LOG.read_bytes())
    assert proc.returncode == 0 and "lm loss: first" in proc.stdout


def test_text_report_names_the_facts(cli):
    out = cli("log", str(LOGS / "nan_loss.log")).stdout
    assert "finite: NO" in out and "nan iterations: 4" in out and "MFSDP-LOG-LOSS-NOT-FINITE" in out


def test_help_teaches(cli):
    proc = cli("log", "--help")
    assert proc.returncode == 0 and "examples:" in proc.stdout and "mfsdp.py log -" in proc.stdout


def _bad(tmp_path, kind):
    p = tmp_path / "x.log"
    if kind == "dir":
        p.mkdir()
    elif kind == "loop":
        os.symlink(tmp_path / "y.log", p)
        os.symlink(p, tmp_path / "y.log")
    elif kind == "fifo_no_writer":
        os.mkfifo(p)
    elif kind == "text_no_log":
        p.write_text("just some words\nnothing about training\n")
    elif kind == "device":
        return "/dev/zero"
    return p


@pytest.mark.parametrize("kind", ["missing", "dir", "loop", "fifo_no_writer", "text_no_log", "device"])
def test_bad_input_exit_2_one_line(cli, tmp_path, kind):
    proc = cli("log", str(_bad(tmp_path, kind)), timeout=30)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_permission_denied(tmp_path):
    p = tmp_path / "x.log"
    p.write_bytes(REAL_LOG.read_bytes())
    os.chmod(p, 0)
    proc = subprocess.run(
        [*without_read_override(), sys.executable, str(MFSDP), "log", str(p)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "permission denied" in proc.stderr.lower() and "Traceback" not in proc.stderr


def test_pipe_path_streams():
    """A pipe given as a path, as bash's <(cmd) does (/dev/fd/N), is read to its end."""
    r, w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, str(MFSDP), "log", f"/dev/fd/{r}"],
        pass_fds=(r,),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(r)

    def feed():
        with os.fdopen(w, "wb") as fw:
            fw.write(REAL_LOG.read_bytes())

    t = threading.Thread(target=feed)
    t.start()
    out, err = proc.communicate(timeout=60)
    t.join(timeout=10)
    assert proc.returncode == 0, err
    assert "iterations: 10 lines" in out


def test_plain_imports_only(root):
    """ckpt and log load only the standard library and PyYAML (fast start, nothing optional needed)."""
    code = (
        "import sys; sys.path.insert(0, 'scripts'); import mfsdp_lib.cli.ckpt, mfsdp_lib.cli.log; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'numpy', 'jsonschema', 'megatron', 'safetensors', 'yaml')]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"  # yaml too is imported lazily, only when a run_config.yaml is read


def test_stdin_closed_is_exit_2():
    """`mfsdp.py log - <&-`: Python starts with sys.stdin None; that is unusable input, not a bug (exit 3)."""
    p = subprocess.run(
        [sys.executable, str(MFSDP), "log", "-"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.close(0),
    )
    assert p.returncode == 2, p.stderr
    assert "standard input is closed" in p.stderr and "Traceback" not in p.stderr


def test_smoke_result_line_nested_too_deep_is_ignored(cli, tmp_path):
    """A SMOKE_RESULT line whose JSON is nested past the decoder's limit made log exit 3 (RecursionError)."""
    log = tmp_path / "run.log"
    log.write_text(REAL_LOG.read_text() + "SMOKE_RESULT " + "[" * 100_000 + "]" * 100_000 + "\n")
    p = cli("log", str(log))
    assert p.returncode == 0, p.stderr


def test_nan_report_names_first_nan_and_one_rank(cli, tmp_path):
    log = tmp_path / "rank3.log"
    log.write_bytes(nan_from_40_log())
    out = cli("log", str(log)).stdout
    head = out.splitlines()[0]
    assert head.endswith("(61 lines, rank 3)"), head
    assert "first NaN: it 40" in out and "last finite 6.1 (it 39)" in out, out
    obj = json.loads(cli("log", str(log), "--format", "json").stdout)
    assert obj["loss"]["first_nonfinite_iteration"] == 40 and obj["ranks"] == [3]


def test_several_ranks_are_named_ranks(cli):
    head = cli("log", str(LOGS / "multirank_interleaved.log")).stdout.splitlines()[0]
    assert "ranks 0,1)" in head, head
