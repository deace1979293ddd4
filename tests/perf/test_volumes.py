"""The analytic per-step volumes of each strategy, and their check against a recorded log."""

from __future__ import annotations

import json
import re

import pytest

import raw_store  # benchmarks/: the raw GPU results, extracted from their archive on first use
from _helpers_skill import read
from conftest import FIXTURES
from mfsdp_lib.perf import collectives as co
from mfsdp_lib.perf import volumes as vo

P, N, M = 8_030_261_248, 8, 16  # Llama 3 8B, 8 ranks, GBS 128 at MBS 1


def _kind(rows, kind):
    return vo.by_kind(rows)[kind]


def test_distopt_gathers_bf16_params_once_and_reduce_scatters_fp32_grads_once():
    rows = vo.volumes("distopt", vo.Job(params=P, dp=N, micro_batches=M))
    assert _kind(rows, "all_gather") == {"low": round(2 * P * 7 / 8), "high": round(2 * P * 7 / 8)}
    assert _kind(rows, "reduce_scatter")["low"] == round(4 * P * 7 / 8)
    assert all(r["times"] == "once per step" for r in rows)


def test_ddp_all_reduces_once_per_step():
    rows = vo.volumes("ddp", vo.Job(params=P, dp=N, micro_batches=M, grad_bytes=2))
    assert _kind(rows, "all_reduce")["high"] == round(2 * P * 2 * 7 / 8)


def test_optim_grads_params_gathers_forward_and_backward_every_micro_batch():
    rows = vo.volumes("optim_grads_params", vo.Job(params=P, dp=N, micro_batches=M))
    ag = _kind(rows, "all_gather")
    assert ag["low"] == ag["high"] == round(2 * M * 2 * P * 7 / 8)
    assert _kind(rows, "reduce_scatter")["low"] == round(M * 4 * P * 7 / 8)


def test_params_outside_fsdp_units_are_gathered_once_per_step():
    unit = 6_979_321_856  # the 32 transformer layers; embedding + output layer + final norm stay outside
    rows = vo.volumes("optim_grads_params", vo.Job(params=P, dp=N, micro_batches=M, unit_params=unit))
    ag = _kind(rows, "all_gather")
    f = 7 / 8
    assert ag["low"] == ag["high"] == round(2 * M * unit * 2 * f + (P - unit) * 2 * f)


def test_fsdp_gradient_bytes_follow_the_communication_dtype():
    """Megatron FSDP reduces in megatron_fsdp_grad_comm_dtype, else main_grads_dtype, else the param dtype;
    grad_reduce_in_fp32 is not read (Nemotron 3 Nano: fp32 main grads, bf16 communication -> 2 bytes)."""
    g = vo.gradient_comm_bytes
    assert g("optim_grads_params", grad_reduce_in_fp32=True) == 2
    assert g("optim_grads_params", grad_reduce_in_fp32=False, main_grads_bytes=4) == 4
    assert g("optim_grads_params", grad_reduce_in_fp32=False, main_grads_bytes=4, grad_comm_bytes=2) == 2
    assert g("optim", grad_reduce_in_fp32=False, grad_comm_bytes=4) == 4
    assert g("distopt", grad_reduce_in_fp32=True, grad_comm_bytes=2) == 4  # DDP / distopt: the flag decides
    assert g("ddp", grad_reduce_in_fp32=False) == 2
    # as a run_config.yaml spells them (Bridge's Nemotron 3 Nano recipe)
    nano = {
        "grad_reduce_in_fp32": True,
        "megatron_fsdp_main_grads_dtype": {"_target_": "torch.float32", "_call_": False},
        "megatron_fsdp_grad_comm_dtype": {"_target_": "torch.bfloat16", "_call_": False},
    }
    assert vo.gradient_comm_bytes_of("optim_grads_params", nano) == 2
    assert vo.gradient_comm_bytes_of("optim_grads_params", dict(nano, megatron_fsdp_grad_comm_dtype=None)) == 4
    assert vo.gradient_comm_bytes_of("distopt", nano) == 4


