"""report: results of 'run' -> benchmarks/results/evals_<agent>.json with the uplift over no-skill runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evals import adversarial, grader, report  # noqa: E402
from evals.transcripts import UnreadableTranscript  # noqa: E402

HAND = ROOT / "tests" / "fixtures" / "transcripts"
SHAPE = {"benchmark", "title", "date", "machine", "command", "columns", "rows", "notes", "raw"}


def _run(case_id, name, with_skill, attempt=1, judge="off"):
    g = grader.grade(grader.get_case(case_id), HAND / name, judge=judge)
    return {"case": case_id, "attempt": attempt, "with_skill": with_skill, "transcript": name, "grade": g}


def _stand_in_judge(case, transcript):
    """A scripted stand-in for a language model judge: it passes everything it is asked about (tests only)."""
    return {
        "name": "stand-in judge (tests only, not a model)",
        "status": "judged",
        "passed": True,
        "reason": "stand-in",
    }


def _outcome_run(tmp, with_skill=True):
    """A run decided by the file it left: enable's overrides written to fsdp_overrides.txt, graded in its project."""
    case = grader.get_case("mfsdp-enable-llama3-recipe")
    proj = Path(tmp) / "project"
    adversarial.copy_fixture(case["id"], proj)
    steps = [{"bash": "python3 {skill_dir}/scripts/mfsdp.py enable --emit overrides --gpus 8 > fsdp_overrides.txt"}]
    item = {"id": "r", "case": case["id"], "label": "good", "steps": steps, "answer": case["ground_truth"]}
    events = adversarial.render_claude(item, adversarial._steps(item, proj))
    g = grader.grade(case, events, workspace=proj)
    return {"case": case["id"], "attempt": 1, "with_skill": with_skill, "transcript": None, "grade": g}


@pytest.fixture(scope="module")
def outcome_run(tmp_path_factory):
    return _outcome_run(tmp_path_factory.mktemp("outcome"))


def _results(scripted=True, agent="claude-code", outcome=None):
    c = "mfsdp-ckpt-format-assertion"
    extra = [outcome] if outcome else []
    return {
        "agent": agent,
        "scripted_model": scripted,
        "cli_version": "2.1.332",
        "date": "2026-12-02T18:00:00+00:00",
        "machine": "test host",
        "command": "python3 -m evals run --agent claude-code --attempts 2",
        "runs": extra
        + [
            _run(c, "claude_pass_ckpt_assertion.jsonl", True, 1),  # prose only: not judged
            _run(c, "claude_pass_ckpt_assertion.jsonl", True, 3, judge=_stand_in_judge),  # the judge passes it
            _run(c, "claude_fail_security_rm_env.jsonl", True, 2),  # fails security only
            _run(c, "claude_fail_discoverability_not_loaded.jsonl", False, 1),  # baseline: no skill
            {"case": c, "attempt": 2, "with_skill": False, "transcript": None, "grade": None},  # CLI crashed
            _run("decoy-cuda-graphs", "claude_pass_decoy_cuda_graphs.jsonl", True),
            _run("decoy-cuda-graphs", "claude_pass_decoy_cuda_graphs.jsonl", False),
        ],
    }


def _row(summary, name):
    return next(r for r in summary["rows"] if r[0] == name)


