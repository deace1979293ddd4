"""mfsdp_lib/devenv.py: the developers' environments live per user and per checkout, never in the skill folder
(the installer copies every file of it), and dev.sh asks this module for the folder."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from mfsdp_lib import devenv


def test_default_folder_is_in_the_users_cache_keyed_by_the_checkout(tmp_path):
    a, b = tmp_path / "one" / "skill", tmp_path / "two" / "skill"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": "/nowhere"}
    home_a, home_b = devenv.dev_home(str(a), env), devenv.dev_home(str(b), env)
    assert Path(home_a).parent == tmp_path / "xdg" / devenv.APP / "dev"
    assert home_a != home_b  # two clones with the same folder name never share a virtualenv
    assert Path(home_a).name.startswith("skill-") and len(Path(home_a).name) == len("skill-") + devenv.KEY_HEX
    link = tmp_path / "link"
    link.symlink_to(a, target_is_directory=True)
    assert devenv.dev_home(str(link), env) == home_a  # every spelling of one checkout agrees


def test_home_cache_when_xdg_is_relative(tmp_path):
    env = {"XDG_CACHE_HOME": "rel", "HOME": str(tmp_path)}
    assert devenv.dev_home(str(ROOT), env).startswith(str(tmp_path / ".cache" / devenv.APP / "dev") + os.sep)


def test_explicit_folder_is_used_but_never_inside_the_checkout(tmp_path):
    assert devenv.dev_home(str(ROOT), {devenv.ENV_VAR: str(tmp_path)}) == str(tmp_path)
    with pytest.raises(devenv.DevHomeError, match="inside the checkout"):
        devenv.dev_home(str(ROOT), {devenv.ENV_VAR: str(ROOT / ".venv")})


def test_layout_paths():
    env = {devenv.ENV_VAR: "/d"}
    assert devenv.python(str(ROOT), "venv310", env) == "/d/venv310/bin/python"
    assert devenv.skills_cli(str(ROOT), env) == "/d/node/node_modules/.bin/skills"


def test_dev_sh_uses_the_same_folder(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != devenv.ENV_VAR}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "dev.sh"), "where"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == devenv.dev_home(str(ROOT), env)
    inside = subprocess.run(
        ["bash", str(ROOT / "scripts" / "dev.sh"), "where"],
        env=dict(env, MFSDP_DEV_HOME=str(ROOT / "envs")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert inside.returncode == 2 and "inside the checkout" in inside.stderr
