"""Shared bits for the ckpt/log tests: fixture locations and discovery of real GPU-run fixtures.

Role ``gpu`` adds real runs under ``tests/fixtures/gpu-run/``; the tests find them here (checkpoint roots by
their tracker files, logs by ``*.log``) so new runs are tested without editing any test.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REAL_RUN = FIXTURES / "real-h200-run"
REAL_CKPT = REAL_RUN / "checkpoint_metadata_only"
REAL_LOG = REAL_RUN / "fsdp_save.log"
CKPT = FIXTURES / "ckpt"
LOGS = FIXTURES / "logs"
GPU_RUN = FIXTURES / "gpu-run"

TRACKERS = ("latest_train_state.pt", "latest_checkpointed_iteration.txt")


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
    for dirpath, dirs, files in os.walk(dst):  # the shared originals are read-only
        for n in dirs + files:
            os.chmod(os.path.join(dirpath, n), 0o755 if n in dirs else 0o644)
    return dst


def is_root_user() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0