def test_rates_and_uplift_per_dimension(outcome_run):
    summary, cases = report.build([_results(outcome=outcome_run)])
    assert set(summary) >= SHAPE and set(cases) >= SHAPE
    assert summary["benchmark"] == "evals_claude-code" and cases["benchmark"] == "evals_claude-code_cases"
    assert summary["columns"][:4] == [
        "Dimension",
        "Runs with skill",
        "Not judged with skill",
        "With skill (of decided)",
    ]
    # with skill: 5 runs (outcome pass, prose only, judge pass, security fail, decoy prose only);
    # without: 3 (no load, crashed, decoy prose only)
    v = summary["raw"]["verdicts"]
    assert v["with_skill"] == {"outcome": 1, "judge": 1, "not_judged": 2, "failed": 1}
    assert v["without_skill"] == {"outcome": 0, "judge": 0, "not_judged": 1, "failed": 2}
    # rates and uplift over decided runs only, with the runs left out beside them
    assert _row(summary, "All five (case passes)") == ["All five (case passes)", 5, 2, "67%", 1, "0%", "+67 pp"]
    # a run that failed elsewhere is never sent to the judge, so its correctness stays not judged
    assert _row(summary, "Correctness") == ["Correctness", 5, 3, "100%", 2, "0%", "+100 pp"]
    assert _row(summary, "Security") == ["Security", 5, 0, "80%", 0, "67%", "+13 pp"]
    assert _row(summary, "Discoverability") == ["Discoverability", 5, 0, "100%", 0, "33%", "+67 pp"]
    assert summary["raw"]["rates"]["all"]["with_skill"] == pytest.approx(2 / 3)
    assert summary["raw"]["rates"]["all"]["not_judged_with_skill"] == 2
    notes = " ".join(summary["notes"])
    assert "1 passed as decided by the file" in notes and "1 passed as decided by the judge" in notes
    assert "2 not judged" in notes and "stand-in judge (tests only, not a model)" in notes
    per_case = {r[0]: r for r in cases["rows"]}
    row = per_case["mfsdp-ckpt-format-assertion"]
    assert row[1] == 3 and row[2] == "1 judge, 1 not judged, 1 failed" and row[3] == "50%"
    assert row[4:] == [2, "0%", "+50 pp", "security"]
    assert per_case["decoy-cuda-graphs"][2:4] == ["1 not judged", "n/a"]
    assert per_case["mfsdp-enable-llama3-recipe"][2:4] == ["1 outcome", "100%"]


def test_no_judge_means_prose_runs_are_reported_as_not_judged_never_passed():
    summary, _ = report.build([_results()])
    raw = summary["raw"]["runs"]
    prose = [r for r in raw if r["attempt"] == 1 and r["case"] == "mfsdp-ckpt-format-assertion" and r["with_skill"]]
    assert prose[0]["passed"] is None and prose[0]["decided_by"] is None
    judged = [r for r in raw if r["attempt"] == 3]
    assert judged[0]["passed"] is True and judged[0]["decided_by"] == "judge"
    assert judged[0]["judge"] == {
        "name": "stand-in judge (tests only, not a model)",
        "status": "judged",
        "passed": True,
        "reason": "stand-in",
    }


def test_scripted_runs_are_labelled_everywhere():
    summary, cases = report.build([_results(scripted=True)])
    for obj in (summary, cases):
        assert report.SCRIPTED_LABEL in obj["title"]
        assert any(report.SCRIPTED_LABEL in n for n in obj["notes"])
    real, _ = report.build([_results(scripted=False)])
    assert report.SCRIPTED_LABEL not in real["title"] and not any("scripted" in n for n in real["notes"])


def test_scripted_flag_from_invocation_record_is_enough():
    res = _results(scripted=False)
    res["runs"][0]["grade"]["transcript"]["scripted_model"] = True
    summary, _ = report.build([res])
    assert summary["raw"]["scripted_model"] is True and report.SCRIPTED_LABEL in summary["title"]


def test_no_baseline_means_no_uplift():
    res = _results()
    res["runs"] = [r for r in res["runs"] if r["with_skill"]]
    summary, _ = report.build([res])
    assert _row(summary, "Security")[5:] == ["n/a", "n/a"]
    assert any("uplift not measured" in n for n in summary["notes"])


def test_mixed_agents_are_refused():
    with pytest.raises(UnreadableTranscript, match="one agent"):
        report.build([_results(agent="claude-code"), _results(agent="codex")])


def test_cli_writes_both_files_atomically(tmp_path):
    res = tmp_path / "with.json"
    res.write_text(json.dumps(_results()))
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "evals", "report", str(res), "--out-dir", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == ["evals_claude-code.json", "evals_claude-code_cases.json"]  # no temp files left
    data = json.loads((out / "evals_claude-code.json").read_text())
    assert data["command"] == "python3 -m evals run --agent claude-code --attempts 2"
    assert data["date"] == "2026-12-02T18:00:00+00:00" and len(data["rows"]) == 6
    assert "Security" in proc.stdout and "wrote" in proc.stdout


@pytest.mark.parametrize("content", ["{broken", json.dumps({"agent": "codex"}), json.dumps([1])])
def test_cli_bad_results_exit_2(tmp_path, content):
    res = tmp_path / "r.json"
    res.write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "evals", "report", str(res), "--out-dir", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists()