def test_optim_and_optim_grads_differ_in_when_grads_are_reduced():
    opt = vo.volumes("optim", vo.Job(params=P, dp=N, micro_batches=M))
    og = vo.volumes("optim_grads", vo.Job(params=P, dp=N, micro_batches=M))
    assert _kind(og, "reduce_scatter")["low"] == M * _kind(opt, "reduce_scatter")["low"]
    assert _kind(og, "all_gather") == _kind(opt, "all_gather")


def test_one_rank_moves_nothing():
    assert vo.total(vo.volumes("optim_grads_params", vo.Job(params=P, dp=1, micro_batches=4))) == {"low": 0, "high": 0}


def test_every_row_names_its_formula_and_source():
    for s in vo.STRATEGIES:
        for r in vo.volumes(s, vo.Job(params=10, dp=2)):
            assert r["formula"] and ("megatron" in r["source"]) and "::" in r["source"]


def test_unknown_strategy_and_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="unknown strategy"):
        vo.volumes("optim_grad_params", vo.Job(params=1, dp=2))
    with pytest.raises(ValueError):
        vo.volumes("ddp", vo.Job(params=1, dp=0))


def test_the_synthetic_recorded_log_agrees_with_the_distopt_formula():
    log = json.loads((FIXTURES / "perf" / "synthetic_distopt_n8.json").read_text())
    agg = co.aggregate(log)
    measured = {k: v.get("dp", 0) for k, v in agg["bytes_per_step"].items() if k in ("all_gather", "reduce_scatter")}
    verdict = vo.compare(measured, vo.volumes("distopt", vo.Job(params=1_000_000, dp=4, micro_batches=4)))
    assert all(v["within"] for v in verdict.values()), verdict
    # and a volume twice too large is caught
    measured["all_gather"] *= 2
    verdict = vo.compare(measured, vo.volumes("distopt", vo.Job(params=1_000_000, dp=4, micro_batches=4)))
    assert not verdict["all_gather"]["within"]


def test_megatron_fsdp_reduces_gradients_in_the_parameter_dtype():
    # ddp.grad_reduce_in_fp32 is not passed to Megatron FSDP (volumes.SOURCES["fsdp_grad_dtype"]); the H200
    # llama-1b runs reduce-scattered 1.93 GB per step at N = 8 under optim_grads_params, P x 2 B x 7/8.
    for strategy in vo.FSDP_STRATEGIES:
        assert vo.gradient_comm_bytes(strategy, grad_reduce_in_fp32=True) == 2
        assert vo.gradient_comm_bytes(strategy, grad_reduce_in_fp32=True, main_grads_bytes=4) == 4
    assert vo.gradient_comm_bytes("distopt", grad_reduce_in_fp32=True) == 4
    assert vo.gradient_comm_bytes("ddp", grad_reduce_in_fp32=False) == 2


def test_fp8_gathers_count_the_parameters_outside_the_layers_in_bf16():
    job = vo.Job(params=1000, dp=8, param_bytes=1, grad_bytes=2, unit_params=800, other_param_bytes=2)
    ag = next(r for r in vo.volumes("distopt", job) if r["kind"] == "all_gather")
    assert ag["bus_bytes"]["low"] == round((800 * 1 + 200 * 2) * 7 / 8)
    plain = vo.Job(params=1000, dp=8, param_bytes=1, grad_bytes=2, unit_params=800)
    assert next(r for r in vo.volumes("distopt", plain) if r["kind"] == "all_gather")["bus_bytes"]["low"] == 875


# --------------------------------------------------------------------------- the recorded H200 runs

RAW = raw_store.path("rehearse_perf_1xh200")
RESULT = json.loads((FIXTURES.parent.parent / "benchmarks" / "results" / "rehearse_perf_1xh200.json").read_text())
RECORDED = sorted((FIXTURES / "perf").glob("recorded_*.json"))


def _run_config(name: str) -> dict:
    """The run_config.yaml the recorded run wrote (``llama1b_n8_distopt`` -> ``llama1b_n8.distopt...``)."""
    import yaml

    stem = name
    for strategy in ("_distopt", "_optim_grads_params"):
        if name.endswith(strategy):
            stem = name[: -len(strategy)] + "." + strategy[1:]
    found = sorted(RAW.glob(f"{stem}.*run_config.yaml"))
    assert len(found) == 1, (name, [p.name for p in found])
    return yaml.safe_load(found[0].read_text())


