"""The library's bytecode cache (``mfsdp_lib/bytecode_cache.py``): where it lives, when there is none, and that
the signed skill folder never gets a ``.pyc``.

The end-to-end tests run ``scripts/mfsdp.py`` in a subprocess with a user's environment (no
``PYTHONDONTWRITEBYTECODE``), pointing ``XDG_CACHE_HOME`` or ``PYTHONPYCACHEPREFIX`` at a temporary folder,
and read Python's own ``-v`` trace to see which bytecode it loaded.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MFSDP, ROOT
from mfsdp_lib import bytecode_cache as B

APP_CACHE = Path(B.APP) / "pycache"


def _user_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env.pop("MFSDP_DEBUG", None)
    env.update(extra)
    return env


def _check(env: dict, script: Path = MFSDP, verbose: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *(["-v"] if verbose else []), str(script), "check", "--env", "PATH=/usr/bin"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return proc


def _pycs(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*.pyc")} if folder.exists() else set()


def _skill_bytecode(root: Path) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath == str(root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]  # .venv, .git, .cache: not the skill's
        out |= {os.path.join(dirpath, f) for f in filenames if f.endswith((".pyc", ".pyo"))}
    return out


# --------------------------------------------------------------------------- where


def test_xdg_cache_home_is_used_when_absolute(tmp_path):
    assert B.default_dir({"XDG_CACHE_HOME": str(tmp_path), "HOME": "/nowhere"}) == str(tmp_path / APP_CACHE)


def test_home_cache_without_xdg_or_with_a_relative_one(tmp_path):
    home = str(tmp_path)
    assert B.default_dir({"HOME": home}) == str(tmp_path / ".cache" / APP_CACHE)
    # the XDG base-directory spec: a relative XDG_CACHE_HOME is invalid and ignored
    assert B.default_dir({"HOME": home, "XDG_CACHE_HOME": "rel/cache"}) == str(tmp_path / ".cache" / APP_CACHE)


def test_choose_makes_a_private_folder(tmp_path):
    folder = B.choose(str(ROOT), None, {"XDG_CACHE_HOME": str(tmp_path)})
    assert folder == str(tmp_path / APP_CACHE)
    for p in (tmp_path / B.APP, tmp_path / APP_CACHE):
        st = p.lstat()
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()


def test_explicit_prefix_is_respected_but_never_inside_the_skill(tmp_path):
    assert B.choose(str(ROOT), str(tmp_path / "mine"), {"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "mine")
    assert B.choose(str(ROOT), str(ROOT / "scripts" / "cache"), {}) is None
    assert B.choose(str(ROOT), str(ROOT), {}) is None


@pytest.mark.parametrize("how", ["under-a-file", "group-writable", "symlink", "shared-parent", "inside-skill"])
def test_no_cache_when_the_folder_is_unusable(tmp_path, how):
    """No usable private folder: no cache (None), silently; the caller then compiles from source."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    skill = str(ROOT)
    if how == "under-a-file":  # cannot be created (works as root too, unlike a read-only folder)
        (tmp_path / "xdg").write_text("a file, not a folder")
    elif how == "group-writable":
        (tmp_path / "xdg" / B.APP).mkdir(parents=True)
        os.chmod(tmp_path / "xdg" / B.APP, 0o770)
    elif how == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        (tmp_path / "xdg").mkdir()
        os.symlink(tmp_path / "elsewhere", tmp_path / "xdg" / B.APP)
    elif how == "shared-parent":  # anyone could rename our folder away and put theirs in its place
        (tmp_path / "xdg").mkdir()
        os.chmod(tmp_path / "xdg", 0o777)
    elif how == "inside-skill":
        skill = str(tmp_path)
    assert B.choose(skill, None, env) is None


def test_enable_without_a_cache_points_at_a_prefix_that_cannot_exist(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "pycache_prefix", sys.pycache_prefix)
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    (tmp_path / "file").write_text("")
    assert B.enable(str(ROOT), None) is None
    assert sys.pycache_prefix == B.NO_CACHE and sys.dont_write_bytecode
    assert B.store() == 0


# --------------------------------------------------------------------------- end to end


