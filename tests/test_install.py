"""`npx skills add` for real: install this working tree with the npm `skills` CLI and use the copy.

The CLI (pinned by [tool.mfsdp] skills-cli in pyproject.toml, installed by ``bash scripts/dev.sh test`` into the
checkout's dev folder, ``mfsdp_lib/devenv.py``) installs a
copy of the working tree's files (those git tracks or would commit) into a throw-away project,
non-interactively and with telemetry off, exactly as a user would:

    skills add <copy> --skill nemo-mbridge-perf-megatron-fsdp -a claude-code -y

Then: the folder is ``.claude/skills/nemo-mbridge-perf-megatron-fsdp/``; it holds every file byte for
byte, minus exactly what the CLI skips by design (read from its source, ``copyDirectory``: folders
``.git``, ``__pycache__``, ``__pypackages__`` and files named ``metadata.json``; planted below to prove
it); scripts keep their executable bit; ``scripts/mfsdp.py --help`` and ``check`` run from the copy;
``agentskills validate`` (PyPI skills-ref) accepts it; a signature made over the source verifies on the
installed copy.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: pip's own copy of the same parser
    from pip._vendor import tomli as tomllib

from mfsdp_lib import devenv
from mfsdp_lib.integrity import signature as sig

pytestmark = pytest.mark.network  # the CLI comes from npm (kept in the dev folder after the first run)

ROOT = pathlib.Path(__file__).resolve().parent.parent
SKILL = sig.SKILL_NAME
PINNED_CLI = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mfsdp"]["skills-cli"]
PLANTED_SKIPS = ["scripts/__pycache__/junk.cpython-311.pyc", "tests/metadata.json", "__pypackages__/x/y.py"]


def _skills_cli() -> pathlib.Path:
    env = os.environ.get("MFSDP_SKILLS_CLI")
    cli = pathlib.Path(env) if env else pathlib.Path(devenv.skills_cli(str(ROOT)))
    if not cli.exists():
        pytest.fail(f"npm 'skills' CLI not installed at {cli}; run: bash scripts/dev.sh test (it installs it)")
    if shutil.which("node") is None:
        pytest.fail("node is not installed; the install test needs Node 18+ (bash scripts/dev.sh test says how)")
    return cli


def _source_files() -> list[str]:
    """What a commit of this working tree would hold (tracked + untracked-not-ignored), else the signed set."""
    if shutil.which("git") and (ROOT / ".git").exists():
        proc = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        )
        files = [f for f in proc.stdout.decode().split("\0") if f]
        return sorted(f for f in files if (ROOT / f).is_file() and f != sig.SIGNATURE_NAME)
    return [f for f in sig.signed_files(ROOT)]


def _installer_skips(rel: str) -> bool:
    parts = rel.split("/")
    return parts[-1] in sig.INSTALLER_SKIPS_FILES or any(p in sig.INSTALLER_SKIPS_DIRS for p in parts[:-1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    cli = _skills_cli()
    version = json.loads((cli.resolve().parent.parent / "package.json").read_text())["version"]
    assert version == PINNED_CLI, f"skills CLI {version} installed, {PINNED_CLI} pinned"
    base = tmp_path_factory.mktemp("install")
    src = base / "src" / SKILL
    for rel in _source_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)  # copy2 keeps the mode bits
    for rel in PLANTED_SKIPS:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("{}\n")
    project, home = base / "project", base / "home"
    project.mkdir()
    home.mkdir()
    env = dict(os.environ, DISABLE_TELEMETRY="1", DO_NOT_TRACK="1", HOME=str(home), CI="1")
    proc = subprocess.run(
        [str(cli), "add", str(src), "--skill", SKILL, "-a", "claude-code", "-y"],
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"src": src, "dest": project / ".claude" / "skills" / SKILL, "project": project, "log": proc.stdout}


def _tree(path: pathlib.Path) -> dict[str, pathlib.Path]:
    return {p.relative_to(path).as_posix(): p for p in path.rglob("*") if p.is_file()}


def test_installs_into_the_claude_skills_folder(installed):
    dest = installed["dest"]
    assert dest.is_dir(), installed["log"]
    assert (dest / "SKILL.md").is_file()
    assert (dest / "scripts" / "mfsdp.py").is_file()


def test_every_file_is_installed_byte_for_byte_minus_the_cli_skips(installed):
    src, dest = _tree(installed["src"]), _tree(installed["dest"])
    expected = {rel for rel in src if not _installer_skips(rel)}
    assert set(dest) == expected, f"missing: {sorted(expected - set(dest))}; unexpected: {sorted(set(dest) - expected)}"
    for rel in PLANTED_SKIPS:  # the skip list in mfsdp_lib.integrity.signature matches the real CLI
        assert rel in src and rel not in dest
    for rel in expected:
        assert dest[rel].read_bytes() == src[rel].read_bytes(), rel


def test_executable_bits_survive(installed):
    src, dest = _tree(installed["src"]), _tree(installed["dest"])
    executables = [rel for rel, p in src.items() if p.stat().st_mode & stat.S_IXUSR and rel in dest]
    assert "scripts/mfsdp.py" in executables
    for rel in executables:
        assert dest[rel].stat().st_mode & stat.S_IXUSR, f"{rel} lost its executable bit"


def test_mfsdp_help_runs_from_the_installed_copy(installed):
    dest = installed["dest"]
    proc = subprocess.run(
        [sys.executable, "scripts/mfsdp.py", "--help"], cwd=dest, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "check" in proc.stdout and "enable" in proc.stdout
    direct = subprocess.run(
        [str(dest / "scripts" / "mfsdp.py"), "--help"],
        cwd=installed["project"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert direct.returncode == 0, direct.stderr  # runnable by its shebang, from another folder


def test_check_runs_from_the_installed_copy(installed):
    dest = installed["dest"]
    proc = subprocess.run(
        [sys.executable, "scripts/mfsdp.py", "check", "--format", "json"],
        cwd=dest,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert isinstance(report["ok"], bool) and isinstance(report["findings"], list)


def test_agentskills_validate_accepts_the_installed_copy(installed):
    exe = pathlib.Path(sys.executable).parent / "agentskills"
    tool = str(exe) if exe.exists() else shutil.which("agentskills")
    if tool is None and sys.version_info < (3, 11):
        pytest.skip("agentskills (PyPI skills-ref) needs Python 3.11+; this interpreter is older")
    assert tool is not None, "agentskills (PyPI skills-ref) is not installed; bash scripts/dev.sh test installs it"
    proc = subprocess.run([tool, "validate", str(installed["dest"])], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Valid skill" in proc.stdout


def test_signature_made_on_the_source_verifies_on_the_installed_copy(installed, signing_keys, tmp_path):
    # Sign a copy of the source as it was given to the installer, then compare with what was installed:
    # the signed set must be exactly what the CLI installs (planted skips included).
    src = tmp_path / SKILL
    shutil.copytree(installed["src"], src)
    sig.sign(src, str(signing_keys["key"]), str(signing_keys["cert"]), [str(c) for c in signing_keys["chain"]])
    dest = tmp_path / "installed" / SKILL
    shutil.copytree(installed["dest"], dest)
    shutil.copy2(src / sig.SIGNATURE_NAME, dest / sig.SIGNATURE_NAME)
    ok = sig.verify(dest, str(signing_keys["root"]))
    assert ok.files == sorted(_tree(installed["dest"]), key=pathlib.PurePosixPath)  # the order signed_files uses


# --------------------------------------------------------------------------- README's order: set up, then install


def _release_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _files_under(path: pathlib.Path) -> set[str]:
    return {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() or p.is_symlink()}


# The environments of a dev folder (devenv.LAYOUT): made once, and only read by the jobs this test runs.
DEV_ENVIRONMENTS = ("venv", "venv310", "node")


@pytest.mark.slow
def test_a_clone_set_up_by_dev_sh_then_installed_holds_only_the_skill_and_verifies(tmp_path, signing_keys):
    """README's own order on a clone: `dev.sh setup`, `dev.sh demo` and a pytest run through dev.sh (its
    virtualenvs, skills CLI, demo output, pytest and hypothesis caches), then `skills add <clone>`. Nothing
    dev.sh makes may land in the clone (the installer would copy it: 1.9 GB when the environments lived there),
    and the installed folder must pass `skill_signature.py verify` without --dev-tree.

    The clone's dev folder is the default one (keyed by the clone's path under XDG_CACHE_HOME); its environments
    are links to this checkout's, so that no package is downloaded again, and the rest (the demo's output, the tool
    caches) is its own: test_packaging.py's demo may run at the same time in this checkout's folder."""
    cli = _skills_cli()
    ours = pathlib.Path(devenv.dev_home(str(ROOT)))
    if not pathlib.Path(devenv.python(str(ROOT))).exists():
        pytest.fail(f"no dev virtualenv at {ours}: run the suite with bash scripts/dev.sh test, which sets it up")
    clone = tmp_path / "clone" / SKILL
    for rel in _source_files():
        (clone / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, clone / rel)
    sig.sign(clone, str(signing_keys["key"]), str(signing_keys["cert"]), [str(c) for c in signing_keys["chain"]])
    before = _files_under(clone)
    cache = tmp_path / "xdg"
    env = {k: v for k, v in os.environ.items() if k not in ("MFSDP_DEV_HOME", "MFSDP_SKILLS_CLI", "SKILLS_CLI")}
    env.update(XDG_CACHE_HOME=str(cache), CI="", DISABLE_TELEMETRY="1", DO_NOT_TRACK="1")
    theirs = pathlib.Path(devenv.dev_home(str(clone), env))
    assert theirs.parent == cache / devenv.APP / "dev" and not theirs.is_relative_to(clone)
    theirs.mkdir(parents=True, mode=0o700)
    for env_dir in (devenv.LAYOUT[name] for name in DEV_ENVIRONMENTS):
        if (ours / env_dir).is_dir():
            (theirs / env_dir).symlink_to(ours / env_dir, target_is_directory=True)
    # test_fuzz_config.py runs Hypothesis, which keeps a database; dev.sh test310 runs pytest with its cache.
    for job in (["setup"], ["demo"], ["test310", "tests/rules/test_fuzz_config.py", "-q", "-x", "-k", "random_bytes"]):
        proc = subprocess.run(
            ["bash", "scripts/dev.sh", *job], cwd=clone, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"dev.sh {job[0]}: " + proc.stdout[-1500:] + proc.stderr[-1500:]
        assert str(theirs) in proc.stdout + proc.stderr or job[0] == "test310"
    assert _files_under(clone) == before, "dev.sh wrote into the checkout: " + ", ".join(
        sorted(_files_under(clone) - before)
    )
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    proc = subprocess.run(
        [str(cli), "add", str(clone), "--skill", SKILL, "-a", "claude-code", "-y"],
        cwd=project,
        env=dict(env, HOME=str(home), CI="1"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dest = project / ".claude" / "skills" / SKILL
    assert _files_under(dest) == before
    verify = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "skill_signature.py"),
            "verify",
            "--root",
            str(signing_keys["root"]),
            "--expect-version",
            _release_version(),
            str(dest),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
