"""Packaging facts that must not drift apart: README's two commands, .ci/run, dev.sh, pyproject pins."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DEV = (ROOT / "scripts" / "dev.sh").read_text(encoding="utf-8")
CI = (ROOT / ".ci" / "run").read_text(encoding="utf-8")

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: pip's own copy of the same parser
    from pip._vendor import tomli as tomllib


def _two_commands() -> list[str]:
    section = README.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [ln.split("#", 1)[0].strip() for ln in block.splitlines() if ln.strip()]


def test_readme_has_exactly_two_commands_and_ci_runs_the_test_one():
    cmds = _two_commands()
    assert cmds == ["bash scripts/dev.sh demo", "bash scripts/dev.sh test"]
    ci_cmds = [ln.strip() for ln in CI.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert ci_cmds[-1] == cmds[1], ".ci/run must end by running README's test command"


def test_dev_sh_subcommands_exist():
    for sub in ("demo", "test", "sign", "benchmark-md", "setup"):
        assert re.search(rf"^\s+{re.escape(sub)}\)", DEV, re.M), sub
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "dev.sh"), "no-such-job"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2 and "bash scripts/dev.sh test" in proc.stderr


def test_extras_used_by_dev_sh_exist_and_are_pinned():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert re.search(r'^TEST_EXTRAS="all"$', DEV, re.M)
    skipped = set(re.search(r'^NOT_FOR_TESTS="([^"]*)"', DEV, re.M).group(1).split(","))
    named = set(extras) - skipped
    for literal in re.findall(r'setup_python "([a-z,]+)"', DEV) + [
        re.search(r'^DEMO_EXTRAS="([^"]*)"', DEV, re.M).group(1)
    ]:
        named |= set(literal.split(","))
    assert {"run", "test", "sign", "validate"} <= named <= set(extras), named - set(extras)
    for name in named | skipped:
        for req in extras[name]:
            assert "==" in req, f"extra {name}: {req} is not pinned"


def skills_cli_version() -> str:
    """The one place the npm `skills` CLI version is written: [tool.mfsdp] skills-cli in pyproject.toml."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mfsdp"]["skills-cli"]


def test_skills_cli_version_has_one_source():
    version = skills_cli_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert "skills_cli_version" in DEV and not re.search(r'SKILLS_CLI_VERSION="[0-9.]', DEV), "dev.sh must read it"
    # README states it for readers; it must say the same.
    assert f"npm `skills` | {version}" in README and f"npx skills@{version} add" in README
    for other in re.findall(r"skills@(\d+\.\d+\.\d+)", README):
        assert other == version, f"README names skills@{other}, pyproject.toml pins {version}"


def test_ci_runs_lint_types_and_both_pythons():
    """CI runs README's test command; that command lints, type-checks and runs Python 3.12 and 3.10."""
    assert "cmd_lint" in DEV.split("cmd_test() {", 1)[1].split("\n}", 1)[0]
    assert "cmd_test310" in DEV.split("cmd_test() {", 1)[1].split("\n}", 1)[0]
    assert re.search(r'^MAIN_PY_VERSION="3\.12"', DEV, re.M) and re.search(r'^OLDEST_PY_VERSION="3\.10"', DEV, re.M)
    assert "CI=" in CI or "export CI" in CI, ".ci/run must mark the run as CI so a missing Python 3.10 fails"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert {"ruff", "mypy"} == {r.split("==")[0] for r in pyproject["project"]["optional-dependencies"]["lint"]}
    assert (
        pyproject["tool"]["ruff"]["target-version"] == "py310" and pyproject["tool"]["mypy"]["python_version"] == "3.10"
    )


def test_dev_sh_treats_an_empty_selection_as_no_failure():
    """pytest exits 5 when a selection runs no test; dev.sh (and so .ci/run) must not fail on it."""
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.fail(".venv is not set up: run the suite with bash scripts/dev.sh test, which sets it up")
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "dev.sh"),
            "test",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "no_test_is_named_like_this_xyz",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "selected no test (exit 5)" in proc.stderr


def test_line_endings_are_pinned():
    attrs = (ROOT / ".gitattributes").read_text().splitlines()
    assert "* text=auto eol=lf" in attrs
    assert "skill.oms.sig -text" in attrs  # the bundle is never rewritten on checkout


def test_demo_runs_twice():
    """README: 'A second run skips the set-up.' The second demo stopped at 'enable -o ... exists' (exit 2)."""
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.fail(".venv is not set up: run the suite with bash scripts/dev.sh test, which sets it up")
    for attempt in (1, 2):
        proc = subprocess.run(
            ["bash", str(ROOT / "scripts" / "dev.sh"), "demo"], capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"run {attempt}: " + proc.stdout[-1500:] + proc.stderr[-1500:]
