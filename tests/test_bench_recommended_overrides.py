"""Every KEY=VALUE the skill recommends is extracted, and the committed plan covers each one (a new one fails here)."""

from __future__ import annotations

import json

import bench_recommended_overrides as bro
from conftest import ROOT

PLAN = json.loads((ROOT / "benchmarks" / "recommended_overrides_plan.json").read_text())


def _pairs(records):
    return {(r["key"], r["value"]) for r in records}


def test_extraction_finds_the_known_sources():
    found = _pairs(bro.extract())
    # enable's five settings and --perf's meta-device init
    for key, value in bro.enable_mod.MINIMAL_OVERRIDES.items():
        assert (key, bro._text(value)) in found
    assert ("model.init_model_with_meta_device", "true") in found
    # a rule's literal fix, and a fix computed from the config (read from its source)
    assert ("dist.use_tp_pp_dp_mapping", "false") in found
    assert ("ddp.reuse_grad_buf_for_mxfp8_param_ag", "false") in found
    # the text: the dtype given as Bridge's dtype form, taken whole (the string form, which crashes at wrap, is
    # no longer recommended anywhere), a list value taken whole, the Python form
    assert ("ddp.megatron_fsdp_main_grads_dtype", "{_target_:torch.float32,_call_:false}") in found
    assert ("ddp.megatron_fsdp_main_grads_dtype", "fp32") not in found
    assert ("model.offload_modules", "[core_attn,attn_proj]") in found
    assert ("checkpoint.ckpt_format", "fsdp_dtensor") in found
    assert not [v for _k, v in found if v.endswith((")", ";", "'", '"'))]  # prose punctuation stripped


def test_every_rule_fix_with_an_assignment_is_extracted():
    found = bro.extract()
    where = {w for r in found for w in r["where"]}
    for rule in bro.rules.RULES:
        fix = rule.fix if isinstance(rule.fix, str) else ""
        if bro._KV.search(fix) or bro._PRESET.search(fix):
            assert f"rule {rule.id}" in where, rule.id


def test_every_enable_change_is_literal_or_accounted_for():
    literal, other = bro.enable_calls()
    assert literal
    counts: dict[str, int] = {}
    for _line, key_src in other:
        assert key_src in bro.ENABLE_COMPUTED, f"enable.py: a new non-literal change({key_src}, ...): extract it"
        counts[key_src] = counts.get(key_src, 0) + 1
    assert counts == {k: n for k, (n, _why) in bro.ENABLE_COMPUTED.items()}


def test_committed_plan_covers_every_extracted_override():
    """A new override in the rules, enable or the text fails until the plan is regenerated (--plan)."""
    planned = _pairs(PLAN["overrides"])
    missing = _pairs(bro.extract()) - planned
    assert not missing, f"not in benchmarks/recommended_overrides_plan.json: {sorted(missing)}"
    assert bro.build_plan() == PLAN, "the plan is stale: python3 benchmarks/bench_recommended_overrides.py --plan"


def test_every_override_has_a_job_or_a_reason():
    for row in PLAN["overrides"]:
        if row["job"]:
            assert row["job"] in bro.RUN_GPU_S
            assert f"{row['key']}={row['value']}" in row["overrides"]
            assert row["command"].startswith("python3 scripts/rehearse_train.py --model-preset ")
            world = bro.REAL_WORLD if row["job"] in bro.REAL_WORLD_KINDS else bro.WORLD
            assert f"--world-size {world} --rank 0 --iters 2 --strategy optim_grads_params" in row["command"]
        else:
            assert row["not_run_why"], row["id"]
    jobs = {r["job"] for r in PLAN["overrides"] if r["job"]}
    assert {"dense", "moe", "lora", "fp8", "checkpoint"} <= jobs
    assert {b["job"] for b in PLAN["baselines"]} == set(bro.RUN_GPU_S) >= jobs  # hybrid included


