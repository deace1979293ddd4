"""Real Megatron-Bridge / Megatron-Core wheels for tests that read their source.

Bridge 0.6.x needs Python >= 3.12 and a CUDA build of Transformer Engine to
*import*, but its wheel is pure Python and Megatron-Core's wheel is a zip with
Python sources: tests read them as text and never import them (so is fla-core's, the
flash-linear-attention kernels megatron-core's gated delta net calls). The wheels are
downloaded once with ``pip download --no-deps`` (the real PyPI artefacts) into a
cache folder, then reused; tests skip with the reason when no registry is
reachable and nothing is cached.

Cache: ``$MFSDP_WHEEL_CACHE`` or ``~/.cache/mfsdp-skill/wheels``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

# The versions every fact in the skill was checked against (see mfsdp_lib.PINNED_*).
BRIDGE_REQ = "megatron-bridge==0.6.2"
MCORE_REQ = "megatron-core==0.19.2"
# megatron-core ships platform wheels only; any of them holds the same Python sources.
MCORE_PLATFORM = "manylinux_2_28_x86_64"
# flash-linear-attention's kernels, which megatron-core's gated delta net calls (its dev extra pins
# flash-linear-attention~=0.4.0; the kernels ship in fla-core, a pure-Python wheel).
FLA_REQ = "fla-core==0.4.2"

CACHE = Path(os.environ.get("MFSDP_WHEEL_CACHE", Path.home() / ".cache" / "mfsdp-skill" / "wheels"))


@contextlib.contextmanager
def _cache_lock():
    """One process at a time in the cache: the suite runs in several pytest-xdist workers, and two of them
    downloading or unpacking the same wheel at once would see each other's partial files."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _download(req: str, pattern: str, platform: str | None = None) -> Path:
    with _cache_lock():
        return _download_locked(req, pattern, platform)


def _download_locked(req: str, pattern: str, platform: str | None) -> Path:
    found = sorted(CACHE.glob(pattern))
    if found:
        return found[-1]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "-d",
        str(CACHE),
        req,
    ]
    if platform:
        cmd[cmd.index("-d") : cmd.index("-d")] = ["--platform", platform]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    found = sorted(CACHE.glob(pattern))
    if proc.returncode != 0 or not found:
        pytest.fail(f"cannot download {req} (is PyPI reachable?): {proc.stderr.strip().splitlines()[-1:]}")
    return found[-1]


def _unpack(wheel: Path) -> Path:
    with _cache_lock():
        return _unpack_locked(wheel)


def _unpack_locked(wheel: Path) -> Path:
    dest = CACHE / (wheel.name + ".d")
    marker = dest / ".complete"
    if not marker.exists():
        tmp = CACHE / (wheel.name + ".tmp")
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tmp)
        if dest.exists():
            import shutil

            shutil.rmtree(dest)
        tmp.rename(dest)
        marker.touch()
    return dest


@pytest.fixture(scope="session")
def bridge_wheel() -> Path:
    return _download(BRIDGE_REQ, "megatron_bridge-0.6.2-*.whl")


@pytest.fixture(scope="session")
def mcore_wheel() -> Path:
    return _download(MCORE_REQ, "megatron_core-0.19.2-*.whl", MCORE_PLATFORM)


@pytest.fixture(scope="session")
def bridge_src(bridge_wheel) -> Path:
    """Folder holding the unpacked ``megatron/bridge`` sources of the pinned wheel."""
    return _unpack(bridge_wheel)


@pytest.fixture(scope="session")
def mcore_src(mcore_wheel) -> Path:
    """Folder holding the unpacked ``megatron/core`` sources of the pinned wheel."""
    return _unpack(mcore_wheel)


@pytest.fixture(scope="session")
def fla_src() -> Path:
    """Folder holding the unpacked ``fla`` sources of the pinned flash-linear-attention kernels."""
    return _unpack(_download(FLA_REQ, "fla_core-0.4.2-*.whl"))
