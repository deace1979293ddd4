"""Unit tests of evals/runner.py that need no agent CLI: arguments, isolation, config, scripts vs cases.

The runs themselves are covered by test_evals_e2e.py with the real binaries.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evals import runner  # noqa: E402
from evals import scripted_model as sm  # noqa: E402

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the runner itself does not need it
URL = "http://127.0.0.1:1234"


def test_bad_arguments_exit_2_with_one_line(capsys, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cases = [
        ["--agent", "claude-code", "--scripted", "--cases", "no-such-case"],
        ["--agent", "claude-code", "--scripted", "--attempts", "0"],
        ["--agent", "claude-code", "--live"],
    ]
    for argv in cases:
        assert runner.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("evals run: "), err
    assert runner.main(cases[0]) == 2 and "no-such-case" in capsys.readouterr().err


def test_every_case_has_a_good_and_a_bad_script():
    cases = set(runner.load_cases())
    assert set(runner.scripted_cases()) == cases
    assert set(runner.scripted_cases(variant="bad")) == cases


def test_scripted_run_needs_a_script_for_each_case(capsys, tmp_path, monkeypatch):
    empty = tmp_path / "scripted"
    empty.mkdir()
    monkeypatch.setattr(runner, "SCRIPTED_DIR", empty)
    monkeypatch.setattr(runner, "scripted_cases", lambda directory=empty, variant="good": {})
    assert runner.main(["--agent", "codex", "--scripted", "--cases", "decoy-unrelated-csv"]) == 2
    assert "no good script" in capsys.readouterr().err


def test_claude_env_is_isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-real-key")
    monkeypatch.setenv("SOME_SECRET_TOKEN", "do-not-pass")
    env = runner.claude_env(tmp_path, URL)
    assert env["ANTHROPIC_API_KEY"] == runner.DUMMY_KEY and env["ANTHROPIC_BASE_URL"] == URL
    assert "SOME_SECRET_TOKEN" not in env and env["HOME"] == str(tmp_path)
    assert env["CLAUDE_CONFIG_DIR"] == str(tmp_path / ".claude")
    for flag in ("DISABLE_TELEMETRY", "DISABLE_AUTOUPDATER", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"):
        assert env[flag] == "1"
    live = runner.claude_env(tmp_path, None)
    assert live["ANTHROPIC_API_KEY"] == "sk-real-key" and "ANTHROPIC_BASE_URL" not in live


def test_codex_home_points_at_the_scripted_server(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-key")
    env = runner.codex_env(tmp_path, URL)
    assert env["OPENAI_API_KEY"] == runner.DUMMY_KEY and env["CODEX_HOME"] == str(tmp_path / ".codex")
    cfg = tomllib.loads((tmp_path / ".codex" / "config.toml").read_text())
    provider = cfg["model_providers"][cfg["model_provider"]]
    assert provider["base_url"] == URL + "/v1" and provider["wire_api"] == "responses"
    assert provider["env_key"] == "OPENAI_API_KEY"
    assert cfg["analytics"]["enabled"] is False and cfg["check_for_update_on_startup"] is False
    assert all(cfg["features"][f] is False for f in runner.CODEX_OFF_FEATURES)
    live = tomllib.loads((runner.codex_home(tmp_path / "live", None) / "config.toml").read_text())
    assert live["model_providers"][live["model_provider"]]["base_url"] == "https://api.openai.com/v1"


def test_agent_argv():
    claude = runner.agent_argv(runner.CLAUDE, ["claude"], "q?", None)
    assert claude[:3] == ["claude", "-p", "q?"]
    assert claude[claude.index("--output-format") + 1] == "stream-json" and "--verbose" in claude
    assert {"Bash", "Read", "Skill"} <= set(claude[claude.index("--allowedTools") + 1].split(","))
    codex = runner.agent_argv(runner.CODEX, ["codex"], "q?", "gpt-x")
    assert codex[:3] == ["codex", "exec", "--json"] and codex[-1] == "q?"
    assert codex[codex.index("--model") + 1] == "gpt-x"


def test_cli_lookup_honours_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CLAUDE_CLI", "/opt/x/claude")
    monkeypatch.setenv("SKILLS_CLI", "node /opt/skills/bin/cli.mjs")
    assert runner.find_agent_cli(runner.CLAUDE) == ["/opt/x/claude"]
    assert runner.find_skills_cli() == ["node", "/opt/skills/bin/cli.mjs"]
    monkeypatch.delenv("SKILLS_CLI")
    monkeypatch.setenv("MFSDP_SKILLS_CLI", "/opt/dev/skills")
    assert runner.find_skills_cli() == ["/opt/dev/skills"]
    monkeypatch.delenv("MFSDP_SKILLS_CLI")
    monkeypatch.setenv("PATH", "/nonexistent")
    local = [[str(p)] for p in (runner._dev_skills_cli(), *runner.SKILLS_CLI_LOCAL) if p.is_file()]
    assert runner.find_skills_cli(allow_npx=False) == (local[0] if local else None)
    # dev.sh's copy is found in the checkout's dev folder, never inside the skill folder
    dev = tmp_path / "dev"
    cli = dev / "node" / "node_modules" / ".bin" / "skills"
    cli.parent.mkdir(parents=True)
    cli.write_text("#!/bin/sh\n")
    monkeypatch.setenv("MFSDP_DEV_HOME", str(dev))
    assert runner.find_skills_cli(allow_npx=False) == [str(cli)]


def _fake_root(tmp_path: Path, with_skill_md: bool) -> Path:
    root = tmp_path / "root"
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "mfsdp.py").write_text("print('x')\n")
    for junk in (".git", "node_modules", "__pycache__"):
        (root / junk).mkdir()
        (root / junk / "f").write_text("junk")
    if with_skill_md:
        (root / "SKILL.md").write_text("---\nname: n\ndescription: real\n---\n")
    return root


@pytest.mark.parametrize("with_skill_md", [True, False])
def test_skill_copy_excludes_build_products_and_stands_in_only_when_needed(tmp_path, with_skill_md):
    dest = tmp_path / "copy"
    info = runner.prepare_skill_copy(dest, _fake_root(tmp_path, with_skill_md))
    assert (dest / "scripts" / "mfsdp.py").is_file()
    assert not any((dest / junk).exists() for junk in (".git", "node_modules", "__pycache__"))
    text = (dest / "SKILL.md").read_text()
    if with_skill_md:
        assert "real" in text and info["skill_md"] == "working tree"
    else:
        assert f"name: {runner.SKILL_NAME}" in text and "STAND-IN" in text and "stand-in" in info["skill_md"]
    assert not (tmp_path / "root" / "SKILL.md").exists() or with_skill_md  # the source is never written


def test_every_script_matches_its_case():
    """A script must act out its case: load the skill and run the expected script, or, for a decoy, neither."""
    cases = runner.load_cases()
    scripts = runner.scripted_cases()
    assert len(scripts) >= 40
    for case_id, path in scripts.items():
        assert case_id in cases, f"{path.name}: no case {case_id} in evals.json"
        case, turns = cases[case_id], sm.load_script(path)["turns"]
        runs = [t["run"] for t in turns if "run" in t]
        if case["expected_skill"] is None:
            assert not runs and not any("load_skill" in t for t in turns), f"{case_id} is a decoy"
            continue
        assert "load_skill" in turns[0], f"{case_id}: load the skill first"
        if case["expected_script"]:
            script, sub = case["expected_script"].split()[:2]
            words = [shlex.split(r) for r in runs]
            assert any(w[:3] == ["python3", "{skill_dir}/" + script, sub] for w in words), (case_id, runs)


def test_results_file_shape_is_what_report_reads(tmp_path):
    from evals import report

    rec = {
        "case": "decoy-unrelated-csv",
        "agent": "codex",
        "attempt": 1,
        "with_skill": True,
        "scripted_model": True,
        "transcript": "t.jsonl",
        "exit_code": 0,
        "seconds": 1.0,
        "grade": None,
    }
    res = runner.results_file([rec], "python3 -m evals run --agent codex", True, "codex", ["/bin/true"], None)
    assert res["agent"] == "codex" and res["scripted_model"] is True and res["runs"] == [rec]
    assert sm.SCRIPTED_LABEL in res["note"] and res["model"] == sm.SCRIPTED_MODEL_NAME
    summary, per_case = report.build([json.loads(json.dumps(res))])
    assert "scripted model" in summary["title"]


def test_timeout_kills_the_cli_and_what_it_spawned(tmp_path):
    import os
    import time

    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    code, out, err = runner.run_bounded(
        ["bash", "-c", f"sleep 60 & echo $! > {pidfile}; echo started; wait"],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"]},
        timeout_s=1,
    )
    assert code is None and out == "started\n" and err.startswith("timed out after 1 s")
    assert time.monotonic() - t0 < 30
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"):
            break  # killed, waiting to be reaped by init
        time.sleep(0.1)
    else:
        pytest.fail(f"the grandchild sleep {pid} survived the timeout")


def test_run_bounded_returns_exit_code_and_output(tmp_path):
    import os

    code, out, err = runner.run_bounded(
        ["bash", "-c", "echo o; echo e >&2; exit 3"], cwd=tmp_path, env={"PATH": os.environ["PATH"]}, timeout_s=30
    )
    assert (code, out, err) == (3, "o\n", "e\n")


def test_help_run_examples_name_cases_the_scripted_model_can_play():
    """Without an API key 'run' replays evals/scripted/<case>.json; an example in 'python3 -m evals --help'
    naming a case without one fails with 'no script' for every user who copies it."""
    from evals import __main__ as cli

    scripted = {p.stem for p in (ROOT / "evals" / "scripted").glob("*.json")}
    examples = [
        line.split()
        for line in (cli.EPILOG + runner.EPILOG).splitlines()
        if " run --agent" in line and "--cases" in line and "--live" not in line and "API_KEY" not in line
    ]
    assert examples
    for argv in examples:
        cases = argv[argv.index("--cases") + 1 :]
        cases = cases[: next((i for i, a in enumerate(cases) if a.startswith(("-", "#"))), len(cases))]
        assert set(cases) <= scripted, f"{' '.join(argv)}: no scripted reply for {set(cases) - scripted}"


def test_bad_scripts_say_why_and_are_labelled():
    for case_id, path in runner.scripted_cases(variant="bad").items():
        script = json.loads(path.read_text())
        assert script["variant"] == "bad" and script["why_bad"], case_id
        assert "WRONG answer on purpose" in script["note"], case_id


def test_live_run_without_a_judge_verdict_is_not_judged(tmp_path, monkeypatch):
    """A live attempt is graded with the LLM judge required: with no verdict it is 'not judged', never passed."""
    fake = tmp_path / "fake-claude"
    answer = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "result": "Write `def mean_latency(path):` reading r['latency_ms'] with csv.DictReader.",
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    init = {"type": "system", "subtype": "init", "cwd": str(tmp_path), "session_id": "s", "skills": []}
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(init)}\n{json.dumps(answer)}\nEOF\n")
    fake.chmod(0o755)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    rec = runner.run_attempt(
        agent=runner.CLAUDE,
        case=runner.load_cases()["decoy-unrelated-csv"],
        attempt=1,
        with_skill=False,
        out=tmp_path / "out",
        cli=[str(fake)],
        skills_cli=None,
        script_path=None,  # live: no scripted model
    )
    g = rec["grade"]
    assert g["passed"] is None and g["status"] == "not judged"
    assert g["judge"]["model"] and g["judge"]["prompt_sha256"] and "no ANTHROPIC_API_KEY" in g["judge"]["reason"]
    assert len(rec["meta_sha256"]) == 64
    # the record the runner wrote is the one whose digest it recorded
    from evals.transcripts import meta_digest

    assert meta_digest(rec["transcript"] + ".meta.json") == rec["meta_sha256"]


def test_runner_and_grader_read_the_cases_through_one_loader():
    from evals import cases, grader

    assert grader.get_case is cases.get_case and grader.load_cases is cases.load_cases
    assert runner.load_cases() == cases.by_id()


def test_a_copied_installation_is_the_real_install_file_for_file(tmp_path):
    """The all-cases sweep installs once per agent and copies it into each run: the copy must hold exactly what
    a real `skills add` writes into a project and its home, byte for byte."""
    import hashlib

    skills = runner.find_skills_cli(allow_npx=False)
    assert skills, "the skills CLI is not installed (bash scripts/dev.sh setup installs it)"

    def tree(root: Path) -> dict:
        return {
            str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }

    agent = runner.CODEX
    inst = runner.prepare_installation(skills, agent, tmp_path / "once")
    direct_project, direct_home = tmp_path / "direct" / "project", tmp_path / "direct" / "home"
    direct_project.mkdir(parents=True)
    direct_home.mkdir()
    copy = tmp_path / "src" / runner.SKILL_NAME
    runner.prepare_skill_copy(copy)
    runner.install_skill(skills, copy, direct_project, direct_home, agent)
    project, home = tmp_path / "run" / "project", tmp_path / "run" / "home"
    project.mkdir(parents=True)
    home.mkdir()
    got = runner._copy_installation(inst, project, home, agent)
    # the lock file records the temporary folder the skill was installed from, which differs between any two
    # installs; everything else must be equal
    lock = "skills-lock.json"

    def unlocked(root: Path) -> dict:
        return {k: v for k, v in tree(root).items() if k != lock}

    def lock_of(root: Path) -> dict:
        data = json.loads((root / lock).read_text())
        for entry in data["skills"].values():
            entry.pop("source")
        return data

    assert unlocked(project) == unlocked(direct_project) and tree(home) == tree(direct_home)
    assert lock_of(project) == lock_of(direct_project)
    assert Path(got["installed"], "SKILL.md").is_file() and got["copied_from"] == inst["root"]
    with pytest.raises(runner.RunError):
        runner._copy_installation(inst, project, home, runner.CLAUDE)