def test_kinds_and_known_outcomes():
    by = {(r["key"], r["value"]): r for r in PLAN["overrides"]}
    assert by[("model.moe_single_grouped_weight", "false")]["job"] == "moe"
    assert "--balanced-routing" in by[("model.moe_single_grouped_weight", "false")]["command"]
    assert by[("model.init_model_with_meta_device", "false")]["job"] == "lora"  # the PEFT rule's fix
    assert "--peft lora" in by[("model.init_model_with_meta_device", "false")]["command"]
    assert by[("ddp.keep_fp8_transpose_cache", "false")]["job"] == "fp8"
    assert by[("ddp.reuse_grad_buf_for_mxfp8_param_ag", "false")]["job"] is None  # MXFP8: Blackwell only
    dtype = by[("ddp.megatron_fsdp_main_grads_dtype", "{_target_:torch.float32,_call_:false}")]
    assert dtype["job"] and dtype["expected"] == "passes wrap and two steps"
    assert by[("checkpoint.save", "/path/to/checkpoints")]["job"] is None
    seq = by[("model.sequence_parallel", "true")]
    assert seq["overrides"] == ["model.tensor_model_parallel_size=2", "model.sequence_parallel=true"]


def test_batches_hold_each_run_once():
    ids = [i for b in PLAN["batches"] for i in b["rows"]]
    runnable = [b["id"] for b in PLAN["baselines"]] + [r["id"] for r in PLAN["overrides"] if r["job"]]
    assert sorted(ids) == sorted(runnable)
    assert all(b["estimated_s"] <= bro.BATCH_BUDGET_S for b in PLAN["batches"])


def test_collect_from_a_raw_run(tmp_path):
    row = next(r for r in PLAN["overrides"] if r["job"] == "dense")
    d = tmp_path / "raw" / row["id"]
    d.mkdir(parents=True)
    summary = {
        "ranks": [
            {
                "result": "failed",
                "device": "stand-in",
                "phases": [{"name": "validate", "status": "passed"}, {"name": "model_wrap", "status": "failed"}],
                "failure": {"message": "boom", "site": "x.py:1", "rule": None, "phase": "model_wrap"},
            }
        ]
    }
    (d / "row.json").write_text(json.dumps({"id": row["id"], "exit": 1, "summary": summary}))
    res = bro.collect([tmp_path / "raw"], PLAN, None)
    got = res["rows"][0]
    assert got["result"] == "failed" and got["phases"]["wrap"] == "failed"
    assert got["first_error"]["rule"] == "no rule"
    assert {(n["key"], n["value"]) for n in res["not_run"]} == {
        (r["key"], r["value"]) for r in PLAN["overrides"] if not r["job"]
    }


def test_run_batch_on_a_machine_without_a_gpu(tmp_path, monkeypatch):
    """--run's CPU path: the real engine refuses here (exit 2); each run still leaves its row.json."""
    import sys

    import bench_what_works as bw

    monkeypatch.setattr(bw, "STAGGER_S", 0.0)
    monkeypatch.setattr(bw, "START_MARGIN_S", 1)
    plan = {**PLAN, "batches": [{"batch": 9, "rows": ["baseline_dense"], "estimated_s": None}]}
    summary = bro.run_batch(plan, 9, tmp_path, sys.executable, budget_s=60, max_concurrent=1)
    assert summary["rows"] == ["baseline_dense"]
    raw = json.loads((tmp_path / "baseline_dense" / "row.json").read_text())
    assert raw["exit"] == 2 and raw["summary"]["result"] == "failed"
    res = bro.collect([tmp_path], plan, None)
    assert res["rows"][0]["result"] == "not run"  # the engine never started a phase: no verdict on the override


def test_result_file_has_the_project_result_shape(tmp_path):
    import make_report as mr

    row = next(r for r in PLAN["overrides"] if r["job"] == "moe")
    d = tmp_path / "raw" / row["id"]
    d.mkdir(parents=True)
    summary = {"ranks": [{"result": "passed", "device": "stand-in", "phases": [{"name": "train", "status": "passed"}]}]}
    (d / "row.json").write_text(
        json.dumps({"id": row["id"], "exit": 0, "date": "2026-01-02T00:00:00", "summary": summary})
    )
    out = tmp_path / "recommended_overrides_1xh200.json"
    assert bro.main(["--collect", str(tmp_path / "raw"), "--out", str(out)]) == 0
    data = mr._load_one(out, out.name)
    assert data["benchmark"] == "recommended_overrides_1xh200" and data["date"] == "2026-01-02"
    assert data["table_rows"] == [[f"{row['key']}={row['value']}", "moe", "", "passed", ""]]


