#!/usr/bin/env python3
"""Does a fresh GPU run reproduce a recorded one? Rehearsal reports and smoke rank records, field by field.

Why: the recorded H200 runs under ``benchmarks/results/raw/`` are the evidence behind BENCHMARK.md.
After a change to the GPU-side code (``scripts/mfsdp_gpu``), the same runs, made again, must give
the same verdicts and the same figures; this script says which run and which field differ.

How: for every fresh run that has a recorded run of the same name, compare
* exactly: the result, where a failure happened (phase, exception type), the number of steps, the
  parameter and optimizer-state counts, the process groups, the settings the run changed (their
  keys and values; values that are paths on the machine are left out), a save/load's resumed
  iteration and file count, a parity verdict, a smoke's parameters, iterations and verdicts;
* within ``--rel-tol`` (default 1 %): memory (overall and between-step peaks, memory after setup,
  per-phase allocated and peak bytes; a smoke's peak and model state). The allocator's rounding
  and library versions move these by a fraction of a percent; a code change that allocates
  differently moves them by more.
Wall times, losses of fake worlds and timestamps are never compared (they are not reproducible).

    python3 benchmarks/gpu_regen_check.py rehearse FRESH_RESULTS_DIR
    python3 benchmarks/gpu_regen_check.py smoke FRESH_OUT/cli_smoke/rank0.json

Exit status: 0 every compared run agrees, 1 a difference (listed), 2 bad input (nothing to compare).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import raw_store  # noqa: E402  (beside this script: the recorded runs are read from the raw-results archive)

# The recorded runs, by their names in the raw-results archive (extracted on first use, not at import).
RECORDED_REHEARSE = ("rehearse_1xh200",)
RECORDED_SMOKE = ("gpu_smoke_1xh200", "smoke_rank0.json")
REL_TOL = 0.01  # allocator rounding and library patch versions stay well inside 1 %
# Per-phase memory figures of the early phases move by whole allocator blocks between runs of one config:
# the tokenizer phase's peak (before any model exists; CUDA context and NCCL warm-up of concurrent runs)
# is 50 to 113 MiB across the recorded runs. A phase difference within this floor is not a code change;
# the run's overall and between-step figures keep the relative tolerance alone.
ABS_TOL_BYTES = 128 * 2**20
# Settings whose value is a path on the machine that ran (differs per run folder).
PATH_SETTINGS = {"checkpoint.save", "checkpoint.pretrained_checkpoint"}
MEMORY_FIELDS = ("peak_allocated_bytes", "between_steps_bytes", "after_setup_bytes")
PHASE_MEMORY = ("allocated_bytes", "peak_allocated_bytes")
SMOKE_EXACT = ("strategy", "model", "world_size", "iterations", "parameters", "finite", "error")
SMOKE_MEMORY = ("peak_allocated_bytes", "model_state_bytes", "allocated_after_setup_bytes")


def _get(d, path: str):
    for part in path.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


def _exact(diffs: list[str], name: str, rec, fresh) -> None:
    if rec != fresh:
        diffs.append(f"{name}: recorded {rec!r}, fresh {fresh!r}")


def _close(diffs: list[str], name: str, rec, fresh, tol: float, abs_tol: int = 0) -> None:
    if rec is None and fresh is None:
        return
    if not isinstance(rec, (int, float)) or not isinstance(fresh, (int, float)):
        diffs.append(f"{name}: recorded {rec!r}, fresh {fresh!r}")
        return
    rel = abs(fresh - rec) / max(abs(rec), 1)
    if rel > tol and abs(fresh - rec) > abs_tol:
        diffs.append(f"{name}: recorded {rec}, fresh {fresh} ({rel:.2%} > {tol:.0%})")


def _settings(rep: dict) -> dict:
    return {
        r.get("key"): r.get("value") for r in rep.get("settings_applied") or [] if r.get("key") not in PATH_SETTINGS
    }


def optimizer_shards(rep: dict) -> int | None:
    """How many ranks share one copy of the optimizer's parameters in this run (None: not judged).

    The distributed optimizer shards the main parameters over the data-parallel group; DDP keeps them whole.
    """
    strategy = _get(rep, "facts.strategy")
    dp = _get(rep, "facts.data_parallel_size")
    if strategy == "distopt" and isinstance(dp, int) and dp > 0:
        return dp
    if strategy == "ddp":
        return 1
    # Megatron FSDP: the Adam moments are DTensors whose numel() is the global size, so the state count
    # is not per rank and this check cannot judge it.
    return None


def optimizer_counts_consistent(rep: dict) -> bool | None:
    """Do a report's optimizer counts agree with its own parameter count (None: cannot tell)?

    Adam updates this rank's share of the trainable parameters (``local_trainable_numel`` divided by
    ``optimizer_shards``, up to the distributed optimizer's bucket padding) and keeps two moments for each.
    """
    trainable = _get(rep, "params.local_trainable_numel")
    updated = _get(rep, "optimizer_state.updated_param_numel")
    state = _get(rep, "optimizer_state.state_numel")
    shards = optimizer_shards(rep)
    if not all(isinstance(v, int) for v in (trainable, updated, state)) or not shards:
        return None
    expected = trainable / shards
    return abs(updated - expected) <= PADDING_TOL * expected and state == 2 * updated


PADDING_TOL = 0.001  # the distributed optimizer pads its buckets: well under 0.1 % of a 1 B model


def _optimizer_counts(diffs: list[str], rec: dict, fresh: dict) -> None:
    """Optimizer-state counts, exactly; where they differ, the report whose counts disagree with its own
    parameter count is the wrong one. A recorded run that counted one optimizer twice is named as such
    (it is not a change of the GPU-side code) once the fresh run's counts are consistent."""
    pairs = [("state_numel", "updated_param_numel")]
    for key in pairs[0]:
        r, f = _get(rec, f"optimizer_state.{key}"), _get(fresh, f"optimizer_state.{key}")
        if r == f:
            continue
        if optimizer_counts_consistent(fresh) and optimizer_counts_consistent(rec) is False:
            continue  # reported by recorded_count_errors
        diffs.append(f"optimizer_state.{key}: recorded {r!r}, fresh {f!r}")


