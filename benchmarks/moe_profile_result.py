#!/usr/bin/env python3
"""Why Megatron FSDP's compute is slower than the distributed optimizer's on a MoE job: the kernel profiles.

``bench_rehearse_perf.py --only moe_prof_fsdp,moe_prof_distopt,moe_prof_fsdp_nomirror --out RAW`` runs the
``qwen3-moe-16l`` preset (Qwen3-30B-A3B's layer shapes, EP 8) as rank 0 of a world of 64 under each strategy with
``rehearse --perf --profile``: the timed steps under ``torch.profiler`` (GPU kernels only), each kernel's device time
summed by name and by kind (``scripts/mfsdp_gpu/kernel_profile.py``). This script reads the engine reports the driver
copied beside each row (``<row>.rank_0.report.json``) and writes the project's result shape:

* one row per run: step time under the profiler (CUDA events), GPU kernel time per step, and the kinds that take
  the most time;
* the difference per kind, FSDP minus the distributed optimizer, and FSDP with the mirror minus FSDP without it
  (the mirror's copies are the fake backend's own work: a real all-gather writes those bytes with NCCL's kernels,
  which the fake backend does not run);
* notes that say, from these numbers only, which kinds make up the gap.

The profiler slows the steps; throughput figures come from the unprofiled ``rehearse --perf`` rows. The output
name follows the raw folder's (``moe_profile_1xh100`` -> ``benchmarks/results/moe_profile_1xh100.json``).

    python3 benchmarks/moe_profile_result.py benchmarks/results/raw/moe_profile_1xh100

Exit codes: 0 written, 1 a row has no profile (the file is still written, saying so), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import raw_store  # beside this script

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from mfsdp_gpu.kernel_profile import difference  # noqa: E402  (pure Python: no torch)

ROWS = {
    "moe_prof_fsdp": ("optim_grads_params", True),
    "moe_prof_distopt": ("distopt", True),
    "moe_prof_fsdp_nomirror": ("optim_grads_params", False),
}
KINDS_SHOWN = 4  # kinds named per row in the table, longest first
COLUMNS = [
    "row",
    "strategy",
    "collective mirror",
    "step s under the profiler (median)",
    "GPU kernel ms/step",
    "longest kinds, ms/step",
    "kernel launches/step",
]


def _read(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if isinstance(x, (int, float)))
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def run_row(raw: Path, name: str) -> dict:
    """One run's record from its engine report: step times, the kernel profile, the device."""
    strategy, mirror = ROWS[name]
    rep = _read(raw / f"{name}.rank_0.report.json") or {}
    steps = (rep.get("memory") or {}).get("steps") or []
    timed = [((s.get("cuda_event_s") or {}).get("step_s")) for s in steps if s.get("cuda_event_s")]
    prof = rep.get("kernel_profile") if isinstance(rep.get("kernel_profile"), dict) else None
    ok = bool(prof and "by_kind_ms_per_step" in prof)
    return {
        "row": name,
        "strategy": strategy,
        "mirror": mirror,
        "status": "passed" if ok else f"no profile ({rep.get('result') or 'no report'})",
        "step_s_profiled": _median([t for t in timed if t is not None]),
        "profile": prof if ok else None,
        "device": rep.get("device") if isinstance(rep.get("device"), str) else (rep.get("device") or {}).get("name"),
        "losses": [s.get("loss") for s in steps],
    }


def table_row(r: dict) -> list:
    p = r.get("profile") or {}
    kinds = list((p.get("by_kind_ms_per_step") or {}).items())[:KINDS_SHOWN]
    launches = sum((p.get("calls_by_kind_per_step") or {}).values()) if p else None
    return [
        r["row"],
        r["strategy"],
        "on" if r["mirror"] else "off",
        r.get("step_s_profiled"),
        p.get("device_ms_per_step"),
        ", ".join(f"{k} {v:.1f}" for k, v in kinds) if kinds else "—",
        round(launches) if launches is not None else None,
    ]


