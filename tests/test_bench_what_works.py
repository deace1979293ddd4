"""The CPU parts of the what-works benchmark: the plan, its batches and commands, the batch driver's process
handling (with stand-in engines: no GPU here), and turning raw files into result rows (real engine reports)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

import bench_what_works as bw
import raw_store
import what_works_result as wr
from conftest import ROOT
from mfsdp_lib import what_works

PLAN = json.loads((ROOT / "benchmarks" / "what_works_plan.json").read_text())
RAW = raw_store.folder()
PP2_REPORT = RAW / "gpu_pkg_reverify_1xh200" / "rehearse" / "B_pp2_llama1b_n8_optim_grads_params" / "report.json"
# a recorded run with a NaN timed step: the 70 B row before the FP8 scale keeper (kept as evidence)
PERF_REPORT = RAW / "rehearse_perf_1xh200_before_fp8_fix" / "llama70b_n64.rank_0.report.json"
DONE_WHEN_KEYS = {
    "recipe",
    "family",
    "mode",
    "world_size",
    "layout_before",
    "layout_after",
    "check_before",
    "check_after",
    "phases",
    "first_error",
    "memory_gib",
    "tokens_per_s_per_gpu",
    "predicted_tokens_per_s_per_gpu",
    "changes",
}


# ------------------------------------------------------------------------------------------- the plan


def test_names_give_family_mode_and_world():
    assert bw.family_of("qwen3_30b_a3b_pretrain_16gpu_h100_bf16") == "qwen3_moe"
    assert bw.family_of("qwen3_8b_pretrain_4gpu_h100_bf16") == "qwen3"
    assert bw.family_of("qwen3_vl_8b_sft_2gpu_h100_bf16") == "qwen3_vl"
    assert bw.family_of("nemotron_nano_9b_v2_sft_2gpu_h100_bf16") == "nemotron_nano_v2"
    assert bw.family_of("vanilla_gpt_pretrain_1gpu_h100_bf16") == "gpt"
    assert bw.family_of("exaone4_1p2b_sft") is None
    assert bw.mode_of("gemma2_2b_peft_1gpu_h100_bf16") == "peft"
    assert bw.mode_of("nemotron_3_5_lightning_sft_openmathinstruct2_packed") == "sft"
    assert bw.named_world("deepseek_v3_pretrain_256gpu_h100_bf16_32nodes") == 256
    assert bw.named_world("nemotron_3_super_pretrain") is None


def test_plan_covers_every_family_and_mode_of_the_corpus():
    records = bw.verdicts()
    present = {
        (bw.family_of(s), bw.mode_of(s))
        for s, r in records.items()
        if (r.get("build") or {}).get("ok") and bw.family_of(s) and bw.mode_of(s)
    }
    planned = {(r["family"], r["mode"]) for r in PLAN["rows"]}
    assert planned == present
    assert len(PLAN["rows"]) >= 30
    assert len({r["id"] for r in PLAN["rows"]}) == len(PLAN["rows"])
    kinds = {k for r in PLAN["rows"] for k in r["kinds"]}
    assert {"moe", "mla", "hybrid", "vlm", "peft"} <= kinds
    fams = {r["family"] for r in PLAN["rows"]}
    assert {"qwen3_moe", "deepseek_v3", "glm", "gpt_oss", "olmoe", "nemotronh", "nemotron_3_nano", "qwen3_vl"} <= fams


def test_plan_rows_have_the_result_schema_with_nothing_measured():
    for row in PLAN["rows"]:
        assert set(row) >= DONE_WHEN_KEYS, row["id"]
        assert set(row["phases"]) == set(what_works.PHASES)
        assert set(row["phases"].values()) == {"not run"}
        assert row["first_error"] is None and row["tokens_per_s_per_gpu"] is None
        assert row["memory_gib"]["measured_state"] is None and row["memory_gib"]["measured_peak"] is None
        assert row["predicted_tokens_per_s_per_gpu"] == {"low": None, "high": None}
        assert set(row["layout_before"]) == {"tp", "pp", "cp", "ep", "dp"}
        assert row["expected"]["outcome"] and row["expected"]["why"]
        assert not what_works.measured(row)


def test_plan_follows_the_skill_route():
    for row in PLAN["rows"]:
        if row["layout_before"]["pp"] > 1 and row["enable"]["written"]:
            assert "--set-pp-1" in row["enable"]["args"], row["id"]
            assert row["layout_after"]["pp"] == 1
            # the rest of the layout is kept
            assert {k: row["layout_after"][k] for k in ("tp", "cp", "ep")} == {
                k: row["layout_before"][k] for k in ("tp", "cp", "ep")
            }
        if row["enable"]["written"]:
            assert row["changes"]["ddp.use_megatron_fsdp"] is True
            assert row["check_after"]["exit"] == 0 or row["expected"]["outcome"] == "refused by check"
        if row["gpu_run"]:
            cmd = row["dry_run"]["commands"][0]
            assert cmd.startswith("python3 scripts/rehearse_train.py ")
            assert f"--world-size {row['world_size']} --rank 0 " in cmd and "--perf" in cmd
            assert "/work/" not in cmd and "/tmp/" not in cmd  # machine-free
            assert ("--save-load" in cmd) == row["save_load"]
    probes = [r for r in PLAN["rows"] if r["pp_probe"]]
    assert probes and all("--rank-position" not in p["pp_probe"]["dry_run"]["commands"][0] for p in probes)
    for p in probes:  # the last stage's first rank of the as-shipped layout
        world, pp = p["world_size"], p["layout_before"]["pp"]
        assert f"--rank {world - world // pp} " in p["pp_probe"]["dry_run"]["commands"][0]
    fams_with_sl = {r["family"] for r in PLAN["rows"] if r["save_load"]}
    assert len(fams_with_sl) >= 15
    for fam in fams_with_sl:  # one save/load row per family
        assert sum(1 for r in PLAN["rows"] if r["family"] == fam and r["save_load"]) == 1


def test_needs_and_fallbacks():
    hybrid = [r for r in PLAN["rows"] if "hybrid" in r["kinds"]]
    assert hybrid and all(r["needs"]["mamba_ssm"] for r in hybrid)
    flex = [r for r in PLAN["rows"] if r["needs"]["moe_dispatcher"]]
    assert flex and all(bw.DISPATCHER_FALLBACK in r["fallbacks_if_missing"] for r in flex)
    row = flex[0]
    assert bw.fallbacks_for(row, {"deep_ep": True, "hybrid_ep": True}) == []
    assert bw.fallbacks_for(row, {"deep_ep": False, "hybrid_ep": False}) == [bw.DISPATCHER_FALLBACK]
    dsa = {"needs": {"moe_dispatcher": None, "dsa_kernels": "cudnn"}}
    assert bw.fallbacks_for(dsa, {"flash_mla": False}) == [bw.DSA_FALLBACK]


def test_batches_fit_a_call_and_hold_each_runnable_row_once():
    seen = []
    for b in PLAN["batches"]:
        assert b["estimated_s"] <= bw.BATCH_BUDGET_S or len(b["rows"]) == 1
        seen += b["rows"]
    runnable = [r["id"] for r in PLAN["rows"] if r["gpu_run"]]
    assert sorted(seen) == sorted(runnable)
    not_run = [r for r in PLAN["rows"] if not r["gpu_run"]]
    assert all(
        r["expected"]["outcome"] in ("refused by enable", "refused by check", "does not fit one H200") for r in not_run
    )


def test_make_batches_packs_in_order_and_pays_mamba_once():
    rows = [
        {"id": f"r{i}", "gpu_run": True, "estimate_gpu_s": 100, "needs": {"mamba_ssm": i < 2}, "pp_probe": None}
        for i in range(6)
    ]
    batches = bw.make_batches(rows, budget_s=bw.IMPORT_S + 100 * 3 + bw.MAMBA_FIRST_S)
    assert [b["rows"] for b in batches] == [["r0", "r1", "r2"], ["r3", "r4", "r5"]]
    assert batches[0]["estimated_s"] == bw.IMPORT_S + 300 + bw.MAMBA_FIRST_S
    assert batches[1]["estimated_s"] == bw.IMPORT_S + 300


def test_timing_overrides_cap_micro_batches():
    cfg = {"train": {"global_batch_size": 512, "micro_batch_size": 1}, "model": {"seq_length": 4096}}
    layout = {"tp": 1, "cp": 1, "dp": 16}
    mem = {"params": 1e9, "expert_params": 0}
    assert bw.timing_overrides(cfg, layout, mem) == [f"train.global_batch_size={16 * bw.MAX_TIMED_MICROBATCHES}"]
    cfg["train"]["global_batch_size"] = 32  # two micro-batches: the recipe's own
    assert bw.timing_overrides(cfg, layout, mem) == []
    big = {"params": 5e12, "expert_params": 0}  # a step far over the row's cap: one micro-batch
    cfg["train"]["global_batch_size"] = 512
    assert bw.timing_overrides(cfg, layout, big) == ["train.global_batch_size=16"]


def test_plan_row_is_what_the_route_gives_now(tmp_path):
    """Two rows of the committed plan, planned again: the CPU route (check, enable, memory) has not drifted."""
    ids = ["deepseek_v3_pretrain_256gpu_h100_bf16_32nodes", "qwen3_30b_a3b_peft_4gpu_h100_bf16"]
    fresh = bw.build_plan(tmp_path, only=ids)
    for row in fresh["rows"]:
        old = next(r for r in PLAN["rows"] if r["id"] == row["id"])
        for key in ("check_before", "enable", "check_after", "layout_after", "memory_gib", "needs", "source"):
            assert row[key] == old[key], (row["id"], key)


# ------------------------------------------------------------------------------------------- the driver


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(bw, "STAGGER_S", 0.0)
    monkeypatch.setattr(bw, "START_MARGIN_S", 1)


def _standin(tmp_path, name: str, body: str) -> dict:
    d = tmp_path / "rows" / name
    code = (
        "import json, os, sys, time, subprocess\n"
        f"d = {str(d)!r}\n"
        "json.dump({'gpu_lock': os.environ.get('MFSDP_GPU_LOCK'), 'started_utc': 'x'}, open(os.path.join(d, 'report.json'), 'w'))\n"
        + body
    )
    return {"id": name, "name": "rehearse", "role": "rank 0", "dir": str(d), "command": [sys.executable, "-c", code]}


def test_run_engines_budget_stops_the_whole_group(tmp_path, quick):
    pidfile = tmp_path / "child.pid"
    runs = [
        _standin(tmp_path, "a", "print('ok')\n"),
        _standin(
            tmp_path,
            "b",
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(120)\n",
        ),
        _standin(tmp_path, "c", "print('never')\n"),
    ]
    t0 = time.time()
    recs = bw.run_engines(runs, tmp_path, budget_s=6, max_concurrent=1)
    assert time.time() - t0 < 40
    assert recs[0]["exit"] == 0 and recs[0]["stopped"] is None
    assert recs[1]["stopped"] == "budget" and recs[1]["exit"] != 0
    assert recs[2] == {"name": "rehearse", "role": "rank 0", "exit": None, "stopped": "not started: budget"}
    child = int(pidfile.read_text())
    for _ in range(20):  # the engine's own child went with its group
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(child, 9)
        pytest.fail("a child of a stopped run outlived the batch")
    assert recs[0]["window"]["gpu_lock"] == str(tmp_path / "gpu.lock")
    assert bw.timing_exclusive(recs) is True
    assert not (tmp_path / "gpu.lock").exists()


def test_timing_exclusive_needs_every_run_to_hold_the_lock():
    assert bw.timing_exclusive([]) is None
    assert bw.timing_exclusive([{"exit": 0, "window": {"gpu_lock": "/x"}}, {"exit": None}]) is True
    assert bw.timing_exclusive([{"exit": 0, "window": {"gpu_lock": None}}]) is False
    # two slots: each run held a lock, but not the same one, so two could be on the GPU together
    two = [{"exit": 0, "window": {"gpu_lock": "/x.0"}}, {"exit": 0, "window": {"gpu_lock": "/x.1"}}]
    assert bw.timing_exclusive(two) is False
    # a run that ended at Bridge's validate took no lock and used no GPU time: it does not break exclusivity ...
    held = {"exit": 0, "window": {"gpu_lock": "/x", "last_phase": "train"}}
    refused = {"exit": 1, "window": {"gpu_lock": None, "last_phase": "validate"}}
    assert bw.timing_exclusive([held, refused]) is True
    assert bw.timing_exclusive([refused]) is None  # nothing used the GPU: nothing to say
    # ... but one that got past validate without the lock, or left no report, does
    assert bw.timing_exclusive([held, {"exit": 1, "window": {"gpu_lock": None, "last_phase": "model_build"}}]) is False
    assert bw.timing_exclusive([held, {"exit": 1, "window": {"gpu_lock": None, "last_phase": None}}]) is False
    assert bw.last_phase({"phases": {"import": {}, "validate": {}, "model_build": {}}}) == "model_build"
    assert bw.last_phase({}) is None


def test_run_engines_with_gpu_slots_spreads_runs_over_the_locks(tmp_path, quick):
    """Untimed runs share the GPU: run i takes slot i % slots, and none waits for the others' memory."""
    runs = [
        _standin(
            tmp_path,
            n,
            "json.dump({'gpu_lock': os.environ.get('MFSDP_GPU_LOCK'), 'margin': os.environ.get('MFSDP_GPU_FREE_MARGIN_GIB')}, open(os.path.join(d, 'report.json'), 'w'))\n",
        )
        for n in ("a", "b", "c")
    ]
    recs = bw.run_engines(runs, tmp_path, budget_s=60, max_concurrent=3, gpu_slots=2)
    locks = [r["window"]["gpu_lock"] for r in recs]
    assert locks == [str(tmp_path / "gpu.lock.0"), str(tmp_path / "gpu.lock.1"), str(tmp_path / "gpu.lock.0")]
    assert all(json.loads((tmp_path / "rows" / n / "report.json").read_text())["margin"] == "inf" for n in "abc")
    assert bw.timing_exclusive(recs) is False
    assert not list(tmp_path.glob("gpu.lock*"))
    # one slot (the timed batches): the single lock, and the engine's default wait for memory
    env = bw.child_env(tmp_path)
    assert env["MFSDP_GPU_LOCK"] == str(tmp_path / "gpu.lock") and "MFSDP_GPU_FREE_MARGIN_GIB" not in env


