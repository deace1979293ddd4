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
RECORDED_REHEARSE = ROOT / "benchmarks" / "results" / "raw" / "rehearse_1xh200"
RECORDED_SMOKE = ROOT / "benchmarks" / "results" / "raw" / "gpu_smoke_1xh200" / "smoke_rank0.json"
REL_TOL = 0.01  # allocator rounding and library patch versions stay well inside 1 %
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


def _close(diffs: list[str], name: str, rec, fresh, tol: float) -> None:
    if rec is None and fresh is None:
        return
    if not isinstance(rec, (int, float)) or not isinstance(fresh, (int, float)):
        diffs.append(f"{name}: recorded {rec!r}, fresh {fresh!r}")
        return
    rel = abs(fresh - rec) / max(abs(rec), 1)
    if rel > tol:
        diffs.append(f"{name}: recorded {rec}, fresh {fresh} ({rel:.2%} > {tol:.0%})")


def _settings(rep: dict) -> dict:
    return {
        r.get("key"): r.get("value") for r in rep.get("settings_applied") or [] if r.get("key") not in PATH_SETTINGS
    }


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
                _close(diffs, f"phases.{phase}.{key}", r.get(key), f.get(key), tol)
    for key in ("local_numel", "global_numel", "local_trainable_numel", "local_expert_numel"):
        _exact(diffs, f"params.{key}", _get(rec, f"params.{key}"), _get(fresh, f"params.{key}"))
    for key in ("state_numel", "updated_param_numel"):
        _exact(
            diffs, f"optimizer_state.{key}", _get(rec, f"optimizer_state.{key}"), _get(fresh, f"optimizer_state.{key}")
        )
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
        lines += [f"{name}: agrees"] if not diffs else [f"{name}: DIFFERS"] + [f"  {d}" for d in diffs]
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
        rec, new = _load(Path(a.recorded or RECORDED_SMOKE)), _load(fresh)
        if rec is None or new is None:
            sys.stderr.write(f"gpu_regen_check.py: cannot read {'the recorded record' if rec is None else fresh}\n")
            return 2
        diffs = compare_smoke(rec, new, a.rel_tol)
        print("smoke: agrees" if not diffs else "\n".join(["smoke: DIFFERS"] + [f"  {d}" for d in diffs]))
        return 1 if diffs else 0
    compared, lines = check_rehearsals(fresh, Path(a.recorded or RECORDED_REHEARSE), a.rel_tol)
    print("\n".join(lines))
    if not compared:
        sys.stderr.write(f"gpu_regen_check.py: no run under {fresh} has a recorded counterpart\n")
        return 2
    return 1 if any(ln.endswith(": DIFFERS") for ln in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
