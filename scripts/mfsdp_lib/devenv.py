"""Where a checkout's development environments live: per user, per checkout, outside the skill folder.

``bash scripts/dev.sh`` makes two virtualenvs (Python 3.12 and 3.10), installs the npm ``skills`` CLI, writes
the demo's output and runs tools that keep caches (mypy, ruff, pytest, hypothesis). The repository root is
the skill folder, and the ``skills`` installer copies every file of it except ``.git``, ``__pycache__``,
``__pypackages__`` and files named ``metadata.json``: environments inside the checkout would be installed
with the skill (some 1.9 GB after the tests) and would fail ``skill_signature.py verify``. So they live in a
folder of the user's own, beside the library's bytecode cache (``bytecode_cache.app_cache``):

* ``$MFSDP_DEV_HOME`` when set (made absolute; refused when it lies inside the checkout);
* else ``<cache>/nemo-mbridge-perf-megatron-fsdp/dev/<checkout name>-<key>``, where ``<cache>`` is
  ``$XDG_CACHE_HOME`` (absolute values only) or ``~/.cache``, and ``<key>`` is the first ``KEY_HEX`` hex
  digits of the SHA-256 of the checkout's real path. One folder per checkout, so two clones or worktrees
  never share a virtualenv that one of them is reinstalling, and the name says which checkout it serves.

``LAYOUT`` names what is inside. ``dev.sh`` asks this module for the folder (one implementation for the shell
and for the tests, benchmarks and eval runner that look for the virtualenvs or the ``skills`` CLI), and sets
``MFSDP_DEV_HOME`` for everything it starts. Standard library only; run as
``python3 -c 'import sys; sys.path.insert(0, "scripts"); from mfsdp_lib import devenv; ...'`` or imported.
"""

from __future__ import annotations

import hashlib
import os

from .bytecode_cache import APP as APP  # noqa: F401  (re-exported: the folder name under the cache)
from .bytecode_cache import app_cache

ENV_VAR = "MFSDP_DEV_HOME"
KEY_HEX = 12  # 48 bits of the path's digest: no two checkouts of one user collide in practice
# What dev.sh keeps there (the names the tests and benchmarks look up).
LAYOUT = {
    "venv": "venv",  # Python 3.12: the whole suite, lint, the demo
    "venv310": "venv310",  # Python 3.10: the scripts' tests on the oldest Python they promise
    "node": "node",  # npm prefix of the pinned `skills` CLI (node_modules/.bin/skills)
    "demo": "demo",  # dev.sh demo's enabled config
    "mypy_cache": "tool-cache/mypy",
    "ruff_cache": "tool-cache/ruff",
    "pytest_cache": "tool-cache/pytest",
    "hypothesis": "tool-cache/hypothesis",
}
TOOL_CACHE = "tool-cache"  # the caches a fresh clone does not have (benchmarks clear them before a timed run)


class DevHomeError(ValueError):
    """``MFSDP_DEV_HOME`` names a folder inside the checkout."""


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def key(checkout: str) -> str:
    """``<name>-<hex>`` of the checkout's real path (links resolved, so every spelling of it agrees)."""
    real = os.path.realpath(checkout)
    digest = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:KEY_HEX]
    return f"{os.path.basename(real) or 'root'}-{digest}"


def dev_home(checkout: str, environ=None) -> str:
    """The folder holding CHECKOUT's development environments (not created here)."""
    env = os.environ if environ is None else environ
    chosen = env.get(ENV_VAR) or ""
    if chosen:
        folder = os.path.abspath(chosen)
        if _inside(folder, checkout):
            raise DevHomeError(
                f"{ENV_VAR}={chosen} lies inside the checkout {checkout}: the installer would copy it with the skill"
            )
        return folder
    return os.path.join(app_cache(env), "dev", key(checkout))


def path(checkout: str, what: str, environ=None) -> str:
    """One entry of ``LAYOUT`` (``venv``, ``node`` ...) under the checkout's dev home."""
    return os.path.join(dev_home(checkout, environ), LAYOUT[what])


def skills_cli(checkout: str, environ=None) -> str:
    """Where dev.sh installs the pinned npm ``skills`` CLI."""
    return os.path.join(path(checkout, "node", environ), "node_modules", ".bin", "skills")


def python(checkout: str, which: str = "venv", environ=None) -> str:
    """The interpreter of one of the dev virtualenvs (``venv`` or ``venv310``)."""
    return os.path.join(path(checkout, which, environ), "bin", "python")
