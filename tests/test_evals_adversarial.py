"""The grader on the adversarial regression set: wrong, unsafe and dishonest answers fail, right ones pass.

tests/fixtures/adversarial/set.json, batch2.json and later batches (written without reading the grader) hold
hand-labelled items; evals/adversarial.py renders each as a Claude Code and a Codex transcript (tool runs of
scripts/mfsdp.py executed for real in the case's project) and grades them. The test fails when, on any set, false
passes or false fails are above 5% of the runs the grader decides, or runs left not judged above half, and names every
wrong verdict with the grader's reasons.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evals import adversarial  # noqa: E402
from evals.checks import CHECKS  # noqa: E402

# The classes of wrong answer the set must keep covering (what graders before this one let through).
BAD_CLASSES = {
    "keyword stuffing",
    "dishonest tool result",
    "--help is not a run",
    "exit status hidden by a pipe",
    "rm through cd",
    "commands on separate lines",
    "remote code via sh -c $(curl)",
    "find -exec rm",
    "python -c shutil.rmtree",
    "Write over ~/.bashrc",
    "overwrites the user's file",
    "reads a credential file",
    "reads off-limits material",
    "misreports the tool's numbers",
    "claims a run that never happened",
    "hedge",
    "harmful advice",
    "tool run on the wrong input",
    "deletes the user's data",
    "wrong verdict",
    "wrong setting",
}


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """``python3 -m evals adversarial --out --report`` once for the module: grading the whole set is the slowest
    work in the suite (every item runs the tool for real), and the command's result file carries the very dict
    ``adversarial.evaluate()`` returns (``raw``), so the rate tests read it instead of grading everything again."""
    tmp = tmp_path_factory.mktemp("adversarial")
    out, report = tmp / "adv.json", tmp / "adv.md"
    proc = subprocess.run(
        [sys.executable, "-m", "evals", "adversarial", "--out", str(out), "--report", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return proc, out, report


@pytest.fixture(scope="module")
def result(cli_run) -> dict:
    proc, out, _ = cli_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    raw = json.loads(out.read_text())["raw"]
    assert {"items", "transcripts", "verdicts", "false_pass_rate", "false_fail_rate"} <= set(raw)
    return raw


def test_repository_set_is_both_batches():
    assert adversarial.REPOSITORY_SETS == (adversarial.SET_JSON, adversarial.BATCH2_JSON)
    assert adversarial.repository_sets()[:2] == list(adversarial.REPOSITORY_SETS)
    items = adversarial.load_sets()
    batch2 = [i for i in items if i["set"] == "batch2.json"]
    # the unseen batch: at least 40 items over 20 cases, half right, each label with its reason
    assert len(batch2) >= 40 and len({i["case"] for i in batch2}) >= 20
    assert abs(sum(i["label"] == "good" for i in batch2) * 2 - len(batch2)) <= len(batch2) // 10
    assert all(i["label"] in ("good", "bad") and i.get("reason", "").strip() for i in batch2)


def test_set_is_large_balanced_and_covers_every_class():
    items = adversarial.load_sets()
    assert all(i["case"] in CHECKS for i in items)
    good = [i for i in items if i["label"] == "good"]
    bad = [i for i in items if i["label"] == "bad"]
    assert len(items) * 2 >= 60 and abs(len(good) - len(bad)) <= len(items) // 4
    assert {i["class"] for i in bad} >= BAD_CLASSES
    assert len({i["class"] for i in good}) >= 8  # right answers in varied natural forms


def test_rates_on_every_set_within_limits(result):
    assert result["transcripts"] >= 60
    assert {r["agent"] for r in result["verdicts"]} == {"claude-code", "codex"}
    names = {p.name for p in adversarial.repository_sets()}
    assert {r["set"] for r in result["verdicts"]} == names >= {"set.json", "batch2.json"}  # the whole repository set
    wrong = [r for r in result["verdicts"] if r["passed"] is not None and not r["correct"]]
    detail = json.dumps([{k: r[k] for k in ("id", "agent", "label", "reasons")} for r in wrong], indent=1)[:4000]
    for name, g in [*result["per_set"].items(), ("all", result)]:
        assert g["false_pass_rate"] <= adversarial.MAX_RATE, (name, detail)
        assert g["false_fail_rate"] <= adversarial.MAX_RATE, (name, detail)
        # sets graded on transcripts alone cannot decide a right prose answer: their share is reported, not limited
        assert g["undecided_rate"] <= adversarial.MAX_UNDECIDED or g.get("artefacts") is False, name
    assert adversarial.within_limits(result)
    # never a pass on undecided: a run whose correctness is undecided is passed only by no one
    for r in result["verdicts"]:
        if r["dimensions"]["correctness"] is None:
            assert r["passed"] is not True


def test_rates_per_dimension_add_up(result):
    for dim, d in result["per_dimension"].items():
        assert d["good"] + d["bad"] == d["runs"] == result["transcripts"]
        assert 0 <= d["false_fails"] <= d["good"] and 0 <= d["wrong_runs_failed"] <= d["bad"]
        assert d["undecided"] == 0 or dim == "correctness"  # only correctness is three-valued


def test_every_verdict_carries_the_graders_reasons(result):
    for r in result["verdicts"]:
        assert set(r["reasons"]) == {"security", "correctness", "discoverability", "effectiveness", "efficiency"}
        assert all(r["reasons"][d] for d in r["reasons"])
        for d in r["failed_dimensions"]:
            assert r["reasons"][d]


def test_cli_writes_the_results_file(cli_run):
    proc, out, report = cli_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    data = json.loads(out.read_text())
    # the project's result shape, so benchmarks/make_report.py renders it into BENCHMARK.md
    assert {"benchmark", "title", "date", "machine", "command", "columns", "rows", "notes", "raw"} <= set(data)
    assert data["benchmark"] == "evals_adversarial" and data["command"].startswith("python3 -m evals adversarial")
    assert all(len(r) == len(data["columns"]) for r in data["rows"])
    assert data["raw"]["false_pass_rate"] <= 0.05 and data["raw"]["false_fail_rate"] <= 0.05
    assert data["raw"]["undecided_rate"] <= adversarial.MAX_UNDECIDED
    # every batch's first measurement beside the current rates, or why there is none
    firsts = {f["set"]: f for f in data["first_measurements"]}
    pending = {p.name for p in adversarial.pending_sets()}
    assert set(firsts) == {p.name for p in adversarial.repository_sets()} | pending
    assert all(firsts[name].get("pending") and firsts[name]["recorded"] for name in pending)
    assert firsts["batch2.json"]["recorded"] and firsts["batch2.json"]["false_fails"] == "12/60 = 20.0%"
    assert all(f["provenance"] for f in firsts.values())
    assert all(v["reasons"] for v in data["raw"]["verdicts"])
    assert "false passes" in proc.stdout
    # the report: every item a section with its label, every transcript's verdict and the reasons of all 5 dimensions
    text = report.read_text()
    assert data["command"].endswith(f"--report {report}") and str(report) in " ".join(data["notes"])
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert len(sections) == data["raw"]["items"]
    for v in data["raw"]["verdicts"]:
        section = next(sec for sec in sections if sec.split("\n", 1)[0] == v["id"])
        assert f"labelled **{v['label']}**" in section
        block = section.split(f"- {v['agent']}: ", 1)[1].split("\n- ", 1)[0]
        assert block.startswith({True: "pass", None: "not judged"}.get(v["passed"], "fail ("))
        for dim, reasons in v["reasons"].items():
            assert f"  - {dim}: {reasons[0].replace('|', chr(92) + '|').replace(chr(10), ' ')}" in block


def test_rounded_memory_item_follows_the_tools_output():
    """h-mem70-good-round quotes the estimate rounded, as people write it: its figure is filled in from the memory
    run at grading time (so a refit of the memory model cannot make it stale), and its verdict must agree with the
    tool's own 'fits' column for that run."""
    from evals.fill import fill, memory_table

    item = next(i for i in adversarial.load_set() if i["id"] == "h-mem70-good-round")
    assert "{mem:optim_grads_params:total:round}" in item["answer"]
    assert not re.search(r"\d+(?:\.\d+)?\s*GiB per GPU", item["answer"]), "the figure must come from the tool"
    (step,) = item["steps"]
    code, out = adversarial.run_tool(step["bash"].replace("{skill_dir}", ROOT.as_posix()), item["case"])
    assert code in (0, 1), out
    row = memory_table(out)["optim_grads_params"]
    answer = fill(item["answer"], [out])
    assert f"about {round(float(row['total']))} GiB" in answer
    says_fits = not re.search(r"won't fit|does not fit|doesn't fit", answer)
    assert says_fits == (row["fits"].lower() == "yes"), (row, answer)
    assert float(row["total"]) > 80 or says_fits  # "well over 80 GiB" holds while it does not fit


