"""What ``mfsdp.py rehearse`` printed on a real H200, rendered as a user reads it.

``benchmarks/results/raw/rehearse_cli_1xh200/`` holds the output of the GPU test
(``tests/gpu/test_rehearse_gpu.py``): the command run as a user runs it, once on the
llama 1.1 B preset at a fake world of 8 under Megatron FSDP ``optim_grads_params`` (it
passed), once with ``pipeline_model_parallel_size=2`` (both rank positions failed at model
wrapping). Its ``rehearsal.json`` is the summary the command printed with ``--format json``;
the text a user sees by default is ``render_text`` of that same summary. These tests render
the recorded summaries and assert the verdict, the rule and fix, the memory table and the
NCCL allowance line; and that the rank reports beside them, read by this tree's code, still
give the same verdict (the summary was not edited by hand).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import raw_store  # benchmarks/: the raw GPU results, extracted from their archive on first use
from mfsdp_lib.runs import rehearse as rh

ROOT = Path(__file__).resolve().parent.parent.parent
RAW = raw_store.path("rehearse_cli_1xh200")
PASSED = RAW / "llama1b_n8_optim_grads_params"
PP2 = RAW / "llama1b_n8_pp2"
MACHINE_PATH = re.compile(r"/(?:root|work|tmp|home)/")


def _summary(case: Path) -> dict:
    f = case / "rehearsal.json"
    assert f.is_file(), f"the recorded rehearsal {f.relative_to(ROOT)} is missing: the evidence for this test"
    data = json.loads(f.read_text())
    assert data["schema"] == rh.REPORT_SCHEMA
    return data


def test_world_of_8_under_fsdp_renders_as_passed_with_memory_and_the_allowance_line():
    s = _summary(PASSED)
    assert s["result"] == "passed" and rh.exit_code(s) == 0
    (r,) = s["ranks"]
    assert (r["rank"], r["world_size"], r["strategy"]) == (0, 8, "optim_grads_params")
    text = rh.render_text(s)
    lines = text.splitlines()
    assert lines[0] == f"rank 0 of 8 ({r['role']}), optim_grads_params, preset llama-1b: PASSED"
    phases = lines[1]
    for name in ("model_build ok", "model_wrap ok", "optimizer ok", "train ok"):
        assert name in phases
    assert "FAILED" not in phases and "first failure" not in text
    # the memory table: measured beside the prediction, both figures present on the same line
    m, p = r["memory"], r["predicted"]
    assert p["available"] is True and p["data_parallel_size"] == 8
    between = next(x for x in lines if x.strip().startswith("between steps"))
    assert between.split()[-2:] == [f"{m['between_steps_gib']:.2f}", f"{p['between_steps_gib']:.2f}"]
    peak = next(x for x in lines if x.strip().startswith("peak allocated"))
    assert peak.split()[-2:] == [f"{m['peak_allocated_gib']:.2f}", f"{p['peak_gib']:.2f}"]
    # a 1.1 B model sharded 8 ways sits far below DDP's unsharded ~18.6 GiB between steps
    assert 0 < m["between_steps_gib"] < 8 and m["between_steps_gib"] <= m["peak_allocated_gib"]
    # the NCCL allowance is its own line, labelled as an allowance, with peak reserved + allowance under it
    n = r["nccl"]
    assert n["communicators"] >= 1 and n["allowance_gib"] > 0
    allowance = next(x for x in lines if x.strip().startswith("NCCL allowance:"))
    assert f"+{n['allowance_gib']:.2f} GiB" in allowance and "an allowance, not measured" in allowance
    assert f"{n['communicators']} communicators x" in allowance
    total = next(x for x in lines if "peak reserved + allowance" in x)
    assert f"{m['peak_reserved_gib'] + n['allowance_gib']:.2f} GiB per GPU" in total
    assert any(x.startswith("note: ") for x in lines)  # the limits are printed with the verdict
    assert lines[-1] == "rehearsal: PASSED"


def test_pipeline_parallel_renders_the_wrap_failure_on_both_stages_with_the_rule_and_fix():
    s = _summary(PP2)
    assert s["result"] == "failed" and rh.exit_code(s) == 1
    assert [(r["rank"], r["role"]) for r in s["ranks"]] == [(0, "first pipeline stage"), (4, "last pipeline stage")]
    assert len(s["command"]) == 2 and all("model.pipeline_model_parallel_size=2" in c for c in s["command"])
    text = rh.render_text(s)
    for r in s["ranks"]:
        f = r["failure"]
        assert (f["phase"], f["type"], f["rule"]) == ("model_wrap", "EinopsError", "MFSDP-PIPELINE-PARALLEL")
        assert "mcore_fsdp_adapter.py:561 in _get_dp_tp_mesh" in f["site"]
        assert "Shape mismatch" in f["message"]  # the specific reason einops gives, kept
        assert f"rank {r['rank']} of 8 ({r['role']}), optim_grads_params, preset llama-1b: FAILED" in text
        # check's rule for the same setting agrees with what the GPU showed (no second, different rule)
        assert [c["rule"] for c in r["check_errors"]] == ["MFSDP-PIPELINE-PARALLEL"]
    assert text.count("first failure at model_wrap: EinopsError") == 2
    assert text.count("[MFSDP-PIPELINE-PARALLEL] Megatron FSDP builds its device mesh over the whole world") == 2
    assert text.count("fix: model.pipeline_model_parallel_size=1") == 2
    assert "check also says" not in text
    assert "phases: initialize_process_group ok" in text and "model_build ok, model_wrap FAILED" in text
    assert "memory per GPU (GiB) (until the failure)" in text
    assert text.rstrip().endswith("rehearsal: FAILED")


@pytest.mark.parametrize("case", [PASSED, PP2], ids=lambda p: p.name)
def test_rank_reports_read_by_this_tree_give_the_recorded_verdict(case):
    s = _summary(case)
    runs = [(str(case / f"rank_{r['rank']}"), r["role"]) for r in s["ranks"]]
    again = rh.summarize(runs)
    assert again["result"] == s["result"]
    for old, new in zip(s["ranks"], again["ranks"], strict=True):
        assert (new["rank"], new["world_size"], new["strategy"], new["result"]) == (
            old["rank"],
            old["world_size"],
            old["strategy"],
            old["result"],
        )
        assert new["memory"] == old["memory"]
        assert [p["name"] for p in new["phases"]] == [p["name"] for p in old["phases"]]
        if old["failure"]:
            for k in ("phase", "type", "rule", "site", "fix"):
                assert new["failure"][k] == old["failure"][k], k
        else:
            assert new["failure"] is None
            assert new["nccl"] == old["nccl"]


def test_recorded_files_carry_no_machine_paths():
    files = [p for p in RAW.rglob("*") if p.is_file()]
    assert len(files) >= 8
    for p in files:
        assert not MACHINE_PATH.search(p.read_text()), p.relative_to(ROOT)


@pytest.mark.parametrize("case", [PASSED, PP2], ids=lambda p: p.name)
def test_the_stated_command_prints_the_recorded_engine_commands(case, tmp_path):
    """BENCHMARK.md names the 'mfsdp.py rehearse' command of each row; its --dry-run gives what was run."""
    import bench_rehearse as br

    assert f"--timeout-s {br.CLI_TIMEOUT_S}" in br.cli_command(case.name, "X")
    gpu_test = (ROOT / br.CLI_GPU_TEST).read_text()
    assert f"RANK_TIMEOUT_S = {br.CLI_TIMEOUT_S} " in gpu_test and f'_out("{case.name}")' in gpu_test
    out = tmp_path / case.name
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "mfsdp.py"), "rehearse", *br.CLI_CASES[case.name]]
        + ["--out", str(out), "--dry-run", "--python", "python3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    printed = [
        x.replace(str(ROOT / "scripts") + "/", "scripts/").replace(str(out), f"{raw_store.logical(RAW)}/{case.name}")
        for x in p.stdout.splitlines()
        if not x.startswith("#")
    ]
    assert printed == _summary(case)["command"]


def test_benchmark_json_of_the_cli_rehearsal_was_made_from_these_files():
    import bench_rehearse as br

    committed = json.loads((ROOT / "benchmarks" / "results" / "rehearse_cli_1xh200.json").read_text())
    assert json.loads(json.dumps(br.summarize_cli(RAW))) == committed
    assert committed["raw"]["gpu_test"].startswith("2 passed")
    assert {c: v["exit"] for c, v in committed["raw"]["cases"].items()} == {PASSED.name: 0, PP2.name: 1}
    rows = committed["rows"]
    assert [r[3] for r in rows] == ["0 (every rank holds the same shapes)", "0 (first pipeline stage)",
                                    "4 (last pipeline stage)"]  # fmt: skip
    assert [r[5] for r in rows[1:]] == ["model_wrap: MFSDP-PIPELINE-PARALLEL"] * 2
