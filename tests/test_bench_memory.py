"""benchmarks/bench_memory.py: predictions beside rehearsal measurements, and its --check targets.

The runs here are synthetic rehearsal reports (the shape scripts/rehearse_train.py writes) whose
measured figures are set relative to the model's own prediction, so each target can be seen to
pass and to fail; the real measurements live under benchmarks/results/raw/.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mfsdp_lib import memory

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "bench_memory.py"
GIB = 2**30

CFG = {
    "model": {
        "hidden_size": 1024,
        "num_layers": 4,
        "num_attention_heads": 8,
        "num_query_groups": 8,
        "ffn_hidden_size": 4096,
        "vocab_size": 32000,
        "gated_linear_unit": True,
        "add_bias_linear": False,
        "normalization": "RMSNorm",
        "share_embeddings_and_output_weights": False,
        "position_embedding_type": "rope",
        "seq_length": 1024,
        "bf16": True,
        "tensor_model_parallel_size": 1,
    },
    "ddp": {"use_megatron_fsdp": True, "data_parallel_sharding_strategy": "optim_grads_params"},
    "train": {"micro_batch_size": 1},
}


def make_run(
    root: Path,
    name: str,
    *,
    between_scale: float,
    peak_scale: float,
    world: int = 8,
    result="passed",
    started="2026-01-01T00:00:00+00:00",
    **request,
):
    run = root / name
    run.mkdir(parents=True)
    (run / "run_config.yaml").write_text(yaml.safe_dump(CFG))
    est = memory.estimate(CFG, dp=world, strategies=("optim_grads_params",))
    b = est.breakdown("optim_grads_params")
    report = {
        "schema": "rehearse-run/1",
        "result": result,
        "source": "preset tiny",
        "started_utc": started,
        "request": {"world_size": world, "strategy": "optim_grads_params", **request},
        "facts": {"strategy": "optim_grads_params", "data_parallel_size": world, "moe": bool(request.get("moe"))},
        "params": {"local_numel": 1, "global_numel": 2},
        "memory": {
            "between_steps_bytes": int(b["after_step"] * between_scale),
            "peak_allocated_bytes": int(b["peak"] * peak_scale),
        },
        "first_failure": None if result == "passed" else {"type": "RuntimeError", "message": "wrap failed"},
    }
    (run / "report.json").write_text(json.dumps(report))
    return run


def bench(*args):
    return subprocess.run([sys.executable, str(BENCH), *map(str, args)], capture_output=True, text=True, timeout=120)


def test_assembles_rows_in_the_report_shape(tmp_path):
    raw = tmp_path / "raw"
    make_run(raw, "ok", between_scale=1.01, peak_scale=0.98)
    make_run(raw, "broken", between_scale=1, peak_scale=1, result="failed")
    out = tmp_path / "memory_vs_measured.json"
    proc = bench("--raw-dir", raw, "--out", out, "--check")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "memory_vs_measured"
    assert len(data["rows"]) == 2 and all(len(data["columns"]) == len(r) for r in data["rows"])
    row = dict(zip(data["columns"], data["rows"][0], strict=True))
    assert row["peak error %"] == pytest.approx(round(100 * (1 / 0.98 - 1), 2), abs=0.02)
    assert row["status"] == "compared"
    broken = dict(zip(data["columns"], data["rows"][1], strict=True))  # failures are listed, not dropped
    assert broken["run"] == "broken" and "wrap failed" in broken["status"] and broken["peak error %"] is None


@pytest.mark.parametrize(
    "between,peak,needle",
    [
        (1.05, 1.0, "model state off"),  # predicted 4.8 % below measured model state
        (1.0, 1.02, "peak under-predicted"),  # predicted peak 2 % below the measured one
        (1.0, 0.93, "peak off"),  # predicted peak 7.5 % above
    ],
)
def test_check_fails_on_each_missed_target(tmp_path, between, peak, needle):
    raw = tmp_path / "raw"
    make_run(raw, "run", between_scale=between, peak_scale=peak)
    proc = bench("--raw-dir", raw, "--out", tmp_path / "o.json", "--check")
    assert proc.returncode == 1
    assert needle in json.loads((tmp_path / "o.json").read_text())["notes"][-1] or needle in " ".join(
        json.loads((tmp_path / "o.json").read_text())["notes"]
    )


def test_unusable_raw_dir_exits_2(tmp_path):
    assert bench("--raw-dir", tmp_path / "nope").returncode == 2
    (tmp_path / "empty").mkdir()
    proc = bench("--raw-dir", tmp_path / "empty")
    assert proc.returncode == 2 and "no report.json" in proc.stderr


def test_controls_are_excluded_and_named(tmp_path):
    """A save/load control and a MoE run on plain fake collectives are listed with the reason and kept
    out of the rows and the targets, even when their figures would miss them."""
    raw = tmp_path / "raw"
    make_run(raw, "train", between_scale=1.0, peak_scale=0.99)
    make_run(raw, "saveload", between_scale=1.0, peak_scale=1.9, save_load=True)
    make_run(raw, "plainfake", between_scale=1.0, peak_scale=1.9, mirror_collectives=False, moe=True)
    out = tmp_path / "o.json"
    proc = bench("--raw-dir", raw, "--out", out, "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    status = {r[0]: r[-1] for r in data["rows"]}
    assert status["train"] == "compared"
    assert "save and load" in status["saveload"] and status["saveload"].startswith("excluded: ")
    assert "plain fake collectives" in status["plainfake"]
    # the same run without the control flags is held to the targets, and misses them
    make_run(raw, "plain", between_scale=1.0, peak_scale=1.9)
    assert bench("--raw-dir", raw, "--out", out, "--check").returncode == 1


def test_folders_combine_once_and_later_attempts_supersede(tmp_path):
    """The same run kept in two folders counts once; a failed first attempt is superseded by the
    later passing one and listed as such."""
    a, b = tmp_path / "a", tmp_path / "b"
    make_run(a, "twice", between_scale=1.0, peak_scale=0.99)
    make_run(b, "twice", between_scale=1.0, peak_scale=0.99)
    make_run(b, "retried", between_scale=1.0, peak_scale=1, result="failed", started="2026-01-01T00:00:00+00:00")
    make_run(a, "retried", between_scale=1.0, peak_scale=0.99, started="2026-01-01T01:00:00+00:00")
    out = tmp_path / "o.json"
    proc = bench("--raw-dir", a, "--raw-dir", b, "--out", out, "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert sorted(r[0] for r in data["rows"] if r[-1] == "compared") == ["retried", "twice"]
    assert [r[-1] for r in data["rows"] if r[-1] != "compared"][0].startswith("excluded: superseded")
    assert "--raw-dir " + str(a) in data["command"] and "--raw-dir " + str(b) in data["command"]
    superseded = [r for r in data["raw"]["runs"] if "superseded" in r.get("excluded", "")]
    assert [r["run"] for r in superseded] == ["retried"] and superseded[0]["result"] == "failed"


def test_a_finished_run_the_model_cannot_size_is_a_miss(tmp_path):
    raw = tmp_path / "raw"
    run = make_run(raw, "unsized", between_scale=1.0, peak_scale=0.99)
    cfg = yaml.safe_load((run / "run_config.yaml").read_text())
    cfg["model"]["experimental_attention_variant"] = "dsv4_hybrid"
    (run / "run_config.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "o.json"
    proc = bench("--raw-dir", raw, "--out", out, "--check")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row[-1].startswith("no prediction:") and "DeepSeek-V4" in row[-1]