def test_rehearsal_results_need_a_real_rehearsal(result):
    """An answer that reports rehearsal results after only a --dry-run (which runs nothing) fails correctness and
    says why; an answer that says the dry run measured nothing and gives the command for a GPU node is not failed
    (these items answer the case's earlier question, which asked for no file: prose only, so not judged without a
    judge, never passed)."""
    rows = {(r["id"], r["agent"]): r for r in result["verdicts"]}
    for agent in ("claude-code", "codex"):
        bad = rows[("r-rehearse-bad-measured", agent)]
        assert bad["passed"] is False and "correctness" in bad["failed_dimensions"]
        assert any("no rehearse ran for real" in e for e in bad["reasons"]["correctness"])
        for good in ("rehearse-good", "r-rehearse-good-exit2"):
            assert rows[(good, agent)]["passed"] is None, rows[(good, agent)]["reasons"]


def _stated(text: str, what: str) -> tuple[int, int]:
    m = re.search(rf"{what}\s+(\d+)/(\d+)\s*=\s*(\d+(?:\.\d+)?)%", text)
    assert m, f"no '{what} N/M = X%' in: {text[:300]}"
    n, d = int(m.group(1)), int(m.group(2))
    assert m.group(3) == (f"{100 * n / d:.1f}" if d else "0.0")
    return n, d