def recorded_count_errors(rec: dict, fresh: dict) -> list[str]:
    """Notes on recorded optimizer counts that disagree with the recorded parameter count while the fresh
    run's agree (printed, not counted as differences)."""
    same = all(
        _get(rec, f"optimizer_state.{k}") == _get(fresh, f"optimizer_state.{k}")
        for k in ("state_numel", "updated_param_numel")
    )
    if same or not (optimizer_counts_consistent(fresh) and optimizer_counts_consistent(rec) is False):
        return []
    return [
        "recorded optimizer counts disagree with the recorded parameter count "
        f"({_get(rec, 'optimizer_state.updated_param_numel')} updated for "
        f"{_get(rec, 'params.local_trainable_numel')} trainable over {optimizer_shards(rec)} shard(s); "
        f"inner optimizers {_get(rec, 'optimizer_state.inner_optimizers')}); the fresh ones agree "
        f"({_get(fresh, 'optimizer_state.updated_param_numel')} updated)"
    ]


def compare_rehearsal(rec: dict, fresh: dict, tol: float = REL_TOL) -> list[str]:
    """The differences between two ``report.json`` of the same run (empty: they agree)."""
    diffs: list[str] = []
    _exact(diffs, "result", rec.get("result"), fresh.get("result"))
    for key in ("phase", "type"):
        _exact(diffs, f"first_failure.{key}", _get(rec, f"first_failure.{key}"), _get(fresh, f"first_failure.{key}"))
    if rec.get("mode") == "parity":
        _exact(diffs, "parity.passed", _get(rec, "parity.passed"), _get(fresh, "parity.passed"))
        _exact(diffs, "parity.steps_compared", _get(rec, "parity.steps_compared"), _get(fresh, "parity.steps_compared"))
        for leg in sorted(set(rec.get("legs") or {}) | set(fresh.get("legs") or {})):
            r, f = _get(rec, f"legs.{leg}") or {}, _get(fresh, f"legs.{leg}") or {}
            _exact(diffs, f"legs.{leg}.exit_code", r.get("exit_code"), f.get("exit_code"))
            for key in ("peak_allocated_bytes", "between_steps_bytes"):
                _close(diffs, f"legs.{leg}.{key}", r.get(key), f.get(key), tol)
        return diffs
    _exact(
        diffs, "phases.train.iterations", _get(rec, "phases.train.iterations"), _get(fresh, "phases.train.iterations")
    )
    for key in MEMORY_FIELDS:
        _close(diffs, f"memory.{key}", _get(rec, f"memory.{key}"), _get(fresh, f"memory.{key}"), tol)
    for phase, r in (rec.get("phases") or {}).items():
        f = _get(fresh, f"phases.{phase}") or {}
        _exact(diffs, f"phases.{phase}.status", r.get("status"), f.get("status"))
        for key in PHASE_MEMORY:
            if key in r:
                _close(diffs, f"phases.{phase}.{key}", r.get(key), f.get(key), tol, ABS_TOL_BYTES)
    for key in ("local_numel", "global_numel", "local_trainable_numel", "local_expert_numel"):
        _exact(diffs, f"params.{key}", _get(rec, f"params.{key}"), _get(fresh, f"params.{key}"))
    _optimizer_counts(diffs, rec, fresh)
    _exact(diffs, "process_groups.count", _get(rec, "process_groups.count"), _get(fresh, "process_groups.count"))
    _exact(diffs, "settings_applied", _settings(rec), _settings(fresh))
    _exact(diffs, "mirror_collectives", rec.get("mirror_collectives"), fresh.get("mirror_collectives"))
    for key in ("files_after_save", "saved_iteration", "resumed_iteration", "equal"):
        _exact(diffs, f"save_load.{key}", _get(rec, f"save_load.{key}"), _get(fresh, f"save_load.{key}"))
    return diffs


