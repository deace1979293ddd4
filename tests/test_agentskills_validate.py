"""The official Agent Skills validator (PyPI ``skills-ref``, ``agentskills validate``)
accepts the skill as it is installed: in a folder named after the skill, both as a
plain copy and as placed by ``npx skills add`` (Vercel's ``skills`` CLI). Negative
controls show the validator really checks: a wrongly named folder and NVIDIA's own
version (its ``when_to_use`` key) fail.

Needs: ``pip install skills-ref==0.1.1``; for the ``skills add`` test the ``skills``
CLI (npm ``skills``, the version pinned in pyproject.toml; 1.7.x needs Node 22) found as ``$SKILLS_CLI`` or on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _helpers_skill import ROOT
from mfsdp_lib import SKILL_NAME, devenv

NAME = SKILL_NAME
# What a user's copy holds: the tracked skill files (no caches, no VCS metadata).
SKIP_PARTS = {".git", ".pytest_cache", ".benchmarks", "__pycache__", ".hypothesis", "node_modules", ".venv"}


def _validator() -> list[str]:
    exe = shutil.which("agentskills")
    if exe:
        return [exe]
    try:
        import skills_ref.cli  # noqa: F401
    except ImportError:
        if sys.version_info < (3, 11):
            pytest.skip("skills-ref (agentskills validate) needs Python 3.11+; this interpreter is older")
        pytest.fail("skills-ref is not installed; bash scripts/dev.sh test installs it (the validate extra)")
    return [sys.executable, "-c", "import sys; from skills_ref.cli import main; sys.exit(main())"]


def _validate(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*_validator(), "validate", str(folder)], capture_output=True, text=True, timeout=60)


def _copy_skill(dest: Path) -> Path:
    def ignore(_dir, names):
        return [n for n in names if n in SKIP_PARTS]

    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


def test_validator_accepts_a_copy_named_after_the_skill(tmp_path):
    proc = _validate(_copy_skill(tmp_path / NAME))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Valid skill" in proc.stdout


def test_validator_rejects_a_folder_not_named_after_the_skill(tmp_path):
    proc = _validate(_copy_skill(tmp_path / "megatron-fsdp"))
    assert proc.returncode != 0
    assert "must match skill name" in proc.stdout + proc.stderr


def test_validator_rejects_nvidias_version_for_its_when_to_use_key(tmp_path, nvidia_skills):
    theirs = nvidia_skills / NAME
    dest = tmp_path / NAME
    shutil.copytree(theirs, dest)
    proc = _validate(dest)
    assert proc.returncode != 0 and "when_to_use" in proc.stdout + proc.stderr


def _skills_cli() -> str:
    local = Path(devenv.skills_cli(str(ROOT)))
    cli = os.environ.get("SKILLS_CLI") or (str(local) if local.exists() else shutil.which("skills"))
    if not cli:
        pytest.fail("the 'skills' CLI is not installed; bash scripts/dev.sh test installs it into its dev folder")
    return cli


@pytest.mark.slow
def test_skills_add_installs_a_folder_the_validator_accepts_and_the_tools_run_from(
    tmp_path, cli, bridge_wheel, mcore_wheel
):
    skills = _skills_cli()
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    env = dict(os.environ, HOME=str(tmp_path / "home"), DO_NOT_TRACK="1", DISABLE_TELEMETRY="1")
    source = _copy_skill(tmp_path / "src" / NAME)
    proc = subprocess.run(
        [skills, "add", str(source), "-a", "claude-code", "-y", "--copy"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    installed = project / ".claude" / "skills" / NAME
    assert (installed / "SKILL.md").is_file(), proc.stdout[-2000:]
    check = _validate(installed)
    assert check.returncode == 0, check.stdout + check.stderr
    # The installed copy's own scripts run (Claude Code invokes them from there).
    run = subprocess.run(
        [
            sys.executable,
            str(installed / "scripts" / "mfsdp.py"),
            "anchors",
            "--bridge-src",
            str(bridge_wheel),
            "--mcore-src",
            str(mcore_wheel),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=project,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
