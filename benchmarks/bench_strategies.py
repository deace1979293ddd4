#!/usr/bin/env python3
"""Benchmark DDP, the distributed optimizer and Megatron FSDP on one machine, in one run.

Why: "is Megatron FSDP worth it for my job?" is answered by numbers taken on the
same machine, model and batch: step time, tokens/s and per-rank peak memory for
each strategy, with the memory estimator's prediction beside each measurement so
the estimator is checked against reality in the same table.

How: every strategy is its own ``torchrun`` job of ``scripts/smoke_train.py`` (a
fresh process, so peak-memory counters and the CUDA caching allocator start
clean), on a Llama 3.2 1B-shaped model by default (16 layers, hidden 2048), where
model state (bf16 weights, fp32 gradients, fp32 master weights and Adam moments)
dominates memory. Step time is the median over the steps after the first two.

Two phases, so the GPU is needed only for the first:

* ``--run`` (on the GPU machine): runs the jobs and keeps each job's rank records
  and log under ``--raw-dir``;
* ``--assemble`` (anywhere): turns the raw records into
  ``benchmarks/results/gpu_strategies_<tag>.json`` in the shape BENCHMARK.md is
  generated from, adding ``mfsdp_lib.memory``'s prediction for each row. Without
  ``--assemble``/``--run`` both phases run.

    python3 benchmarks/bench_strategies.py --nproc-per-node 1 --tag 1xh200
    python3 benchmarks/bench_strategies.py --assemble --raw-dir benchmarks/results/raw/gpu_strategies_1xh200
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import raw_store
from repo_paths import option_value, repo_relative

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))

STRATEGIES = ("ddp", "distopt", "optim", "optim_grads", "optim_grads_params")
GIB = 2**30
COLUMNS = [
    "strategy",
    "GPUs",
    "step time (ms)",
    "step time in repeat runs (ms)",
    "tokens/s",
    "peak allocated GiB (max rank)",
    "model state GiB (measured)",
    "model state + step transient GiB (estimate)",
    "total GiB (estimate)",
    "final loss",
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[3:]),
    )
    p.add_argument("--run", action="store_true", help="only run the GPU jobs")
    p.add_argument("--assemble", action="store_true", help="only build the result JSON from --raw-dir")
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--model", default="llama-1b")
    p.add_argument("--seq-length", type=int, default=2048)
    p.add_argument("--global-batch-size", type=int, default=8)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--tag", default="1xh200", help="names the result file gpu_strategies_<tag>.json")
    p.add_argument("--raw-dir", default=None, help="default benchmarks/results/raw/gpu_strategies_<tag>")
    p.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--machine", default=None, help="words for the machine (default: GPU name and count)")
    p.add_argument("--timeout", type=int, default=420, help="seconds allowed per strategy job")
    p.add_argument(
        "--repeat-raw-dir",
        action="append",
        default=[],
        help="raw folder of an earlier run of the same benchmark (repeatable): its median step "
        "times are shown beside this run's, so run-to-run spread is visible",
    )
    return p.parse_args(argv)


def run_jobs(a, raw: Path, argv: list[str]) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "run.json").write_text(
        json.dumps({"command": shlex.join(["python3", "benchmarks/bench_strategies.py", *argv])})
    )
    for strategy in a.strategies.split(","):
        out = raw / strategy
        out.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={a.nproc_per_node}",
            str(SCRIPTS / "smoke_train.py"),
            "--strategy",
            strategy,
            "--model",
            a.model,
            "--seq-length",
            str(a.seq_length),
            "--global-batch-size",
            str(a.global_batch_size),
            "--micro-batch-size",
            str(a.micro_batch_size),
            "--iters",
            str(a.iters),
            "--out",
            str(out),
        ]
        t0 = time.time()
        with open(out / "train.log", "w") as log:
            rc: int | str
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=a.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        (out / "job.json").write_text(
            json.dumps(
                {
                    "command": shlex.join(cmd),
                    "exit_code": rc,
                    "wall_s": round(time.time() - t0, 1),
                    "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                }
            )
        )
        print(f"[bench] {strategy}: exit {rc} in {time.time() - t0:.0f}s", flush=True)


def _predict(run_config: Path, strategy: str, world: int, seq_length: int, mbs: int) -> dict | None:
    """The estimator's per-GPU prediction for this run (``mfsdp_lib.memory.report``)."""
    try:
        from mfsdp_lib import config_io, memory
    except ImportError:
        return None
    try:
        cfg = config_io.load_effective(str(run_config))
        if config_io.get(cfg, "model.vocab_size") is None:
            # to_yaml() ran before setup; Bridge then takes the tokenizer's size (setup.py,
            # _validate_and_set_vocab_size), as the estimator must too.
            tok = config_io.get(cfg, "tokenizer.vocab_size")
            cfg = config_io.load_effective(str(run_config), [f"model.vocab_size={tok}"])
        return memory.report(cfg, dp=world, strategies=(strategy,), seq_length=seq_length, micro_batch_size=mbs)
    except Exception as exc:  # an estimator bug must not hide the measurements
        return {"error": f"{type(exc).__name__}: {exc}"}


