"""End to end: the REAL Claude Code and Codex CLIs, the REAL `skills` install, our scripts, the grader.

Only the model is scripted (evals/scripted_model.py on 127.0.0.1, replaying evals/scripted/<case>.json). Each
test installs the skill into a throw-away project with the npm `skills` CLI, runs the agent headless, and then
checks what really happened on both sides of the wire:
* the CLI told the model about the installed skill (Claude Code's system/init line and its request; Codex's
  skill listing in its request);
* loading the skill put our SKILL.md in front of the model, and the scripted command ran our real
  scripts/mfsdp.py, whose output went back to the model as a tool result;
* evals.grader grades the transcript: positive and negative cases pass, the no-skill baseline fails.

Skips (with the install command) when a CLI is not installed, or fails when EVALS_E2E_REQUIRE=1 (for CI);
nothing here downloads.
Binaries: pip install claude-agent-sdk==0.2.189 openai-codex-cli-bin==0.163.0; npm install skills@1.5.18
(or point CLAUDE_CLI / CODEX_CLI / SKILLS_CLI at them).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evals import runner  # noqa: E402
from evals import scripted_model as sm  # noqa: E402
from evals.checks import CHECKS  # noqa: E402
from evals.transcripts import read_transcript  # noqa: E402

SKILL = runner.SKILL_NAME
# CI sets this so that a broken install fails loudly instead of skipping the only real end-to-end test.
REQUIRE = bool(os.environ.get("EVALS_E2E_REQUIRE"))
POSITIVE = {runner.CLAUDE: "mfsdp-ckpt-format-assertion", runner.CODEX: "mfsdp-tp-pp-dp-mapping"}
# Every case runs end to end with both CLIs, replaying its good and its bad scripted answer.
ALL_CASES = sorted(runner.load_cases())
WORKERS = 8  # each attempt is a CLI process plus a loopback server; they do not share anything
NEGATIVE = "decoy-unrelated-csv"
pytestmark = pytest.mark.slow


def _absent(reason: str) -> NoReturn:
    if REQUIRE:
        pytest.fail(reason + " (EVALS_E2E_REQUIRE is set)")
    pytest.skip(reason)


def _cli_or_skip(agent: str) -> list[str]:
    cli = runner.find_agent_cli(agent)
    if cli is None:
        pkg = runner.CLAUDE_PYPI if agent == runner.CLAUDE else runner.CODEX_PYPI
        _absent(
            f"the {agent} CLI is not installed: pip install {pkg[0]}=={pkg[1]} (or set "
            f"{'CLAUDE_CLI' if agent == runner.CLAUDE else 'CODEX_CLI'})"
        )
    return cli


@pytest.fixture(scope="module")
def skills_cli() -> list[str]:
    cli = runner.find_skills_cli(allow_npx=False)
    if cli is None:
        _absent(f"the skills CLI is not installed: npm install skills@{runner.SKILLS_NPM_VERSION} (or set SKILLS_CLI)")
    return cli


@pytest.fixture(scope="module")
def cases() -> dict:
    return runner.load_cases()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, skills_cli, cases):
    """Run each (agent, case, with_skill) at most once per module; tests share the results."""
    out = tmp_path_factory.mktemp("e2e")
    done: dict = {}

    def run(agent: str, case_id: str, with_skill: bool = True) -> dict:
        key = (agent, case_id, with_skill)
        if key not in done:
            done[key] = runner.run_attempt(
                agent=agent,
                case=cases[case_id],
                attempt=1,
                with_skill=with_skill,
                out=out,
                cli=_cli_or_skip(agent),
                skills_cli=skills_cli,
                script_path=runner.SCRIPTED_DIR / f"{case_id}.json",
            )
        return done[key]

    return run


def scripted_turns(case: str) -> int:
    """How many model turns the good scripted answer of ``case`` has: the CLI asks for each one once."""
    path = Path(__file__).resolve().parent.parent / "evals" / "scripted" / f"{case}.json"
    return len(json.loads(path.read_text())["turns"])


def requests_of(record: dict) -> list[dict]:
    log = Path(record["transcript"]).parent / "model-requests.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()]


def strings(obj):
    """Every string inside a request body (message texts, system prompt, tool outputs)."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from strings(v)


