"""Packaging facts that must not drift apart: README's two commands, .ci/run, dev.sh, pyproject pins."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mfsdp_lib import devenv

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
    if not os.path.exists(devenv.python(str(ROOT))):
        pytest.fail("the dev virtualenv is not set up: run the suite with bash scripts/dev.sh test, which sets it up")
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
    if not os.path.exists(devenv.python(str(ROOT))):
        pytest.fail("the dev virtualenv is not set up: run the suite with bash scripts/dev.sh test, which sets it up")
    for attempt in (1, 2):
        proc = subprocess.run(
            ["bash", str(ROOT / "scripts" / "dev.sh"), "demo"], capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"run {attempt}: " + proc.stdout[-1500:] + proc.stderr[-1500:]


def test_a_long_pytest_run_says_it_is_still_working(tmp_path):
    """A pytest run prints nothing while one long test file runs (the progress line sat at 75 % for minutes):
    dev.sh prints a line every MFSDP_HEARTBEAT_S seconds (60 by default) until it ends, and no later."""
    if not os.path.exists(devenv.python(str(ROOT), "venv310")):
        pytest.fail("the Python 3.10 dev virtualenv is not set up: run bash scripts/dev.sh test, which sets it up")
    slow = tmp_path / "test_slow.py"
    slow.write_text("import time\n\n\ndef test_slow():\n    time.sleep(3.5)\n")
    start = time.monotonic()
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "dev.sh"), "test310", str(slow), "-q", "-p", "no:cacheprovider"],
        env=dict(os.environ, MFSDP_HEARTBEAT_S="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    beats = [ln for ln in proc.stderr.splitlines() if ln.startswith("[dev.sh] still running: pytest on Python 3.10")]
    wall = time.monotonic() - start  # run() returned: no heartbeat kept the output pipe open after dev.sh
    assert 2 <= len(beats) <= wall + 1, proc.stderr  # the 3.5 s test alone gives 3; one a second at most
    assert [int(re.search(r"\((\d+) s", b).group(1)) for b in beats] == sorted(
        int(re.search(r"\((\d+) s", b).group(1)) for b in beats
    )
    assert re.search(r"\(\d+ s so far\)$", beats[-1])
    assert "1 passed" in proc.stdout
    assert 'HEARTBEAT_S="${MFSDP_HEARTBEAT_S:-60}"' in DEV  # the default README promises


def _verifier_section() -> str:
    return README.split("### Check the signature", 1)[1].split("\n## ", 1)[0]


def test_readme_names_the_release_tag_the_card_names():
    card_version = re.search(r'^version: "([^"]+)"', (ROOT / "card.yaml").read_text(), re.M)
    assert card_version
    tag = f"v{card_version.group(1)}"
    section = _verifier_section()
    assert f"the tag `{tag}`" in section and f"--expect-version {card_version.group(1)}" in section
    assert "<release tag>" not in README + (ROOT / "SECURITY.md").read_text()
    assert f'@ git+<repository-url>@{tag}"' in section and f"git+file://localhost/ABSOLUTE/PATH@{tag}" in section


@pytest.mark.network
@pytest.mark.slow
def test_readme_verifier_install_works_with_the_pip_a_fresh_venv_has(tmp_path):
    """README's `pip install "...[sign] @ git+...@TAG"` on the pip that `python3 -m venv` brings (23.x, which
    refuses `git+file:///PATH` as an invalid requirement), from a clone on disk, in the `localhost` form the
    README gives; then the installed `mfsdp-verify` runs."""
    section = _verifier_section()
    m = re.search(r'pip install "([^"]+)"', section)
    assert m, "README's verifier section has no pip install line"
    local = re.search(r"`(git\+file://localhost/ABSOLUTE/PATH@(v[\d.]+))`", section)
    assert local
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    tag = local.group(2)
    has_tag = subprocess.run(["git", "-C", str(clone), "rev-parse", "-q", "--verify", f"refs/tags/{tag}"])
    if has_tag.returncode != 0:  # before the release is tagged: tag the clone as the maintainers will
        subprocess.run(["git", "-C", str(clone), "tag", "-a", tag, "-m", tag], check=True, timeout=60)
    requirement = m.group(1).replace(
        "git+<repository-url>@" + tag, local.group(1).replace("/ABSOLUTE/PATH", str(clone))
    )
    assert requirement != m.group(1)
    base = getattr(sys, "_base_executable", sys.executable)
    venv = tmp_path / "verify"
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=120)
    pip_version = subprocess.run(
        [str(venv / "bin" / "pip"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    proc = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--no-deps", requirement],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, pip_version + proc.stdout[-2000:] + proc.stderr[-2000:]
    helped = subprocess.run([str(venv / "bin" / "mfsdp-verify"), "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "--expect-version" in helped.stdout, helped.stdout + helped.stderr


def test_readme_states_the_measured_suite_time():
    """README's figure for `dev.sh test` on 2 CPUs is the measured median of benchmarks/results/suite_speed.json."""
    result = json.loads((ROOT / "benchmarks" / "results" / "suite_speed.json").read_text())
    cols = result["columns"]
    row = next(r for r in result["rows"] if r[cols.index("tree")] == "candidate")
    median, spread = row[cols.index("wall s (median)")], row[cols.index("wall s range")]
    assert "2 CPUs" in result["machine"]
    text = " ".join(README.split())
    assert f"a median of {round(median)} s" in text and f"{spread} s over {row[cols.index('runs')]} runs" in text


def test_readme_states_what_an_install_holds():
    """The sizes README gives for an install are those of the signed set (what the installer copies), to 10 %."""
    from mfsdp_lib.integrity import signature as sig

    files = [*sig.signed_files(ROOT), sig.SIGNATURE_NAME]
    total = sum((ROOT / f).stat().st_size for f in files)
    assert not [f for f in files if f.startswith("benchmarks/results/raw/")], "raw results installed as loose files"
    raw = (ROOT / "benchmarks" / "results" / "raw.tar.xz").stat().st_size
    used = sum(
        (ROOT / f).stat().st_size
        for f in files
        if f.split("/")[0] in ("SKILL.md", "references", "scripts", "schemas", "card.yaml", "signing")
    )
    m = re.search(r"About (\d+) MB in about ([\d,]+) files", README)
    assert m, "README no longer says how large an install is"
    assert abs(int(m.group(1)) * 1e6 - total) <= 0.1 * total, total
    assert abs(int(m.group(2).replace(",", "")) - len(files)) <= 0.1 * len(files), len(files)
    assert abs(float(re.search(r"`signing/` \(about ([\d.]+) MB\)", README).group(1)) * 1e6 - used) <= 0.1 * used
    assert abs(float(re.search(r"travel as one ([\d.]+) MB archive", README).group(1)) * 1e6 - raw) <= 0.1 * raw
