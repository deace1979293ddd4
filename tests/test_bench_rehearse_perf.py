"""The ``rehearse --perf`` evidence driver's plan and its result script, on CPU.

The driver runs on one H200 (``benchmarks/bench_rehearse_perf.py``); here its plan is checked (the
rows the issue asks for, in priority order, each command accepted by the real CLI's ``--dry-run``)
and the result script is run on a raw folder made at test time from the synthetic engine report
of ``tests/fixtures/perf`` passed through the real summariser (labelled synthetic: not a
measurement).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

import bench_rehearse_perf as drv
import make_report as mr
import raw_store
import rehearse_perf_result as res
from mfsdp_lib.perf import predict
from mfsdp_lib.perf import report as perf_report
from mfsdp_lib.runs import rehearse as rh

ROOT = Path(__file__).resolve().parent.parent
REPORT = json.loads((ROOT / "tests" / "fixtures" / "perf" / "engine_report_synthetic.json").read_text())
REQUIRED_KEYS = {
    "job",
    "world_size",
    "strategy",
    "params",
    "tokens_per_s_per_gpu",
    "predicted_tokens_per_s_per_gpu",
    "step_time_s",
    "mfu",
    "comm_bytes_per_step",
}


def test_plan_has_every_row_the_result_needs_in_priority_order(tmp_path):
    rows = drv.plan(tmp_path)
    assert [r.name for r in rows] == [
        "anchor_fsdp_n8",
        "anchor_distopt_n8",
        "llama1b_n8",
        "llama1b_n64",
        "llama70b_n64",
        "n1_perf",
        "n1_plain",
        *drv.H100_ROWS[2:],
        *drv.MOE_PROFILE_ROWS,
    ]
    assert drv.H100_ROWS[:2] == ("anchor_fsdp_n8", "anchor_distopt_n8")
    by = {r.name: r for r in rows}
    assert all(by[n].argv[by[n].argv.index("--iters") + 1] == str(drv.ANCHOR_ITERS) for n in drv.H100_ROWS[:4])
    assert drv.ANCHOR_ITERS >= 4  # a median and spread of the anchor need at least 4 timed steps
    assert set(drv.LAUNCHER_POST) <= set(by["anchor_fsdp_n8_pao"].argv)
    assert "--no-mirror-collectives" in by["anchor_fsdp_n8_nomirror"].argv
    assert "--te-grad-accum-fusion" in by["anchor_fsdp_n8_gafte"].argv
    assert [x for x in by["anchor_fsdp_n8_gafte"].argv if x != "--te-grad-accum-fusion" and "gafte" not in x] == [
        x for x in by["anchor_fsdp_n8"].argv if "anchor_fsdp_n8" not in x
    ]  # the anchor apart from the fusion
    prof = [by[n].argv for n in drv.MOE_PROFILE_ROWS]
    assert all("--profile" in p and "qwen3-moe-16l" in p for p in prof)
    assert [p[p.index("--strategy") + 1] for p in prof] == ["optim_grads_params", "distopt", "optim_grads_params"]
    assert "--no-mirror-collectives" in prof[2] and "--no-mirror-collectives" not in prof[0]
    k = by["kscale_k2"].argv
    assert k[k.index("--perf-micro-batches") + 1] == str(drv.K_SCALE)
    i = k.index("--perf-micro-batches")
    same = [x for x in k[:i] + k[i + 2 :] if "kscale" not in x]
    assert same == [x for x in by["kscale_full"].argv if "kscale" not in x]  # the same job apart from K
    q = by["qwen30b_k4"].argv
    assert "--moe-dispatcher" in q and "--moe-dispatcher" not in by["qwen30b_refusal"].argv
    a = by["anchor_fsdp_n8"].argv
    assert drv.RECIPE_8B in a and "--perf" in a and a[a.index("--world-size") + 1] == "8"
    assert all(o in a for o in drv.FSDP_PERF + drv.COMMON_PERF)
    assert "optim_grads_params" in a and "distopt" in by["anchor_distopt_n8"].argv
    assert not set(drv.FSDP_PERF) & set(by["anchor_distopt_n8"].argv)
    assert all(o in by["llama70b_n64"].argv for o in drv.FIT_70B)
    plain = by["n1_plain"]
    assert plain.kind == "engine" and "--no-fake-pg" in plain.argv and "--perf" not in plain.argv
    assert all(o in plain.argv and o in by["n1_perf"].argv for o in drv.SAME_CHECKS)
    for name in ("llama1b_n8", "llama1b_n64"):
        argv = by[name].argv
        assert argv[argv.index("--compare") + 1].startswith("--")  # no variant swallowed by --compare
    for spec in (drv.HF_8B, drv.HF_70B, drv.HF_QWEN30B):
        assert Path(spec.split("=", 1)[1]).is_file()
    # every row alone fits its own cap, and each machine call's expected total fits the budget, imports overlapped
    assert all(drv.IMPORT_S + r.gpu_s < r.cap_s <= drv.BUDGET_S for r in rows)
    h200 = [r for r in rows if r.name not in drv.H100_ROWS[2:] + drv.MOE_PROFILE_ROWS]
    moe = [by[n] for n in drv.MOE_PROFILE_ROWS]
    for call in (h200, moe, *([by[n] for n in c] for c in drv.H100_CALLS)):
        assert drv.expected_wall_s(call) < 0.8 * drv.BUDGET_S  # room for a slow step or a slow import
    assert sorted(n for c in drv.H100_CALLS for n in c) == sorted(drv.H100_ROWS)


def test_every_cli_row_is_accepted_by_the_real_command(tmp_path):
    for row in drv.plan(tmp_path):
        if row.kind != "cli":
            continue
        out = subprocess.run(
            [sys.executable, *row.argv, "--dry-run"], capture_output=True, text=True, cwd=ROOT, timeout=120
        )
        assert out.returncode == 0, f"{row.name}: {out.stderr}"
        assert "--perf" in out.stdout


def test_list_prints_the_commands_and_runs_nothing(tmp_path, capsys):
    assert drv.main(["--out", str(tmp_path / "raw"), "--list"]) == 0
    text = capsys.readouterr().out
    assert text.count("# ") >= 7 and not (tmp_path / "raw").exists()
    assert drv.main(["--out", str(tmp_path / "raw"), "--only", "nope", "--list"]) == 2


def _summary(strategy: str, world: int = 8, perf_overrides: dict | None = None) -> dict:
    rep = copy.deepcopy(REPORT)
    rep["facts"]["strategy"] = strategy
    if perf_overrides:
        rep["perf"].update(perf_overrides)
    return rh.summarize_run(rep, None, "rank 0", predict.Links())


def _raw(tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    raw.mkdir()

    def write(name, result, **extra):
        (raw / f"{name}.json").write_text(json.dumps({"row": name, "exit_code": 0, "result": result, **extra}))

    write("anchor_fsdp_n8", {"ranks": [_summary("optim_grads_params")]})
    write("anchor_distopt_n8", {"ranks": [_summary("distopt")]})
    for n in ("llama1b_n8", "llama1b_n64"):
        ranks = [_summary("distopt"), _summary("optim_grads_params")]
        rows = [
            perf_report.compare_row(s, s, None, r)
            for s, r in zip(("distopt", "optim_grads_params"), ranks, strict=True)
        ]
        write(n, {"ranks": ranks, "compare": {"rows": rows}})
    # llama70b_n64 did not run (no raw file): it must stay as a row that says so
    n1 = _summary("optim_grads_params", 1, {"step_times_s": [1.00, 1.01, 0.99, 1.00, 1.02]})
    write("n1_perf", {"ranks": [n1]})
    write("n1_plain", {"request": {"iters": 7}}, kind="engine")
    lines = [
        f" [2026-12-04 00:00:0{i}] iteration        {i}/       7 | consumed samples: {8 * i} | "
        f"elapsed time per iteration (ms): {t:.1f} | learning rate: 3.0E-04 |"
        for i, t in zip(range(1, 8), (9000.0, 1200.0, 1020.0, 1030.0, 1010.0, 1040.0, 1020.0), strict=True)
    ]
    (raw / "n1_plain.log").write_text("\n".join(lines) + "\n")
    (raw / "driver.json").write_text(json.dumps({"started_utc": "2026-12-04T00:00:00+00:00", "rows": []}))
    return raw


def test_result_rows_carry_the_keys_and_the_anchor_the_published_figures(tmp_path):
    doc = res.build(_raw(tmp_path))
    rows = {r["row"]: r for r in doc["rows"]}
    assert set(rows) == {
        "anchor_fsdp_n8",
        "anchor_distopt_n8",
        "llama1b_n8_distopt",
        "llama1b_n8_optim_grads_params",
        "llama1b_n64_distopt",
        "llama1b_n64_optim_grads_params",
        "llama70b_n64",
        "n1_perf",
    }
    for r in doc["rows"]:
        assert set(r) >= REQUIRED_KEYS, r["row"]
    a = rows["anchor_fsdp_n8"]
    assert a["published_tokens_per_s_per_gpu"] == 14451 and a["published_model_tflops_per_gpu"] == 744
    assert a["tokens_per_s_per_gpu"] == pytest.approx(128 * 8192 / 8 / 9.15)
    assert a["step_time_s"]["low"] <= a["step_time_s"]["high"]
    assert a["published_vs_predicted"]["text"]
    assert set(a["comm_bytes_per_step"]) == {"all_gather", "all_reduce", "reduce_scatter"}
    assert rows["llama70b_n64"]["status"].startswith("not run") and rows["llama70b_n64"]["tokens_per_s_per_gpu"] is None
    n1 = rows["n1_perf"]
    assert n1["plain_run_step_s"]["median"] == pytest.approx(1.02)  # iterations 3..7 of the plain log
    assert n1["agreement"] == pytest.approx((1.00 - 1.02) / 1.02)
    assert n1["agreement_within_5pct"] is True
    assert any("Differences between the anchor" in n for n in doc["notes"])
    assert any("llama70b_n64: not run" in n for n in doc["notes"])


def test_repeat_interleaves_the_rows_each_with_its_own_output(tmp_path):
    rows = [r for r in drv.plan(tmp_path) if r.name in ("n1_perf", "n1_plain")]
    rep = drv.repeated(rows, tmp_path, 2)
    assert [r.name for r in rep] == ["n1_perf_r1", "n1_plain_r1", "n1_perf_r2", "n1_plain_r2"]
    for r in rep:
        outs = [a for a in r.argv if a.endswith(".run")]
        assert outs == [str(tmp_path / f"{r.name}.run")], r.name
    assert drv.repeated(rows, tmp_path, 1) == rows
    assert drv.main(["--out", str(tmp_path / "raw"), "--only", "n1_perf", "--repeat", "0"]) == 2


def _pair(raw: Path, k: int, perf_steps: list[float], plain_ms: list[float] | None) -> None:
    n1 = _summary("optim_grads_params", 1, {"step_times_s": perf_steps})
    (raw / f"n1_perf_r{k}.json").write_text(json.dumps({"row": f"n1_perf_r{k}", "result": {"ranks": [n1]}}))
    iters = 2 + len(perf_steps)
    plain = {"row": f"n1_plain_r{k}", "kind": "engine", "result": {"request": {"iters": iters}}}
    (raw / f"n1_plain_r{k}.json").write_text(json.dumps(plain))
    if plain_ms is not None:
        lines = [
            f" iteration        {i}/       {iters} | elapsed time per iteration (ms): {t:.1f} | lm loss: 1.0 |"
            for i, t in enumerate([5000.0, 1500.0, *plain_ms], start=1)
        ]
        (raw / f"n1_plain_r{k}.log").write_text("\n".join(lines) + "\n")


def test_n1_agreement_comes_from_the_interleaved_pairs_with_the_first_pass_kept(tmp_path):
    raw = _raw(tmp_path)
    (raw / "driver.json").write_text(json.dumps({"started_utc": "2026-12-04T00:00:00+00:00", "max_concurrent": 3}))
    _pair(raw, 1, [1.00, 1.00, 1.00], [980.0, 990.0, 1000.0])  # +1.0 %
    _pair(raw, 2, [1.10, 1.10, 1.10], [1000.0, 1000.0, 1000.0])  # +10 %
    _pair(raw, 3, [1.02, 1.02, 1.02], [1000.0, 1000.0, 1000.0])  # +2 %
    _pair(raw, 4, [1.00, 1.00, 1.00], None)  # the plain run left no timer line: listed, not counted
    (raw / res.PAIRS_SUMMARY).write_text(json.dumps({"max_concurrent": 1, "rows": []}))
    doc = res.build(raw)
    n1 = next(r for r in doc["rows"] if r["row"] == "n1_perf")
    assert n1["agreement"] == pytest.approx(0.02)  # the median pair, not the mean
    assert n1["agreement_spread"] == {"min": pytest.approx((1.0 - 0.99) / 0.99), "max": pytest.approx(0.10), "n": 3}
    assert n1["agreement_within_5pct"] is True
    assert [p["pair"] for p in n1["agreement_pairs"]] == [1, 2, 3, 4] and "why" in n1["agreement_pairs"][3]
    first = n1["agreement_first_pass"]
    assert first["agreement"] == pytest.approx((1.00 - 1.02) / 1.02) and "3 rehearsals" in first["conditions"]
    assert "at most 1 process" in n1["agreement_conditions"]
    note = next(t for t in doc["notes"] if t.startswith("N = 1 agreement"))
    assert "+2.0%" in note and "+10.0%" in note and "within 5%" in note


def test_result_file_renders_in_benchmark_md(tmp_path):
    out = tmp_path / "results" / "rehearse_perf_1xh200.json"
    out.parent.mkdir()
    assert res.main([str(_raw(tmp_path)), "--out", str(out)]) == 0
    text = mr.render(mr.load_results(out.parent))
    assert "rehearse_perf_1xh200" in text and "14451" in text.replace(",", "")
    cols, cells = mr.table(json.loads(out.read_text()))
    assert all(len(c) == len(cols) for c in cells)


def test_result_script_refuses_a_missing_folder(tmp_path, capsys):
    assert res.main([str(tmp_path / "nope")]) == 2


def test_recorded_logs_are_exported_as_fixtures_the_analysis_reads(tmp_path):
    from mfsdp_lib.perf import collectives

    raw = _raw(tmp_path)
    (raw / "anchor_fsdp_n8.rank_0.report.json").write_text(json.dumps(REPORT))
    written = res.export_logs(raw, tmp_path / "fixtures")
    assert [p.name for p in written] == ["recorded_anchor_fsdp_n8_rank_0.json"]
    log = json.loads(written[0].read_text())
    assert log["strategy"] == "optim_grads_params" and collectives.aggregate(log)["bytes_per_step"]


RESULTS = ROOT / "benchmarks" / "results"


@pytest.mark.parametrize("name", ["rehearse_perf_1xh200", "rehearse_perf_1xh100"])
def test_no_committed_figure_comes_from_a_non_finite_step(name):
    # every committed perf row was measured on finite timed steps only: none is excluded for NaN or inf
    path = RESULTS / f"{name}.json"
    if not path.exists():
        pytest.fail(f"{path.name} is missing: its rows were not generated")
    doc = json.loads(path.read_text())
    assert doc["rows"]
    for r in doc["rows"]:
        if str(r.get("status")).startswith("refused"):  # a recorded refusal before the model build: no step ran
            assert r.get("tokens_per_s_per_gpu") is None and not r.get("timed_losses"), r["row"]
            continue
        assert r.get("tokens_per_s_per_gpu"), (r["row"], r.get("status"))
        assert r["losses_checked"] is True, r["row"]
        assert r["nonfinite_timed_steps"] == 0, r["row"]
        used = [x for x in r["timed_losses"] if x is not None and x == x and abs(x) != float("inf")]
        assert len(used) == len(r["timed_losses"]) >= r["timed_steps_used"] >= 1, r["row"]


def test_old_reports_get_their_timed_losses_from_the_step_records(tmp_path):
    # the H200 FSDP anchor's first measurement (kept beside the re-run): finite losses, but NaN and inf
    # gradient norms on both timed steps
    raw = raw_store.path("rehearse_perf_1xh200_before_fp8_fix")
    rec = res.refresh_numerics(json.loads((raw / "anchor_fsdp_n8.json").read_text()), raw)
    perf = rec["result"]["ranks"][0]["perf"]
    assert perf["nonfinite_timed_steps"] == 2 and perf["available"] is False
    assert all(x == x for x in perf["timed_losses"])  # the losses were finite: the gradient norms were not
    raw = raw_store.path("rehearse_perf_1xh200")
    for row in ("anchor_distopt_n8", "anchor_fsdp_n8"):  # the re-run anchor is finite on every timed step
        rec = res.refresh_numerics(json.loads((raw / f"{row}.json").read_text()), raw)
        assert rec["result"]["ranks"][0]["perf"]["nonfinite_timed_steps"] == 0


def test_params_are_the_model_total_beside_the_partition():
    total, local, scope = res._params({"params": 10, "parallel": {"tp": 1, "ep": 1, "pp": 1}}, {})
    assert total == local == 10 and scope.startswith("the whole model")
    total, local, scope = res._params({"params": 10, "parallel": {"tp": 1, "ep": 8, "pp": 1}}, {})
    assert total is None and local == 10  # an old EP record: the total is not known, never guessed
    got = res._params({"params": 300, "local_params": 20, "params_scope": "the whole model"}, {})
    assert got == (300, 20, "the whole model")


def test_analytic_check_reads_the_fsdp_gradient_dtypes_the_engine_recorded():
    """Megatron FSDP reduces in its grad-comm dtype, else its main-grads dtype, else bf16: a recorded fp32
    main-grads run is checked at 4 bytes a gradient, fp32 main grads with bf16 communication (Bridge's
    Nemotron 3 Nano recipe) at 2, whatever grad_reduce_in_fp32 says."""
    log = {"bytes_per_step": {"reduce_scatter": {"dp": 1}}}
    base = {
        "communication": {"available": True, **log},
        "params": 1000,
        "local_params": 1000,
        "world_size": 8,
        "micro_batches": 1,
        "param_gather_bytes": 2,
        "grad_reduce_bytes": 4,
        "params_in_layers": 800,
    }

    def bg(**extra):
        return res.analytic_check({**base, **extra}, "optim_grads_params")["job"]["grad_bytes"]

    assert bg() == 2  # nothing recorded (older records): the parameter dtype
    assert bg(fsdp_main_grads_bytes=4) == 4
    assert bg(fsdp_main_grads_bytes=4, fsdp_grad_comm_bytes=2) == 2
    assert res.analytic_check({**base, "fsdp_main_grads_bytes": 4}, "distopt")["job"]["grad_bytes"] == 4


def test_the_h100_anchor_rows_have_figures_and_a_measured_gap():
    # the anchor's FSDP and distributed-optimizer rows on its own GPU kind: finite, at least 4 timed steps; where the
    # published figure falls outside the prediction, every candidate for the gap is a measured row
    doc = json.loads((RESULTS / "rehearse_perf_1xh100.json").read_text())
    by = {r["row"]: r for r in doc["rows"]}
    for name in ("anchor_fsdp_n8", "anchor_distopt_n8"):
        r = by[name]
        assert r["nonfinite_timed_steps"] == 0 and r["timed_steps_used"] >= 4 and r["tokens_per_s_per_gpu"], name
    a = by["anchor_fsdp_n8"]
    assert any("FP8 weights (current scaling) keep their scale" in d for d in a["deviations"])  # labelled
    if not (a["published_vs_predicted"] or {}).get("inside"):
        gap = a["gap_to_published"]
        assert [c["row"] for c in gap["candidates"]] == list(res.GAP_CANDIDATES)
        assert all(c["measured_tokens_per_s_per_gpu"] and c["nonfinite_timed_steps"] == 0 for c in gap["candidates"])
        assert gap["fake_backend_at_n1"]["rehearsal_vs_real_world_of_1"] is not None
        assert gap["distopt_compute_vs_published"] is not None and gap["fsdp_compute_vs_distopt"] is not None