def _row_prediction(pred: dict | None) -> tuple:
    """(model state GiB, total GiB) of the one strategy row, or (None, None)."""
    if not pred or "error" in pred:
        return None, None
    row = pred["strategies"][0]
    # The measurement is taken right after the optimizer step, so the estimator's step
    # transient (the fp32 gradient copy Megatron FSDP keeps until the next zero_grad) is
    # alive then and belongs in the like-for-like figure.
    state = row.get("after_step_gib")
    if state is None and row.get("model_state_gib") is not None:
        state = round(row["model_state_gib"] + (row.get("step_transient_gib") or 0.0), 3)
    return state, row.get("total_gib")


def assemble(a, raw: Path) -> Path:
    rows, notes, raw_out = [], [], {}
    machine, command = a.machine, None
    for strategy in a.strategies.split(","):
        out = raw / strategy
        job = json.loads((out / "job.json").read_text()) if (out / "job.json").is_file() else {}
        command = command or job.get("command")
        ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
        if not ranks:
            notes.append(
                f"{strategy}: no rank record (exit {job.get('exit_code')}); see raw/{raw.name}/{strategy}/train.log"
            )
            continue
        r0 = next(r for r in ranks if r.get("rank") == 0)
        if r0.get("error"):
            notes.append(f"{strategy}: failed: {r0['error'][:300]}")
        machine = machine or f"{len(ranks)}x {r0.get('device')}"
        pred = _predict(out / "run_config.yaml", strategy, r0.get("world_size", 1), a.seq_length, a.micro_batch_size)
        est_state, est_total = _row_prediction(pred)
        step = r0.get("step_time_s_median")
        repeats = [_repeat_step_ms(Path(d), strategy) for d in a.repeat_raw_dir]
        rows.append(
            [
                strategy,
                r0.get("world_size"),
                None if step is None else round(step * 1e3, 1),
                repeats,
                None if r0.get("tokens_per_s") is None else round(r0["tokens_per_s"]),
                round(max(r.get("peak_allocated_bytes") or 0 for r in ranks) / GIB, 2),
                None
                if r0.get("model_state_bytes") is None
                else round(max(r["model_state_bytes"] for r in ranks) / GIB, 2),
                est_state,
                est_total,
                r0.get("final_loss"),
            ]
        )
        raw_out[strategy] = {
            "exit_code": job.get("exit_code"),
            "wall_s": job.get("wall_s"),
            "parameters": r0.get("parameters"),
            "per_rank_peak_allocated_bytes": {str(r["rank"]): r.get("peak_allocated_bytes") for r in ranks},
            "per_rank_peak_reserved_bytes": {str(r["rank"]): r.get("peak_reserved_bytes") for r in ranks},
            "per_rank_model_state_bytes": {str(r["rank"]): r.get("model_state_bytes") for r in ranks},
            "step_times_s": [s["time_s"] for s in r0.get("steps", [])],
            "losses": [s["loss"] for s in r0.get("steps", [])],
            "estimate": pred,
            "versions": r0.get("versions"),
        }
    if a.repeat_raw_dir:
        spread, same_mem = 0.0, True
        for row in rows:
            times = [t for t in [row[2], *row[3]] if t]
            if times:
                spread = max(spread, max(times) / min(times) - 1)
            for d in a.repeat_raw_dir:
                rec = Path(d) / row[0] / "rank0.json"
                if rec.is_file():
                    same_mem &= json.loads(rec.read_text()).get("peak_allocated_bytes") == raw_out[row[0]][
                        "per_rank_peak_allocated_bytes"
                    ].get("0")
        notes.append(
            "repeat runs of the same benchmark on the same kind of machine: "
            + "; ".join(f"{_name(d)} ({_run_command(Path(d), a)})" for d in a.repeat_raw_dir)
            + f". The median step time of one strategy differed by up to {spread:.0%} between runs, "
            + ("while peak memory was identical to the byte" if same_mem else "and peak memory differed")
            + ": compare step times within one run only"
        )
    if not any(r[7] is not None for r in rows):
        notes.append("no memory estimate beside the measurements: mfsdp_lib.memory was not available when assembled")
    notes += [
        "measured by the command above on a GPU machine (commands and folders as they run from the repository "
        "root: benchmarks/repo_paths.py); this file assembled with: python3 "
        "benchmarks/bench_strategies.py " + shlex.join(a.argv),
        f"model {a.model}, seq {a.seq_length}, GBS {a.global_batch_size}, MBS {a.micro_batch_size}, bf16, "
        f"{a.iters} iterations per strategy; step time is the median of steps 3..{a.iters} (CUDA-synchronised)",
        "model state (measured) = torch.cuda.memory_allocated() right after each optimizer step (last step shown), "
        "when activations are freed; the estimate beside it is mfsdp_lib.memory's after_step_gib "
        "(model state + step transient) for the same config (config_io.load_effective of the run's own to_yaml())",
        "with 1 GPU the data-parallel size is 1: Megatron FSDP shards nothing, so its memory cannot beat DDP's here; "
        "the run shows the cost of the FSDP code path, not its saving",
    ]
    stamp = _run_date(raw)
    result = {
        "benchmark": f"gpu_strategies_{a.tag}",
        "title": f"DDP vs distributed optimizer vs Megatron FSDP ({a.model}, {machine})",
        "date": stamp,
        "machine": machine,
        "command": _run_command(raw, a),
        "columns": COLUMNS,
        "rows": rows,
        "notes": notes,
        "raw": {
            "per_strategy": raw_out,
            "job_command_example": command,
            "raw_dir": _name(raw),
            "repeat_raw_dirs": [_name(d) for d in a.repeat_raw_dir],
        },
    }
    result = repo_relative(result, _output_folders(raw, a))
    dest = Path(a.results_dir) / f"gpu_strategies_{a.tag}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    from mfsdp_lib import config_io

    config_io.write_atomic(str(dest), json.dumps(result, indent=1) + "\n")
    return dest


