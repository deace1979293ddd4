"""The rehearsal benchmark's matrix and scheduler (the GPU runs themselves happen elsewhere).

The matrix must hold every case the rehearsal claims to measure, fit the GPU it is
packed onto, and put the important runs first; the scheduler must respect memory,
concurrency, per-run timeouts and the group's time budget. A stub interpreter
stands in for the engine (labelled: it only writes the report the engine would).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

import bench_rehearse as br
from mfsdp_gpu import args as engine_args
from mfsdp_gpu import bridge

ROOT = Path(__file__).resolve().parent.parent.parent


def _tags(group):
    return [r.tags for r in br.GROUPS[group]()]


def test_group_a_is_the_full_llama_1b_grid():
    got = {(t["n"], t["strategy"]) for t in _tags("A")}
    assert got == {(n, s) for n in (1, 2, 8, 64) for s in bridge.STRATEGIES}
    first = [(t["n"], t["strategy"]) for t in _tags("A")][:5]
    # the rows of the earlier fake-backend table come first, so a cut-off keeps them
    assert first == [(1, "ddp"), (8, "distopt"), (8, "optim_grads_params"), (64, "distopt"), (64, "optim_grads_params")]


def test_group_b_covers_trunks_moe_peft_and_pp():
    tags = _tags("B")
    assert {"model": "llama3-70b", "n": 64, "strategy": "optim_grads_params"} in tags
    assert {(t["model"], t["n"]) for t in tags if t["model"] == "llama3-8b"} == {("llama3-8b", 8), ("llama3-8b", 64)}
    moe = {(t["n"], t["strategy"]) for t in tags if t["model"] == "qwen3-moe-16l"}
    assert {(8, "optim_grads_params"), (64, "optim_grads_params")} <= moe and all(
        t.get("ep") == 8 for t in tags if t["model"] == "qwen3-moe-16l"
    )
    assert {t["n"] for t in _tags("H") if t["model"] == "nemotronh-small"} == {8, 64}  # hybrid: its own group
    assert {t["n"] for t in tags if t.get("peft") == "lora"} == {8, 64}
    assert any(t.get("pp") == 2 and t["strategy"] == "optim_grads_params" for t in tags)


def test_group_c_has_parity_save_load_and_rank_positions():
    runs = br.group_c()
    parity = [r for r in runs if r.tags.get("parity")]
    assert parity and "--parity" in parity[0].args and parity[0].tags["model"] == "llama-1b"
    assert any("--save-load" in r.args and "--parity" not in r.args for r in runs)
    assert {r.tags.get("rank") for r in runs if r.tags.get("pp") == 2} == {0, 4}


def test_every_run_parses_as_engine_arguments_and_names_are_unique():
    runs = [r for g in br.GROUPS.values() for r in g()]
    assert len({r.name for r in runs}) == len(runs)
    for r in runs:
        a = engine_args.rehearse_parser().parse_intermixed_args([*r.args, "--out", "x"])
        engine_args.check_args(a)
        engine_args.parse_overrides(a.overrides)
        assert r.timeout_s >= r.est_s and r.est_gib > 0


def test_each_run_fits_the_gpu_and_groups_fit_their_budget():
    for g, make in br.GROUPS.items():
        runs = make()
        assert all(r.est_gib <= br.GPU_BUDGET_GIB for r in runs), g
        # ideal packing bound: total GiB-seconds over the GPU budget, must leave room in the group's time
        gib_s = sum(r.est_gib * r.est_s for r in runs)
        assert gib_s / br.GPU_BUDGET_GIB < br.GROUP_BUDGET_S[g], g
    # the device time the dense/MoE matrix may use; the hybrid group is one device call of its own (<= 9 min
    # with the install and the archive)
    assert sum(v for g, v in br.GROUP_BUDGET_S.items() if g != "H") <= 16 * 60
    assert br.GROUP_BUDGET_S["H"] <= 8 * 60


def _run(name, gib, est_s=60):
    return br.Run(name, [], est_gib=gib, est_s=est_s)


def test_pick_next_respects_memory_concurrency_and_time():
    pending = [_run("big", 90), _run("mid", 30), _run("small", 10)]
    assert br.pick_next(pending, 0, 0, 120, 6, 600).name == "big"
    assert br.pick_next(pending, 90, 1, 120, 6, 600).name == "mid"  # backfill beside the big one
    assert br.pick_next(pending, 115, 2, 120, 6, 600) is None
    assert br.pick_next(pending, 0, 6, 120, 6, 600) is None
    assert br.pick_next(pending, 0, 0, 120, 6, 30) is None  # nothing can finish in 30 s
    assert br.pick_next([_run("huge", 200)], 0, 0, 120, 6, 600).name == "huge"  # alone, it may try


def test_summary_reads_the_engine_report():
    rep = {
        "result": "failed",
        "setup_wall_s": 12.5,
        "phases": {"model_build": {"allocated_bytes": 2 * br.GIB}, "train": {"losses": [10.4, None]}},
        "memory": {
            "between_steps_bytes": 3 * br.GIB,
            "peak_allocated_bytes": 7 * br.GIB,
            "steps": [{"peak_fwd_bwd_bytes": 6 * br.GIB, "peak_optimizer_step_bytes": 4 * br.GIB}],
        },
        "params": {"local_numel": 10, "local_expert_numel": 4},
        "first_failure": {
            "phase": "model_wrap",
            "type": "EinopsError",
            "message": "m",
            "frames": {"core": "megatron/core/x.py:1 in f"},
        },
    }
    s = br.summarize_report(rep)
    assert s["between_steps_gib"] == 3.0 and s["peak_allocated_gib"] == 7.0 and s["peak_fwd_bwd_gib"] == 6.0
    assert s["after_model_build_gib"] == 2.0 and s["local_expert_numel"] == 4
    assert s["failure"] == {
        "phase": "model_wrap",
        "type": "EinopsError",
        "message": "m",
        "where": "megatron/core/x.py:1 in f",
    }
    assert br.summarize_report(None) == {"result": "no report"}


STUB = """#!{python}
# Stand-in for the GPU engine (labelled stub): writes the report the engine would, after SLEEP seconds.
import json, os, sys, time
args = sys.argv[2:]
out = args[args.index("--out") + 1]
os.makedirs(out, exist_ok=True)
sleep = float(os.environ.get("STUB_SLEEP", "0.2"))
if "hang" in out:
    sleep = 60
