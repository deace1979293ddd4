"""``python3 -m evals run``: run the REAL agent CLIs on eval cases, store their transcripts, grade them.

Why: an eval is only as good as its harness is real. Each attempt here is what a user's machine does: a
throw-away project, the skill installed into it by the real ``skills`` CLI from npm, the real Claude Code
(``claude -p --output-format stream-json --verbose``) or Codex (``codex exec --json``) binary answering the
case's question headless, its own transcript on disk, then graded by ``evals.grader.grade``.

Two model sources:
* ``--scripted`` (the default when the agent's API key is absent, always in CI): the model is
  ``evals.scripted_model`` on 127.0.0.1, replaying ``evals/scripted/<case>.json``. Everything but the model's
  turns is real, which makes this a plumbing test of skill + CLI + grader, NOT a measure of any model; every
  transcript sidecar and the results file say ``scripted_model: true``.
* ``--live``: the real model API, with ``ANTHROPIC_API_KEY`` (Claude Code) or ``OPENAI_API_KEY`` (Codex).

Layout under ``--out DIR``::

    DIR/<agent>/<with-skill|without-skill>/<case>/attempt-<n>/project/    the throw-away project (kept)
    DIR/<agent>/<...>/<case>/attempt-<n>/transcript.jsonl                 the CLI's stdout
    DIR/<agent>/<...>/<case>/attempt-<n>/transcript.jsonl.meta.json       invocation sidecar (evals.transcripts)
    DIR/<agent>/<...>/<case>/attempt-<n>/stderr.txt, model-requests.jsonl (scripted), grade.json
    DIR/results.json                                                      the runs, as `evals report` reads them

Finding the binaries (first hit wins): ``CLAUDE_CLI`` / ``CODEX_CLI`` / ``SKILLS_CLI`` (or ``MFSDP_SKILLS_CLI``)
environment variables; the PyPI packages ``claude-agent-sdk`` (``claude_agent_sdk/_bundled/claude``) and
``openai-codex-cli-bin`` (``codex_cli_bin/bin/codex``) located without importing them (so ``pip install
--no-deps`` is enough); the one scripts/dev.sh installed (the checkout's dev folder, ``mfsdp_lib/devenv.py``) or
``node_modules/.bin/skills``;
``claude`` / ``codex`` / ``skills`` on PATH; finally ``npx --yes skills@SKILLS_NPM_VERSION`` (npm registry).

Isolation: every CLI gets a fresh HOME (and CLAUDE_CONFIG_DIR / CODEX_HOME inside it), a minimal environment
(no inherited API keys in scripted mode), telemetry, auto-update and nonessential traffic switched off, and a
wall-clock timeout. The skill is installed from a temporary copy of the skill root, never from the repo itself,
so nothing the CLIs write lands in the working tree.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import functools
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evals import cases as cases_mod
from evals import scripted_model as sm
from evals.transcripts import meta_digest

SKILL_NAME = "nemo-mbridge-perf-megatron-fsdp"
EVALS_DIR = Path(__file__).resolve().parent
SKILL_ROOT = EVALS_DIR.parent
SCRIPTED_DIR = EVALS_DIR / "scripted"
# Scripted answers a demanding expert would reject, one per case: the grader must fail them end to end.
SCRIPTED_BAD_DIR = SCRIPTED_DIR / "bad"
VARIANTS = ("good", "bad")
EVALS_JSON = cases_mod.EVALS_JSON

CLAUDE = "claude-code"
CODEX = "codex"
AGENTS = (CLAUDE, CODEX)

# Pinned versions, the ones this harness was verified with. skills 1.5.18 is the last release whose
# package.json accepts Node 18/20 (1.5.19+ require Node >= 22.20, which Debian 12 does not ship).
SKILLS_NPM_VERSION = "1.5.18"
CLAUDE_PYPI = ("claude-agent-sdk", "0.2.189")  # bundles Claude Code 2.1.332
CODEX_PYPI = ("openai-codex-cli-bin", "0.163.0")  # bundles codex-cli 0.163.0

# Where `skills add -a <agent>` puts a project skill, relative to the project root (skills 1.5.18: a copy under
# .agents/skills, which Codex reads directly, and a symlink to it under .claude/skills for Claude Code).
PROJECT_SKILL_DIRS = {CLAUDE: ".claude/skills", CODEX: ".agents/skills"}
API_KEY_ENV = {CLAUDE: "ANTHROPIC_API_KEY", CODEX: "OPENAI_API_KEY"}
# Claude Code -p denies any tool not allowed up front (there is nobody to ask); these are what the cases need.
CLAUDE_ALLOWED_TOOLS = "Bash,Read,Skill,Glob,Grep,Edit,Write"
# A model name in Codex 0.163's own catalogue, so it does not warn about missing metadata in scripted runs.
CODEX_SCRIPTED_MODEL = "gpt-5.5"
DUMMY_KEY = "scripted-not-a-key"
# Codex 0.163 features that phone out on start-up (plugin marketplace sync, ChatGPT apps, model discovery).
CODEX_OFF_FEATURES = ("apps", "plugins", "remote_plugin", "plugin_sharing", "api_key_model_discovery", "in_app_updates")
# Per-attempt wall clock: scripted runs finish in seconds; a live agent may think for minutes.
SCRIPTED_TIMEOUT_S = 180
LIVE_TIMEOUT_S = 900
SKILLS_TIMEOUT_S = 120
# Files of the skill root that a user's install never needs (build products, VCS, our own run outputs).
COPY_IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".hypothesis",
    ".mypy_cache",  # the lint's caches: large, and rewritten while a concurrent mypy run holds them
    ".ruff_cache",
    ".venv310",
    "node_modules",
    ".cache",
    "build",
    "dist",
    "*.egg-info",
    ".whl",
    ".gpuwork",
    "eval-runs",
)
# Written into the temporary copy only when the working tree has no SKILL.md yet (never committed).
STANDIN_SKILL_MD = """---
name: {name}
description: Megatron FSDP in NVIDIA Megatron-Bridge - enable it on a recipe, check a config for every known
  conflict, convert checkpoints to fsdp_dtensor. TEMPORARY STAND-IN written by evals/runner.py because the
  working tree had no SKILL.md.
