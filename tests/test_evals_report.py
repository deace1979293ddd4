"""report: results of 'run' -> benchmarks/results/evals_<agent>.json with the uplift over no-skill runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evals import grader, report  # noqa: E402
from evals.transcripts import UnreadableTranscript  # noqa: E402

HAND = ROOT / "tests" / "fixtures" / "transcripts"
SHAPE = {"benchmark", "title", "date", "machine", "command", "columns", "rows", "notes", "raw"}


def _run(case_id, name, with_skill, attempt=1):
    g = grader.grade(grader.get_case(case_id), HAND / name)
    return {"case": case_id, "attempt": attempt, "with_skill": with_skill, "transcript": name, "grade": g}


def _results(scripted=True, agent="claude-code"):
    c = "mfsdp-ckpt-format-assertion"
    return {
        "agent": agent,
        "scripted_model": scripted,
        "cli_version": "2.1.332",
        "date": "2026-12-02T18:00:00+00:00",
        "machine": "test host",
        "command": "python3 -m evals run --agent claude-code --attempts 2",
        "runs": [
            _run(c, "claude_pass_ckpt_assertion.jsonl", True, 1),  # passes all five
            _run(c, "claude_fail_security_rm_env.jsonl", True, 2),  # fails security only
            _run(c, "claude_fail_discoverability_not_loaded.jsonl", False, 1),  # baseline: no skill
            {"case": c, "attempt": 2, "with_skill": False, "transcript": None, "grade": None},  # CLI crashed
            _run("decoy-cuda-graphs", "claude_pass_decoy_cuda_graphs.jsonl", True),
            _run("decoy-cuda-graphs", "claude_pass_decoy_cuda_graphs.jsonl", False),
        ],
    }


def _row(summary, name):
    return next(r for r in summary["rows"] if r[0] == name)


def test_rates_and_uplift_per_dimension():
    summary, cases = report.build([_results()])
    assert set(summary) >= SHAPE and set(cases) >= SHAPE
    assert summary["benchmark"] == "evals_claude-code" and cases["benchmark"] == "evals_claude-code_cases"
    assert summary["columns"] == ["Dimension", "Runs with skill", "With skill", "Without skill", "Uplift"]
    # with skill: 3 runs (pass, security-fail, decoy pass); without: 3 (no-load, crashed, decoy pass)
    assert _row(summary, "Security") == ["Security", 3, "67%", "67%", "+0 pp"]
    assert _row(summary, "Discoverability") == ["Discoverability", 3, "100%", "33%", "+67 pp"]
    assert _row(summary, "All five (case passes)") == ["All five (case passes)", 3, "67%", "33%", "+33 pp"]
    assert summary["raw"]["rates"]["all"] == {"with_skill": pytest.approx(2 / 3), "without_skill": pytest.approx(1 / 3)}
    per_case = {r[0]: r for r in cases["rows"]}
    assert per_case["mfsdp-ckpt-format-assertion"] == [
        "mfsdp-ckpt-format-assertion",
        2,
        "50%",
        2,
        "0%",
        "+50 pp",
        "security",
    ]
    assert per_case["decoy-cuda-graphs"][2] == "100%"


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
    assert _row(summary, "Security")[3:] == ["n/a", "n/a"]
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