def _job(row: dict, cfg: dict, strategy: str) -> vo.Job:
    """The analytic job of a recorded run: sizes as the recorder measured them, byte widths from its config."""
    recorded = row["analytic_check"]["job"]  # params, dp, micro-batches, gathered bytes: what the rank reported
    return vo.Job(
        params=recorded["params"],
        dp=recorded["dp"],
        micro_batches=recorded["micro_batches"],
        param_bytes=recorded["param_bytes"],
        grad_bytes=vo.gradient_comm_bytes_of(strategy, cfg["ddp"]),
        unit_params=recorded["unit_params"],
        other_param_bytes=recorded["other_param_bytes"],
    )


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_every_recorded_run_matches_the_formulas_of_perf_md(path):
    """The one set of formulas (this module, quoted by references/perf.md) against what the recorder counted
    on the H200: every data-parallel volume within COMPARE_TOLERANCE of its single analytic value."""
    log = json.loads(path.read_text())
    name = path.stem.removeprefix("recorded_").removesuffix("_rank_0")
    row = next(r for r in RESULT["rows"] if r["row"] == name)
    strategy = log.get("strategy") or row["strategy"]
    job = _job(row, _run_config(name), strategy)
    measured = {k: v.get("dp", 0) + v.get("dp_cp", 0) for k, v in co.aggregate(log)["bytes_per_step"].items()}
    rows = vo.volumes(strategy, job)
    assert all(r["bus_bytes"]["low"] == r["bus_bytes"]["high"] for r in rows)
    verdict = vo.compare(measured, rows)
    assert verdict and all(v["within"] for v in verdict.values()), verdict


def test_the_16_micro_batch_anchor_rules_out_gathering_non_layer_params_per_micro_batch():
    """Were the embedding and output layer gathered with the layers (up to 2m times), the FP8 anchor would
    move 254 GB per step; it moves 197.30 GB, the once-per-step value (197.27 GB) plus padding."""
    path = FIXTURES / "perf" / "recorded_anchor_fsdp_n8_rank_0.json"
    row = next(r for r in RESULT["rows"] if r["row"] == "anchor_fsdp_n8")
    job = _job(row, _run_config("anchor_fsdp_n8"), "optim_grads_params")
    assert job.micro_batches == 16 and job.unit_params < job.params
    got = co.aggregate(json.loads(path.read_text()))["bytes_per_step"]["all_gather"]["dp"]
    once = _kind(vo.volumes("optim_grads_params", job), "all_gather")["low"]
    f = (job.dp - 1) / job.dp
    per_micro_batch = once + (2 * job.micro_batches - 1) * (job.params - job.unit_params) * job.other_param_bytes * f
    assert abs(got - once) / once < vo.COMPARE_TOLERANCE < abs(got - per_micro_batch) / per_micro_batch
    assert "197.30 GB" in read("references/perf.md") and f"{got / 1e9:.2f}" == "197.30"
    assert f"{once / 1e9:.2f}" == "197.27" and f"{per_micro_batch / 1e9:.2f}" == "254.27"


# The formula column of references/perf.md's table, per strategy row label, against volumes.py's formulas.
_DOC_ROW = {
    "ddp": "DDP",
    "distopt": "distributed optimizer",
    "optim": "FSDP `optim`",
    "optim_grads": "FSDP `optim_grads`",
    "optim_grads_params": "FSDP `optim_grads_params`",
}


@pytest.mark.parametrize("strategy", sorted(_DOC_ROW))
def test_perf_md_states_the_formulas_this_module_computes(strategy):
    doc = read("references/perf.md")
    line = next(ln for ln in doc.splitlines() if ln.startswith(f"| {_DOC_ROW[strategy]} |"))
    stated = set(re.findall(r"`([^`]*\b(?:bg|bp)\b[^`]*)`", line))
    for r in vo.volumes(strategy, vo.Job(params=10, dp=2)):
        for term in r["formula"].split(" + "):
            term = term.replace("2(N-1)/N", "2f").replace("(N-1)/N", "f").strip()
            assert term in stated, f"perf.md's {strategy} row does not state {term!r} (it states {stated})"
