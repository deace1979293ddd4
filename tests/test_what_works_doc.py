"""``benchmarks/what_works_doc.py``: references/what-works.md from measured rows only (TEST FIXTURE input)."""

from __future__ import annotations

import json
import re

import what_works_doc as doc
from conftest import FIXTURES, ROOT
from mfsdp_lib import what_works

FIXTURE = FIXTURES / "what_works" / "what_works_TEST_FIXTURE.json"


def test_render_one_table_with_footnotes():
    rows = what_works.load(str(FIXTURE))
    text = doc.render(rows, "fixture.json")
    table = [ln for ln in text.splitlines() if ln.startswith("| ")]
    assert table[0] == "| family | pretrain | SFT | PEFT (LoRA) |"
    assert [ln.split(" | ")[0] for ln in table[1:]] == ["| qwen3", "| deepseek_v3"]  # planned olmoe row left out
    assert "**passes** (1 GPU)" in text and "1,234 tok/s/GPU compute" in text
    assert "**failed at wrap** (256 GPUs, PP set to 1)" in text
    assert "TP2 PP8 EP32 DP16 -> TP2 EP32 DP128" in text
    notes = text.split("## Notes", 1)[1]
    assert "FIXTURE ERROR: invented for the tests" in notes and "rule: no rule" in notes
    assert "model.moe_token_dispatcher_type=alltoall" in notes
    assert "state +10.0%, peak +10.0%" in notes  # the memory miss is a footnote
    # every footnote number used in the table is defined, and none is left unused
    used = {int(x) for ln in table for x in re.findall(r"\[(\d+)\]", ln)}
    defined = {int(m) for m in re.findall(r"^(\d+)\. ", notes, re.M)}
    assert used == defined == set(range(1, len(defined) + 1))


def test_cells_name_the_gpu_only_when_rows_were_measured_on_more_than_one():
    rows = what_works.load(str(FIXTURE))
    assert " on H" not in doc.render(rows, "f.json")  # one kind of GPU: the line under the table says which
    measured = [r for r in rows if (r.get("measured") or {}).get("device")]
    assert measured, "the fixture has measured rows"
    other = json.loads(json.dumps(measured[0]))
    other["measured"]["device"] = "NVIDIA H100 80GB HBM3"
    mixed = doc.render([other, *[r for r in rows if r is not measured[0]]], "f.json")
    assert "tok/s/GPU compute on H100" in mixed
    assert doc.gpu_name("NVIDIA H200") == "H200" and doc.gpu_name(None) == "one GPU"


def test_says_how_many_rows_were_timed_alone_and_notes_one_that_was_not():
    rows = json.loads(json.dumps(what_works.load(str(FIXTURE))))
    measured = [r for r in rows if (r.get("measured") or {}).get("device")]
    for r in measured:
        r["measured"].update(timing_exclusive=True, engines_at_once=4)
    text = doc.render(rows, "f.json")
    assert f"{len(measured)} of the {len(measured)} measured rows were built, wrapped and timed alone" in text
    assert "up to 4 rehearsals were alive at once" in text and "no shared lock" not in text
    measured[0]["measured"]["timing_exclusive"] = False
    text = doc.render(rows, "f.json")
    assert f"{len(measured) - 1} of the {len(measured)} measured rows" in text
    assert f"{measured[0]['recipe']}: timed while another run of its batch could use the GPU (no shared lock)" in text


def test_refuses_without_measured_rows(tmp_path, capsys):
    planned = tmp_path / "planned.json"
    data = json.loads(FIXTURE.read_text())
    for r in data["rows"]:
        r["phases"] = dict.fromkeys(what_works.PHASES, "not run")
    planned.write_text(json.dumps(data))
    out = tmp_path / "what-works.md"
    assert doc.main(["--results", str(planned), "--write", str(out)]) == 1
    assert not out.exists()
    assert "not measured yet" in capsys.readouterr().err


def test_write_then_check_detects_drift(tmp_path):
    out = tmp_path / "what-works.md"
    assert doc.main(["--results", str(FIXTURE), "--write", str(out)]) == 0
    assert doc.main(["--results", str(FIXTURE), "--check", str(out)]) == 0
    out.write_text(out.read_text() + "edited\n")
    assert doc.main(["--results", str(FIXTURE), "--check", str(out)]) == 1


