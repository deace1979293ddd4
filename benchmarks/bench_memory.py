#!/usr/bin/env python3
"""Predicted vs measured per-rank memory: ``mfsdp.py memory`` against rehearsal runs.

Why: a memory estimate is only worth what it is measured against, and the one error that
matters is a prediction below the real peak (it turns "fits" into an OOM). This benchmark
puts ``mfsdp_lib.memory``'s prediction beside each measured run, per rank: parameters held,
memory allocated between training steps (model state), and the peak
(``torch.cuda.max_memory_allocated``), with the error of each.

How: the measurements are rehearsal runs (``scripts/rehearse_train.py``: one GPU playing
rank R of a data-parallel world of N through PyTorch's fake process group, real
Megatron-Bridge code, real allocations). Each run leaves ``<run>/report.json`` (world size,
strategy, per-rank parameter numel, memory between steps and at the peak) and
``<run>/run_config.yaml`` (the ``ConfigContainer.to_yaml()`` of the job). This script reads
both, asks ``memory.estimate`` for the same config, world size and strategy, and writes
``benchmarks/results/memory_vs_measured.json`` in the shape BENCHMARK.md is generated from.
It needs no GPU: the raw runs are kept in the repository (``--raw-dir``, repeatable), so anyone
can regenerate the table and see what a change to the model does to it.

    python3 benchmarks/bench_memory.py --raw-dir benchmarks/results/raw/rehearse_1xh200 \
        --raw-dir benchmarks/results/raw/memory_rehearsal_1xh200
    python3 benchmarks/bench_memory.py --raw-dir DIR [--raw-dir DIR2 ...] --check   # exit 1 on a missed target

More folders of runs (say, a later hybrid Mamba batch) are one more ``--raw-dir``. A run found in
several folders is one measurement (same name and start time); of two attempts of the same run
the later one counts and the earlier is listed as superseded.

Targets (``--check``): model state within 3 %, peak within 5 % and never more than 1 % under
the measured peak, on every included run. Runs that are not training measurements of the rank
the model predicts are excluded by rule (``exclusion``: plain fake collectives on a MoE model,
checkpoint save/load controls, parity summaries, pipeline ranks off the most-loaded stage), and
runs that failed are listed with their failure: both are named in the result, never dropped.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import raw_store  # noqa: E402  (beside this script: the raw results are read from their archive)
from mfsdp_lib import memory  # noqa: E402

GIB = 2**30
BENCH_ID = "memory_vs_measured"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / f"{BENCH_ID}.json"
# The accuracy targets the memory model is held to.
MODEL_STATE_TOL = 0.03  # |predicted - measured| / measured, memory allocated between steps
PEAK_TOL = 0.05  # |predicted - measured| / measured, max_memory_allocated
PEAK_UNDER_TOL = 0.01  # the prediction may be at most this far below the measured peak
COLUMNS = [
    "run",
    "model",
    "N",
    "strategy",
    "params/rank measured",
    "params/rank predicted",
    "between steps GiB measured",
    "between steps GiB predicted",
    "model state error %",
    "peak GiB measured",
    "peak GiB predicted",
    "peak error %",
    "status",
]
COMPARED = "compared"


def _load_yaml(path: Path):
    import yaml  # PyYAML: the skill's one parsing dependency

    return yaml.safe_load(path.read_text(encoding="utf-8"))


def find_runs(raw: Path) -> list[Path]:
    """Run folders under ``raw`` (any depth) that hold a report.json."""
    return sorted(p.parent for p in raw.rglob("report.json"))


def _pp_stage(rank: int, world: int, pp: int) -> int:
    """Pipeline stage of a global rank: Megatron-Core's default rank order puts PP outermost
    (``order="tp-cp-ep-dp-pp"``, parallel_state.py ``initialize_model_parallel``)."""
    return rank // max(1, world // pp)


def exclusion(rep: dict, cfg: dict | None) -> str | None:
    """Why a run is not a training measurement of the rank the memory model predicts, or None.

    The memory model predicts the most-loaded rank of a training job. These runs measure something
    else, so comparing them would show a miss that is not one (the MoE run on plain fake collectives
    peaks 48 % above the same job with mirrored collectives)."""
    req = rep.get("request") or {}
    facts = rep.get("facts") or {}
    if "legs" in rep or rep.get("mode") == "parity":
        return "parity summary of two runs (DDP vs Megatron FSDP losses); its legs are listed on their own"
    if req.get("save_load"):
        return "checkpoint save and load control (it measures the checkpoint path, not training alone)"
    if req.get("mirror_collectives") is False and facts.get("moe"):
        return (
            "MoE on plain fake collectives: the token dispatcher reads token counts from buffers no collective "
            "wrote, so its activation memory is an artefact of the simulation (the same job with mirrored "
            "collectives is compared)"
        )
    model = (cfg or {}).get("model") or {}
    pp = int(model.get("pipeline_model_parallel_size") or 1)
    world = int(req.get("world_size") or 1)
    rank = int(req.get("rank") or 0)
    if pp > 1 and cfg is not None:
        try:
            est = memory.estimate(cfg, dp=int(facts.get("data_parallel_size") or 1), strategies=("ddp",))
        except memory.ModelError:
            return None
        heavy = 0 if est.counts.stage == "first" else pp - 1
        stage = _pp_stage(rank, world, pp)
        if stage != heavy:
            return (
                f"rank {rank} sits on pipeline stage {stage}, not the most-loaded stage ({est.counts.stage}) that "
                "the memory model predicts; the run on that stage is compared"
            )
    return None


def local_params_predicted(est, strategy: str) -> float:
    """Parameters this rank holds as its own tensors: Megatron FSDP presents every parameter as a
    DTensor shard of the data-parallel group (counted locally, as the rehearsal counts them, for
    optim, optim_grads and optim_grads_params alike); DDP and the distributed optimizer keep
    whole parameters."""
    c, par = est.counts, est.parallel
    dense = c.gpu_dense + ((c.gpu_lora - c.gpu_lora_experts) if est.peft else 0.0)
    experts = c.gpu_experts + (c.gpu_lora_experts if est.peft else 0.0)
    if strategy in ("optim", "optim_grads", "optim_grads_params") and par.dp * par.cp > 1:
        etp = par.etp or par.tp
        n_exp = max(1, (par.dp * par.cp * par.tp) // (par.ep * etp))
        return dense / (par.dp * par.cp) + experts / n_exp
    return dense + experts


def compare_run(run: Path, raw: Path | None = None) -> dict:
    """One run: measured figures from report.json, the prediction for its run_config.yaml."""
    rep = json.loads((run / "report.json").read_text(encoding="utf-8"))
    req = rep.get("request") or {}
    facts = rep.get("facts") or {}
    mem = rep.get("memory") or {}
    name = run.relative_to(raw).as_posix() if raw is not None and run != raw else run.name
    out: dict = {
        "run": name,
        "raw_dir": _rel(raw) if raw is not None else None,
        "path": _rel(run),
        "started_utc": rep.get("started_utc"),
        "result": rep.get("result"),
        "world_size": req.get("world_size"),
        "rank": req.get("rank", 0),
        "strategy": facts.get("strategy") or req.get("strategy"),
        "model": (rep.get("source") or "").replace("preset ", ""),
        "params_local_measured": (rep.get("params") or {}).get("local_numel"),
        "between_measured_bytes": mem.get("between_steps_bytes"),
        "peak_measured_bytes": mem.get("peak_allocated_bytes"),
    }
    cfg_file = run / "run_config.yaml"
    why = exclusion(rep, _load_yaml(cfg_file) if cfg_file.is_file() else None)
    if why:
        out["excluded"] = why
        return out
    if rep.get("result") != "passed" or mem.get("between_steps_bytes") is None:
        failure = rep.get("first_failure") or {}
        message = " ".join(str(failure.get("message", "")).split())[:160]
        out["skipped"] = (
            f"run did not finish its steps ({rep.get('result')}): {failure.get('type', '')} {message}".strip()
        )
        return out
    cfg_path = run / "run_config.yaml"
    if not cfg_path.is_file():
        out["skipped"] = "no run_config.yaml beside report.json"
        return out
    cfg = _load_yaml(cfg_path)
    model = cfg.get("model") or {}
    world = int(req.get("world_size") or 1)
    tp = int(model.get("tensor_model_parallel_size") or 1)
    pp = int(model.get("pipeline_model_parallel_size") or 1)
    cp = int(model.get("context_parallel_size") or 1)
    dp = int(facts.get("data_parallel_size") or world // (tp * pp * cp))
    strategy = out["strategy"]
    try:
        est = memory.estimate(cfg, dp=dp, strategies=(strategy,))
    except memory.ModelError as exc:  # a finished run the model cannot size: a miss, listed as one
        out["no_prediction"] = f"no prediction: {exc}"
        return out
    part = est.breakdown(strategy)
    params = rep.get("params") or {}
    measured_between = mem["between_steps_bytes"]
    measured_peak = mem.get("peak_allocated_bytes")
    out.update(
        {
            "dp": dp,
            "params_local_measured": params.get("local_numel"),
            "params_local_predicted": round(local_params_predicted(est, strategy)),
            "params_global_measured": params.get("global_numel"),
            "params_global_predicted": est.counts.total + (est.counts.lora_total if est.peft else 0),
            "between_measured_bytes": measured_between,
            "between_predicted_bytes": part["after_step"],
            "peak_measured_bytes": measured_peak,
            "peak_predicted_bytes": part["peak"],
            "breakdown_bytes": {k: round(v) for k, v in part.items()},
        }
    )
    return out


def _err(pred: float, meas: float | None) -> float | None:
    if not meas:
        return None
    return round(100.0 * (pred - meas) / meas, 2)


def collect(raws: list[Path]) -> list[dict]:
    """Every run of every folder, once: a run found in two folders (same name, same start) is one
    measurement, kept from the first folder given; of two attempts of one run (same name, later
    start) the later counts and the earlier is marked superseded."""
    runs: dict[str, dict] = {}
    superseded: list[dict] = []
    for raw in raws:
        for path in find_runs(raw):
            r = compare_run(path, raw)
            prev = runs.get(r["run"])
            if prev is None:
                runs[r["run"]] = r
                continue
            if prev.get("started_utc") == r.get("started_utc"):
                continue  # the same measurement, kept in two folders
            older, newer = sorted((prev, r), key=lambda x: str(x.get("started_utc")))
            runs[r["run"]] = newer
            superseded.append(
                {
                    **{k: v for k, v in older.items() if k not in ("skipped", "excluded")},
                    "excluded": f"superseded: this attempt ({older['path']}, {older.get('result')}) was run again "
                    f"later ({newer['path']}, {newer.get('started_utc')}), which is the one compared",
                }
            )
    return sorted(runs.values(), key=lambda x: x["run"]) + superseded


def assemble(raws: Path | list[Path], machine: str, command: str) -> tuple[dict, list[str]]:
    raws = [raws] if isinstance(raws, Path) else list(raws)
    runs = collect(raws)
    rows: list[list] = []
    problems: list[str] = []
    skipped: list[list] = []
    excluded: list[list] = []
    worst_state = worst_peak_under = worst_peak_over = None

    def gib(x):
        return round(x / GIB, 2) if x else None

    for r in runs:
        if "excluded" in r or "skipped" in r or "no_prediction" in r:
            if "excluded" in r:
                status, into = f"excluded: {r['excluded']}", excluded
            elif "skipped" in r:
                status, into = r["skipped"], skipped
            else:  # finished, but the model cannot size it: held to the targets, and missed
                status, into = r["no_prediction"], rows
                problems.append(f"{r['run']}: {r['no_prediction']}")
            into.append(
                [
                    r["run"],
                    r.get("model"),
                    r.get("world_size"),
                    r.get("strategy"),
                    r.get("params_local_measured"),
                    None,
                    gib(r.get("between_measured_bytes")),
                    None,
                    None,
                    gib(r.get("peak_measured_bytes")),
                    None,
                    None,
                    status,
                ]
            )
            continue
        e_state = _err(r["between_predicted_bytes"], r["between_measured_bytes"])
        e_peak = _err(r["peak_predicted_bytes"], r["peak_measured_bytes"])
        rows.append(
            [
                r["run"],
                r["model"],
                r["world_size"],
                r["strategy"],
                r["params_local_measured"],
                r["params_local_predicted"],
                round(r["between_measured_bytes"] / GIB, 2),
                round(r["between_predicted_bytes"] / GIB, 2),
                e_state,
                round(r["peak_measured_bytes"] / GIB, 2) if r["peak_measured_bytes"] else None,
                round(r["peak_predicted_bytes"] / GIB, 2),
                e_peak,
                COMPARED,
            ]
        )
        if e_state is not None:
            worst_state = e_state if worst_state is None or abs(e_state) > abs(worst_state) else worst_state
            if abs(e_state) > 100 * MODEL_STATE_TOL:
                problems.append(
                    f"{r['run']}: model state off by {e_state} % (target within {100 * MODEL_STATE_TOL:g} %)"
                )
        if e_peak is not None:
            worst_peak_under = e_peak if worst_peak_under is None or e_peak < worst_peak_under else worst_peak_under
            worst_peak_over = e_peak if worst_peak_over is None or e_peak > worst_peak_over else worst_peak_over
            if e_peak < -100 * PEAK_UNDER_TOL:
                problems.append(f"{r['run']}: peak under-predicted by {-e_peak} % (target: never more than 1 %)")
            elif abs(e_peak) > 100 * PEAK_TOL:
                problems.append(f"{r['run']}: peak off by {e_peak} % (target within {100 * PEAK_TOL:g} %)")
    notes = [
        "Measured: one H200 playing rank R (0 unless the run name says otherwise) of a world of N with "
        "PyTorch's fake process group "
        "(real Megatron-Bridge 0.6.2, megatron-core 0.19.2, megatron-fsdp 0.6.1 code and allocations; "
        "collectives move no data). 'between steps' = torch.cuda.memory_allocated() after the last "
        "optimizer step; 'peak' = torch.cuda.max_memory_allocated() over the run.",
        "Predicted: mfsdp_lib.memory.estimate on the run's own run_config.yaml, world size and strategy; "
        "'between steps' is after_step (model state + the optimizer-step copy + what start_param_sync "
        "gathers), 'peak' is the total including the calibrated margin.",
        f"Worst model-state error: {worst_state} %; peak error from {worst_peak_under} % to {worst_peak_over} % "
        f"(targets: model state within {100 * MODEL_STATE_TOL:g} %, peak within {100 * PEAK_TOL:g} % and never "
        f"more than {100 * PEAK_UNDER_TOL:g} % under).",
    ]
    if problems:
        notes.append("Targets missed: " + "; ".join(problems))
    else:
        notes.append(f"Every one of the {len(rows)} compared runs meets the targets.")
    notes.append(
        f"Rows whose status is not '{COMPARED}' are not held to the targets: {len(skipped)} run(s) that did not "
        f"finish (their failure is the status) and {len(excluded)} excluded by rule: an attempt run again later, or "
        "a run that does not measure training on the rank the memory model predicts (the reason is the status). "
        "Their measured figures are shown where the run recorded them."
    )
    started = sorted(str(r["started_utc"]) for r in runs if r.get("started_utc"))
    result = {
        "benchmark": BENCH_ID,
        "title": "Memory per rank: `mfsdp.py memory` predicted vs measured (dense, MoE with EP, hybrid, LoRA)",
        # The measurement's date (the last run's start), so regenerating from the same runs is stable.
        "date": started[-1] if started else _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "machine": machine,
        "command": command,
        "columns": COLUMNS,
        "rows": rows + skipped + excluded,
        "notes": notes,
        "raw": {"raw_dirs": [_rel(r) for r in raws], "runs": runs},
    }
    return result, problems


def _rel(p: Path) -> str:
    named = raw_store.logical(p)  # a folder of the raw-results archive keeps the name it was recorded under
    if named:
        return named
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="bench_memory.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit codes: 0 written (and, with --check, every target met); 1 --check and a target missed; "
        "2 unusable input.",
    )
    p.add_argument(
        "--raw-dir",
        type=Path,
        action="append",
        required=True,
        help="folder of rehearsal runs (each with report.json); repeat it to combine folders",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"result file (default {_rel(DEFAULT_OUT)})")
    p.add_argument(
        "--machine",
        default="1x NVIDIA H200 (rank R of a simulated world of N, PyTorch fake process group)",
        help="where the raw runs were measured, in words",
    )
    p.add_argument("--date", help="ISO date to record (default: the last run's start time)")
    p.add_argument("--check", action="store_true", help="exit 1 when a run misses a target")
    p.add_argument("--print", action="store_true", help="print the table instead of writing --out")
    a = p.parse_args(argv)
    a.raw_dir = [raw_store.resolve(r) for r in a.raw_dir]
    for raw in a.raw_dir:
        if not raw.is_dir():
            sys.stderr.write(f"bench_memory.py: error: --raw-dir {raw} is not a folder\n")
            return 2
        if not find_runs(raw):
            sys.stderr.write(f"bench_memory.py: error: no report.json under {raw}\n")
            return 2
    command = "python3 benchmarks/bench_memory.py " + " ".join(f"--raw-dir {_rel(r)}" for r in a.raw_dir)
    try:
        result, problems = assemble(a.raw_dir, a.machine, command)
    except memory.ModelError as exc:
        sys.stderr.write(f"bench_memory.py: error: {exc}\n")
        return 2
    if a.date:
        result["date"] = a.date
    if a.print:
        print(" | ".join(COLUMNS))
        for row in result["rows"]:
            print(" | ".join(str(x) for x in row))
        for n in result["notes"]:
            print("-", n)
    else:
        from mfsdp_lib import config_io

        config_io.write_atomic(str(a.out), json.dumps(result, indent=1) + "\n")
        compared = sum(1 for row in result["rows"] if row[-1] == COMPARED)
        print(
            f"wrote {a.out}: {compared} compared run(s), {len(result['rows']) - compared} listed without a "
            f"comparison, {len(problems)} target(s) missed"
        )
    return 1 if (a.check and problems) else 0


if __name__ == "__main__":
    sys.exit(main())
