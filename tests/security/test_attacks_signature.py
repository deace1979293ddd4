"""Tampering with the signed folder: one test per attack (SECURITY.md, items 1, 2 and 13).

Each test signs a copy of this skill with a throw-away CA made at test time (conftest's ``signing_keys``), then
attacks the copy the way an attacker with write access to the installed folder would.
"""

from __future__ import annotations

import os
import py_compile
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from mfsdp_lib.integrity import signature as sig

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: pip's own copy of the same parser
    from pip._vendor import tomli as tomllib

pytest.importorskip("model_signing", reason="model-signing is not installed (bash scripts/dev.sh test installs it)")
pytest.importorskip("OpenSSL", reason="pyopenssl is not installed (bash scripts/dev.sh test installs it)")

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120


@pytest.fixture(scope="module")
def ca(signing_keys):
    return signing_keys


def _copy_and_sign(dest: Path, ca, edit=None) -> Path:
    for rel in sig.signed_files(ROOT):
        t = dest / rel
        t.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, t)
    if edit:
        edit(dest)
    sig.sign(dest, ca["key"], ca["cert"], ca["chain"], allow_untracked=True)
    return dest


@pytest.fixture(scope="module")
def _signed_template(tmp_path_factory, ca):
    """This skill signed once for the module (signing hashes every file); each test attacks its own copy of it."""
    return _copy_and_sign(tmp_path_factory.mktemp("signed") / sig.SKILL_NAME, ca)


@pytest.fixture
def signed(tmp_path, _signed_template):
    """A signed copy of this skill, the test's own to attack (the same bytes and modes as signing it afresh)."""
    dest = tmp_path / sig.SKILL_NAME
    shutil.copytree(_signed_template, dest, symlinks=True)
    return dest


def _problems(path, ca, **kw) -> list[str]:
    with pytest.raises(sig.VerificationError) as info:
        sig.verify(path, ca["root"], **kw)
    return info.value.problems