def compare_smoke(rec: dict, fresh: dict, tol: float = REL_TOL) -> list[str]:
    """The differences between two smoke rank records (``rank<R>.json``) of the same job."""
    diffs: list[str] = []
    for key in SMOKE_EXACT:
        _exact(diffs, key, rec.get(key), fresh.get(key))
    for path in ("bridge_validate.ok", "check.ok", "save_resume.equal", "resumed_iteration", "config.overrides"):
        _exact(diffs, path, _get(rec, path), _get(fresh, path))
    for key in SMOKE_MEMORY:
        _close(diffs, key, rec.get(key), fresh.get(key), tol)
    return diffs


def _load(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_rehearsals(fresh_dir: Path, recorded_dir: Path, tol: float) -> tuple[int, list[str]]:
    """(runs compared, lines to print); a fresh run without a recorded one is named, not compared."""
    lines, compared = [], 0
    for path in sorted(fresh_dir.glob("*/report.json")):
        name = path.parent.name
        rec, fresh = _load(recorded_dir / name / "report.json"), _load(path)
        if rec is None or fresh is None:
            lines.append(f"{name}: not compared ({'no recorded run' if rec is None else 'fresh report unreadable'})")
            continue
        compared += 1
        diffs = compare_rehearsal(rec, fresh, tol)
        notes = [f"  note: {n}" for n in recorded_count_errors(rec, fresh)]
        lines += ([f"{name}: agrees"] if not diffs else [f"{name}: DIFFERS"] + [f"  {d}" for d in diffs]) + notes
    return compared, lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="gpu_regen_check.py",
        description="Compare a fresh GPU run with the recorded one: exact verdicts and counts, memory within a tolerance.",
        epilog="Exit status: 0 agree, 1 a difference, 2 nothing to compare.",
    )
    p.add_argument("kind", choices=("rehearse", "smoke"))
    p.add_argument("fresh", help="rehearse: the results folder (one sub-folder per run); smoke: a fresh rank0.json")
    p.add_argument("--recorded", default=None, help="default: the recorded 1 x H200 run under benchmarks/results/raw")
    p.add_argument("--rel-tol", type=float, default=REL_TOL, help="relative tolerance on memory (default 0.01)")
    a = p.parse_args(argv)
    fresh = Path(a.fresh)
    if a.kind == "smoke":
        rec, new = _load(Path(a.recorded) if a.recorded else raw_store.path(*RECORDED_SMOKE)), _load(fresh)
        if rec is None or new is None:
            sys.stderr.write(f"gpu_regen_check.py: cannot read {'the recorded record' if rec is None else fresh}\n")
            return 2
        diffs = compare_smoke(rec, new, a.rel_tol)
        print("smoke: agrees" if not diffs else "\n".join(["smoke: DIFFERS"] + [f"  {d}" for d in diffs]))
        return 1 if diffs else 0
    compared, lines = check_rehearsals(
        fresh, Path(a.recorded) if a.recorded else raw_store.path(*RECORDED_REHEARSE), a.rel_tol
    )
    print("\n".join(lines))
    if not compared:
        sys.stderr.write(f"gpu_regen_check.py: no run under {fresh} has a recorded counterpart\n")
        return 2
    return 1 if any(ln.endswith(": DIFFERS") for ln in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
