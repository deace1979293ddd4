"""Replay of the skill's tool runs that would print what an earlier run in the same process printed.

Why: the adversarial set runs ``scripts/mfsdp.py`` for real some 1,200 times for its steps, and the outcome checks
run it again on every file a run leaves, once per transcript format, yet most of those runs repeat one another: the
same command line on a fresh copy of the same case's project, which differs only in the temporary folder it sits in.
Each start of the tool costs a new Python process; the answer is the same.

A run is replayed only when nothing it can see differs, so the replay is what running it again would print:

* the key holds the command (or argv), the environment, and a digest of the folder it runs in: every entry's
  relative path and kind, each file's bytes and permission bits, each link's target (links are not followed: the
  skill's install link points at this checkout, which does not change during a run), and each file's modification
  time unless the caller knows the run reads none (the skill's tool reads none: it opens and sizes files, never
  dates them; a file a step wrote has a new time in every copy of the project, so with times few runs would match);
* the folder's own path may differ: it is stored as a marker and written back as the new folder's path. A run whose
  output still names the folder's parent after that (a resolved or partial form of the path) is never stored;
* only a run that left its folder exactly as it found it is stored (a run that writes a file would have to be
  replayed with its effects), and a run that raised (a timeout) is never stored.

The cache lives in the process (``RunCache``), so a fresh process, as every test suite run and every eval is,
starts empty: nothing carries over between checkouts or edits of the tool.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

# Stands for the run's folder in a stored output; NUL never occurs in a path or in the tool's text output.
FOLDER_MARK = "\0run-folder\0"


def tree_digests(folder: Path) -> tuple[str, str]:
    """Two digests of everything under FOLDER a run could read (names, kinds, file bytes, modes, link targets):
    without and with the files' modification times."""
    plain, timed = hashlib.sha256(), hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, folder)
        for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            entry = f"{rel_dir}/{name}\0{stat.S_IFMT(st.st_mode)}\0".encode()
            if stat.S_ISLNK(st.st_mode):
                entry += os.readlink(path).encode() + b"\0"
            else:
                entry += f"{st.st_mode & 0o7777}\0{st.st_size}\0".encode()
                if stat.S_ISREG(st.st_mode):
                    with open(path, "rb") as fh:
                        entry += hashlib.sha256(fh.read()).digest()
                timed.update(f"{st.st_mtime_ns}\0".encode())
            plain.update(entry)
            timed.update(entry)
        for d in dirnames:
            entry = f"{rel_dir}/{d}\0dir\0".encode()
            plain.update(entry)
            timed.update(entry)
    return plain.hexdigest(), timed.hexdigest()


class RunCache:
    """Runs (returncode, text, ...) keyed by what they see; see the module's docstring for when one is replayed."""

    def __init__(self) -> None:
        self._runs: dict[tuple, tuple] = {}
        self.hits = 0
        self.misses = 0

    def run(self, key: tuple, folder: Path, fn: Callable[[], tuple], mtimes: bool = True) -> tuple:
        """FN() (a tuple of an exit status and texts) as run in FOLDER, or the replay of an earlier run like it;
        MTIMES False when FN reads no file's modification time (then they are no part of the key)."""
        plain, timed = tree_digests(folder)
        before = timed if mtimes else plain
        full_key = (key, mtimes, before)
        stored = self._runs.get(full_key)
        here = str(folder)
        if stored is not None:
            self.hits += 1
            return tuple(x.replace(FOLDER_MARK, here) if isinstance(x, str) else x for x in stored)
        self.misses += 1
        result = fn()
        texts = [x for x in result if isinstance(x, str)]
        marked = tuple(x.replace(here, FOLDER_MARK) if isinstance(x, str) else x for x in result)
        parent = str(folder.parent)
        if (
            not any(FOLDER_MARK in t for t in texts)
            and not any(parent in x for x in marked if isinstance(x, str))
            and tree_digests(folder)[1] == timed
        ):
            self._runs[full_key] = marked
        return result


def env_key(env: dict[str, str] | None) -> tuple:
    """The environment as part of a key (None: the process's own, as a subprocess inherits it)."""
    return tuple(sorted((os.environ if env is None else env).items()))