def test_second_call_loads_checked_bytecode_from_the_user_cache(tmp_path):
    before = _skill_bytecode(ROOT)
    env = _user_env(XDG_CACHE_HOME=str(tmp_path))
    cache = tmp_path / APP_CACHE
    _check(env)
    written = _pycs(cache)
    lib = [p for p in written if "mfsdp_lib" in p.parts]
    assert len(lib) >= 10 and any(p.name.startswith("config_io.") for p in lib), sorted(map(str, written))[:20]
    # PEP 552 checked-hash bytecode: flags 0b11, validated against the source on every import
    for p in lib:
        head = p.read_bytes()[:8]
        assert int.from_bytes(head[4:8], "little") == B.PEP552_CHECKED_HASH, p
    stamps = {p: p.stat().st_mtime_ns for p in written}
    trace = _check(env, verbose=True).stderr
    loaded = {line.split("'")[1] for line in trace.splitlines() if line.startswith("# code object from '")}
    assert {str(p) for p in lib} <= loaded, sorted({str(p) for p in lib} - loaded)[:5]
    assert {p: p.stat().st_mtime_ns for p in _pycs(cache)} == stamps  # nothing rewritten on the warm call
    assert _skill_bytecode(ROOT) == before, "a .pyc appeared in the skill folder"


def test_a_changed_source_is_never_run_from_stale_bytecode(tmp_path):
    """Same size and time, different content (an archive with normalised times): the hash check catches it."""
    skill = tmp_path / "skill"
    shutil.copytree(ROOT / "scripts", skill / "scripts", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = _user_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    script = skill / "scripts" / "mfsdp.py"
    assert _check(env, script).returncode in (0, 1)
    findings = skill / "scripts" / "mfsdp_lib" / "findings.py"
    text = findings.read_text()
    st = findings.stat()
    # a same-length edit that shows up in check's output (the embedded default has no findings)
    edited = text.replace('"no findings\\n"', '"NO FINDINGS\\n"', 1)
    assert len(edited) == len(text) and edited != text
    findings.write_text(edited)
    os.utime(findings, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert findings.stat().st_size == st.st_size and findings.stat().st_mtime_ns == st.st_mtime_ns
    out = _check(env, script).stdout
    assert "NO FINDINGS" in out, out[-500:]


def test_explicit_pycacheprefix_is_where_the_bytecode_goes(tmp_path):
    prefix = tmp_path / "prefix"
    env = _user_env(PYTHONPYCACHEPREFIX=str(prefix), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    _check(env)
    assert any("mfsdp_lib" in p.parts for p in _pycs(prefix))
    assert not _pycs(tmp_path / "xdg")


def test_dont_write_bytecode_is_honoured(tmp_path):
    env = _user_env(XDG_CACHE_HOME=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    _check(env)
    assert not _pycs(tmp_path)


def test_unwritable_cache_still_checks_and_writes_nothing(tmp_path):
    """No usable cache folder: the same report, no message about it, no bytecode anywhere."""
    (tmp_path / "xdg").write_text("not a folder")
    before = _skill_bytecode(ROOT)
    proc = _check(_user_env(XDG_CACHE_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path / "xdg")))
    cached = _check(_user_env(XDG_CACHE_HOME=str(tmp_path / "ok")))
    assert proc.stderr == "" and proc.stdout == cached.stdout and proc.returncode == cached.returncode
    assert _skill_bytecode(ROOT) == before


def test_signature_still_verifies_after_cached_calls(tmp_path, signing_keys):
    """A signed copy of the skill, called twice with a cache: verify still finds exactly the signed files."""
    from mfsdp_lib.integrity import signature as sig

    dest = tmp_path / sig.SKILL_NAME
    for rel in sig.signed_files(ROOT):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    sig.sign(dest, signing_keys["key"], signing_keys["cert"], signing_keys["chain"])
    env = _user_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    for _ in range(2):
        _check(env, dest / "scripts" / "mfsdp.py")
    assert _pycs(tmp_path / "cache" / APP_CACHE)  # the cache was used ...
    assert not _skill_bytecode(dest)  # ... and the skill folder holds no bytecode
    ok = sig.verify(dest, signing_keys["root"])
    assert ok.files == sig.signed_files(dest)
