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


def make_run(root: Path, name: str, *, between_scale: float, peak_scale: float, world: int = 8, result="passed"):
    run = root / name
    run.mkdir(parents=True)
    (run / "run_config.yaml").write_text(yaml.safe_dump(CFG))
    est = memory.estimate(CFG, dp=world, strategies=("optim_grads_params",))
    b = est.breakdown("optim_grads_params")
    report = {
        "schema": "rehearse-run/1",
        "result": result,
        "source": "preset tiny",
        "request": {"world_size": world, "strategy": "optim_grads_params"},
        "facts": {"strategy": "optim_grads_params", "data_parallel_size": world},
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
    assert len(data["rows"]) == 1 and len(data["columns"]) == len(data["rows"][0])
    row = dict(zip(data["columns"], data["rows"][0], strict=True))
    assert row["error %"] == pytest.approx(round(100 * (1 / 0.98 - 1), 2), abs=0.02)
    assert any("broken" in n and "wrap failed" in n for n in data["notes"])  # failures are listed, not dropped


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