def test_tail_file_keeps_the_end(tmp_path):
    p = tmp_path / "log.txt"
    p.write_bytes(b"a" * 1000 + b"THE END")
    bw.tail_file(p, limit=100)
    data = p.read_bytes()
    assert data.endswith(b"THE END") and len(data) < 200 and b"cut" in data


def test_prepare_row_makes_the_enabled_job_and_its_commands(tmp_path):
    row = next(r for r in PLAN["rows"] if r["id"] == "deepseek_v3_pretrain_256gpu_h100_bf16_32nodes")
    prep = bw.prepare_row(row, tmp_path, "python3", {"deep_ep": False, "hybrid_ep": False})
    assert prep["stale"] is False and prep["fallbacks"] == [bw.DISPATCHER_FALLBACK]
    assert (tmp_path / "rows" / row["id"] / "enabled.yaml").is_file()
    names = [r["name"] for r in prep["runs"]]
    assert names == ["rehearse", "pp_probe"]
    main, probe = prep["runs"]
    assert main["command"][:2] == ["python3", str(ROOT / "scripts" / "rehearse_train.py")]
    assert bw.DISPATCHER_FALLBACK in main["command"] and "--save-load" in main["command"]
    assert main["dir"] == str(tmp_path / "rows" / row["id"] / "rehearse" / "rank_0")
    assert probe["command"][probe["command"].index("--rank") + 1] == "224"
    with_ep = bw.prepare_row(row, tmp_path / "b", "python3", {"deep_ep": True, "hybrid_ep": True})
    assert with_ep["fallbacks"] == [] and bw.DISPATCHER_FALLBACK not in with_ep["runs"][0]["command"]