def explain(rows: dict) -> tuple[dict, list[str]]:
    """The per-kind differences and the notes that say what they show."""
    f, d, n = (rows[k].get("profile") for k in ("moe_prof_fsdp", "moe_prof_distopt", "moe_prof_fsdp_nomirror"))
    comp: dict = {}
    notes: list[str] = []
    if f and d:
        gap = difference(f, d)
        total = f["device_ms_per_step"] - d["device_ms_per_step"]
        comp["fsdp_minus_distopt_ms_per_step"] = gap
        comp["fsdp_minus_distopt_total_ms_per_step"] = round(total, 3)
        rel = total / d["device_ms_per_step"] if d["device_ms_per_step"] else None
        adds = [(k, v) for k, v in gap.items() if v > 0]
        share = ", ".join(f"{k} {v:+.1f} ms" for k, v in adds[:4])
        notes.append(
            f"GPU kernel time per step: Megatron FSDP {f['device_ms_per_step']:.1f} ms, distributed optimizer "
            f"{d['device_ms_per_step']:.1f} ms ({100 * rel:+.1f}%)." if rel is not None else ""
        )
        notes.append(f"What FSDP adds, by kind (ms per step): {share or 'nothing'}.")
    if f and n:
        mirror = difference(f, n)
        comp["mirror_on_minus_off_ms_per_step"] = mirror
        m_total = f["device_ms_per_step"] - n["device_ms_per_step"]
        comp["mirror_total_ms_per_step"] = round(m_total, 3)
        notes.append(
            f"The collective mirror's own work (FSDP with it minus FSDP without it): {m_total:+.1f} ms per step, "
            + ", ".join(f"{k} {v:+.1f}" for k, v in list(mirror.items())[:3])
            + ". A real all-gather writes those bytes too, with NCCL's kernels on their own stream: the mirror's "
            "copies stand in for that work on the compute stream, which the fake backend leaves out otherwise."
        )
        if "fsdp_minus_distopt_total_ms_per_step" in comp and comp["fsdp_minus_distopt_total_ms_per_step"]:
            share = m_total / comp["fsdp_minus_distopt_total_ms_per_step"]
            comp["mirror_share_of_gap"] = round(share, 3)
            notes.append(f"So the mirror accounts for {100 * share:.0f}% of FSDP's extra kernel time on this job.")
    return comp, [x for x in notes if x]


def build(raw: Path) -> dict:
    rows = {name: run_row(raw, name) for name in ROWS}
    comp, notes = explain(rows)
    top = {
        name: (r.get("profile") or {}).get("top_kernels", [])[:10] for name, r in rows.items() if r.get("profile")
    }
    driver = _read(raw / "driver.json") or {}
    device = next((r["device"] for r in rows.values() if r.get("device")), None)
    rel = raw_store.logical(raw) or str(raw)
    return {
        "benchmark": raw.name,
        "title": "Why Megatron FSDP's compute is slower than the distributed optimizer's on a MoE job: GPU kernel "
        "time per step by kind (Qwen3-30B-A3B layer shapes, 16 layers, EP 8, rank 0 of 64)",
        "date": str(driver.get("started_utc") or "")[:10] or None,
        "machine": f"1x {device}" if device else "unknown (no row recorded a device)",
        "command": f"python3 benchmarks/bench_rehearse_perf.py --out {rel} --only {','.join(ROWS)}; "
        f"python3 benchmarks/moe_profile_result.py {rel}",
        "columns": COLUMNS,
        "rows": [table_row(r) for r in rows.values()],
        "notes": notes
        + [
            "Kinds come from the kernels' names (scripts/mfsdp_gpu/kernel_profile.py, KINDS); the ten longest kernels "
            "of each run are in raw.top_kernels. Step times here are under the profiler; the unprofiled figures are "
            "the rehearse --perf rows."
        ],
        "raw": {"folder": rel, "driver": driver, "comparison": comp, "top_kernels": top, "runs": list(rows.values())},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="moe_profile_result.py", description=__doc__.split("\n\n")[0])
    p.add_argument("raw", type=Path, help="the folder bench_rehearse_perf.py wrote the moe_prof_* rows into")
    p.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/<raw folder's name>.json")
    a = p.parse_args(argv)
    raw = raw_store.resolve(a.raw)
    if not raw.is_dir():
        sys.stderr.write(f"moe_profile_result.py: error: {a.raw} is not a folder\n")
        return 2
    doc = build(raw)
    out = a.out or ROOT / "benchmarks" / "results" / f"{raw.name}.json"
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    missing = [r["row"] for r in doc["raw"]["runs"] if r["status"] != "passed"]
    print(f"wrote {out}" + (f"; no profile: {', '.join(missing)}" if missing else ""))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