def skill_description(record: dict) -> str:
    """The description from the installed SKILL.md front matter (what the CLI must list)."""
    text = (Path(record["install"]["installed"]) / "SKILL.md").read_text()
    front = text.split("---")[1]
    import yaml

    return " ".join(str(yaml.safe_load(front)["description"]).split())


def listed_in(body: dict, name: str) -> str | None:
    """The skill-listing line `- NAME: description` the CLI put into a request, or None."""
    pattern = re.compile(rf"^\s*-\s+{re.escape(name)}:\s*(.+)$", re.M)
    for s in strings(body):
        m = pattern.search(s)
        if m:
            return m.group(1)
    return None


def meta_of(record: dict) -> dict:
    return json.loads(Path(record["transcript"] + ".meta.json").read_text())


def assert_check_ran_and_case_passed(rec: dict, t) -> None:
    """`scripts/mfsdp.py check` ran on usable input (exit 0 or 1), the answer is labelled, all five dimensions pass."""
    check = [
        c
        for c in t.commands
        if any(len(w) > 2 and w[1].endswith("scripts/mfsdp.py") and w[2] == "check" for w in c.segments)
    ]
    assert check and check[0].exit_code in (0, 1) and not check[0].denied, [vars(c) for c in t.commands]
    assert t.final_answer.startswith(sm.SCRIPTED_LABEL)
    assert meta_of(rec)["scripted_model"] is True and meta_of(rec)["with_skill"] is True
    grade = rec["grade"]
    assert grade["passed"] is True and grade["decided_by"] == "outcome", json.dumps(grade, indent=1)
    assert all(d["passed"] for d in grade["dimensions"].values()), grade["dimensions"]


# ------------------------------------------------------------------------------------------- Claude Code


