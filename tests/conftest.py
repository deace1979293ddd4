"""Shared test set-up.

* ``scripts/`` is put on sys.path so tests import ``mfsdp_lib`` exactly as the CLI does.
* Every input a test reads is in the repository (``tests/fixtures``, ``scripts/data``)
  or made at test time (a throw-away certificate authority for signing: ``signing_keys``).
  Two inputs cannot be shipped, and only the tests that need them may skip, saying why:
  NVIDIA's signed skills (``nvidia_skills``: NVIDIA's files, not ours to redistribute)
  and the release signing material (``release_signing``: the private key never leaves
  its owners). Both are read from ``$MFSDP_SHARED_DIR`` (or a ``shared`` folder beside
  the checkout) when present.
* ``run_cli`` runs ``scripts/mfsdp.py`` in a subprocess, the way an agent does.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# No bytecode in the skill folder from the test run either: every .pyc there is an unsigned file that
# `skill_signature.py verify` reports (dev.sh also exports PYTHONDONTWRITEBYTECODE=1 for pytest's own).
sys.dont_write_bytecode = True
# The commands the tests start (scripts/mfsdp.py, python -m evals ..., hundreds of them) get one bytecode cache
# for the session, in a temporary folder outside the skill folder: with PYTHONPYCACHEPREFIX set, Python writes
# and reads every .pyc there and never beside a source, and compiling the library, the standard library and
# PyYAML again in every child was about half the suite's time. (A test of the cache itself, or of bytecode
# beside the sources, takes both variables out of its child's environment.)
_CHILD_PYCACHE = tempfile.mkdtemp(prefix="mfsdp-tests-pycache-")
atexit.register(shutil.rmtree, _CHILD_PYCACHE, True)
if not Path(_CHILD_PYCACHE).resolve().is_relative_to(Path(__file__).resolve().parent.parent):
    os.environ["PYTHONPYCACHEPREFIX"] = _CHILD_PYCACHE
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
MFSDP = SCRIPTS / "mfsdp.py"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))
# The benchmark scripts' logic is tested too (their GPU work happens elsewhere).
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.append(str(ROOT / "benchmarks"))

from mfsdp_lib import devenv  # noqa: E402  (scripts/ is on sys.path from here)

# Hypothesis keeps its example database in ./.hypothesis unless told otherwise: inside the checkout, which is
# the skill folder an install copies. dev.sh points it at the checkout's dev folder; a direct pytest run gets
# the same folder here (Hypothesis reads the variable when it first stores something, after this runs).
os.environ.setdefault(
    "HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(devenv.dev_home(str(ROOT)), devenv.LAYOUT["hypothesis"])
)


def _find_shared() -> Path | None:
    env = os.environ.get("MFSDP_SHARED_DIR")
    candidates = [Path(env)] if env else []
    candidates.append(ROOT.parent / "shared")
    for c in candidates:
        if c.is_dir():
            return c
    return None


SHARED = _find_shared()


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def tests_dir() -> Path:
    """The tests folder: ``tests_dir / "fixtures/..."`` is data shipped with the repository."""
    return Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The whole external folder (kept for tests not yet moved to the fixtures below)."""
    if SHARED is None:
        pytest.skip("the external fixtures folder ($MFSDP_SHARED_DIR) is absent")
    return SHARED


@pytest.fixture(scope="session")
def nvidia_skills() -> Path:
    """NVIDIA's own signed skills, as NVIDIA ships them: not redistributable, so never in the repository."""
    folder = SHARED / "fixtures" / "nvidia-signed-skills" if SHARED is not None else None
    if folder is None or not folder.is_dir():
        pytest.skip("needs NVIDIA's signed skills, which are not ours to redistribute (set MFSDP_SHARED_DIR)")
    return folder


@pytest.fixture(scope="session")
def release_signing() -> Path:
    """The folder with the release signing chain (and key); held by the skill's signers only."""
    folder = SHARED / "signing" if SHARED is not None else None
    if folder is None or not (folder / "root.crt.pem").is_file():
        pytest.skip("needs the release signing material, held by the skill's signers only (set MFSDP_SHARED_DIR)")
    return folder


@pytest.fixture(scope="session")
def signing_keys(tmp_path_factory) -> dict:
    """A throw-away root, intermediate and leaf made for this test session (``_helpers_ca``)."""
    from _helpers_ca import make_chain

    return make_chain(tmp_path_factory.mktemp("ca"))


def run_cli(
    *args: str, input: str | bytes | None = None, env: dict | None = None, cwd=None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run ``python3 scripts/mfsdp.py ARGS`` and capture text output."""
    full_env = dict(os.environ)
    full_env.pop("MFSDP_DEBUG", None)
    if env:
        full_env.update(env)
    if isinstance(input, bytes):
        proc = subprocess.run(
            [sys.executable, str(MFSDP), *args],
            input=input,
            capture_output=True,
            env=full_env,
            cwd=cwd,
            timeout=timeout,
        )
        return subprocess.CompletedProcess(
            proc.args, proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")
        )
    return subprocess.run(
        [sys.executable, str(MFSDP), *args],
        input=input,
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
    )


@pytest.fixture
def cli():
    return run_cli


# The test files that take longest, longest first (seconds on a 2-CPU machine, from pytest --durations: the sum of
# each file's setup and calls). pytest-xdist's --dist loadfile hands a worker one whole file at a time, in the order
# the files are collected (dev.sh turns off its reordering by test count, which put these few-test files last):
# started first, they run beside the many short files instead of alone at the end, with the other worker idle.
# Only when they run changes, never what they assert; a file not named here keeps its place after them.
LONGEST_FILES = (
    "tests/test_evals_e2e.py",  # ~110: every case with both agent CLIs (eight at once)
    "tests/test_evals_adversarial.py",  # ~60: the whole labelled set graded in one process
    "tests/recipes/test_corpus.py",  # ~45
    "tests/rules/test_recipe_corpus.py",  # ~28
    "tests/test_packaging.py",  # ~26: a fresh virtualenv, pip, dev.sh itself
    "tests/test_install.py",  # ~23: git clone and the real `npx skills add`
    "tests/security/test_attacks_signature.py",  # ~22
    "tests/integrity/test_signature.py",  # ~22
    "tests/runs/test_bench_rehearse.py",  # ~21: budgets and timeouts waited out
    "tests/runs/test_checkpoints.py",  # ~17
    "tests/recipes/test_gen_corpus_cpu.py",  # ~14
    "tests/cli/test_cli_memory.py",  # ~14
    "tests/test_bench_what_works.py",  # ~11
)


def pytest_collection_modifyitems(session, config, items):
    """The files of LONGEST_FILES first, in its order; every other file after them, as collected (a stable sort:
    the tests of one file keep their order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    root = Path(str(config.rootpath))

    def place(item) -> int:
        try:
            rel = Path(str(item.path)).resolve().relative_to(root).as_posix()
        except ValueError:
            return len(rank)
        return rank.get(rel, len(rank))

    items.sort(key=place)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA GPUs and an importable Megatron-Bridge")
    config.addinivalue_line("markers", "network: needs a package registry (PyPI / npm)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


# Real-wheel fixtures (bridge_wheel, mcore_wheel, bridge_src, mcore_src, fla_src) live in _wheels.py.
from _wheels import bridge_src, bridge_wheel, fla_src, mcore_src, mcore_wheel  # noqa: E402,F401