def test_no_reference_without_results():
    """references/what-works.md exists only when the results it is generated from do."""
    md = ROOT / "references" / "what-works.md"
    results = ROOT / "benchmarks" / "results" / "what_works_1xh200.json"
    if md.exists():
        assert results.exists()
        assert doc.main(["--results", str(results), "--check", str(md)]) == 0


def test_a_passing_row_above_an_h100s_memory_says_it_does_not_fit_the_gpu_its_recipe_names():
    """A recipe named for the H100 whose rank peaked above what an 80 GB H100 gives a process gets a footnote, with
    memory's prediction when there is one; a row within the H100, or one not named for it, gets none."""
    rows = {r["id"]: r for r in what_works.load(str(ROOT / "benchmarks/results/what_works_1xh200.json"))}
    page = doc.render(
        [rows["qwen3_vl_8b_sft_2gpu_h100_bf16"], rows["wan_1_3b_text2image_pretrain_1gpu_h100_bf16"]], "f"
    )
    assert "its measured peak, 95.1 GiB, is more than an 80 GB H100 gives a process (79.18 GiB)" in page
    assert "says so before a run" in page and "`memory` gives no prediction for it" in page  # Wan is not sized
    small = rows["llama32_1b_sft_1gpu_h100_bf16"]
    assert "80 GB H100" not in doc.render([small], "f")
    other = {**rows["qwen3_vl_8b_sft_2gpu_h100_bf16"], "id": "qwen3_vl_8b_sft_2gpu_b200_bf16"}
    assert "80 GB H100" not in doc.render([other], "f")


def test_every_under_predicted_row_names_where_its_gap_is_explained():
    """A row `memory` under-predicts by more than the matrix's 1 % says where the references name the gap and the
    headroom to keep; the named paragraph exists (its bold lead-in), and no entry points at a row that is not
    under-predicted."""
    result = json.loads((ROOT / "benchmarks" / "results" / "what_works_1xh200.json").read_text())
    under = {
        r["id"]
        for r in result["rows"]
        if min((r.get("memory_check") or {}).get(k) or 0 for k in ("state_error", "peak_error")) < -0.01
    }
    assert under == set(doc.NAMED_MEMORY_GAPS), under
    for rid, (path, lead) in doc.NAMED_MEMORY_GAPS.items():
        assert f"- **{lead}" in (ROOT / path).read_text(), (rid, path, lead)
    page = (ROOT / "references" / "what-works.md").read_text()
    assert all(
        f"the gap is named, with the headroom to keep, in {p} ({lead})" in page
        for p, lead in doc.NAMED_MEMORY_GAPS.values()
    )


def test_coverage_counts_every_family_and_mode_of_the_corpus_and_lists_what_is_not_measured():
    """Every recipe family belongs to exactly one family as users name them; every family x mode cell of the
    corpus has a measured row (the matrix's goal); the page says so, and lists each planned recipe not measured
    yet as an expectation, never as a verdict."""
    import bench_what_works as bw

    members = [f for group in bw.FAMILY_GROUPS.values() for f in group]
    assert sorted(members) == sorted(name for name, _ in bw.FAMILIES)
    plan = json.loads((ROOT / "benchmarks" / "what_works_plan.json").read_text())["rows"]
    rows = what_works.load(str(ROOT / "benchmarks" / "results" / "what_works_1xh200.json"))
    cells = {(bw.group_of(r["family"]), r["mode"]) for r in plan}
    have = {(bw.group_of(r["family"]), r["mode"]) for r in rows}
    assert None not in {c[0] for c in cells} and cells <= have, sorted(cells - have, key=str)
    page = (ROOT / "references" / "what-works.md").read_text()
    assert f"{len(cells)} of the corpus's {len(cells)} family x mode cells have a measured row" in page
    pending = [r for r in plan if r["id"] not in {x["id"] for x in rows}]
    assert all(f"- `{r['recipe']}` ({r['family']}, {r['mode']}): expected: " in page for r in pending)
    section = doc.coverage(rows[:1], plan)
    assert any("Cells with no measured row:" in line for line in section)  # a partial matrix names its gaps
