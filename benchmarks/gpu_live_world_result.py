#!/usr/bin/env python3
"""Turn the raw files of the live-mode world streak into ``benchmarks/results/gpu_live_world_<tag>.json``.

Live mode (``mfsdp.py enable --recipe NAME``) judges the config twice: with our rule table and with
Bridge's ``runtime_config_update()``. The batch rules depend on the world size (micro-batch x DP must
divide the global batch), and Bridge, without a process group, reads the world from the WORLD_SIZE
variable. The streak (``live_world.sh`` in the raw folder, on an H200 where Megatron-Bridge imports)
checks that both judge one world: ``--gpus N``, a launcher's WORLD_SIZE, or the layout's smallest.
Run W40 is the same call as W4 with live mode as it was before ``live_world()``. This script restates
the runs' .out/.err/.rc files (read by ``gpu_live_mode_result._row``) without running anything.

    python3 benchmarks/gpu_live_world_result.py --raw-dir benchmarks/results/raw/gpu_live_world_1xh200 --tag 1xh200
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import raw_store  # noqa: E402  (beside this script: the raw results are read from their archive)

RUNS = ("W1", "W2", "W3", "W4", "W40", "W5", "W6")
OLD_COPY = "/tmp/old_scripts/"  # where live_world.sh kept live mode as it was before live_world()


def _live_mode_result():
    spec = importlib.util.spec_from_file_location(
        "gpu_live_mode_result", ROOT / "benchmarks" / "gpu_live_mode_result.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    glr = _live_mode_result()
    a = glr.parse_args(argv, __doc__)
    raw = raw_store.resolve(a.raw_dir)
    stages = glr._stages(raw)
    missing = [n for n in RUNS if n not in stages]
    if missing:
        print(f"gpu_live_world_result: {raw}/stages.txt has no line for {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = [glr._row(n, stages[n], raw, earlier_copy=OLD_COPY, code=("before live_world()", "current")) for n in RUNS]
    setup = glr.setup_line(raw)
    total = re.search(r"^total (\d+)s", (raw / "stages.txt").read_text(), re.M)
    by = {r[0]: dict(zip(glr.COLUMNS, r, strict=True)) for r in rows}
    agreed = [n for n, r in by.items() if r["agreement"] == "agree"]
    doc = {
        "benchmark": f"gpu_live_world_{a.tag}",
        "title": "Live mode judges one world with our rules and Bridge (--gpus, WORLD_SIZE) on 1x NVIDIA H200",
        "date": "2026-12-03T19:43:00+00:00",
        "machine": "1x NVIDIA H200; Megatron-Bridge 0.6.2 from the wheels of tests/gpu/device-wheels.txt",
        "command": "bash benchmarks/results/raw/gpu_live_world_1xh200/live_world.sh  # on a machine where Megatron-Bridge "
        "imports (set-up: tests/gpu/README.md); every row's invocation is in the table",
        "columns": glr.COLUMNS,
        "rows": rows,
        "notes": [
            "Recipe vanilla_gpt_pretrain_config with the shape of its docstring example and micro-batch 2; its global "
            "batch is 32, and 24 in the runs that test a batch that micro-batch x DP does not divide at 8 GPUs.",
            f"Agreement on {len(agreed)} of {len(rows)} runs ({', '.join(agreed)}). With --gpus 8 (W1, W2), a "
            "launcher's WORLD_SIZE=8 (W4) and --gpus 4 over WORLD_SIZE=8 (W5), our rules and Bridge judged the same "
            "world: both accepted 32 at 8 GPUs and 24 at 4, both refused 24 at 8 (our MFSDP-TRAIN-BATCH-DP and "
            "MFSDP-EVAL-BATCH-DP; Bridge's eval-batch assertion). Without either (W3) both judged the layout's "
            "smallest world, 1.",
            f"Before live_world() (W40: {by['W40']['agreement']}): with WORLD_SIZE=8 from a launcher and no --gpus, "
            "Bridge judged 8 GPUs while our rules judged the smallest world, so a batch both should refuse came "
            "out as a disagreement instead of our rule with its fix.",
            f"W6: a WORLD_SIZE that is not a count ends with one line and exit {by['W6']['exit']}.",
            f"Stdout holds only the override lines on accepted runs (W1, W3, W5: "
            f"{', '.join(str(by[n]['other stdout lines']) for n in ('W1', 'W3', 'W5'))} other lines): Megatron's "
            "log handler no longer writes there.",
            f"Set-up on a bare machine: tests/gpu/setup_device.sh, exit {setup.group(1) if setup else '?'} in "
            f"{setup.group(2) if setup else '?'} s; the 7 runs ran side by side after it "
            f"(streak total {total.group(1) if total else '?'} s).",
        ],
        "raw": {
            "dir": raw_store.logical(raw) or os.path.relpath(raw, ROOT),
            "runs": {n: [f"{n}.out", f"{n}.err", f"{n}.rc"] for n in RUNS},
            "stages": "stages.txt",
            "setup": "setup.log",
            "script": "live_world.sh",
            "code": "code_sha256.txt",
        },
    }
    glr.write_result(doc, a.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
