"""Shared bits for the ckpt/log tests: fixture locations and discovery of real GPU-run fixtures.

Role ``gpu`` adds real runs under ``tests/fixtures/gpu-run/``; the tests find them here (checkpoint roots by
their tracker files, logs by ``*.log``) so new runs are tested without editing any test.

``CKPT`` is not the committed folder but a temporary copy of it with the real file names: the ``skills``
installer never copies a file named ``metadata.json`` (``mfsdp_lib.integrity.signature.INSTALLER_SKIPS_FILES``), so
``make_fixtures.py`` stores those as ``metadata.json.fixture``; the copy, made once per test process and
removed at exit, renames them back, so the tests read what Bridge writes in an installed copy too.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REAL_RUN = FIXTURES / "real-h200-run"
REAL_CKPT = REAL_RUN / "checkpoint_metadata_only"
REAL_LOG = REAL_RUN / "fsdp_save.log"
CKPT_STORED = FIXTURES / "ckpt"
FIXTURE_SUFFIX = ".fixture"  # as in fixtures/ckpt/make_fixtures.py
LOGS = FIXTURES / "logs"
GPU_RUN = FIXTURES / "gpu-run"

TRACKERS = ("latest_train_state.pt", "latest_checkpointed_iteration.txt")


def materialise(src: Path, dst: Path) -> Path:
    """Copy a fixture tree, giving each ``NAME.fixture`` file its real name ``NAME``."""
    shutil.copytree(src, dst)
    for dirpath, _dirs, files in os.walk(dst):
        for name in files:
            if name.endswith(FIXTURE_SUFFIX):
                os.rename(os.path.join(dirpath, name), os.path.join(dirpath, name[: -len(FIXTURE_SUFFIX)]))
    return dst


def _materialised_ckpt() -> Path:
    tmp = tempfile.mkdtemp(prefix="mfsdp-ckpt-fixtures-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    return materialise(CKPT_STORED, Path(tmp) / "ckpt")


CKPT = _materialised_ckpt()


def real_checkpoint_roots() -> list[Path]:
    """The copied H200 run plus every checkpoint root found under tests/fixtures/gpu-run/."""
    roots = [REAL_CKPT]
    if GPU_RUN.is_dir():
        for dirpath, _dirs, files in os.walk(GPU_RUN):
            if any(t in files for t in TRACKERS):
                roots.append(Path(dirpath))
    return roots


def real_logs() -> list[Path]:
    logs = [REAL_LOG]
    if GPU_RUN.is_dir():
        logs += sorted(p for p in GPU_RUN.rglob("*.log") if p.is_file())
    return logs


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for dirpath, dirs, files in os.walk(dst):  # the originals may be read-only (an installed copy)
        for n in dirs + files:
            os.chmod(os.path.join(dirpath, n), 0o755 if n in dirs else 0o644)
    return dst


def is_root_user() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


# Root reads a mode-000 file through two capabilities; dropping them from the bounding set (util-linux
# `setpriv`) makes root obey the permission bits, so "permission denied" can be tested as root too (CI runs
# as root). The process keeps uid 0, so the interpreter and the skill stay reachable.
DAC_CAPS = "-dac_override,-dac_read_search"


def without_read_override() -> list[str]:
    """Command prefix that makes the CLI obey file permission bits, also when the tests run as root."""
    if not is_root_user():
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("running as root needs util-linux 'setpriv' to test permission denial (apt-get install util-linux)")
    return [setpriv, f"--bounding-set={DAC_CAPS}", f"--inh-caps={DAC_CAPS}"]


def nan_from_40_log(rank: int = 3, last: int = 60, first_nan: int = 40) -> bytes:
    """Rank 3's log of a run whose loss goes NaN at iteration 40 and stays NaN to 60, one line per iteration,
    built from the real Bridge line: Bridge leaves the NaN loss out and counts the NaN iteration (the counter
    restarts after each line: train_utils.py :: training_log), here 1, 2, ... to make the sum differ from the
    number of lines."""
    template = next(ln for ln in REAL_LOG.read_text().splitlines() if re.search(r"\] iteration\s+\d+/", ln))
    out = [f"[rank{rank}]:Starting training loop at iteration 0"]
    for n in range(1, last + 1):
        line = re.sub(r"iteration\s+\d+/\s+\d+", f"iteration {n:8d}/{last:8d}", template)
        if n < first_nan:
            line = re.sub(r"lm loss: \S+", f"lm loss: {10.0 - n / 10:.6E}", line)
        else:
            line = re.sub(r" lm loss: \S+ \|", "", line)
            line = line.replace("number of nan iterations:   0", f"number of nan iterations: {n - first_nan + 1:3d}")
        out.append(f"[rank{rank}]:{line}")
    return ("\n".join(out) + "\n").encode()