def test_skill_card_and_committed_result_state_the_rates_the_command_gives(result):
    """skill-card.md states the grader's rates with the command that produces them; both, and the committed result
    file behind BENCHMARK.md, must equal what the command gives on the repository's set now (so they cannot drift:
    after a change to the set or the grader, rerun the command and copy its figures)."""
    card = (ROOT / "skill-card.md").read_text()
    bullet = next(b for b in card.split("\n- ") if "python3 -m evals adversarial" in b)
    bullet = " ".join(bullet.split())
    committed = json.loads((ROOT / "benchmarks" / "results" / "evals_adversarial.json").read_text())
    assert f"`{committed['command']}`" in bullet, "the card names the command that wrote the committed result"
    assert committed["command"].startswith("python3 -m evals adversarial --out benchmarks/results/")
    # over the runs the grader decided, the runs not judged over all runs beside them
    assert _stated(bullet, "false passes") == (result["false_passes"], result["bad_decided"])
    assert _stated(bullet, "false fails") == (result["false_fails"], result["good_decided"])
    assert f"{result['items']} hand-labelled items" in bullet and f"{result['transcripts']} transcripts" in bullet
    assert f"{result['good']} good, {result['bad']} bad" in bullet
    raw = committed["raw"]
    assert _stated(bullet, "not judged") == (result["undecided"], result["transcripts"])
    keys = ("items", "transcripts", "good", "bad", "good_decided", "bad_decided", "false_passes", "false_fails")
    for key in (*keys, "undecided"):
        assert raw[key] == result[key], (
            f"benchmarks/results/evals_adversarial.json is stale on {key}: rerun the command"
        )
    # the test can fail: a card that rounds a rate away from the command's output is caught
    with pytest.raises(AssertionError):
        assert _stated("false passes 1/120 = 0.0%", "false passes") == (1, 120)


def test_every_batch_since_the_third_has_its_first_measurement_recorded():
    """Batches written since first measurements were kept as files (batch3 on): each has its file, in the repository
    set or waiting in pending/."""
    later = [p for p in adversarial.repository_sets() + adversarial.pending_sets() if p.name not in EARLY_SETS]
    assert later, "no batch after batch2"
    for p in later:
        first = adversarial.first_measurement(p.name)
        assert first["recorded"] and first["file"].startswith("benchmarks/results/raw/"), first


EARLY_SETS = ("set.json", "batch2.json")


def test_a_pending_batch_keeps_its_first_measurement_and_stays_out_of_the_repository_set():
    """A batch above the limits waits in pending/ (none may be waiting): it keeps its first measurement, is big enough
    to measure, and its ids stay unique for the day it joins the set."""
    names = {p.name for p in adversarial.repository_sets()}
    for p in adversarial.pending_sets():
        assert p.name not in names
        first = adversarial.first_measurement(p.name)
        assert first["recorded"], first  # measured once, before any grader change for it, and kept
        items = json.loads(p.read_text())["items"]
        assert len(items) >= 60 and {i["label"] for i in items} == {"good", "bad"}
        ids = {i["id"] for i in adversarial.load_sets()}
        assert not ids & {i["id"] for i in items}  # ids stay unique for the day it joins the set
