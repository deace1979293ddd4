"""The rehearsal verdict, read from reports the engine wrote on a real H200.

``benchmarks/results/raw/rehearse_1xh200/`` holds the engine's ``report.json`` (and the
``run_config.yaml`` Bridge wrote) of real runs: Megatron-Bridge 0.6.2 on one H200 as
rank R of fake worlds of 1 to 64. These tests feed those files to
``mfsdp_lib.runs.rehearse`` and assert what a user reads: the pipeline-parallel wrap
failure explained under the rule id ``check`` uses, with its fix; the memory lines beside
``memory``'s prediction; the NCCL allowance on its own line; the parity verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import raw_store  # benchmarks/: the raw GPU results, extracted from their archive on first use
from mfsdp_lib.runs import rehearse as rh

ROOT = Path(__file__).resolve().parent.parent.parent
RAW = raw_store.path("rehearse_1xh200")


def _run(name: str) -> Path:
    d = RAW / name
    assert (d / "report.json").is_file(), f"recorded run {name} is missing"
    return d


def test_pipeline_parallel_wrap_failure_is_explained_with_the_rule_and_fix():
    s = rh.summarize([(str(_run("B_pp2_llama1b_n8_optim_grads_params")), "first pipeline stage")])
    assert s["result"] == "failed" and rh.exit_code(s) == 1
    r = s["ranks"][0]
    assert r["rank"] == 0 and r["world_size"] == 8
    f = r["failure"]
    assert f["phase"] == "model_wrap" and f["type"] == "EinopsError"
    assert f["rule"] == rh.RULE_PIPELINE == "MFSDP-PIPELINE-PARALLEL"
    assert "mcore_fsdp_adapter.py:561 in _get_dp_tp_mesh" in f["site"]
    assert "pipeline_model_parallel_size=2" in f["why"]
    assert "model.pipeline_model_parallel_size=1" in f["fix"]
    # phases before the wrap passed; the wrap is the one that failed
    status = {p["name"]: p["status"] for p in r["phases"]}
    assert status["model_build"] == "passed" and status["model_wrap"] == "failed" and "train" not in status
    text = rh.render_text(s)
    assert "first failure at model_wrap: EinopsError" in text
    assert "[MFSDP-PIPELINE-PARALLEL]" in text and "fix: model.pipeline_model_parallel_size=1" in text
    assert text.rstrip().endswith("rehearsal: FAILED")


def test_memory_lines_sit_beside_the_prediction_and_match_the_measurement():
    s = rh.summarize([(str(_run("A_llama1b_n8_distopt")), None)])
    assert s["result"] == "passed" and rh.exit_code(s) == 0
    r = s["ranks"][0]
    m = r["memory"]
    # the measured figures of that H200 run (GiB per rank)
    assert m["between_steps_gib"] == pytest.approx(7.81, abs=0.005)
    assert m["peak_allocated_gib"] == pytest.approx(11.77, abs=0.005)
    assert m["peak_reserved_gib"] >= m["peak_allocated_gib"]
    assert m["after_setup_gib"] is not None
    p = r["predicted"]
    assert p["available"] and p["strategy"] == "distopt" and p["data_parallel_size"] == 8
    # memory's prediction for the same config: within 10 % of what was measured
    assert p["between_steps_gib"] == pytest.approx(m["between_steps_gib"], rel=0.10)
    assert p["peak_gib"] == pytest.approx(m["peak_allocated_gib"], rel=0.10)
    text = rh.render_text(s)
    assert "memory per GPU (GiB)   measured   predicted by 'memory'" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("between steps"))
    assert "7.81" in line and f"{p['between_steps_gib']:.2f}" in line


def test_nccl_allowance_is_its_own_labelled_line_with_its_basis():
    s = rh.summarize([(str(_run("A_llama1b_n8_distopt")), None)])
    n = s["ranks"][0]["nccl"]
    rep = json.loads((RAW / "A_llama1b_n8_distopt" / "report.json").read_text())
    assert n["communicators"] == rep["process_groups"]["count_size_gt_1"] == 7
    # 4 MiB Simple + 512 KiB LL + 4,915,200 B LL128 per connection, 32 channels
    assert rh.NCCL_BUFFER_BYTES_PER_CONNECTION == 4194304 + 524288 + 4915200
    assert n["allowance_gib"] == pytest.approx(7 * 32 * (4194304 + 524288 + 4915200) / 2**30, abs=0.001)
    assert "allowance, not a measurement" in n["basis"]
    text = rh.render_text(s)
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("NCCL allowance")]
    assert len(lines) == 1 and "7 communicators" in lines[0] and "not measured" in lines[0]


def test_moe_says_collectives_were_mirrored_and_whether_routing_was_forced():
    bal = rh.summarize([(str(_run("C_moe_n8_ep8_optim_grads_params_balanced")), None)])["ranks"][0]
    real = rh.summarize([(str(_run("B_moe_n8_ep8_optim_grads_params")), None)])["ranks"][0]
    assert bal["moe"]["balanced_routing"] is True and real["moe"]["balanced_routing"] is False
    assert "all_to_all_single" in bal["moe"]["mirrored_collectives"]
    assert "routing balanced (forced" in rh.render_text({"ranks": [bal]})
    assert "routing as the router decides" in rh.render_text({"ranks": [real]})


def test_parity_verdict_is_reported():
    s = rh.summarize([], parity_dir=str(_run("C_parity_llama1b")))
    par = s["parity"]
    assert par["passed"] and s["result"] == "passed"
    assert par["steps_compared"] == 5 and par["max_abs_loss_diff"] < par["atol"] == 0.02
    assert par["legs"]["fsdp"]["save_load_equal"] is True
    text = rh.render_text(s)
    assert "parity (real world of 1, DDP vs Megatron FSDP): PASSED: max |loss diff| 0.0022 over 5 steps" in text


def test_missing_environment_package_is_an_environment_failure_not_a_config_rule():
    r = rh.summarize([(str(_run("B_hybrid_n8_optim_grads_params")), None)])["ranks"][0]
    f = r["failure"]
    assert f["phase"] == "model_build" and f["type"] == "ImportError"
    assert f["rule"] is None and f["category"] == "environment" and "mamba-ssm" in f["fix"]


def test_a_rank_without_a_report_fails_and_says_so(tmp_path):
    s = rh.summarize([(str(tmp_path), "rank 0")])
    assert s["result"] == "failed" and s["ranks"][0]["failure"]["type"] == "NoReport"
    assert "did not start" in rh.render_text(s)


def test_a_run_killed_mid_phase_is_a_failure(tmp_path):
    rep = json.loads((RAW / "A_llama1b_n8_distopt" / "report.json").read_text())
    rep["result"] = "running"
    rep["first_failure"] = None
    (tmp_path / "report.json").write_text(json.dumps(rep))
    assert rh.summarize([(str(tmp_path), None)])["result"] == "failed"


def test_not_a_rehearsal_report_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a rehearsal report"):
        rh.summarize_run({"schema": "something-else"})


@pytest.mark.parametrize(
    "world, pp, wanted, expected",
    [
        (64, 1, ["auto"], [0]),
        (8, 2, ["auto"], [0, 4]),
        (16, 4, ["auto"], [0, 12]),
        (16, 4, ["first", "5", "last"], [0, 5, 12]),
    ],
)
def test_one_process_per_distinct_rank_position(world, pp, wanted, expected):
    assert [r for r, _ in rh.rank_positions(world, pp, wanted)] == expected


def test_rank_positions_refuse_impossible_layouts():
    with pytest.raises(ValueError, match="not a multiple"):
        rh.rank_positions(6, 4)
    with pytest.raises(ValueError, match="outside a world"):
        rh.rank_positions(8, 1, ["8"])
    with pytest.raises(ValueError, match="expected auto"):
        rh.rank_positions(8, 1, ["middle"])


def test_summary_json_was_made_from_these_files_and_agrees_with_the_reference():
    # benchmarks/results/rehearse_1xh200.json is what BENCHMARK.md renders; rebuilt from RAW it must not change
    import bench_rehearse as br

    committed = json.loads((ROOT / "benchmarks" / "results" / "rehearse_1xh200.json").read_text())
    rebuilt = json.loads(json.dumps(br.summarize_raw(RAW)))
    assert rebuilt == committed
    raw = committed["raw"]
    assert raw["reference_compared"] >= 5 and raw["reference_all_within"] is True
    assert any("all within 3 %" in n and n.endswith("yes") for n in committed["notes"])
    pp = raw["runs"]["B_pp2_llama1b_n8_optim_grads_params"]
    assert pp["failure"]["rule"] == "MFSDP-PIPELINE-PARALLEL"


def test_a_string_dtype_at_the_wrap_is_explained_with_the_dtype_rule():
    """The wrap failure of 'ddp.megatron_fsdp_main_grads_dtype=fp32' (an AttributeError raised in
    megatron_fsdp's buffer set-up, as the engine records a first failure) names the check rule; the rule's
    fix is per finding, so the explanation gives its own."""
    ff = {
        "phase": "model_wrap",
        "type": "AttributeError",
        "message": "'str' object has no attribute 'is_floating_point'",
        "frames": {
            "fsdp": "megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py:2704 in "
            "_init_each_parameter_group_buffers"
        },
    }
    out = rh.explain_failure(ff)
    assert out["rule"] == "MFSDP-DTYPE-STRING" and out["category"] == "config"
    assert "{_target_:torch.float32,_call_:false}" in out["fix"]
    # the same message from elsewhere is not this cause
    other = dict(ff, frames={"innermost": "some/other/module.py:1 in f"})
    assert rh.explain_failure(other)["rule"] is None


def test_a_cuda_graph_build_without_the_te_rng_tracker_is_explained_with_its_rule():
    """The recorded H200 run of the full-iteration CUDA graph settings without model.use_te_rng_tracker (the
    engine's first failure, as report.json keeps it) names the rule that check now has for it."""
    run = raw_store.path("recommended_overrides_1xh200") / "batch_5" / "rerun_state_machine.check_for_nan_in_loss_false"
    report = json.loads((run / "report.json").read_text())
    out = rh.explain_failure(report["first_failure"], report.get("request"))
    assert out["rule"] == "MFSDP-CUDA-GRAPH-TE-RNG" and out["category"] == "config"
    assert out["fix"] == "model.use_te_rng_tracker=true"
    # the same message raised outside Bridge's GPT provider is not this cause
    other = dict(report["first_failure"], frames={"innermost": "some/other/module.py:1 in f"})
    assert rh.explain_failure(other)["rule"] is None


def test_save_load_says_whether_the_load_restored_anything():
    """A fake world's load restores no tensor (its checkpoint holds one rank's shards); a real world of 1 compares
    the forward loss across the round trip: the text says which it was."""
    base = {"saved_iteration": 2, "resumed_iteration": 2}
    fake = rh.render_text({"ranks": [{"save_load": {**base, "losses_compared": False, "equal": None}}]})
    assert "saved iteration 2, resumed 2; one process stands for the world, so the load restored no tensor" in fake
    same = rh.render_text({"ranks": [{"save_load": {**base, "losses_compared": True, "equal": True}}]})
    assert "forward loss equal across it" in same and "restored no tensor" not in same
    moved = rh.render_text({"ranks": [{"save_load": {**base, "losses_compared": True, "equal": False}}]})
    assert "forward loss DIFFERENT across it" in moved