def test_collect_reports_what_the_engine_ran_and_flags_a_job_changed_since(tmp_path):
    """The recorded run of the full-iteration CUDA graph override failed at the build; the job now adds the TE RNG
    tracker (the fix). The result shows the overrides the engine was given, flags the changed job, and names the
    rule the failure now has."""
    import raw_store

    plan = json.loads((ROOT / "benchmarks" / "recommended_overrides_plan.json").read_text())
    got = bro.collect([raw_store.path("recommended_overrides_1xh200") / "batch_5"], plan, None)
    row = next(r for r in got["rows"] if r["id"] == "rerun_state_machine.check_for_nan_in_loss_false")
    assert row["result"] == "failed" and row["plan_changed"] is True
    assert "model.use_te_rng_tracker=true" not in row["overrides"]
    assert "model.use_te_rng_tracker=true" in row["planned_overrides"]
    assert row["first_error"]["rule"] == "MFSDP-CUDA-GRAPH-TE-RNG"
    assert any("plan_changed" in n and row["id"] in n for n in got["notes"])
    assert all(r["plan_changed"] is False for r in got["rows"] if r["result"] == "passed")
    assert bro.ran_overrides("python3 x.py --model-preset tiny --out /o a.b=1 c.d=[1,2]") == ["a.b=1", "c.d=[1,2]"]
    assert bro.ran_overrides(None) is None


def test_batch_option_takes_several_batches():
    assert bro.batch_list("3") == [3]
    assert bro.batch_list("1,2,4") == [1, 2, 4]
    assert bro.batch_list("1+2") == [1, 2]
    assert bro.batch_rows(PLAN, [1, 2]) == PLAN["batches"][0]["rows"] + PLAN["batches"][1]["rows"]
    import argparse

    import pytest

    with pytest.raises(argparse.ArgumentTypeError):
        bro.batch_list("one")
    with pytest.raises(SystemExit, match="no batch 99"):
        bro.batch_rows(PLAN, [1, 99])


def test_a_run_whose_job_the_plan_changed_is_flagged_for_a_rerun():
    """The job, not only its KEY=VALUE words: a checkpoint run at the fake world of 8 is not the planned world-1 job."""
    planned = next(r for r in PLAN["overrides"] if r["job"] == "checkpoint")
    here = bro.job_words(planned["command"])
    assert here and "--out" not in here and here[0] != "python3"
    device = planned["command"].replace("python3 scripts/", "/opt/venv/bin/python3 /root/repo/scripts/")
    device = device.replace("'$OUT/", "'/root/ro/batch_1/")
    assert bro.job_words(device) == here  # the same job on another machine
    older = device.replace(f"--world-size {bro.REAL_WORLD} ", f"--world-size {bro.WORLD} ")
    assert older != device and bro.job_words(older) != here


def test_a_run_the_budget_stopped_is_not_run_and_keeps_an_earlier_result(tmp_path):
    row = next(r for r in PLAN["overrides"] if r["job"] == "dense")
    ok = {"ranks": [{"result": "passed", "device": "stand-in", "phases": [{"name": "train", "status": "passed"}]}]}
    cut = {"ranks": [{"result": "failed", "device": "stand-in", "phases": [{"name": "import", "status": "passed"}]}]}
    for name, raw in (
        ("a_first", {"id": row["id"], "exit": 0, "summary": ok}),
        ("b_later", {"id": row["id"], "exit": -9, "stopped": "budget", "summary": cut}),
    ):
        (tmp_path / name / row["id"]).mkdir(parents=True)
        (tmp_path / name / row["id"] / "row.json").write_text(json.dumps(raw))
    (kept,) = bro.collect([tmp_path / "a_first", tmp_path / "b_later"], PLAN, None)["rows"]
    assert kept["result"] == "passed" and "a_first" in kept["raw"]
    (alone,) = bro.collect([tmp_path / "b_later"], PLAN, None)["rows"]
    assert alone["result"] == "not run"  # stopped by the budget: no verdict on the override