def _evil_pyc(src_text: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    src = target.parent / "_evil_src.py"
    src.write_text(src_text)
    py_compile.compile(str(src), cfile=str(target), doraise=True)
    src.unlink()


# --------------------------------------------------------------------------- 1. unsigned bytecode


def _crafted_cache_entry(source: Path, evil: str) -> Path:
    """A __pycache__ entry whose header carries the source's own mtime and size: Python loads it INSTEAD of
    the source (that is how its cache check works), unless told to look for caches elsewhere."""
    import importlib.util
    import marshal

    st = source.stat()
    header = importlib.util.MAGIC_NUMBER + struct.pack("<III", 0, int(st.st_mtime) & 0xFFFFFFFF, st.st_size)
    pyc = source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(header + marshal.dumps(compile(evil, str(source), "exec")))
    return pyc


def _plain_env(tmp_path: Path) -> dict[str, str]:
    """A user's environment: Python's default bytecode handling (no PYTHONDONTWRITEBYTECODE, no
    PYTHONPYCACHEPREFIX, both of which the test session sets), the per-user cache in a temporary folder."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "user-cache")
    return env


def test_1_pycache_bytecode_is_named_by_verify_and_never_loaded(signed, ca, tmp_path):
    evil = "import pathlib; pathlib.Path('PWNED').write_text('x')\nraise SystemExit('PWNED')\n"
    env = _plain_env(tmp_path)
    pyc = _crafted_cache_entry(signed / "scripts" / "mfsdp_lib" / "findings.py", evil)
    problems = _problems(signed, ca)
    rel = pyc.relative_to(signed).as_posix()
    assert problems == [f"{rel}: " + sig._extra_reason(rel)] and "unsigned bytecode" in problems[0]
    # Without the entry points' cache prefix, plain Python would run it (the attack is real) ...
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'scripts'); import mfsdp_lib.findings"],
        cwd=signed,
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT,
    )
    assert "PWNED" in probe.stderr and (signed / "PWNED").exists()
    (signed / "PWNED").unlink()
    # ... the skill's entry points never do: they read bytecode only from the user's cache, never beside a source
    for argv in (["scripts/mfsdp.py", "check"], ["scripts/skill_signature.py", "files"]):
        p = subprocess.run(
            [sys.executable, *argv], cwd=signed, capture_output=True, text=True, env=env, timeout=TIMEOUT
        )
        assert p.returncode in (0, 1) and "PWNED" not in p.stderr, p.stderr
    assert not (signed / "PWNED").exists()


def test_1_sourceless_pyc_beside_the_scripts_is_named_and_never_run(signed, ca):
    """A sourceless yaml.pyc in scripts/ is imported before site-packages' yaml: it must not run, and verify
    must name it."""
    _evil_pyc("import pathlib; pathlib.Path('PWNED').write_text('x')\n", signed / "scripts" / "yaml.pyc")
    problems = _problems(signed, ca)
    assert any(p.startswith("scripts/yaml.pyc: unsigned bytecode") for p in problems), problems
    p = subprocess.run(
        [sys.executable, str(signed / "scripts" / "mfsdp.py"), "check"],
        capture_output=True,
        text=True,
        cwd=signed.parent,
        timeout=TIMEOUT,
    )
    assert p.returncode == 2 and "compiled bytecode in the skill folder" in p.stderr, p.stderr
    assert not (signed.parent / "PWNED").exists()
    p = subprocess.run(
        [
            sys.executable,
            str(signed / "scripts" / "skill_signature.py"),
            "verify",
            "--root",
            str(ca["root"]),
            str(signed),
        ],
        capture_output=True,
        text=True,
        cwd=signed.parent,
        timeout=TIMEOUT,
    )
    assert p.returncode == 2 and not (signed.parent / "PWNED").exists()


def test_1_egg_info_hidden_and_build_files_are_named(signed, ca):
    for rel in ["scripts/megatron_bridge-0.6.2.egg-info/PKG-INFO", ".hidden", "references/.x/y", "dist/a.whl"]:
        (signed / rel).parent.mkdir(parents=True, exist_ok=True)
        (signed / rel).write_text("x\n")
    problems = _problems(signed, ca)
    named = sorted(p.split(": ")[0] for p in problems)
    assert named == [".hidden", "dist/a.whl", "references/.x/y", "scripts/megatron_bridge-0.6.2.egg-info/PKG-INFO"]
    assert any("package metadata" in p for p in problems) and any("hidden" in p for p in problems)


def test_1_entry_points_and_tests_write_no_bytecode(signed, ca, tmp_path):
    env = _plain_env(tmp_path)
    for argv in (["scripts/mfsdp.py", "check"], ["scripts/mfsdp.py", "rules"], ["scripts/skill_signature.py", "files"]):
        p = subprocess.run([sys.executable, *argv], cwd=signed, capture_output=True, env=env, timeout=TIMEOUT)
        assert p.returncode in (0, 1), p.stderr
    assert not [p for p in signed.rglob("*") if p.name == "__pycache__" or p.suffix == ".pyc"]
    assert sig.verify(signed, ca["root"]).files
    # a run that does write bytecode (plain python, no -B) leaves files that verify names
    subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'scripts'); import mfsdp_lib.findings"],
        cwd=signed,
        env=env,
        check=True,
        timeout=TIMEOUT,
    )
    assert any("__pycache__" in p for p in _problems(signed, ca))


# --------------------------------------------------------------------------- 2. a verifier from outside


def _outside_verifier(site: Path) -> list[str]:
    """What `pip install ...[sign]` puts in site-packages for mfsdp-verify, copied from the trusted checkout."""
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert proj["project"]["scripts"]["mfsdp-verify"] == "skill_signature:verify_main"
    setup = proj["tool"]["setuptools"]
    assert setup["package-dir"] == {"": "scripts"} and "mfsdp_lib.integrity" in setup["packages"]
    for mod in setup["py-modules"]:
        shutil.copy2(ROOT / "scripts" / f"{mod}.py", site / f"{mod}.py")
    for pkg in setup["packages"]:
        d = site / pkg.replace(".", "/")
        d.mkdir(parents=True, exist_ok=True)
        for f in (ROOT / "scripts" / pkg.replace(".", "/")).glob("*.py"):
            shutil.copy2(f, d / f.name)
    return [sys.executable, "-c", "import sys; from skill_signature import verify_main; sys.exit(verify_main())"]


def test_2_a_tampered_folder_cannot_vouch_for_itself(signed, ca, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    outside = _outside_verifier(site)
    # The attacker rewrites the folder's own verifier to say "verified" whatever it is asked.
    own = signed / "scripts" / "skill_signature.py"
    own.write_text("import sys\nprint('verified: all files match skill.oms.sig')\nsys.exit(0)\n")
    inside = subprocess.run(
        [sys.executable, str(own), "verify", "--root", str(ca["root"]), str(signed)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert inside.returncode == 0 and "verified" in inside.stdout  # the self-vouching the README no longer teaches
    env = dict(os.environ, PYTHONPATH=str(site))
    p = subprocess.run(
        [*outside, "--root", str(ca["root"]), str(signed)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=TIMEOUT,
    )
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "scripts/skill_signature.py: changed" in p.stderr
    # model-signing's own CLI, the pinned one-liner of SECURITY.md, is a second independent check
    ms = shutil.which("model_signing", path=os.path.dirname(sys.executable))
    if ms:
        p = subprocess.run(
            [
                ms,
                "verify",
                "certificate",
                str(signed),
                "--signature",
                str(signed / sig.SIGNATURE_NAME),
                "--certificate_chain",
                str(ca["root"]),
                "--no-ignore-git-paths",
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert p.returncode == 1 and "Signature mismatch" in (p.stdout + p.stderr)


def test_2_outside_verifier_accepts_the_intact_folder_and_the_inside_one_warns(signed, ca, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    p = subprocess.run(
        [
            *_outside_verifier(site),
            "--root",
            str(ca["root"]),
            "--expect-version",
            sig.card_identity(ROOT)[1],
            str(signed),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=TIMEOUT,
    )
    assert p.returncode == 0, p.stderr
    assert "no other file is there" in p.stdout and "runs from inside" not in p.stderr
    p = subprocess.run(
        [*_outside_verifier(site), str(signed)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert p.returncode == 2 and p.stderr.startswith("mfsdp-verify verify: error: give --root"), p.stderr
    p = subprocess.run(
        [
            sys.executable,
            str(signed / "scripts" / "skill_signature.py"),
            "verify",
            "--root",
            str(ca["root"]),
            str(signed),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert p.returncode == 0 and "runs from inside the folder it checks" in p.stderr


def test_2_readme_teaches_the_outside_verifier():
    readme = (ROOT / "README.md").read_text()
    security = (ROOT / "SECURITY.md").read_text()
    for text in (readme, security):
        assert "mfsdp-verify" in text and "--expect-version" in text
        assert "model_signing verify certificate" in text
    assert "scripts/skill_signature.py verify \\\n    --root" not in readme


# --------------------------------------------------------------------------- 13. pin the release


def _bump(version: str):
    def edit(dest: Path):
        card = dest / "card.yaml"
        text = card.read_text()
        old = sig.card_identity(dest)[1]
        card.write_text(text.replace(f'version: "{old}"', f'version: "{version}"', 1))

    return edit


def test_13_an_older_signed_release_does_not_pass_for_the_expected_one(tmp_path, ca):
    old = _copy_and_sign(tmp_path / "old" / sig.SKILL_NAME, ca, _bump("0.0.9"))
    new = _copy_and_sign(tmp_path / "new" / sig.SKILL_NAME, ca, _bump("0.2.0"))
    assert sig.verify(old, ca["root"]).version == "0.0.9"  # intact and signed ...
    problems = _problems(old, ca, expect_version="0.2.0")  # ... but not the release the user asked for
    assert problems == ["card.yaml: version 0.0.9, expected 0.2.0"]
    assert sig.verify(new, ca["root"], expect_version="0.2.0").version == "0.2.0"


def test_13_the_bundle_is_bound_to_the_cards_name(tmp_path, ca):
    def rename(dest: Path):
        card = dest / "card.yaml"
        card.write_text(card.read_text().replace(f"name: {sig.SKILL_NAME}", "name: another-skill", 1))

    other = _copy_and_sign(tmp_path / "x", ca, rename)
    problems = _problems(other, ca)
    assert problems == [f"skill.oms.sig: subject '{sig.SKILL_NAME}' is not the skill's name 'another-skill'"]


def test_13_card_version_is_the_project_version():
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert sig.card_identity(ROOT) == (sig.SKILL_NAME, proj["project"]["version"])


def test_1_a_signed_file_replaced_by_a_fifo_does_not_hang_verify(signed, ca):
    target = signed / "references" / "rules.md"
    target.unlink()
    os.mkfifo(target)
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "skill_signature.py"),
            "verify",
            "--root",
            str(ca["root"]),
            str(signed),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "references/rules.md: is not a regular file" in p.stderr, p.stderr
