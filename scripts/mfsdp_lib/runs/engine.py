"""Engine processes (the GPU side of ``rehearse`` and ``smoke``): started in a group of their own, stopped whole.

An engine is a Python process that builds a model on the GPU; it may start processes of its own
(``torch.distributed.run`` starts one worker per GPU). Each is started as the leader of a new
session (``start_new_session=True``), so that every process it starts shares its process group
and the group can be signalled as one (``os.killpg``), and so that a Ctrl-C typed at the terminal
reaches the CLI alone, which then stops the group in order.

Why the CLI must do it: schedulers and ``timeout`` stop a job with SIGTERM (and a closed terminal
sends SIGHUP) to the CLI's own process group; an engine in a session of its own never receives
it, and would keep its GPU memory after the CLI has gone, so that the next job fails out of
memory at model build. ``mfsdp.py`` therefore turns SIGTERM and SIGHUP into :class:`Stopped` (a
``KeyboardInterrupt``, as Python makes of SIGINT): the code that started an engine catches it,
calls :func:`stop_group`, and lets it go on to the command's exit code ``128 + signal``.

:func:`stop_group` sends SIGTERM to the whole group, waits until no process of the group is left
(not only the leader: a worker that outlives its parent still holds its GPU memory), and sends
SIGKILL to what remains after the grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence

# The signals that stop a command: Ctrl-C, a scheduler's or timeout's stop, a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Seconds an engine gets to end after SIGTERM (it writes its report's last phase, frees the GPU)
# before SIGKILL; then seconds to wait for the killed processes to be gone.
TERM_GRACE_S = 20.0
KILL_GRACE_S = 10.0
POLL_S = 0.1  # how often the group is looked at while waiting


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP received by the CLI: handled where Ctrl-C is (``signum`` says which)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


def exit_code_of(exc: BaseException) -> int:
    """The shell's code for a command ended by a signal: 128 + its number (Ctrl-C: 130)."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


def _raise_stopped(signum, frame):
    raise Stopped(signum)


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """While inside: SIGTERM and SIGHUP raise :class:`Stopped` in the main thread (SIGINT keeps
    Python's KeyboardInterrupt). The previous handlers come back afterwards."""
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, _raise_stopped)
        except (ValueError, OSError):  # not the main thread: leave the handlers alone
            pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def start(cmd: Sequence[str], **popen_kwargs) -> subprocess.Popen:
    """``cmd`` as the leader of a new session and process group (its pid is the group's id)."""
    popen_kwargs["start_new_session"] = True
    return subprocess.Popen(list(cmd), **popen_kwargs)


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is left (zombies, already dead, do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(_state(pid) not in ("Z", None) for pid in _members(pgid)) if os.path.isdir("/proc") else True


def _members(pgid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 2 and int(fields[2]) == pgid:  # stat field 5, pgrp (after pid, comm, state, ppid)
            out.append(int(name))
    return out


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _wait_gone(proc: subprocess.Popen, pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0)  # reap the leader, so that it stops counting
        if not group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def stop_group(proc: subprocess.Popen, term_grace_s: float = TERM_GRACE_S, kill_grace_s: float = KILL_GRACE_S) -> str:
    """Stop every process of ``proc``'s group: SIGTERM, then SIGKILL after ``term_grace_s``.

    Returns how it ended: "gone" (nothing was left), "terminated", "killed", or "left" (something
    survived SIGKILL's grace, which only an uninterruptible process does)."""
    pgid = proc.pid
    if not group_alive(pgid):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0)
        return "gone"
    for sig, grace, done in ((signal.SIGTERM, term_grace_s, "terminated"), (signal.SIGKILL, kill_grace_s, "killed")):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return done
        except PermissionError:
            return "left"
        if _wait_gone(proc, pgid, grace):
            return done
    return "left"
