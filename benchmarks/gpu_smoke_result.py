#!/usr/bin/env python3
"""Turn one GPU smoke session's raw files into ``benchmarks/results/gpu_smoke_<tag>.json``.

``tests/gpu/run_device.sh RESULTS pytest smoke`` leaves, per stage, the rank records
``smoke_train.py`` wrote, the ``mfsdp.py smoke`` summary and the pytest log. BENCHMARK.md
is generated only from files of the shared result shape, so this script restates those
raw files in it - one row for the seed's pytest criterion, one for the user-facing
command - without recomputing anything: every figure is copied from a raw file whose
path is recorded in ``raw``.

    python3 benchmarks/gpu_smoke_result.py --raw-dir benchmarks/results/raw/gpu_smoke_1xh200 \\
        --pytest-log tests/fixtures/gpu-run/pytest_smoke.log --tag 1xh200 \\
        --command "NPROC=1 bash tests/gpu/run_device.sh benchmarks/results/raw/gpu_smoke_1xh200 pytest smoke verdicts"

Commands and folders are written as they run from the repository root (``repo_paths``): the
output folder given to ``run_device.sh`` on the GPU machine is shown as the raw folder here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import raw_store
from repo_paths import repo_relative

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30
COLUMNS = [
    "run",
    "result",
    "final loss",
    "finite",
    "step time (ms)",
    "tokens/s",
    "peak allocated GiB",
    "checkpoint format",
    "save/resume |delta loss|",
    "parameters",
]
PYTEST_SUMMARY = re.compile(r"=+ (.*\b(passed|failed|error)\b.*) in [\d.]+s")
BRIDGE_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] iteration")


def _shape(model: str | None) -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    from mfsdp_gpu.presets import SMOKE_SHAPES

    shape = SMOKE_SHAPES.get(model or "")
    return "(" + ", ".join(f"{k} {v}" for k, v in shape.items()) + ")" if shape else ""


def _row(name: str, result: str, rec: dict, fmt: str | None) -> list:
    sr = rec.get("save_resume") or {}
    step = rec.get("step_time_s_median")
    return [
        name,
        result,
        rec.get("final_loss"),
        rec.get("finite"),
        None if step is None else round(step * 1e3, 1),
        None if rec.get("tokens_per_s") is None else round(rec["tokens_per_s"]),
        None if rec.get("peak_allocated_bytes") is None else round(rec["peak_allocated_bytes"] / GIB, 3),
        fmt,
        sr.get("abs_delta"),
        rec.get("parameters"),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--raw-dir", required=True, help="holds pytest_rank0.json, smoke_rank0.json, cli_smoke.json")
    p.add_argument("--pytest-log", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--command", required=True, help="the command that ran on the GPU machine")
    p.add_argument("--machine", required=True)
    p.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    a = p.parse_args(argv)
    raw = raw_store.resolve(a.raw_dir)
    pyrec = json.loads((raw / "pytest_rank0.json").read_text())
    smrec = json.loads((raw / "smoke_rank0.json").read_text())
    summary = json.loads((raw / "cli_smoke.json").read_text())
    log = Path(a.pytest_log).read_text(errors="replace")
    m = PYTEST_SUMMARY.search(log)
    pytest_result = m.group(1).strip() if m else "no pytest summary line"
    stamps = BRIDGE_STAMP.findall(log)
    fmt = (summary.get("checkpoint") or {}).get("format")
    ver = smrec.get("versions") or {}
    rows = [
        _row("pytest tests/gpu/test_smoke_gpu.py (torchrun, 1 rank)", pytest_result, pyrec, fmt),
        _row("mfsdp.py smoke --save-resume --format json", "pass" if summary.get("pass") else "fail", smrec, fmt),
    ]
    notes = [
        f"model {smrec.get('model')} {_shape(smrec.get('model'))}, NullTokenizer, mock data, seq "
        f"{smrec.get('seq_length')}, GBS {smrec.get('global_batch_size')}, MBS {smrec.get('micro_batch_size')}, bf16, "
        f"{smrec.get('iters')} iterations, strategy {smrec.get('strategy')}, checkpoint format "
        f"{(smrec.get('config') or {}).get('overrides', {}).get('checkpoint.ckpt_format')}",
        "save/resume: the checkpoint saved at iteration 10 was loaded into a fresh model; forward-only loss on the "
        "same next batch before save and after load, compared within bf16 tolerance (rtol 1.6e-2)",
        f"Bridge accepted the config (runtime_config_update/validate): {smrec.get('bridge_validate')}; our check: "
        f"ok={(smrec.get('check') or {}).get('ok')}, findings "
        f"{[f['rule'] for f in (smrec.get('check') or {}).get('findings', [])]}",
        f"Megatron FSDP settings applied by: {(smrec.get('config') or {}).get('applied_by')}",
        "step time is the median of steps 3..10, CUDA-synchronised; the first step (kernel set-up) is left out",
        "versions: " + ", ".join(f"{k} {v}" for k, v in ver.items()),
        "with 1 GPU the data-parallel size is 1: Megatron FSDP shards nothing; the run proves the code path and "
        "the fsdp_dtensor round trip, not the memory saving",
    ]
    calls = raw / "device_calls.json"
    if calls.is_file():
        dc = json.loads(calls.read_text())
        n = sum(isinstance(c.get("call"), int) for c in dc["calls"])
        notes.append(
            f"GPU machine time: {dc['total_device_s']} s for the whole session "
            f"({n} steps, the set-up from a bare machine and the strategy benchmarks included); "
            "per step in raw/" + raw.name + "/device_calls.json"
        )
    date = max(stamps).replace(" ", "T") + "+00:00" if stamps else None
    result = {
        "benchmark": f"gpu_smoke_{a.tag}",
        "title": f"Megatron FSDP smoke test on {a.machine.split(' (')[0]}: finite loss and fsdp_dtensor save/resume",
        "date": date,
        "machine": a.machine,
        "command": a.command,
        "columns": COLUMNS,
        "rows": rows,
        "notes": notes,
        "raw": {
            "files": sorted(raw_store.logical(x) or os.path.relpath(x, ROOT) for x in raw.iterdir())
            + [raw_store.logical(a.pytest_log) or os.path.relpath(Path(a.pytest_log).resolve(), ROOT)],
            "pytest_command": "python -m torch.distributed.run --nproc_per_node=1 -m pytest "
            "tests/gpu/test_smoke_gpu.py -v -s -p no:cacheprovider",
            "smoke_command": summary.get("command"),
            "save_resume": {"pytest": pyrec.get("save_resume"), "smoke": smrec.get("save_resume")},
            "losses": {
                "pytest": [s["loss"] for s in pyrec.get("steps", [])],
                "smoke": [s["loss"] for s in smrec.get("steps", [])],
            },
            "checkpoint": summary.get("checkpoint"),
        },
    }
    dest = Path(a.results_dir) / f"gpu_smoke_{a.tag}.json"
    sys.path.insert(0, str(ROOT / "scripts"))
    from mfsdp_lib import config_io

    out_dir = re.search(r"run_device\.sh\s+(\S+)", a.command)
    if out_dir and out_dir.group(1).startswith("/"):
        named = raw_store.logical(raw) or os.path.relpath(raw.resolve(), ROOT)
        result = repo_relative(result, {out_dir.group(1): named})
        result["command"] = a.command.replace(out_dir.group(1), named)
    else:
        result = repo_relative(result, {})
    config_io.write_atomic(str(dest), json.dumps(result, indent=1) + "\n")
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