def test_the_validate_failures_of_the_h100_run_are_fixed_in_the_jobs_and_the_text(tmp_path):
    """The recorded run of the reruns (batch_s4b): four overrides failed at Bridge's validate. Each failure was the
    job (a setting applied without the ones megatron-core checks beside it) or advice that named one setting of a
    pair; the planned jobs now carry what the rules ask for, the text names the pair, and the flex-dispatcher words
    perf.md quotes from a refusal are not advice."""
    import raw_store

    got = bro.collect([raw_store.path("recommended_overrides_1xh200") / "batch_s4b"], PLAN, None)
    rows = {r["id"]: r for r in got["rows"]}
    want = {
        "model.recompute_granularity_full": ("recompute_method must be", ["model.recompute_method=uniform"]),
        "model.recompute_method_uniform": ("recompute_num_layers must be", ["model.recompute_num_layers=1"]),
        "model.recompute_num_layers_null": ("recompute_num_layers must be", ["model.recompute_granularity=selective"]),
        "optimizer.use_precision_aware_optimizer_true": (
            "--use-precision-aware-optimizer only supported with distributed optimizer",
            ["optimizer.use_distributed_optimizer=true"],
        ),
    }
    for rid, (message, added) in want.items():
        row = rows[rid]
        assert row["result"] == "failed" and message in row["first_error"]["message"], rid
        assert row["plan_changed"] is True and all(a in row["planned_overrides"] for a in added), rid
        assert not any(a in row["overrides"] for a in added), rid
    assert bro.context_for("model.recompute_granularity", "null") == []  # only full needs the pair
    assert "model.moe_token_dispatcher_type_flex" not in rows  # the raw run exists; the plan no longer rehearses it
    flex = next(r for r in PLAN["overrides"] if r["id"] == "model.moe_token_dispatcher_type_flex")
    assert flex["job"] is None and "refusal" in flex["not_run_why"]
    memory_md = (ROOT / "references" / "memory.md").read_text()
    assert "`model.recompute_granularity=full model.recompute_method=uniform model.recompute_num_layers=1`" in memory_md
    assert (
        "`optimizer.use_precision_aware_optimizer=True` (decoupled grads) with `optimizer.use_distributed_optimizer=True`"
        in memory_md
    )


def test_a_list_the_engine_read_as_text_is_a_fault_of_the_rehearsal_not_a_verdict(tmp_path):
    """The recorded offload run: `model.offload_modules=[core_attn,attn_proj]` reached the trained config as the text
    "[core_attn,attn_proj]" (the engine read Hydra's unquoted list as a string; it now reads a list). The run is not
    a verdict on the advice: not run, with the fault, to run again."""
    import raw_store

    got = bro.collect([raw_store.path("recommended_overrides_1xh200") / "batch_s4b"], PLAN, None)
    row = next(r for r in got["rows"] if r["id"] == "model.offload_modules_core_attn_attn_proj_")
    assert row["result"] == "not run" and "not a list" in row["rehearsal_fault"]
    assert any("rehearsal_fault" in n and row["id"] in n for n in got["notes"])
    (table,) = [t for t in got["table_rows"] if t[0] == "model.offload_modules=[core_attn,attn_proj]"]
    assert "the rehearsal's fault, fixed" in table[3]
    (tmp_path / "run_config.yaml").write_text("model:\n  offload_modules: [core_attn]\n  n: 3\n")
    assert bro.not_applied(tmp_path, ["model.offload_modules=[core_attn]", "model.n=3", "model.absent=[x]"]) == []
    (tmp_path / "run_config.yaml").write_text("model:\n  offload_modules: '[core_attn]'\n")
    assert bro.not_applied(tmp_path, ["model.offload_modules=[core_attn]"]) == [
        "model.offload_modules=[core_attn] reached the config as the text '[core_attn]', not a list"
    ]
    assert bro.not_applied(tmp_path / "none", ["a.b=[1]"]) == []


def test_every_run_replaced_after_a_flag_or_a_failure_stays_on_record_with_its_answer():
    """The committed result keeps each earlier run that failed or was flagged (superseded), with what it met and the
    run that replaced it; that run is the row the result shows now."""
    result = json.loads((ROOT / "benchmarks/results/recommended_overrides_1xh200.json").read_text())
    rows = {r["id"]: r for r in result["rows"]}
    assert result["superseded"], "the recorded runs include failures that led to fixes"
    for h in result["superseded"]:
        assert h["result"] == "failed" or h["plan_changed"] or h["rehearsal_fault"], h
        assert h["measured_again"] != h["raw"]
        later = [x for x in result["superseded"] if x["id"] == h["id"] and x["raw"] == h["measured_again"]]
        assert later or rows[h["id"]]["raw"] == h["measured_again"], h  # answered by the row, or by a later rerun
    assert any("superseded" in n for n in result["notes"])