def test_run_refuses_a_used_folder_and_unknown_rows(tmp_path, capsys):
    (tmp_path / "x").write_text("")
    with pytest.raises(SystemExit):
        bw.main(["--run", "--batch", "1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        bw.main(["--run", "--rows", "no_such_row", "--out", str(tmp_path / "new")])
    assert "not in the plan" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- results


def _raw_batch(tmp_path, row_id: str, report: dict, save_load: bool = False) -> tuple:
    from mfsdp_lib.perf import predict as pp

    batch = tmp_path / "batch_1"
    run_dir = batch / "rows" / row_id / "rehearse" / "rank_0"
    run_dir.mkdir(parents=True)
    (run_dir / "report.json").write_text(json.dumps(report))
    run = {"dir": str(run_dir), "role": "rank 0", "command": ["python3", "scripts/rehearse_train.py"]}
    links = pp.Links(pp.DGX_NVLINK_GBPS, pp.DGX_IB_GBPS, pp.DGX_GPUS_PER_NODE)
    raw = {
        "schema": bw.RAW_SCHEMA,
        "id": row_id,
        "batch": 1,
        "prepare": {"stale": False, "fallbacks": []},
        "runs": [
            {
                "name": "rehearse",
                "role": "rank 0",
                "exit": 0,
                "wall_s": 10.0,
                "stopped": None,
                "dir": os.path.relpath(run_dir, batch),
                "summary": bw.summarize_run(run, links),
            }
        ],
    }
    (batch / "rows" / row_id / "row.json").write_text(json.dumps(raw))
    (batch / "batch.json").write_text(
        json.dumps({"timing_exclusive": True, "started_utc": "2026-01-01T00:00:00+00:00"})
    )
    return batch, raw


def test_fold_phases():
    ph = [{"name": n, "status": "passed"} for n in ("import", "config", "validate", "setup_start", "model_build")]
    ph.append({"name": "model_wrap", "status": "failed"})
    assert wr.fold_phases(ph, False) == {
        "validate": "passed",
        "wrap": "failed",
        "optimizer": "not run",
        "first_steps": "not run",
        "save": "not run",
        "load": "not run",
    }
    cut = [{"name": "validate", "status": "passed"}, {"name": "some_new_phase", "status": "running"}]
    assert wr.fold_phases(cut, False)["validate"] == "failed"  # an unknown phase's failure is never dropped


def test_result_row_from_a_real_wrap_failure(tmp_path):
    report = json.loads(PP2_REPORT.read_text())
    plan_row = next(r for r in PLAN["rows"] if r["pp_probe"])
    batch, _raw = _raw_batch(tmp_path, plan_row["id"], report)
    res = wr.collect([batch], PLAN, None)
    row = res["rows"][0]
    assert row["phases"]["validate"] == "passed" and row["phases"]["wrap"] == "failed"
    assert row["phases"]["optimizer"] == "not run"
    assert row["first_error"]["rule"] == "MFSDP-PIPELINE-PARALLEL"
    assert "mcore_fsdp_adapter" in (row["first_error"]["where"] or "")
    assert row["tokens_per_s_per_gpu"] is None
    assert what_works.measured(row) and what_works.verdict(row) == "failed at wrap"
    assert row["memory_gib"]["predicted_state"] == plan_row["memory_gib"]["predicted_state"]


def test_result_row_drops_throughput_of_non_finite_steps(tmp_path):
    report = json.loads(PERF_REPORT.read_text())
    assert "nan" in [str(x) for x in report["phases"]["train"]["losses"]]  # the recorded run has one
    plan_row = PLAN["rows"][0]
    batch, _raw = _raw_batch(tmp_path, plan_row["id"], report)
    row = wr.collect([batch], PLAN, None)["rows"][0]
    assert row["phases"]["first_steps"] == "passed"
    assert row["nonfinite_timed_steps"] >= 1
    assert row["tokens_per_s_per_gpu"] is None
    assert row["memory_gib"]["measured_peak"] > 0


def test_result_row_keeps_finite_throughput(tmp_path):
    report = json.loads(PERF_REPORT.read_text())
    report["phases"]["train"]["losses"] = [11.7, 11.7, 11.6]
    plan_row = PLAN["rows"][0]
    batch, _raw = _raw_batch(tmp_path, plan_row["id"], report)
    row = wr.collect([batch], PLAN, None)["rows"][0]
    assert row["nonfinite_timed_steps"] == 0
    assert row["tokens_per_s_per_gpu"] > 0
    rng = row["predicted_tokens_per_s_per_gpu"]
    assert rng["low"] is not None and rng["low"] <= rng["high"]


def test_memory_check_tolerances():
    ok = wr.memory_check(
        {"predicted_state": 10.2, "measured_state": 10.0, "predicted_peak": 10.4, "measured_peak": 10.0}
    )
    assert ok["within_tolerance"] is True
    under = wr.memory_check(
        {"predicted_state": 9.85, "measured_state": 10.0, "predicted_peak": None, "measured_peak": None}
    )
    assert under["within_tolerance"] is False  # 1.5 % under: never under by more than 1 %
    assert wr.memory_check({"predicted_state": None, "measured_state": None}) is None


def test_collect_merges_batches_and_refuses_nothing_measured(tmp_path, capsys):
    report = json.loads(PP2_REPORT.read_text())
    b1, _ = _raw_batch(tmp_path / "one", PLAN["rows"][0]["id"], report)
    b2, _ = _raw_batch(tmp_path / "two", PLAN["rows"][1]["id"], report)
    out = tmp_path / "res.json"
    assert wr.main([str(b1), "--out", str(out)]) == 0
    assert wr.main([str(b2), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["id"] for r in data["rows"]] == [PLAN["rows"][0]["id"], PLAN["rows"][1]["id"]]
    empty = tmp_path / "empty"
    (empty / "rows").mkdir(parents=True)
    assert wr.main([str(empty), "--out", str(tmp_path / "none.json")]) == 1
    assert not (tmp_path / "none.json").exists()
    assert wr.main([str(tmp_path / "nothing"), "--out", str(out)]) == 2


def test_a_row_a_later_batch_never_started_keeps_its_measurement(tmp_path):
    rid = PLAN["rows"][0]["id"]
    b1, _ = _raw_batch(tmp_path / "one", rid, json.loads(PP2_REPORT.read_text()))
    b2, raw = _raw_batch(tmp_path / "two", rid, json.loads(PP2_REPORT.read_text()))
    raw["runs"] = [{"name": "rehearse", "role": "rank 0", "exit": None, "stopped": "not started: budget"}]
    (b2 / "rows" / rid / "row.json").write_text(json.dumps(raw))
    (row,) = wr.collect([b1, b2], PLAN, None)["rows"]
    assert row["measured"]["raw"].startswith(wr.repo_path(b1))
    assert wr.collect([b2], PLAN, None)["rows"] == []  # with nothing earlier, an unstarted row gives no row


def test_no_results_committed_without_raw_files():
    res = ROOT / "benchmarks" / "results" / "what_works_1xh200.json"
    if res.exists():
        for row in json.loads(res.read_text())["rows"]:
            raw = raw_store.resolve(ROOT / row["measured"]["raw"])
            assert (raw / "row.json").is_file(), row["id"]
    else:
        assert not (ROOT / "references" / "what-works.md").exists()


def test_run_batch_end_to_end_on_a_machine_without_a_gpu(tmp_path, quick):
    """The whole --run path on this CPU machine: the real engine refuses (no PyTorch/CUDA here, exit 2) and the
    batch still leaves a row.json per row and a batch.json; nothing is marked measured."""
    rid = "qwen3_1p7b_pretrain_1gpu_h100_bf16"
    plan = {**PLAN, "batches": [{"batch": 0, "rows": [rid], "estimated_s": None}]}
    out = tmp_path / "b0"
    summary = bw.run_batch(plan, 0, out, sys.executable, budget_s=60, max_concurrent=2)
    assert summary["rows"] == [rid]
    raw = json.loads((out / "rows" / rid / "row.json").read_text())
    assert raw["schema"] == bw.RAW_SCHEMA and raw["prepare"]["stale"] is False
    (run,) = raw["runs"]
    assert run["name"] == "rehearse" and run["exit"] == 2  # the engine's own refusal
    assert run["summary"]["result"] == "failed"
    row = wr.collect([out], PLAN, None)["rows"][0]
    assert row["phases"] == dict.fromkeys(what_works.PHASES, "not run")
    assert not what_works.measured(row)  # a run that never reached the GPU is no result


def test_batch_order_names_every_family_once():
    fams = [f for f, _ in bw.FAMILIES]
    assert sorted(bw.BATCH_ORDER) == sorted(fams)
    first = PLAN["batches"][0]["rows"]
    assert any(r.startswith("qwen3_30b_a3b") for r in first)  # MoE with EP first


def _engine_accepts(command: str, out: str) -> None:
    """The engine's own argument parser and checks (no PyTorch needed) accept a planned command."""
    import shlex

    from mfsdp_gpu.args import check_args, parse_overrides, rehearse_parser

    argv = shlex.split(command.replace("$OUT", out))
    assert argv[:2] == ["python3", "scripts/rehearse_train.py"], command
    argv = [str(ROOT / a) if a.startswith("tests/") else a for a in argv[2:]]
    argv = [a if "=tests/" not in a else a.replace("=tests/", f"={ROOT}/tests/") for a in argv]
    a = rehearse_parser().parse_intermixed_args(argv)
    check_args(a)
    parse_overrides(a.overrides)


def test_every_planned_engine_command_is_accepted_by_the_engine(tmp_path):
    for row in PLAN["rows"]:
        for cmd in row["dry_run"]["commands"] + ((row.get("pp_probe") or {}).get("dry_run") or {}).get("commands", []):
            _engine_accepts(cmd, str(tmp_path))
    overrides = json.loads((ROOT / "benchmarks" / "recommended_overrides_plan.json").read_text())
    for row in overrides["baselines"] + [r for r in overrides["overrides"] if r["job"]]:
        _engine_accepts(row["command"], str(tmp_path))


def test_a_row_whose_preparation_fails_does_not_stop_the_batch(tmp_path, quick, monkeypatch):
    rid = "qwen3_1p7b_pretrain_1gpu_h100_bf16"
    plan = {**PLAN, "batches": [{"batch": 0, "rows": [rid], "estimated_s": None}]}

    def broken(*_a, **_k):
        raise RuntimeError("mfsdp.py enable exited 3: stand-in crash")

    monkeypatch.setattr(bw, "prepare_row", broken)
    bw.run_batch(plan, 0, tmp_path / "b", sys.executable, budget_s=30, max_concurrent=1)
    raw = json.loads((tmp_path / "b" / "rows" / rid / "row.json").read_text())
    assert "stand-in crash" in raw["prepare"]["error"] and raw["runs"] == []


def test_result_file_has_the_project_result_shape(tmp_path):
    """benchmarks/make_report.py (BENCHMARK.md) reads every results file: the collected one must load there."""
    import make_report as mr

    report = json.loads(PP2_REPORT.read_text())
    batch, _raw = _raw_batch(tmp_path, PLAN["rows"][0]["id"], report)
    out = tmp_path / "what_works_1xh200.json"
    assert wr.main([str(batch), "--out", str(out)]) == 0
    data = mr._load_one(out, out.name)
    assert data["benchmark"] == "what_works_1xh200" and len(data["table_rows"]) == 1
    assert data["table_rows"][0][5] == "failed at wrap"
    assert what_works.load(str(out))[0]["id"] == PLAN["rows"][0]["id"]  # and the lookup reads it


def test_measured_batches_fill_the_matrix_and_keep_fixed_faults_apart():
    """The H200 batches as recorded: runs that failed on a since-fixed fault of the rehearsal or the machine's
    set-up are kept in rehearsal_faults with the fault and the fix, never as the recipe's verdict; tensor-parallel
    MoE rows whose timed losses were +inf under finite gradient norms have their throughput (the engine's count)."""
    batches = sorted((RAW / "what_works_1xh200").glob("batch_*"))
    assert batches
    res = wr.collect(batches, PLAN, None)
    faults = {f["id"]: f for f in res["rehearsal_faults"]}
    rows = {r["id"]: r for r in res["rows"]}
    for fid, f in faults.items():  # a fault is never a row's verdict: pending, or answered by a later run
        assert (fid in rows) == bool(f.get("measured_again")), fid
        if fid in rows:
            assert rows[fid]["measured"]["raw"] == f["measured_again"] and f["measured_again"] != f["raw"]
    assert faults["glm52_pretrain_416gpu_h100_bf16"]["first_error"]["message"].startswith("dsa_kernel_backend must")
    assert "Hydra" in faults["glm52_pretrain_416gpu_h100_bf16"]["fixed"]
    assert faults["gpt3_175b_pretrain_32gpu_h100_bf16"]["fixed"].endswith("tp-comm-overlap-off")
    assert all(f["fault"] and f["fixed"] and f["raw"] for f in faults.values())
    moe = rows["qwen3_30b_a3b_pretrain_8gpu_h100_bf16"]
    assert moe["loss_inf_tp_steps"] and moe["nonfinite_timed_steps"] == 0 and moe["tokens_per_s_per_gpu"] > 0
    for r in rows.values():  # a figure is never from a non-finite step
        assert r["tokens_per_s_per_gpu"] is None or r["nonfinite_timed_steps"] == 0
    assert any("rehearsal_faults" in n for n in res["notes"])
    # every measured row was timed alone on the GPU (the runs that took no lock all ended at Bridge's validate)
    assert all(r["measured"]["timing_exclusive"] is True for r in rows.values()), [
        r["id"] for r in rows.values() if r["measured"]["timing_exclusive"] is not True
    ]
    assert all(wr.batch_timing_exclusive(b) is True for b in batches)


def test_wan_rows_are_expected_to_run_wans_own_step_and_other_diffusion_models_are_not():
    """The engine drives Wan providers with Bridge's WanForwardStep on Bridge's Wan mock data
    (mfsdp_gpu.workload): a Wan row goes on to the memory check like any row, with a note of the latent
    tokens its mock batches hold; a diffusion model of another provider still meets the GPT step."""
    import yaml

    cfg = yaml.safe_load(
        (ROOT / "tests/fixtures/recipes/yaml/wan_1_3b_text2image_pretrain_1gpu_h100_bf16.yaml").read_text()
    )
    assert bw.diffusion_outcome(cfg) is None
    note = bw.diffusion_note(cfg)
    assert note and "WanForwardStep" in note and "37440 latent tokens per micro-batch" in note
    assert "model.seq_length=4096" in note  # memory's prediction counts fewer tokens than the mock feeds
    flux = {"model": {"_target_": "megatron.bridge.diffusion.models.flux.flux_provider.FluxProvider"}}
    assert bw.diffusion_outcome(flux)["outcome"] == "fails (rehearsal limit)"
    assert bw.diffusion_note(flux) is None
    for row in PLAN["rows"]:
        if "diffusion" in row["kinds"] and row["id"].startswith("wan_"):
            assert row["expected"]["outcome"] != "fails (rehearsal limit)", row["id"]
            assert "WanForwardStep" in row["expected"]["why"], row["id"]


def test_a_forward_only_row_is_held_only_never_to_be_under_predicted_at_its_peak():
    """Qwen3-VL 8B pretrain as measured: both models frozen, text fed, every gradient norm 0.0 (no backward ran).
    Its measured peak is a forward pass's: `memory`'s training peak may exceed it, never fall below it; the state
    between steps keeps the full tolerance, and the page's note says why."""
    (batch,) = [b for b in sorted((RAW / "what_works_1xh200").glob("batch_*")) if b.name == "batch_s4a"]
    res = wr.collect([batch], PLAN, None)
    rows = {r["id"]: r for r in res["rows"]}
    vl = rows["qwen3_vl_8b_pretrain_4gpu_h100_bf16_mock"]
    assert vl["forward_only_steps"] is True
    assert vl["memory_check"]["peak_forward_only"] is True
    assert vl["tokens_per_s_per_gpu"] is None  # a forward pass's rate is not a training throughput
    assert vl["predicted_tokens_per_s_per_gpu"] == {"low": None, "high": None}
    assert not any(r["forward_only_steps"] for rid, r in rows.items() if rid != vl["id"])  # the others trained
    import what_works_doc as doc

    page = doc.render([vl], "f.json")
    assert "the timed steps ran no backward" in page
    assert "text-only mock batches" in page  # every vision-language row says its batches had no image
    mem = {"predicted_state": 4.86, "measured_state": 4.84, "predicted_peak": 19.8, "measured_peak": 7.7}
    assert wr.memory_check(mem, True)["within_tolerance"] is True
    assert wr.memory_check(mem, False)["within_tolerance"] is False  # as a training peak it would be a miss
    assert wr.memory_check({**mem, "predicted_peak": 7.0}, True)["within_tolerance"] is False  # under stays a miss
    assert wr.forward_only({"memory": {"steps": [{"grad_norm": 0.0}, {"grad_norm": 1.5}]}}) is False
    assert wr.forward_only({"memory": {"steps": []}}) is False and wr.forward_only(None) is False


def test_memory_check_compares_a_deviated_row_as_run():
    """A row run with a config-changing deviation is held to memory's prediction for the job as it ran."""
    mem = {"predicted_state": 10.0, "measured_state": 10.0, "predicted_peak": 9.6, "measured_peak": 10.0}
    assert wr.memory_check(mem)["within_tolerance"] is False  # 4 % under the config as written
    ran = dict(mem, predicted_peak_as_run=10.3, predicted_state_as_run=10.0, as_run=["k=v"])
    assert wr.memory_check(ran)["within_tolerance"] is True and wr.memory_check(ran)["peak_error"] == 0.03
    devs = [{"id": "mamba1-kernel-absent"}, {"id": "mamba-mem-eff-path-off", "extra_activation_bytes": 1}]
    assert wr.as_run_overrides(devs) == ["model.use_mamba_mem_eff_path=false"]
    assert wr.as_run_overrides(None) == [] and wr.as_run_overrides([{"id": "tp-comm-overlap-off"}]) == []


def test_gpt_oss_and_nemotron_rows_are_within_the_tolerance():
    """The recorded what-works batch with GPT-OSS 20B and Nemotron 3 Nano 4B: with today's ``memory`` (each row's
    prediction asked again as the plan asks it), every row of the two models that trained is within the memory
    tolerance; the Nemotron rows ran the unfused Mamba path and are compared as run."""
    import copy

    batch = raw_store.path("what_works_1xh200") / "batch_s4a"
    assert batch.is_dir(), f"{batch} is missing: the measured rows"
    plan = copy.deepcopy(PLAN)
    for row in plan["rows"]:
        if row["id"].startswith(("gpt_oss_20b", "nemotron_3_nano_4b")):
            mem = bw.memory_route(batch / "rows" / row["id"] / "enabled.yaml", row["world_size"], ROOT)
            row["memory_gib"] = {k: mem[k] for k in ("predicted_state", "predicted_peak")}
    rows = {r["id"]: r for r in wr.collect([batch], plan, None)["rows"]}
    ids = [i for i in rows if i.startswith(("gpt_oss_20b", "nemotron_3_nano_4b"))]
    assert len(ids) == 6, ids
    for i in ids:
        mem, check = rows[i]["memory_gib"], rows[i]["memory_check"]
        assert check and check["within_tolerance"], (i, mem, check)
        assert bool(mem.get("as_run")) == i.startswith("nemotron"), i
        if mem.get("as_run"):
            assert mem["predicted_peak_as_run"] > mem["predicted_peak"], i
            import what_works_doc as doc

            assert "ran with `model.use_mamba_mem_eff_path=false` (a labelled deviation" in doc.render([rows[i]], "f")


def test_a_fixed_fault_measured_again_stays_on_record_and_the_page_names_it(tmp_path):
    """A run that failed on a fault of the rehearsal, then ran again after the fix: the new run gives the row, the
    fault stays in rehearsal_faults with measured_again (the raw run that answers it), the note no longer counts it
    as pending, and the generated page lists it under its own heading."""
    import what_works_doc as doc

    rid = PLAN["rows"][0]["id"]
    earlier = {
        "rehearsal_faults": [
            {"id": rid, "raw": "old/batch", "first_error": {"message": "x"}, "phases": {}, "fault": "F", "fixed": "X"}
        ]
    }
    pending = wr.collect([], PLAN, earlier)
    assert any("Not in the matrix yet: 1" in n for n in pending["notes"]) and not pending["rows"]
    batch, _raw = _raw_batch(tmp_path, rid, json.loads(PP2_REPORT.read_text()))
    res = wr.collect([batch], PLAN, earlier)
    (fault,) = res["rehearsal_faults"]
    assert fault["measured_again"] == res["rows"][0]["measured"]["raw"] and fault["raw"] == "old/batch"
    assert not any("Not in the matrix yet" in n for n in res["notes"])
    assert any("measured again after the fix" in n for n in res["notes"])
    out = tmp_path / "r.json"
    out.write_text(json.dumps(res))
    assert doc.fixed_faults(str(out)) == [fault]
    page = doc.render(res["rows"], "r.json", doc.fixed_faults(str(out)))
    assert "## Faults of the rehearsal, fixed and measured again" in page and f"`{rid}`: F. Fixed: X." in page
    assert "## Faults of the rehearsal" not in doc.render(res["rows"], "r.json", [])


def test_a_run_cut_by_the_batch_budget_gives_no_row_and_replaces_none(tmp_path):
    """The GPU call's budget stops a run (exit -9, stopped "budget") or never starts it: no verdict, so no row,
    and an earlier batch's row of that recipe stays."""
    assert wr.ran_to_a_verdict({"exit": 0, "stopped": None})
    assert wr.ran_to_a_verdict({"exit": -9, "stopped": "timeout"})  # the row's own timeout is a measurement
    assert not wr.ran_to_a_verdict({"exit": -9, "stopped": "budget"})
    assert not wr.ran_to_a_verdict({"exit": None, "stopped": "not started: budget"})
    rid = PLAN["rows"][0]["id"]
    batch, raw = _raw_batch(tmp_path, rid, json.loads(PP2_REPORT.read_text()))
    earlier = wr.collect([batch], PLAN, None)
    assert [r["id"] for r in earlier["rows"]] == [rid]
    raw["runs"][0].update(exit=-9, stopped="budget")
    (batch / "rows" / rid / "row.json").write_text(json.dumps(raw))
    assert wr.collect([batch], PLAN, None)["rows"] == []
    assert wr.collect([batch], PLAN, earlier)["rows"] == earlier["rows"]


GLM_PRETRAIN = "glm52_pretrain_416gpu_h100_bf16"


def test_a_run_cut_after_its_steps_gives_a_row_with_the_cut_phase_not_run():
    """GLM-5.2 pretrain's recorded run: the GPU call's time limit cut the rehearsal in its load, after the training
    steps and the save had passed, and cut the pipeline probe while it waited for the GPU. The row keeps what was
    measured, shows the load as not run with the cut named (no error: nothing failed), records no probe verdict,
    and never replaces a row that ran every phase. A cut before the steps passed still gives no row."""
    import what_works_doc as doc

    batch = RAW / "what_works_1xh200" / "batch_s7a"
    raw = json.loads((batch / "rows" / GLM_PRETRAIN / "row.json").read_text())
    main = next(r for r in raw["runs"] if r["name"] == "rehearse")
    assert main["stopped"] == "budget" and main["exit"] != 0
    assert wr.cut_after_steps(main) == "load" and wr.ran_to_a_verdict(main)
    (row,) = wr.collect([batch], PLAN, None)["rows"]
    assert row["phases"] == {
        "validate": "passed",
        "wrap": "passed",
        "optimizer": "passed",
        "first_steps": "passed",
        "save": "passed",
        "load": "not run",
    }
    assert row["first_error"] is None and row["cut"]["phase"] == "load"
    assert row["pp_probe"]["cut"] is True and row["pp_probe"]["phases"] is None
    assert row["memory_gib"]["measured_state"] and row["tokens_per_s_per_gpu"]
    assert "the load was not run to its end" in doc.render([row], "f.json")
    full = {k: v for k, v in row.items() if k != "cut"}
    full["phases"] = {**row["phases"], "load": "passed"}
    (kept,) = wr.collect([batch], PLAN, {"rows": [full]})["rows"]
    assert kept["phases"]["load"] == "passed" and "cut" not in kept
    in_steps = {
        "exit": -9,
        "stopped": "budget",
        "summary": {
            "ranks": [{"phases": [{"name": "model_wrap", "status": "passed"}, {"name": "train", "status": "failed"}]}]
        },
    }
    assert wr.cut_after_steps(in_steps) is None and not wr.ran_to_a_verdict(in_steps)


WAN14B = "wan_14b_sft_8gpu_h100_bf16"


def test_wan14b_assert_cause_is_what_its_cause_runs_show():
    """The Wan 2.1 14B row's cause is established by five runs of its enabled job (raw, beside the matrix): the
    as-shipped job with blocking launches asserts in Transformer Engine's THD padding mask in a backward; the job
    without sequence parallelism, at TP 1 and at CP 1 trains; all-to-all CP reads a NaN loss after 2 steps. Each
    ran the byte-identical enabled YAML of the matrix row, with the overrides the record names."""
    import hashlib

    cause = raw_store.resolve(wr.CAUSE_RAW_WAN14B)
    runs = json.loads((cause / "runs.json").read_text())
    enabled = RAW / "what_works_1xh200" / "batch_s6a" / "rows" / WAN14B / "enabled.yaml"
    assert runs["row"] == WAN14B and runs["yaml"]["sha256"] == hashlib.sha256(enabled.read_bytes()).hexdigest()
    rep = {v: json.loads((cause / v / "report.json").read_text()) for v in runs["runs"]}
    for v, spec in runs["runs"].items():
        assert rep[v]["request"]["overrides"] == spec["overrides"], v
        assert rep[v]["request"]["world_size"] == 8 and rep[v]["request"]["fake_pg"] is True
    blocking = rep["blocking"]["first_failure"]
    assert blocking["phase"] == "train" and "get_thd_padding_mask" in blocking["frames"]["innermost"]
    assert "device-side assert" in blocking["message"]
    assert "index out of bounds" in (cause / "blocking" / "stdout.log").read_text()
    assert {v for v, r in rep.items() if r["result"] == "passed"} == {"cp1", "nosp", "tp1"}
    for v in ("cp1", "nosp", "tp1"):
        assert rep[v]["phases"]["train"]["losses_finite"] is True and rep[v]["phases"]["train"]["steps_done"] == 3
    a2a = rep["a2a"]
    assert a2a["first_failure"]["message"] == "Loss exploded: nan" and a2a["phases"]["train"]["steps_done"] == 2
    assert_msg = (
        "/TransformerEngine/common/util/rtc.cpp:110 in function operator(): CUDA Error: device-side assert triggered"
    )
    known = wr.first_error({"failure": {"message": assert_msg, "category": "crash"}}, None, WAN14B)
    assert known["category"] == "not-fsdp" and known["evidence"] == wr.CAUSE_RAW_WAN14B
    assert "get_thd_padding_mask" in known["why"] and "not a verdict on Megatron FSDP" in known["why"]
    # scoped to the recipe: the same message from another row stays open
    other = wr.first_error({"failure": {"message": assert_msg, "category": "crash"}}, None, "other_row")
    assert other["category"] == "open"


def test_a_missing_package_and_an_unestablished_cause_are_never_read_as_fsdp_verdicts():
    """GPT-3 175B stopped at build for want of Apex (the full Transformer Engine layer spec's final norm); a
    device-side assert with no established cause (a row other than Wan 2.1 14B, whose cause runs established it):
    each row keeps where it stopped, with a why that says it is not a verdict on Megatron FSDP; any other error
    keeps its own category."""
    apex = wr.first_error({"failure": {"message": "Apex must be installed to use FusedLayerNorm.", "category": None}})
    assert apex["category"] == "not-fsdp" and "use_transformer_engine_full_layer_spec=true" in apex["why"]
    assert_msg = (
        "/TransformerEngine/common/util/rtc.cpp:110 in function operator(): CUDA Error: device-side assert triggered"
    )
    dev = wr.first_error({"failure": {"message": assert_msg, "category": "crash"}})
    assert dev["category"] == "open" and "not established" in dev["why"]
    oom = wr.first_error({"failure": {"message": "CUDA out of memory. Tried to allocate 2 GiB", "category": "oom"}})
    assert oom["category"] == "oom" and oom["why"] is None
    rows = {r["id"]: r for r in json.loads((ROOT / "benchmarks/results/what_works_1xh200.json").read_text())["rows"]}
    assert rows["gpt3_175b_pretrain_32gpu_h100_bf16"]["first_error"]["category"] == "not-fsdp"
    assert rows[WAN14B]["first_error"]["category"] == "not-fsdp"
    assert rows[WAN14B]["first_error"]["evidence"] == wr.CAUSE_RAW_WAN14B
    import what_works_doc as doc

    page = doc.render([rows["wan_1_3b_text2image_pretrain_1gpu_h100_bf16"]], "f.json")
    assert "a diffusion model, driven by Bridge's own training step on Bridge's mock batches" in page