---
# {name} (temporary stand-in)

Check a Bridge config: `python3 scripts/mfsdp.py check CONFIG.yaml`.
"""


# Where a plain `npm install` in the skill root puts the skills CLI (scripts/dev.sh puts it in the checkout's dev
# folder, outside the skill folder: _dev_skills_cli).
SKILLS_CLI_LOCAL = (SKILL_ROOT / "node_modules" / ".bin" / "skills",)


def _dev_skills_cli() -> Path:
    """The skills CLI scripts/dev.sh installs for this checkout (scripts/mfsdp_lib/devenv.py decides where)."""
    scripts = str(SKILL_ROOT / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from mfsdp_lib import devenv  # noqa: PLC0415 - the skill's library, loaded only when the CLI is looked for

    return Path(devenv.skills_cli(str(SKILL_ROOT)))


class RunError(Exception):
    """Something the run needs is missing or broken (one line, exit 2)."""


# --------------------------------------------------------------------------------------------- locating tools


def _package_file(module: str, *parts: str) -> Path | None:
    """A file inside an installed package, found without importing it (the SDK's import pulls in anyio etc.)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        cand = Path(loc, *parts)
        if cand.is_file():
            return cand
    return None


def find_agent_cli(agent: str) -> list[str] | None:
    """argv prefix of the agent's CLI, or None when it is not installed."""
    if agent == CLAUDE:
        env, found, name = "CLAUDE_CLI", _package_file("claude_agent_sdk", "_bundled", "claude"), "claude"
    else:
        env, found, name = "CODEX_CLI", _package_file("codex_cli_bin", "bin", "codex"), "codex"
    if os.environ.get(env):
        return [os.environ[env]]
    if found and os.access(found, os.X_OK):
        return [str(found)]
    on_path = shutil.which(name)
    return [on_path] if on_path else None


def find_skills_cli(allow_npx: bool = True) -> list[str] | None:
    for var in ("SKILLS_CLI", "MFSDP_SKILLS_CLI"):  # MFSDP_SKILLS_CLI: what scripts/dev.sh exports
        if os.environ.get(var):
            return shlex.split(os.environ[var])
    for local in (_dev_skills_cli(), *SKILLS_CLI_LOCAL):
        if local.is_file():
            return [str(local)]
    on_path = shutil.which("skills")
    if on_path:
        return [on_path]
    npx = shutil.which("npx")
    if allow_npx and npx:
        return [npx, "--yes", f"skills@{SKILLS_NPM_VERSION}"]
    return None


@functools.cache
def _cli_version(argv: tuple[str, ...]) -> str:
    try:
        out = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def cli_version(argv: list[str]) -> str:
    """`CLI --version`, asked once per binary per process."""
    return _cli_version(tuple(argv))


# --------------------------------------------------------------------------------------------- cases, scripts


def load_cases(path: Path = EVALS_JSON) -> dict[str, dict]:
    """The cases by id (evals.cases reads the file once for the grader, the runner and the CLI)."""
    from evals.transcripts import UnreadableTranscript

    try:
        return cases_mod.by_id(path)
    except UnreadableTranscript as exc:
        raise RunError(str(exc)) from None


def scripted_cases(directory: Path = SCRIPTED_DIR, variant: str = "good") -> dict[str, Path]:
    """Case id -> script file; VARIANT "bad" reads the scripted wrong answers in scripted/bad/."""
    if variant == "bad" and directory == SCRIPTED_DIR:
        directory = SCRIPTED_BAD_DIR
    return {p.stem: p for p in sorted(directory.glob("*.json"))}


# --------------------------------------------------------------------------------------------- environment


def base_env(home: Path) -> dict[str, str]:
    """A minimal environment: nothing of the caller's (keys, config dirs) leaks into the agent."""
    py_dir = str(Path(sys.executable).parent)  # so the agent's `python3` is ours (PyYAML is there)
    path = os.pathsep.join([py_dir, os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
    env = {
        "PATH": path,
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TMPDIR": os.environ.get("TMPDIR", tempfile.gettempdir()),
        "TERM": "dumb",
        "NO_COLOR": "1",
        # No telemetry from any tool we start (skills CLI reads both names).
        "DISABLE_TELEMETRY": "1",
        "DO_NOT_TRACK": "1",
    }
    return env


def claude_env(home: Path, base_url: str | None) -> dict[str, str]:
    env = base_env(home)
    env.update(
        {
            "CLAUDE_CONFIG_DIR": str(home / ".claude"),
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
        }
    )
    if base_url:
        env.update({"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": DUMMY_KEY})
    else:
        env["ANTHROPIC_API_KEY"] = os.environ.get("ANTHROPIC_API_KEY", "")
        if os.environ.get("ANTHROPIC_BASE_URL"):
            env["ANTHROPIC_BASE_URL"] = os.environ["ANTHROPIC_BASE_URL"]
    return env


def codex_home(home: Path, base_url: str | None) -> Path:
    """A CODEX_HOME whose config.toml points Codex at the scripted server (or the real OpenAI API)."""
    ch = home / ".codex"
    ch.mkdir(parents=True, exist_ok=True)
    if base_url:
        provider = f"base_url = {json.dumps(base_url + '/v1')}\n"
        model = CODEX_SCRIPTED_MODEL
    else:
        provider = 'base_url = "https://api.openai.com/v1"\n'
        model = os.environ.get("EVALS_CODEX_MODEL", CODEX_SCRIPTED_MODEL)
    (ch / "config.toml").write_text(
        "# Written by evals/runner.py for one eval attempt.\n"
        f"model = {json.dumps(model)}\n"
        'model_provider = "evals"\n'
        "check_for_update_on_startup = false\n"
        "[analytics]\nenabled = false\n"
        "[feedback]\nenabled = false\n"
        # Features that reach github.com / chatgpt.com at start-up (seen with strace); an eval needs none.
        "[features]\n" + "".join(f"{name} = false\n" for name in CODEX_OFF_FEATURES) + "[model_providers.evals]\n"
        'name = "evals"\n' + provider + 'wire_api = "responses"\n'
        'env_key = "OPENAI_API_KEY"\n'
        "request_max_retries = 0\nstream_max_retries = 0\n",
        encoding="utf-8",
    )
    return ch


def codex_env(home: Path, base_url: str | None) -> dict[str, str]:
    env = base_env(home)
    env["CODEX_HOME"] = str(codex_home(home, base_url))
    env["OPENAI_API_KEY"] = DUMMY_KEY if base_url else os.environ.get("OPENAI_API_KEY", "")
    return env


# --------------------------------------------------------------------------------------------- one attempt


def prepare_skill_copy(dest: Path, skill_root: Path = SKILL_ROOT) -> dict:
    """Copy the skill root for installing; write a stand-in SKILL.md only when the tree has none."""
    shutil.copytree(skill_root, dest, ignore=COPY_IGNORE, symlinks=False)
    info = {"skill_root": str(skill_root), "skill_md": "working tree"}
    if not (dest / "SKILL.md").is_file():
        (dest / "SKILL.md").write_text(STANDIN_SKILL_MD.format(name=SKILL_NAME), encoding="utf-8")
        info["skill_md"] = "temporary stand-in (the working tree has no SKILL.md)"
    return info


def install_skill(skills_cli: list[str], skill_copy: Path, project: Path, home: Path, agent: str) -> dict:
    argv = [*skills_cli, "add", str(skill_copy), "--skill", SKILL_NAME, "-a", agent, "-y"]
    t0 = time.monotonic()
    proc = subprocess.run(
        argv,
        cwd=project,
        env=base_env(home),
        capture_output=True,
        text=True,
        timeout=SKILLS_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    installed = project / PROJECT_SKILL_DIRS[agent] / SKILL_NAME / "SKILL.md"
    if proc.returncode != 0 or not installed.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RunError(f"skills add failed (exit {proc.returncode}): {' | '.join(tail)}")
    return {"argv": argv, "seconds": round(time.monotonic() - t0, 2), "installed": str(installed.parent)}


def prepare_installation(skills_cli: list[str], agent: str, root: Path) -> dict:
    """One real ``skills add`` into an empty project (``root/project``, home ``root/home``), for reuse.

    Installing is the same for every case (the CLI copies the skill into the project and records it), so a sweep
    over many cases installs once per agent and copies the result into each run's project and home
    (``run_attempt(..., installation=...)``): the per-run cost of the install (a Node process copying the skill)
    goes, the installed files are the ones the real CLI wrote."""
    project, home = root / "project", root / "home"
    project.mkdir(parents=True)
    home.mkdir()
    with tempfile.TemporaryDirectory(prefix="skillcopy-") as tmp:
        copy = Path(tmp) / SKILL_NAME
        source = prepare_skill_copy(copy)
        install = install_skill(skills_cli, copy, project, home, agent)
    return {"agent": agent, "root": str(root), "skill_source": source, "install": install}


def _copy_installation(installation: dict, project: Path, home: Path, agent: str) -> dict:
    if installation["agent"] != agent:
        raise RunError(f"an installation made for {installation['agent']} cannot serve {agent}")
    root = Path(installation["root"])
    for src, dst in ((root / "project", project), (root / "home", home)):
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    installed = project / PROJECT_SKILL_DIRS[agent] / SKILL_NAME
    return dict(installation["install"], installed=str(installed), copied_from=str(root))


def agent_argv(agent: str, cli: list[str], prompt: str, model: str | None) -> list[str]:
    if agent == CLAUDE:
        argv = [
            *cli,
            "-p",
            prompt,
            "--output-format",
            "stream-json",
            "--verbose",
            "--allowedTools",
            CLAUDE_ALLOWED_TOOLS,
        ]
        if model:
            argv += ["--model", model]
        return argv
    argv = [*cli, "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
    if model:
        argv += ["--model", model]
    return [*argv, prompt]


def run_bounded(argv: list[str], cwd: Path, env: dict, timeout_s: float) -> tuple[int | None, str, str]:
    """Run a CLI in its own process group; past TIMEOUT_S the whole group (the commands it spawned too) is killed.

    Returns (exit code or None on timeout, stdout, stderr).
    """
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group we created for this CLI, nothing else
        out, err = proc.communicate()
        return None, out, f"timed out after {timeout_s} s\n{err}"


def run_attempt(
    *,
    agent: str,
    case: dict,
    attempt: int,
    with_skill: bool,
    out: Path,
    cli: list[str],
    skills_cli: list[str] | None,
    script_path: Path | None,
    model: str | None = None,
    timeout_s: float | None = None,
    grade: bool = True,
    installation: dict | None = None,
    judge: object = None,
) -> dict:
    """Run one case once; returns the row for results.json (also written as attempt files).

    ``installation`` (from ``prepare_installation``): copy that real install instead of running the skills CLI.
    ``judge``: a judge command (``evals.judge``) for the runs the evidence leaves open; default: none for scripted
    runs (they are then not judged), the Anthropic API judge for live runs."""
    case_id = case["id"]
    adir = out / agent / ("with-skill" if with_skill else "without-skill") / case_id / f"attempt-{attempt}"
    if adir.exists():
        shutil.rmtree(adir)
    project, home = adir / "project", adir / "home"
    copy_fixture(case_id, project)
    home.mkdir()
    record: dict = {
        "case": case_id,
        "agent": agent,
        "attempt": attempt,
        "with_skill": with_skill,
        "scripted_model": script_path is not None,
    }
    if with_skill and installation is not None:
        record["skill_source"] = installation["skill_source"]
        record["install"] = _copy_installation(installation, project, home, agent)
    elif with_skill:
        if skills_cli is None:
            raise RunError(
                f"the skills CLI is not installed (npm install skills@{SKILLS_NPM_VERSION}, or set SKILLS_CLI)"
            )
        with tempfile.TemporaryDirectory(prefix="skillcopy-") as tmp:
            copy = Path(tmp) / SKILL_NAME
            record["skill_source"] = prepare_skill_copy(copy)
            record["install"] = install_skill(skills_cli, copy, project, home, agent)
    prompt = case["question"]
    transcript = adir / "transcript.jsonl"
    server = None
    if script_path is not None:
        script = sm.load_script(script_path)
        skill_dir = f"{PROJECT_SKILL_DIRS[agent]}/{SKILL_NAME}"
        server = sm.ScriptedModelServer(script, SKILL_NAME, skill_dir, log_path=adir / "model-requests.jsonl")
        server.start()
    try:
        base_url = server.base_url if server else None
        env = claude_env(home, base_url) if agent == CLAUDE else codex_env(home, base_url)
        argv = agent_argv(agent, cli, prompt, None if server else model)
        limit = timeout_s or (SCRIPTED_TIMEOUT_S if server else LIVE_TIMEOUT_S)
        t0 = time.monotonic()
        exit_code, stdout, stderr = run_bounded(argv, cwd=project, env=env, timeout_s=limit)
        seconds = round(time.monotonic() - t0, 2)
    finally:
        if server:
            server.stop()
    transcript.write_text(stdout, encoding="utf-8")
    record["fixture"] = str(cases_mod.fixture_dir(case_id) or "") or None
    (adir / "stderr.txt").write_text(stderr, encoding="utf-8")
    meta = {
        "agent": agent,
        "invocation": argv,
        "prompt": prompt,
        "with_skill": with_skill,
        "scripted_model": server is not None,
        "case": case_id,
        "cwd": str(project),
        "exit_code": exit_code,
        "seconds": seconds,
        "cli_version": cli_version(cli),
    }
    if server:
        meta["scripted"] = {
            "script": str(script_path),
            "label": sm.SCRIPTED_LABEL,
            "requests": len(server.requests),
            "turns_served": server.turns_served(),
            "request_log": str(adir / "model-requests.jsonl"),
        }
    meta_path = Path(str(transcript) + ".meta.json")
    meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    # The digest lets a later `evals grade --meta FILE --meta-sha256 DIGEST` trust this record and no other.
    record.update(
        {
            "transcript": str(transcript),
            "exit_code": exit_code,
            "seconds": seconds,
            "meta_sha256": meta_digest(meta_path),
        }
    )
    if grade:
        # Without a judge's verdict a run that no file decides is "not judged", never passed.
        chosen = judge if judge is not None else ("off" if server else "api")
        record["grade"] = grade_transcript(case, transcript, agent, meta=meta, judge=chosen, workspace=project)
        (adir / "grade.json").write_text(json.dumps(record["grade"], indent=2) + "\n", encoding="utf-8")
    return record


def grade_transcript(
    case: dict,
    transcript: Path,
    agent: str,
    meta: dict | None = None,
    judge: object = "off",
    workspace: Path | None = None,
) -> dict | None:
    """Grade with evals.grader; an unreadable transcript (the CLI crashed) is None, which report counts as failed.

    META is the invocation record this runner wrote itself (so it is trusted without a digest check); WORKSPACE is
    the project folder the agent worked in, where the file a case asks for is checked.
    """
    from evals import grader
    from evals.transcripts import UnreadableTranscript

    try:
        return grader.grade(case, str(transcript), agent=agent, meta=meta, judge=judge, workspace=workspace)
    except UnreadableTranscript:
        return None


def copy_fixture(case_id: str, project: Path) -> None:
    """The case's project tree (evals/fixtures/...) as the agent's starting folder; "*.fixture" files get their real
    names back (the skills installer would drop a file named metadata.json from the skill itself)."""
    from evals.adversarial import copy_fixture as _copy

    _copy(case_id, project)


# --------------------------------------------------------------------------------------------- results


def results_file(
    records: list[dict], command: str, scripted: bool, agent: str, cli: list[str], model: str | None
) -> dict:
    """results.json in the input format of ``python3 -m evals report`` (evals/report.py)."""
    return {
        "agent": agent,
        "scripted_model": scripted,
        "model": sm.SCRIPTED_MODEL_NAME if scripted else model,
        "cli_version": cli_version(cli),
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "machine": f"{platform.node() or 'host'}: {platform.platform()}, {os.cpu_count()} CPUs",
        "command": command,
        "note": (
            f"{sm.SCRIPTED_LABEL}S: model turns replayed from evals/scripted/ on 127.0.0.1; the CLI, the "
            "skills install, tool execution and transcripts are real; token counts and costs are "
            "synthetic. A plumbing check, never a model's score."
        )
        if scripted
        else "",
        "runs": records,
    }


# --------------------------------------------------------------------------------------------- CLI

DESCRIPTION = """\
Run eval cases end to end through a real agent CLI and grade the transcripts.

Without an API key for the agent (or with --scripted) the model is the scripted server in
evals/scripted_model.py replaying evals/scripted/<case>.json on 127.0.0.1: a plumbing test of
skill install + CLI + scripts + grader, labelled SCRIPTED everywhere, never a model's score.
"""
EPILOG = """\
examples:
  python3 -m evals run --agent claude-code --scripted --out /tmp/evalrun
  python3 -m evals run --agent codex --cases mfsdp-enable-llama3-recipe decoy-unrelated-csv --both
  python3 -m evals report /tmp/evalrun/results.json --out-dir /tmp/tables
  ANTHROPIC_API_KEY=... python3 -m evals run --agent claude-code --live --attempts 3 --both
exit status: 0 every graded attempt passed; 1 some attempt failed; 2 the run could not start.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m evals run",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--agent", required=True, choices=AGENTS)
    p.add_argument(
        "--cases",
        nargs="+",
        metavar="ID",
        help="case ids (default: every case that has a script when scripted, every case when live)",
    )
    p.add_argument("--attempts", type=int, default=1, metavar="N", help="runs per case and skill mode (default 1)")
    skill = p.add_mutually_exclusive_group()
    skill.add_argument("--with-skill", dest="skill_mode", action="store_const", const="with", help="(default)")
    skill.add_argument("--without-skill", dest="skill_mode", action="store_const", const="without")
    skill.add_argument(
        "--both",
        dest="skill_mode",
        action="store_const",
        const="both",
        help="each case with and without the skill, for the uplift",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--scripted",
        dest="source",
        action="store_const",
        const="scripted",
        help="replay evals/scripted/ on 127.0.0.1 (default without an API key)",
    )
    src.add_argument(
        "--live",
        dest="source",
        action="store_const",
        const="live",
        help="the real model API (default with ANTHROPIC_API_KEY / OPENAI_API_KEY)",
    )
    p.add_argument(
        "--variant",
        choices=VARIANTS,
        default="good",
        help="scripted runs: replay the right answers (good, default) or the wrong ones in scripted/bad/ (bad)",
    )
    p.add_argument("--model", help="model name for --live runs")
    p.add_argument("--out", type=Path, help="output folder (default: a new temporary folder)")
    p.add_argument("--evals", type=Path, default=EVALS_JSON, help="cases file (default: evals/evals.json)")
    p.add_argument("--timeout", type=float, metavar="S", help="per-attempt wall clock")
    p.add_argument("--no-npx", action="store_true", help="never fetch the skills CLI with npx")
    p.add_argument(
        "--judge",
        metavar="CMD",
        help="a judge command (as for 'grade --judge'): reads the prompt on stdin, prints a verdict; it decides the "
        "runs no file decides (default: none for scripted runs, which leaves them not judged; the Anthropic API "
        "judge for live runs)",
    )
    p.set_defaults(skill_mode="with")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _main(args, argv if argv is not None else sys.argv[1:])
    except (RunError, sm.ScriptError) as exc:
        print(f"evals run: {exc}", file=sys.stderr)
        return 2


def _main(args, argv: list[str]) -> int:
    if args.attempts < 1:
        raise RunError("--attempts must be at least 1")
    source = args.source or ("live" if os.environ.get(API_KEY_ENV[args.agent]) else "scripted")
    scripted = source == "scripted"
    if not scripted and not os.environ.get(API_KEY_ENV[args.agent]):
        raise RunError(f"--live needs {API_KEY_ENV[args.agent]} in the environment")
    cases = load_cases(args.evals)
    scripts = scripted_cases(variant=args.variant)
    wanted = args.cases or (sorted(c for c in scripts if c in cases) if scripted else sorted(cases))
    unknown = [c for c in wanted if c not in cases]
    if unknown:
        raise RunError(f"unknown case id(s): {', '.join(unknown)} (see {args.evals})")
    if scripted:
        missing = [c for c in wanted if c not in scripts]
        if missing:
            where = SCRIPTED_DIR if args.variant == "good" else SCRIPTED_BAD_DIR
            raise RunError(f"no {args.variant} script in {where} for: {', '.join(missing)}")
    if not wanted:
        raise RunError("no cases to run")
    cli = find_agent_cli(args.agent)
    if cli is None:
        pkg = CLAUDE_PYPI if args.agent == CLAUDE else CODEX_PYPI
        raise RunError(
            f"the {args.agent} CLI is not installed (pip install {pkg[0]}=={pkg[1]}, or set "
            f"{'CLAUDE_CLI' if args.agent == CLAUDE else 'CODEX_CLI'})"
        )
    modes = {"with": [True], "without": [False], "both": [True, False]}[args.skill_mode]
    skills_cli = find_skills_cli(allow_npx=not args.no_npx) if True in modes else None
    out = args.out or Path(tempfile.mkdtemp(prefix=f"evals-{args.agent}-"))
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for case_id in wanted:
        for with_skill in modes:
            for n in range(1, args.attempts + 1):
                rec = run_attempt(
                    agent=args.agent,
                    case=cases[case_id],
                    attempt=n,
                    with_skill=with_skill,
                    out=out,
                    cli=cli,
                    skills_cli=skills_cli,
                    script_path=scripts.get(case_id) if scripted else None,
                    model=args.model,
                    timeout_s=args.timeout,
                    judge=args.judge,
                )
                g = rec.get("grade") or {}
                verdict = (
                    "FAIL (unreadable transcript)"
                    if not g
                    else {"pass": "PASS", "fail": "FAIL"}.get(str(g.get("status")), "NOT JUDGED")
                )
                print(
                    f"{verdict:8} {args.agent} {case_id} {'with' if with_skill else 'without'}-skill "
                    f"attempt {n} ({rec['seconds']} s) {rec['transcript']}"
                )
                records.append(rec)
    command = shlex.join(["python3", "-m", "evals", "run", *argv])
    results = results_file(records, command, scripted, args.agent, cli, args.model)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"results: {out / 'results.json'} (tables: python3 -m evals report {out / 'results.json'})")
    verdicts = [(r.get("grade") or {}).get("passed") for r in records]
    return 0 if all(v is True for v in verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
