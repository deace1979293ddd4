"""Facts about installed packages, from the interpreter's real environment only.

Python puts the running script's folder (``scripts/``) first on ``sys.path``. ``importlib.metadata`` believes
any ``*.egg-info`` / ``*.dist-info`` it finds on ``sys.path``, and ``import`` takes the first package of a name:
so a ``megatron_bridge.egg-info`` or a ``megatron/`` package planted in the skill folder would make the skill
report Megatron-Bridge as installed, or run the planted code. Everything here leaves the skill folder out.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SKILL_ROOT = Path(__file__).resolve().parents[3]  # scripts/mfsdp_lib/integrity -> the skill folder


def _inside_skill(path: str | os.PathLike) -> bool:
    try:
        p = Path(path or os.getcwd()).resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    return p == SKILL_ROOT or SKILL_ROOT in p.parents


def environment_paths() -> list[str]:
    """``sys.path`` without the entries inside the skill folder (site-packages, PYTHONPATH outside it)."""
    return [p for p in sys.path if not _inside_skill(p)]


def installed_distribution(name: str):
    """``importlib.metadata`` distribution ``name`` from the real environment (``environment_paths``), or None."""
    import importlib.metadata as md

    try:
        return next(iter(md.distributions(name=name, path=environment_paths())), None)
    except Exception:  # a broken metadata folder in site-packages: treat as not installed
        return None


def module_outside_skill(top: str) -> bool:
    """True when top-level package ``top`` resolves outside the skill folder (or not at all).

    ``importlib.util.find_spec`` of a TOP-level name executes nothing; a package of that name planted in
    ``scripts/`` would otherwise be imported, and run, instead of the installed one.
    """
    import importlib.util

    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return True
    if spec is None:
        return True
    places = list(spec.submodule_search_locations or []) + ([spec.origin] if spec.origin else [])
    return not any(_inside_skill(p) for p in places if p and os.path.isabs(p))
