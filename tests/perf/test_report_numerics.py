"""``perf.report``: non-finite timed steps are left out and said first; K-micro-batch timing is scaled to the step."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from mfsdp_lib.perf import report  # noqa: E402
from mfsdp_lib.runs import rehearse as rh  # noqa: E402

PERF = json.loads((ROOT / "tests" / "fixtures" / "perf" / "engine_report_synthetic.json").read_text())["perf"]


def _perf(**kw) -> dict:
    p = copy.deepcopy(PERF)
    p.update(kw)
    return p


def test_finite_steps_all_count():
    s = report.summarize(_perf(timed_losses=[10.1, 10.0, 9.9], timed_grad_norms=[1.0, 1.0, 1.0]))
    assert s["nonfinite_timed_steps"] == 0 and s["losses_checked"] is True
    assert s["compute"]["step_s"]["n"] == 3 and s["compute"]["step_s"]["median"] == pytest.approx(9.15)
    assert report.warning(s) is None


def test_a_nan_step_is_left_out_of_every_figure_and_said_first():
    # the NaN step is the fastest: were it counted, the median would drop to 8.4 s
    p = _perf(step_times_s=[9.1, 8.4, 9.2], fwd_bwd_times_s=[8.9, 8.2, 9.0], timed_losses=[10.0, math.nan, 10.0])
    s = report.summarize(p)
    assert s["nonfinite_timed_steps"] == 1 and s["excluded_steps"] == [4]
    assert s["compute"]["step_s"]["n"] == 2 and s["compute"]["step_s"]["min"] == pytest.approx(9.1)
    assert s["tokens_per_s_per_gpu"] == pytest.approx(128 * 8192 / 8 / 9.15)
    lines = report.render(s)
    assert lines[0].strip().startswith("WARNING: 1 timed step(s) had a non-finite loss") and "steps 4" in lines[0]


def test_an_infinite_gradient_norm_counts_as_non_finite():
    s = report.summarize(_perf(timed_losses=[10.0, 10.0, 10.0], timed_grad_norms=[1.0, math.inf, 1.0]))
    assert s["nonfinite_timed_steps"] == 1 and s["compute"]["step_s"]["n"] == 2


def test_every_step_non_finite_gives_no_figure():
    s = report.summarize(_perf(timed_losses=[math.nan] * 3))
    assert s["available"] is False and "every timed step had a non-finite" in s["why"]
    assert s["nonfinite_timed_steps"] == 3


def test_a_record_without_losses_is_marked_unchecked():
    s = report.summarize(_perf())
    assert s["losses_checked"] is False and s["nonfinite_timed_steps"] == 0


def test_the_rehearsal_text_says_it_on_its_first_line():
    rank = {
        "rank": 0,
        "world_size": 8,
        "result": "passed",
        "perf": report.summarize(_perf(timed_losses=[10.0, math.nan, 10.0])),
    }
    text = rh.render_text({"ranks": [rank], "result": "passed"})
    assert text.splitlines()[0].startswith("rank 0: WARNING: 1 timed step(s) had a non-finite")


def test_compare_table_names_the_rows_with_non_finite_steps():
    rank = {"result": "passed", "perf": report.summarize(_perf(timed_losses=[10.0, math.nan, 10.0]))}
    row = report.compare_row("optim_grads_params", "optim_grads_params", None, rank)
    assert row["nonfinite_timed_steps"] == 1
    assert report.render_compare([row])[0].startswith("WARNING: non-finite timed steps left out")


@pytest.mark.parametrize(
    ("step", "opt", "k", "m", "want"),
    [
        (2.2, 0.2, 4, 32, 0.2 + 2.0 * 8),  # forward/backward x M/K, the optimizer once
        (2.2, None, 4, 8, 4.4),  # optimizer time unknown: all of it scales
        (2.2, 0.2, 8, 8, 2.2),  # K = M: unchanged
    ],
)
def test_scale_step_arithmetic(step, opt, k, m, want):
    sc = {"micro_batches_run": k, "micro_batches_full": m}
    assert report.scale_step(step, opt, sc) == pytest.approx(want)
    assert report.scale_step(step, opt, None) == step


def test_k_micro_batch_record_is_scaled_to_the_step():
    # 4 of 16 micro-batches ran: each step 2.5 s of which 0.2 s optimizer -> 0.2 + 2.3 x 4 = 9.4 s
    sc = {"micro_batches_run": 4, "micro_batches_full": 16, "global_batch_size_full": 128}
    p = _perf(
        step_times_s=[2.5, 2.5, 2.5],
        fwd_bwd_times_s=[2.3, 2.3, 2.3],
        optimizer_times_s=[0.2, 0.2, 0.2],
        scaling=sc,
        timed_losses=[10.0, 10.0, 10.0],
    )
    s = report.summarize(p)
    assert s["compute"]["step_s"]["median"] == pytest.approx(9.4)
    assert s["compute"]["fwd_bwd_s"]["median"] == pytest.approx(9.2)
    assert s["compute"]["optimizer_s"]["median"] == pytest.approx(0.2)
    assert s["tokens_per_s_per_gpu"] == pytest.approx(128 * 8192 / 8 / 9.4)
    assert s["scaling"]["micro_batches_full"] == 16
    assert any(ln.strip().startswith("scaled: 4 of the step's 16 micro-batches") for ln in report.render(s))


def test_nan_written_as_text_in_a_json_report_counts():
    # the engine's report.json holds NaN and infinity as "nan" / "inf" (JSON has no such numbers)
    p = _perf(timed_losses=[10.0, "nan", "nan"], timed_grad_norms=["inf", "nan", "nan"])
    s = report.summarize(p)
    assert s["available"] is False and s["nonfinite_timed_steps"] == 3


def test_the_engines_own_verdict_is_kept():
    s = report.summarize(_perf(timed_losses=[10.0, 10.0, 10.0], nonfinite_steps=[4]))
    assert s["nonfinite_timed_steps"] == 1 and s["excluded_steps"] == [4]


def test_a_tensor_parallel_plus_inf_loss_the_engine_traced_counts_and_is_said():
    p = _perf(
        timed_losses=[math.inf, math.inf, 10.0],
        timed_grad_norms=[56.0, math.nan, 1.0],
        loss_inf_tp_steps=[3],  # the engine's verdict for the first timed step (iteration 3)
        timed_steps=[3, 4, 5],
    )
    s = report.summarize(p)
    assert s["nonfinite_timed_steps"] == 1 and s["excluded_steps"] == [4] and s["compute"]["step_s"]["n"] == 2
    lines = report.render(s)
    assert lines[0].strip().startswith("WARNING: 1 timed step(s)")
    assert lines[1].strip().startswith("NOTE: 1 timed step(s) reported a loss of +inf") and "steps 3" in lines[1]
    # without the engine's verdict the same +inf loss is left out
    s = report.summarize(_perf(timed_losses=[math.inf, 10.0, 10.0], timed_grad_norms=[56.0, 1.0, 1.0]))
    assert s["nonfinite_timed_steps"] == 1 and report.loss_note(s) is None