def test_claude_code_positive_case_end_to_end(runs):
    rec = runs(runner.CLAUDE, POSITIVE[runner.CLAUDE])
    assert rec["exit_code"] == 0, Path(rec["transcript"]).parent.joinpath("stderr.txt").read_text()[-2000:]
    events = [json.loads(line) for line in Path(rec["transcript"]).read_text().splitlines() if line.strip()]
    init = next(e for e in events if e.get("type") == "system" and e.get("subtype") == "init")
    assert SKILL in init["skills"], "Claude Code's system/init line does not list the installed skill"

    reqs = [r for r in requests_of(rec) if r.get("dialect") == "anthropic" and r.get("turn") is not None]
    assert [r["turn"] for r in reqs] == list(range(scripted_turns(POSITIVE[runner.CLAUDE])))
    listing = listed_in(reqs[0]["body"], SKILL)
    assert listing and listing.startswith(skill_description(rec)[:40]), "the skill listing the model saw"
    # The Skill tool put our SKILL.md in front of the model (Claude Code's own message, not ours).
    assert any(
        s.startswith("Base directory for this skill:") and s.splitlines()[0].endswith(f"/.claude/skills/{SKILL}")
        for s in strings(reqs[1]["body"]["messages"])
    )
    # Our script really ran: its result came back to the model as the Bash tool_result.
    result = next(
        b
        for m in reqs[2]["body"]["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result" and b["tool_use_id"] == "toolu_scripted_1"
    )
    assert "ckpt_format" in json.dumps(result["content"]), result
    # the case's project was there: the checker read the user's conf/run_config.yaml
    assert "conf/run_config.yaml" in json.dumps(result["content"])

    t = read_transcript(rec["transcript"])
    assert [s.name for s in t.loaded(SKILL)] == [SKILL]
    assert_check_ran_and_case_passed(rec, t)


def test_claude_code_negative_case_end_to_end(runs):
    rec = runs(runner.CLAUDE, NEGATIVE)
    assert rec["exit_code"] == 0
    t = read_transcript(rec["transcript"])
    assert SKILL in t.skills_available  # installed and offered ...
    assert t.loaded(SKILL) == [] and t.tool_calls == []  # ... and rightly left alone
    # a decoy's answer is prose: without a judge it is not judged (never passed), and nothing failed it
    assert rec["grade"]["passed"] is None and rec["grade"]["decided_by"] is None, json.dumps(rec["grade"], indent=1)
    assert rec["grade"]["dimensions"]["discoverability"]["passed"] is True


def test_claude_code_without_skill_baseline_fails(runs):
    """Same scripted turns, no skill installed: the Skill call errors, the script is missing, the grade fails."""
    rec = runs(runner.CLAUDE, POSITIVE[runner.CLAUDE], with_skill=False)
    t = read_transcript(rec["transcript"])
    assert SKILL not in t.skills_available and t.loaded(SKILL) == []
    assert meta_of(rec)["with_skill"] is False
    assert rec["grade"]["passed"] is False
    assert rec["grade"]["dimensions"]["discoverability"]["passed"] is False
    assert rec["grade"]["dimensions"]["effectiveness"]["passed"] is False


# ------------------------------------------------------------------------------------------- Codex


def test_codex_positive_case_end_to_end(runs):
    rec = runs(runner.CODEX, POSITIVE[runner.CODEX])
    assert rec["exit_code"] == 0, Path(rec["transcript"]).parent.joinpath("stderr.txt").read_text()[-2000:]
    reqs = [r for r in requests_of(rec) if r.get("dialect") == "responses" and r.get("turn") is not None]
    assert [r["turn"] for r in reqs] == list(range(scripted_turns(POSITIVE[runner.CODEX])))
    listing = listed_in(reqs[0]["body"], SKILL)
    assert listing and listing.startswith(skill_description(rec)[:40]), "Codex did not list the installed skill"
    outputs = {
        i["call_id"]: i["output"]
        for i in reqs[2]["body"]["input"]
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    }
    assert f"name: {SKILL}" in outputs["call_scripted_0"]  # Codex's shell printed our SKILL.md to the model
    assert "use_tp_pp_dp_mapping" in str(outputs["call_scripted_1"])

    t = read_transcript(rec["transcript"])
    assert [s.how for s in t.loaded(SKILL)] == ["command"]
    assert_check_ran_and_case_passed(rec, t)


def test_codex_negative_case_end_to_end(runs):
    rec = runs(runner.CODEX, NEGATIVE)
    assert rec["exit_code"] == 0
    reqs = [r for r in requests_of(rec) if r.get("dialect") == "responses"]
    assert listed_in(reqs[0]["body"], SKILL), "the skill was installed, so Codex must offer it"
    t = read_transcript(rec["transcript"])
    assert t.loaded(SKILL) == [] and t.commands == []
    assert rec["grade"]["passed"] is None and rec["grade"]["decided_by"] is None, json.dumps(rec["grade"], indent=1)


# ------------------------------------------------------------------------------------------- the CLI entry


def test_run_command_writes_results_that_report_reads(tmp_path, skills_cli):
    """`python3 -m evals run` then `python3 -m evals report`: the whole CLI path, labelled scripted throughout."""
    _cli_or_skip(runner.CLAUDE)
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
    if skills_cli and not os.environ.get("SKILLS_CLI"):
        env["SKILLS_CLI"] = shlex.join(skills_cli)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "evals",
            "run",
            "--agent",
            "claude-code",
            "--cases",
            NEGATIVE,
            POSITIVE[runner.CLAUDE],
            "--both",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    # The no-skill baseline of the positive case fails its grade, so the run exits 1.
    assert proc.returncode == 1, proc.stdout + proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["agent"] == "claude-code" and results["scripted_model"] is True
    assert sm.SCRIPTED_LABEL in results["note"]
    runs = {(r["case"], r["with_skill"]): r for r in results["runs"]}
    assert set(runs) == {
        (NEGATIVE, True),
        (NEGATIVE, False),
        (POSITIVE[runner.CLAUDE], True),
        (POSITIVE[runner.CLAUDE], False),
    }
    assert runs[(POSITIVE[runner.CLAUDE], True)]["grade"]["passed"] is True
    assert runs[(POSITIVE[runner.CLAUDE], False)]["grade"]["passed"] is False
    assert all(Path(r["transcript"]).is_file() for r in results["runs"])

    tables = tmp_path / "tables"
    rep = subprocess.run(
        [
            sys.executable,
            "-m",
            "evals",
            "report",
            str(out / "results.json"),
            "--out-dir",
            str(tables),
            "--format",
            "json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rep.returncode == 0, rep.stderr
    summary = json.loads((tables / "evals_claude-code.json").read_text())
    assert "scripted model" in summary["title"]


# ------------------------------------------------------------------------------------------- every case, both ways


@pytest.fixture(scope="module")
def every_run(tmp_path_factory, skills_cli, cases):
    """(agent, case, variant) -> run record, for every case with both CLIs, run in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    out = tmp_path_factory.mktemp("e2e-all")
    clis = {agent: _cli_or_skip(agent) for agent in runner.AGENTS}
    scripts = {v: runner.scripted_cases(variant=v) for v in runner.VARIANTS}
    jobs = [(a, c, v) for a in runner.AGENTS for c in ALL_CASES for v in runner.VARIANTS]
    # One real `skills add` per agent, copied into each run: the install does not depend on the case, and the
    # install itself is tested run by run above (and in test_install.py, test_agentskills_validate.py).
    installs = {a: runner.prepare_installation(skills_cli, a, out / f"install-{a}") for a in runner.AGENTS}

    def one(job):
        agent, case_id, variant = job
        return job, runner.run_attempt(
            agent=agent,
            case=cases[case_id],
            attempt=1 if variant == "good" else 2,  # attempt-2 holds the bad replay, beside the good one
            with_skill=True,
            out=out / variant,
            cli=clis[agent],
            skills_cli=skills_cli,
            script_path=scripts[variant][case_id],
            installation=installs[agent],
        )

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return dict(pool.map(one, jobs))


def _regraded(rec: dict, case: dict, agent: str, judge: str) -> dict:
    """The run's transcript graded again with JUDGE, from the runner's own invocation record and project."""
    from evals import grader
    from evals.transcripts import load_meta

    meta = load_meta(rec["transcript"] + ".meta.json", rec["meta_sha256"])
    project = Path(rec["transcript"]).parent / "project"
    return grader.grade(case, rec["transcript"], agent=agent, meta=meta, judge=judge, workspace=project)


# A scripted stand-in for a language model judge that passes whatever it is asked about (tests/scripted_judge.py): it
# shows the judge's verdict deciding the runs no file decides, and that no judge can rescue a run the evidence failed.
LENIENT_JUDGE = f"{sys.executable} {ROOT / 'tests' / 'scripted_judge.py'} pass"


@pytest.mark.parametrize("agent", runner.AGENTS)
@pytest.mark.parametrize("case_id", ALL_CASES)
def test_every_case_end_to_end_good_passes_bad_fails(every_run, cases, agent, case_id):
    good, bad = every_run[(agent, case_id, "good")], every_run[(agent, case_id, "bad")]
    for rec in (good, bad):
        assert rec["exit_code"] == 0, Path(rec["transcript"]).parent.joinpath("stderr.txt").read_text()[-1500:]
        assert rec["grade"] is not None, "the CLI wrote no readable transcript"
        t = read_transcript(rec["transcript"])
        assert t.final_answer.startswith(sm.SCRIPTED_LABEL), t.final_answer[:200]
    g = good["grade"]
    failed = {d: v["evidence"] for d, v in g["dimensions"].items() if v["passed"] is False}
    assert not failed, json.dumps(failed, indent=1)
    if CHECKS[case_id].outcome is not None:
        # the file the case asks for decides: a pass without any judge
        assert g["passed"] is True and g["decided_by"] == "outcome", json.dumps(g["dimensions"], indent=1)[:3000]
    else:
        # prose only: not judged without a judge, never passed; a judge's verdict decides it
        assert g["passed"] is None and g["decided_by"] is None, json.dumps(g["dimensions"], indent=1)[:3000]
        judged = _regraded(good, cases[case_id], agent, LENIENT_JUDGE)
        assert judged["passed"] is True and judged["decided_by"] == "judge", judged["judge"]
        assert judged["judge"]["status"] == "judged" and "scripted_judge.py" in judged["judge"]["name"]
    b = bad["grade"]
    failed = {d: v["evidence"] for d, v in b["dimensions"].items() if v["passed"] is False}
    assert b["passed"] is False and failed, (
        "the scripted wrong answer passed: " + json.dumps(b["dimensions"], indent=1)[:3000]
    )
    assert all(failed.values())  # every failed dimension says why
    # the evidence failed it: a lenient judge cannot pass it
    assert _regraded(bad, cases[case_id], agent, LENIENT_JUDGE)["passed"] is False
