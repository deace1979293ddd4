"""``benchmarks/gpu_regen_check.py``: a fresh GPU run against the recorded one.

Run on the recorded H200 reports themselves (a run reproduces itself), then on copies changed the
way a regression would change them (a peak 2 % higher, a failure in another phase, a setting no
longer applied): each change must be named, and a sub-percent wobble must not be.
"""

from __future__ import annotations

import copy
import json
import shutil

import gpu_regen_check as grc
import raw_store

RAW = raw_store.folder()  # the recorded runs, extracted from benchmarks/results/raw.tar.xz
RUNS = (
    "A_llama1b_n8_optim_grads_params",
    "B_pp2_llama1b_n8_optim_grads_params",
    "C_saveload_llama1b_n8_optim_grads_params",
)


def _rep(name: str) -> dict:
    return json.loads((RAW / "rehearse_1xh200" / name / "report.json").read_text())


def test_every_recorded_rehearsal_reproduces_itself():
    for d in sorted((RAW / "rehearse_1xh200").glob("*/report.json")):
        rep = json.loads(d.read_text())
        assert grc.compare_rehearsal(rep, copy.deepcopy(rep)) == [], d.parent.name


def test_a_higher_peak_a_moved_failure_and_a_lost_setting_are_named():
    rec = _rep(RUNS[0])
    fresh = copy.deepcopy(rec)
    fresh["memory"]["peak_allocated_bytes"] = int(rec["memory"]["peak_allocated_bytes"] * 1.02)
    fresh["settings_applied"] = fresh["settings_applied"][1:]
    diffs = grc.compare_rehearsal(rec, fresh)
    assert any(d.startswith("memory.peak_allocated_bytes") and "2.00%" in d for d in diffs)
    assert any(d.startswith("settings_applied") for d in diffs)
    failed = _rep(RUNS[1])
    moved = copy.deepcopy(failed)
    moved["first_failure"]["phase"] = "model_build"
    assert any(d.startswith("first_failure.phase") for d in grc.compare_rehearsal(failed, moved))


def test_a_wobble_inside_the_tolerance_and_paths_are_not_differences():
    rec = _rep(RUNS[2])
    fresh = copy.deepcopy(rec)
    fresh["memory"]["peak_allocated_bytes"] += rec["memory"]["peak_allocated_bytes"] // 500  # 0.2 %
    for row in fresh["settings_applied"]:
        if row["key"] in grc.PATH_SETTINGS:
            row["value"] = "/elsewhere/checkpoint"
    fresh["started_utc"] = "2030-01-01T00:00:00+00:00"
    assert grc.compare_rehearsal(rec, fresh) == []


def test_the_command_compares_a_results_folder_and_exits_by_verdict(tmp_path, capsys):
    fresh = tmp_path / "fresh"
    for name in RUNS:
        shutil.copytree(RAW / "rehearse_1xh200" / name, fresh / name)
    (fresh / "Z_not_recorded").mkdir()
    (fresh / "Z_not_recorded" / "report.json").write_text("{}")
    assert grc.main(["rehearse", str(fresh)]) == 0
    out = capsys.readouterr().out
    assert all(f"{n}: agrees" in out for n in RUNS) and "Z_not_recorded: not compared (no recorded run)" in out
    path = fresh / RUNS[0] / "report.json"
    rep = json.loads(path.read_text())
    rep["params"]["local_numel"] += 1
    path.write_text(json.dumps(rep))
    assert grc.main(["rehearse", str(fresh)]) == 1
    assert "params.local_numel" in capsys.readouterr().out
    assert grc.main(["rehearse", str(tmp_path / "empty")]) == 2


def test_smoke_records_compare_counts_verdicts_and_memory(tmp_path, capsys):
    rec = json.loads((RAW / "gpu_smoke_1xh200" / "smoke_rank0.json").read_text())
    assert grc.compare_smoke(rec, copy.deepcopy(rec)) == []
    fresh = copy.deepcopy(rec)
    fresh["save_resume"]["equal"] = False
    fresh["model_state_bytes"] = int(rec["model_state_bytes"] * 1.05)
    diffs = grc.compare_smoke(rec, fresh)
    assert any(d.startswith("save_resume.equal") for d in diffs) and any(
        d.startswith("model_state_bytes") for d in diffs
    )
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(rec))
    assert grc.main(["smoke", str(path)]) == 0 and "smoke: agrees" in capsys.readouterr().out
    assert grc.main(["smoke", str(tmp_path / "absent.json")]) == 2


def test_a_small_absolute_wobble_passes_and_a_large_one_does_not():
    rec = _rep(RUNS[0])
    phase = rec["phases"]["tokenizer"]
    fresh = copy.deepcopy(rec)
    fresh["phases"]["tokenizer"]["peak_allocated_bytes"] = phase["peak_allocated_bytes"] + 64 * 2**20
    assert grc.compare_rehearsal(rec, fresh) == []  # whole allocator blocks before any model exists
    fresh["phases"]["tokenizer"]["peak_allocated_bytes"] = phase["peak_allocated_bytes"] + 256 * 2**20
    assert any(d.startswith("phases.tokenizer.peak_allocated_bytes") for d in grc.compare_rehearsal(rec, fresh))


def _double_counted(rep: dict) -> dict:
    bad = copy.deepcopy(rep)
    opt = bad["optimizer_state"]
    opt["state_numel"] *= 2
    opt["updated_param_numel"] *= 2
    opt["inner_optimizers"] = opt["inner_optimizers"] * 2
    return bad


def test_optimizer_counts_are_judged_against_the_parameter_count():
    good = _rep("A_llama1b_n8_distopt")  # the distributed optimizer at N = 8: Adam over 1/8 of the parameters
    good["optimizer_state"]["state_numel"] = 2 * good["params"]["local_trainable_numel"] // 8
    good["optimizer_state"]["updated_param_numel"] = good["params"]["local_trainable_numel"] // 8
    good["optimizer_state"]["inner_optimizers"] = ["FusedAdam"]
    assert grc.optimizer_counts_consistent(_rep(RUNS[0])) is None  # FSDP: DTensor moments count globally
    assert grc.optimizer_counts_consistent(good) is True
    bad = _double_counted(good)
    assert grc.optimizer_counts_consistent(bad) is False
    # A recorded run that counted one optimizer twice: named in a note, not a difference of the fresh code.
    assert grc.compare_rehearsal(bad, good) == []
    assert grc.recorded_count_errors(bad, good) and "disagree" in grc.recorded_count_errors(bad, good)[0]
    # A fresh run whose counts disagree with its own parameters is a difference.
    diffs = grc.compare_rehearsal(good, bad)
    assert any(d.startswith("optimizer_state.state_numel") for d in diffs)
    assert grc.recorded_count_errors(good, bad) == []
