"""``runs.engine``: an engine's whole process group is stopped, leader and grandchildren, TERM then KILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from mfsdp_lib.runs import engine  # noqa: E402


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _family(tmp_path: Path, trap_term: bool) -> tuple[subprocess.Popen, int]:
    """A stand-in engine (bash) with a grandchild (sleep); with trap_term both ignore SIGTERM."""
    pidfile = tmp_path / "child.pid"
    trap = "trap '' TERM; " if trap_term else ""
    script = f"{trap}sleep 300 >/dev/null 2>&1 & echo $! > {pidfile}; wait; sleep 300 >/dev/null 2>&1"
    proc = engine.start(["bash", "-c", script])
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text().strip():
            break
        time.sleep(0.05)
    return proc, int(pidfile.read_text())


def test_stop_group_ends_leader_and_grandchild(tmp_path):
    proc, child = _family(tmp_path, trap_term=False)
    assert os.getpgid(child) == proc.pid  # the grandchild is in the engine's group
    assert engine.stop_group(proc, term_grace_s=10) == "terminated"
    assert _gone(proc.pid) and _gone(child)
    assert not engine.group_alive(proc.pid)


def test_a_group_that_ignores_sigterm_is_killed(tmp_path):
    proc, child = _family(tmp_path, trap_term=True)
    t0 = time.monotonic()
    assert engine.stop_group(proc, term_grace_s=0.5, kill_grace_s=10) == "killed"
    assert time.monotonic() - t0 < 8
    assert _gone(proc.pid) and _gone(child)


def test_a_finished_group_is_gone():
    proc = engine.start(["true"])
    proc.wait()
    assert engine.stop_group(proc) == "gone"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_term_and_hup_raise_stopped_with_the_shells_exit_code(sig):
    with engine.stop_signals_raise(), pytest.raises(KeyboardInterrupt) as info:
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler runs at the next bytecode
    assert isinstance(info.value, engine.Stopped) and info.value.signum == sig
    assert engine.exit_code_of(info.value) == 128 + sig
    assert signal.getsignal(sig) is not engine._raise_stopped  # restored on the way out
    assert engine.exit_code_of(KeyboardInterrupt()) == 130