def _repeat_step_ms(raw: Path, strategy: str) -> float | None:
    rec = raw / strategy / "rank0.json"
    if not rec.is_file():
        return None
    step = json.loads(rec.read_text()).get("step_time_s_median")
    return None if step is None else round(step * 1e3, 1)


def _run_date(raw: Path) -> str:
    """When the measuring phase finished: recorded in job.json, else the logs' last Bridge timestamp."""
    import re

    dates = []
    for job in raw.rglob("job.json"):
        finished = json.loads(job.read_text()).get("finished")
        if finished:
            dates.append(finished)
    if dates:
        return max(dates)
    for log in raw.rglob("train.log"):
        dates += re.findall(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] iteration", log.read_text(errors="replace"))
    if dates:  # Bridge logs UTC wall-clock time
        return max(dates).replace(" ", "T") + "+00:00"
    return _dt.datetime.fromtimestamp(
        max(p.stat().st_mtime for p in raw.rglob("job.json")), _dt.timezone.utc
    ).isoformat(timespec="seconds")


def _name(folder) -> str:
    """A raw folder as the result names it: its recorded name in the raw-results archive, else repository-relative."""
    return raw_store.logical(folder) or os.path.relpath(Path(folder).resolve(), ROOT)


def _output_folders(raw: Path, a) -> dict[str, str]:
    """Output folders of the measuring runs on the GPU machine -> where their files are in this repository."""
    out = {}
    for d in [raw, *map(Path, a.repeat_raw_dir)]:
        cmd = _run_command(d, a)
        raw_dir, results_dir = option_value(cmd, "--raw-dir"), option_value(cmd, "--results-dir")
        if raw_dir and raw_dir.startswith("/"):
            out[raw_dir] = _name(d)
        if results_dir and results_dir.startswith("/"):
            out[results_dir] = "benchmarks/results"
    return out


def _run_command(raw: Path, a) -> str:
    """The command line of the measuring phase, as recorded when it ran."""
    try:
        return json.loads((raw / "run.json").read_text())["command"]
    except (OSError, ValueError, KeyError):
        return (
            f"python3 benchmarks/bench_strategies.py --nproc-per-node {a.nproc_per_node} --tag {a.tag} "
            f"--model {a.model} --seq-length {a.seq_length} --iters {a.iters}"
        )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv)
    a.argv = argv
    # A new run writes a loose folder (`raw_store.py pack` folds it into the archive); assembling alone reads the
    # recorded one, loose or archived.
    raw = Path(a.raw_dir) if a.raw_dir else raw_store.LOOSE / f"gpu_strategies_{a.tag}"
    if not a.run and a.assemble:
        raw = raw_store.resolve(raw)
        a.repeat_raw_dir = [str(raw_store.resolve(d)) for d in a.repeat_raw_dir]
    raw = raw.resolve()
    if not a.assemble:
        run_jobs(a, raw, argv)
    if not a.run:
        dest = assemble(a, raw)
        print(f"[bench] wrote {dest}")
        for row in json.loads(dest.read_text())["rows"]:
            print("  ", row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
