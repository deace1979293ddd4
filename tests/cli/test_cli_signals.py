"""SIGTERM, SIGINT and SIGHUP to a command that started an engine stop the engine's whole process group.

A stand-in engine interpreter (``--python``; labelled: it answers the CUDA probe ``ok`` and, as the
engine, starts a grandchild and waits, writing both pids) shows what a GPU engine would do: it lives
in a session of its own, so a signal to the CLI reaches it only through the CLI. After the CLI
exits, no process of the engine's group may be left (a real engine would still hold its GPU memory).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
MFSDP = ROOT / "scripts" / "mfsdp.py"
SCRIPTS = ROOT / "scripts"

STAND_IN = textwrap.dedent(
    """\
    #!/bin/bash
    # STAND-IN for the engine's Python: answers the probe, then starts a grandchild and waits
    if [ "$1" = "-c" ]; then echo ok; exit 0; fi
    out=""
    while [ $# -gt 0 ]; do case "$1" in --out) out="$2"; shift;; esac; shift; done
    mkdir -p "$out"
    sleep 300 >/dev/null 2>&1 &
    echo "$$ $!" > "$out/pids.tmp"; mv "$out/pids.tmp" "$out/pids"
    echo "[rehearse 00:00:00] model_build ..." >&2
    wait
    """
)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _kill(*pids: int) -> None:
    """SIGKILL whatever of these is still running (a test that failed half-way)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_for(path: Path, seconds: float = 30) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_rehearse_stops_the_engines_group_on(sig, tmp_path):
    stub = tmp_path / "engine_python"
    stub.write_text(STAND_IN)
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "o"
    cli = subprocess.Popen(
        [sys.executable, str(MFSDP), "rehearse", "--model-preset", "tiny", "--world-size", "2"]
        + ["--python", str(stub), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    found: list[Path] = []
    deadline = time.monotonic() + 30
    while not found and time.monotonic() < deadline:
        time.sleep(0.05)
        found = sorted(out.glob("*/pids"))
    assert found, "the stand-in engine never started"
    pids = [int(x) for x in _wait_for(found[0]).split()]
    engine_pid, grandchild = pids
    try:
        assert os.getpgid(engine_pid) == engine_pid != os.getpgid(cli.pid)  # its own group: the CLI must stop it
        cli.send_signal(sig)
        _, err = cli.communicate(timeout=60)
        assert cli.returncode == 128 + sig, err
        assert "stopping the engine's process group" in err
        assert _gone(engine_pid) and _gone(grandchild), "an engine process outlived the command"
        assert "Traceback" not in err
    except BaseException:
        _kill(cli.pid, engine_pid, grandchild)  # a failed check leaves nothing running behind the suite
        raise


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_smoke_launch_stops_the_launchers_group_on(sig, tmp_path):
    # smoke's launcher (torchrun) started through runs.smoke.launch under the CLI's signal handling
    pidfile = tmp_path / "pids"
    driver = textwrap.dedent(
        f"""\
        import sys
        sys.path.insert(0, {str(SCRIPTS)!r})
        from pathlib import Path
        from mfsdp_lib.runs import engine, smoke
        cmd = ["bash", "-c", "sleep 300 >/dev/null 2>&1 & echo $$ $! > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; wait"]
        try:
            with engine.stop_signals_raise():
                smoke.launch(cmd, Path({str(tmp_path / "train.log")!r}))
        except KeyboardInterrupt as exc:
            sys.exit(engine.exit_code_of(exc))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", driver], stderr=subprocess.PIPE, text=True)
    launcher, grandchild = (int(x) for x in _wait_for(pidfile).split())
    try:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig, err
        assert _gone(launcher) and _gone(grandchild)
    except BaseException:
        _kill(proc.pid, launcher, grandchild)
        raise