json.dump({{"result": "running", "phases": {{}}}}, open(os.path.join(out, "report.json"), "w"))
time.sleep(sleep)
open(os.path.join(out, "ckpt.distcp"), "w").write("x")
json.dump({{"result": "passed", "phases": {{}}, "memory": {{"peak_allocated_bytes": 1073741824}}}}, open(os.path.join(out, "report.json"), "w"))
"""


@pytest.fixture
def stub(tmp_path):
    path = tmp_path / "stub_python"
    path.write_text(STUB.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def _args(stub, **kw):
    ns = br.parse_args(["--out", "x", "--group", "A", "--python", stub])
    ns.budget_s = kw.get("budget_s", 60)
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


def test_run_group_runs_skips_done_and_cleans_checkpoints(tmp_path, stub):
    out = tmp_path / "res"
    runs = [_run("r1", 10, 1), _run("r2", 10, 1), _run("r3", 10, 1)]
    (out / "r3").mkdir(parents=True)
    (out / "r3" / "report.json").write_text(json.dumps({"result": "failed"}))
    got = br.run_group(runs, out, _args(stub))
    assert set(got["jobs"]) == {"r1", "r2"} and got["skipped_present"] == ["r3"]
    assert all(j["exit_code"] == 0 for j in got["jobs"].values())
    assert json.loads((out / "r1" / "report.json").read_text())["result"] == "passed"
    assert not list(out.rglob("*.distcp"))
    assert (out / "r1" / "log.txt").exists()


def test_run_group_stops_at_the_budget_and_marks_the_run_for_a_rerun(tmp_path, stub):
    out = tmp_path / "res"
    runs = [_run("hang", 10, 1), _run("later", 10, 1)]
    got = br.run_group(runs, out, _args(stub, budget_s=4, max_concurrent=1))
    assert got["jobs"]["hang"]["stopped"] == "group budget spent"
    assert (out / "hang" / br.BUDGET_MARKER).exists()
    assert not br.report_done(out, "hang")  # group C picks it up again
    assert got["not_run"] == ["later"]


def test_run_group_enforces_the_per_run_timeout(tmp_path, stub):
    out = tmp_path / "res"
    run = br.Run("hang", [], est_gib=10, est_s=1, timeout_s=2)
    got = br.run_group([run], out, _args(stub, budget_s=30))
    assert got["jobs"]["hang"]["stopped"] == "timeout"
    assert not (out / "hang" / br.BUDGET_MARKER).exists()


def test_list_prints_commands_without_running(tmp_path, capsys):
    assert br.main(["--out", str(tmp_path / "r"), "--group", "B", "--list"]) == 0
    text = capsys.readouterr().out
    assert "B_llama70b_n64_optim_grads_params" in text and "--world-size 64" in text
    assert not (tmp_path / "r").exists()


def test_unknown_only_name_is_refused(tmp_path, capsys):
    assert br.main(["--out", str(tmp_path), "--group", "A", "--only", "nope"]) == 2
    assert "unknown run name" in capsys.readouterr().err


def test_child_environment_is_offline_and_fsdp_safe(monkeypatch):
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    env = br.child_env()
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env and env["HF_HUB_OFFLINE"] == "1"
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # the caller's own environment untouched


def test_budget_stop_is_for_all_running_runs_at_once(tmp_path, stub):
    out = tmp_path / "res"
    runs = [_run(f"hang{i}", 10, 1) for i in range(3)]
    got = br.run_group(runs, out, _args(stub, budget_s=8))
    assert all(got["jobs"][r.name]["stopped"] == "group budget spent" for r in runs)
    assert got["wall_s"] < 8 + 10  # not one grace period per run
    assert all((out / r.name / br.BUDGET_MARKER).exists() for r in runs)
