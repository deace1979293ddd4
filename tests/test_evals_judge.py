"""What a pass means: prose never passes alone; the agent is held to its own tools' real output; the judge decides.

The tool outputs in these transcripts are real: every `scripts/mfsdp.py` step runs in a fresh copy of the case's
project (evals/adversarial.py), and each transcript is rendered in both CLI formats (Claude Code stream-json,
Codex exec --json). The judges here are scripted stand-ins for a language model (tests/scripted_judge.py): they
test the judge's plumbing, never a model's judgement.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evals import adversarial, grader  # noqa: E402
from evals import judge as judge_mod  # noqa: E402
from evals.transcripts import CLAUDE, CODEX  # noqa: E402

STAND_IN = ROOT / "tests" / "scripted_judge.py"  # a scripted stand-in for a language model judge
AGENTS = (CLAUDE, CODEX)


def _judge_cmd(verdict: str, log: Path | None = None) -> str:
    return f"{sys.executable} {STAND_IN} {verdict}" + (f" --log {log}" if log else "")


def _run(case_id: str, steps: list[dict], answer: str, tmp_path: Path, agent: str, *, workspace: bool = True):
    """Grade AGENT's transcript of STEPS (tool steps run for real in a copy of the case's project) and ANSWER."""
    proj = tmp_path / f"project-{agent}"
    adversarial.copy_fixture(case_id, proj)
    item = {"id": "t", "case": case_id, "label": "good", "steps": steps, "answer": answer}
    done = adversarial._steps(item, proj)
    events = adversarial.render_claude(item, done) if agent == CLAUDE else adversarial.render_codex(item, done)
    meta = {"cwd": adversarial.WORKSPACE} if agent == CODEX else None
    return events, meta, (proj if workspace else None), done


def _grade(case_id, steps, answer, tmp_path, agent, judge="off", workspace=True):
    events, meta, ws, done = _run(case_id, steps, answer, tmp_path, agent, workspace=workspace)
    return grader.grade(grader.get_case(case_id), events, agent=agent, meta=meta, workspace=ws, judge=judge), done


def _contradiction(result: dict) -> list[str]:
    return [e for e in result["dimensions"]["correctness"]["evidence"] if "contradicts its own tool" in e]


# ----------------------------------------------------------------------------- 1. prose never passes alone


@pytest.mark.parametrize("agent", AGENTS)
def test_prose_with_every_fact_is_not_judged_without_a_judge(tmp_path, agent):
    """A prose case answered with the case's own ground truth: every required point and nothing against it. Before,
    that was a pass; right words never prove a right answer, so now it is not judged."""
    case = grader.get_case("mfsdp-vs-fsdp2")
    r, _ = _grade(case["id"], [], case["ground_truth"], tmp_path, agent)
    assert r["passed"] is None and r["verdict"] == "not judged" and r["decided_by"] is None
    assert any("prose only" in e for e in r["dimensions"]["correctness"]["evidence"])


@pytest.mark.parametrize("agent", AGENTS)
def test_a_right_file_decides_the_pass(tmp_path, agent):
    steps = [
        {"bash": "python3 {skill_dir}/scripts/mfsdp.py enable --emit overrides --gpus 8 > fsdp_overrides.txt"},
        {"bash": "python3 {skill_dir}/scripts/mfsdp.py check $(cat fsdp_overrides.txt) --gpus 8"},
    ]
    case = grader.get_case("mfsdp-enable-llama3-recipe")
    r, _ = _grade(case["id"], steps, case["ground_truth"], tmp_path, agent)
    assert r["passed"] is True and r["decided_by"] == "outcome", r["dimensions"]["correctness"]["evidence"]


def test_deterministic_fails_stay_without_a_judge(tmp_path):
    answer = "Yes: set checkpoint.load=None in configs/run.yaml."
    r, _ = _grade("trap-load-none-advice", [], answer, tmp_path, CLAUDE, workspace=False)
    assert r["passed"] is False and r["decided_by"] == "deterministic"


# ----------------------------------------------------------------------------- 2. the agent against its own tools


@pytest.mark.parametrize("agent", AGENTS)
def test_failed_check_called_passing_fails(tmp_path, agent):
    """`check` exits 1 with an ERROR (MFSDP-CKPT-FORMAT) and the answer, otherwise right, says the config passes."""
    steps = [{"bash": "python3 {skill_dir}/scripts/mfsdp.py check conf/run_config.yaml --gpus 8"}]
    case = grader.get_case("mfsdp-ckpt-format-assertion")
    answer = (
        "Your config is valid: it passes the checker at 8 GPUs. The assertion comes from checkpoint.save being set "
        "while the format is torch_dist; set checkpoint.ckpt_format=fsdp_dtensor if it ever fires again."
    )
    r, done = _grade(case["id"], steps, answer, tmp_path, agent, workspace=False)
    assert done[0]["exit"] == 1 and "ERROR" in done[0]["output"]  # the tool's real verdict
    assert r["passed"] is False and _contradiction(r), r["dimensions"]["correctness"]["evidence"]
    # the same run answered honestly is not failed for it
    honest = "check exits 1 with MFSDP-CKPT-FORMAT: checkpoint.save is set and the format is torch_dist."
    ok, _ = _grade(case["id"], steps, honest, tmp_path / "ok", agent, workspace=False)
    assert not _contradiction(ok)


@pytest.mark.parametrize("agent", AGENTS)
def test_rejected_value_called_valid_fails(tmp_path, agent):
    """`check` rejects optim_grad_params (exit 2, "is not one of") and the answer calls it a valid alias."""
    steps = [{"bash": "python3 {skill_dir}/scripts/mfsdp.py check configs/run.yaml --gpus 8"}]
    answer = (
        "optim_grad_params is a valid alias of optim_grads_params, so the strategy is fine; the failure must come "
        "from somewhere else. Keep ddp.data_parallel_sharding_strategy as it is."
    )
    r, done = _grade("mfsdp-sharding-strategy-typo", steps, answer, tmp_path, agent, workspace=False)
    assert done[0]["exit"] == 2 and "'optim_grad_params' is not one of" in done[0]["output"]
    assert r["passed"] is False and any("calls 'optim_grad_params' valid" in e for e in _contradiction(r))
    honest = "'optim_grad_params' is not a valid value (a typo); the valid value is optim_grads_params."
    ok, _ = _grade("mfsdp-sharding-strategy-typo", steps, honest, tmp_path / "ok", agent, workspace=False)
    assert not _contradiction(ok), ok["dimensions"]["correctness"]["evidence"]


@pytest.mark.parametrize("agent", AGENTS)
def test_verdict_of_a_run_without_the_users_settings_reported_as_theirs_fails(tmp_path, agent):
    """The user asks about the recipe with the two Megatron FSDP flags; the agent runs `check` on the bare recipe
    (Megatron FSDP off: no findings) and reports what "the checker rejected"."""
    steps = [{"bash": "python3 {skill_dir}/scripts/mfsdp.py check"}]
    answer = (
        "No. The checker rejected it with MFSDP-CKPT-FORMAT: the recipe sets checkpoint.save and checkpoint.load and "
        "its format is torch_dist. Add checkpoint.ckpt_format=fsdp_dtensor."
    )
    r, done = _grade("mfsdp-check-recipe-yaml-defaults", steps, answer, tmp_path, agent, workspace=False)
    assert done[0]["exit"] == 0 and "Megatron FSDP off" in done[0]["output"]
    assert r["passed"] is False and _contradiction(r), r["dimensions"]["correctness"]["evidence"]
    # with the user's two flags the same report is the tool's own verdict
    flags = [
        {"bash": "python3 {skill_dir}/scripts/mfsdp.py check dist.use_megatron_fsdp=true ddp.use_megatron_fsdp=true"}
    ]
    ok, done = _grade("mfsdp-check-recipe-yaml-defaults", flags, answer, tmp_path / "ok", agent, workspace=False)
    assert done[0]["exit"] == 1 and not _contradiction(ok), ok["dimensions"]["correctness"]["evidence"]


@pytest.mark.parametrize("agent", AGENTS)
def test_verdict_of_a_run_on_another_file_reported_as_the_users_fails(tmp_path, agent):
    """The question names configs/llama3_8b.yaml; the agent checks a file of its own and reports the verdict."""
    steps = [
        {"write": "scratch.yaml", "content": "ddp:\n  use_megatron_fsdp: true\ndist:\n  use_megatron_fsdp: true\n"},
        {"bash": "python3 {skill_dir}/scripts/mfsdp.py check scratch.yaml --gpus 32"},
    ]
    answer = "The checker found no errors in your config, so Megatron FSDP can be enabled as it is."
    r, done = _grade("mfsdp-enable-my-yaml", steps, answer, tmp_path, agent, workspace=False)
    assert done[1]["exit"] in (0, 1)
    assert r["passed"] is False and any("never ran on what the question names" in e for e in _contradiction(r))


# ----------------------------------------------------------------------------- 4. the judge


def test_verdict_parsing():
    assert judge_mod.parse_verdict('thinking...\n{"passed": false, "reason": "wrong unit"}') == (False, "wrong unit")
    assert judge_mod.parse_verdict("VERDICT: PASS - states the tool's figures") == (True, "states the tool's figures")
    assert judge_mod.parse_verdict('{"passed": "yes"}')[0] is None
    assert judge_mod.parse_verdict("looks good to me")[0] is None


@pytest.mark.parametrize("agent", AGENTS)
def test_stand_in_judge_decides_a_prose_case_end_to_end(tmp_path, agent):
    """`python3 -m evals grade --judge CMD` on a transcript file: the stand-in gets the case's ground truth, expected
    behaviour and the transcript's real tool output on stdin; its verdict decides and is recorded."""
    case = grader.get_case("mfsdp-average-in-collective-message")
    events, _meta, _ws, _ = _run(case["id"], [], case["ground_truth"], tmp_path, agent)
    path = tmp_path / f"{agent}.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    results = {}
    for verdict in ("pass", "fail", "garbage", "exit3"):
        log = tmp_path / f"prompt-{agent}-{verdict}.txt"
        proc = subprocess.run(
            [sys.executable, "-m", "evals", "grade", "--case", case["id"], str(path), "--agent", agent]
            + ["--format", "json", "--judge", _judge_cmd(verdict, log)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        results[verdict] = (proc.returncode, json.loads(proc.stdout))
        if verdict == "pass":
            prompt = log.read_text()
            assert case["ground_truth"] in prompt and case["expected_behavior"][-1] in prompt
            assert "Skill" in prompt or "SKILL.md" in prompt  # the transcript's own tool calls
    code, r = results["pass"]
    assert code == 0 and r["passed"] is True and r["decided_by"] == "judge"
    assert r["judge"]["status"] == "judged" and r["judge"]["reason"] == "scripted stand-in: pass"
    assert str(STAND_IN) in r["judge"]["name"]
    code, r = results["fail"]
    assert code == 1 and r["passed"] is False and r["decided_by"] == "judge"
    for bad in ("garbage", "exit3"):  # a judge that gives no verdict leaves the run not judged, never passed
        code, r = results[bad]
        assert code == 4 and r["passed"] is None and r["judge"]["status"] == "not judged", r["judge"]


def test_judge_vetoes_a_right_file_but_never_rescues_a_wrong_run(tmp_path):
    steps = [{"bash": "python3 {skill_dir}/scripts/mfsdp.py enable --emit overrides --gpus 8 > fsdp_overrides.txt"}]
    case = grader.get_case("mfsdp-enable-llama3-recipe")
    vetoed, _ = _grade(case["id"], steps, case["ground_truth"], tmp_path, CLAUDE, judge=_judge_cmd("fail"))
    assert vetoed["passed"] is False and vetoed["decided_by"] == "judge"
    wrong, _ = _grade(
        "trap-load-none-advice",
        [],
        "Yes: set checkpoint.load=None.",
        tmp_path / "w",
        CLAUDE,
        judge=_judge_cmd("pass"),
        workspace=False,
    )
    assert wrong["passed"] is False and wrong["decided_by"] == "deterministic"
    assert wrong["judge"]["status"] == "not asked"
