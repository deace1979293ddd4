#!/usr/bin/env python3
"""Where a MoE job's step goes under Megatron FSDP and under the distributed optimizer: the kernel profiles.

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

from mfsdp_gpu.kernel_profile import difference, kind_of  # noqa: E402  (pure Python: no torch)

ROWS = {
    "moe_prof_fsdp": ("optim_grads_params", True),
    "moe_prof_distopt": ("distopt", True),
    "moe_prof_fsdp_nomirror": ("optim_grads_params", False),
}
KINDS_SHOWN = 4  # kinds named per row in the table, longest first
REST = "rest (outside the longest kernels recorded)"
COLUMNS = [
    "row",
    "strategy",
    "collective mirror",
    "step s under the profiler (median)",
    "GPU kernel ms/step",
    "GPU busy share of the step",
    "longest kinds, ms/step",
    "kernels and copies/step",
    "memcpys/step",
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


def by_kind_now(prof: dict) -> dict:
    """Milliseconds per step by kind, from the recorded longest kernels classified with today's ``KINDS`` (the
    kinds summed on the GPU used the rules of that day), plus the time outside them as "rest"."""
    out: dict[str, float] = {}
    named = 0.0
    for k in prof.get("top_kernels") or []:
        kind = kind_of(str(k.get("name", "")))
        out[kind] = out.get(kind, 0.0) + float(k.get("ms_per_step") or 0.0)
        named += float(k.get("ms_per_step") or 0.0)
    rest = float(prof.get("device_ms_per_step") or 0.0) - named
    if rest > 0:
        out[REST] = rest
    return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def run_row(raw: Path, name: str) -> dict:
    """One run's record from its engine report: step times, the kernel profile, the device."""
    strategy, mirror = ROWS[name]
    rep = _read(raw / f"{name}.rank_0.report.json") or {}
    steps = (rep.get("memory") or {}).get("steps") or []
    timed = [((s.get("cuda_event_s") or {}).get("step_s")) for s in steps if s.get("cuda_event_s")]
    prof = rep.get("kernel_profile") if isinstance(rep.get("kernel_profile"), dict) else None
    ok = bool(prof and "by_kind_ms_per_step" in prof)
    step_s = _median([t for t in timed if t is not None])
    row = {
        "row": name,
        "strategy": strategy,
        "mirror": mirror,
        "status": "passed" if ok else f"no profile ({rep.get('result') or 'no report'})",
        "step_s_profiled": step_s,
        "step_spread": (max(good) - min(good)) / min(good) if len(good := [t for t in timed if t]) > 1 else None,
        "profile": prof if ok else None,
        "device": rep.get("device") if isinstance(rep.get("device"), str) else (rep.get("device") or {}).get("name"),
        "losses": [s.get("loss") for s in steps],
    }
    if ok:
        assert prof is not None
        row["by_kind_ms_per_step"] = by_kind_now(prof)
        row["launches_per_step"] = round(sum((prof.get("calls_by_kind_per_step") or {}).values()))
        row["memcpy_per_step"] = round(
            sum(k["calls_per_step"] for k in prof.get("top_kernels") or [] if kind_of(k["name"]) == "memcpy")
        )
        row["gpu_busy_fraction"] = round(prof["device_ms_per_step"] / (1e3 * step_s), 3) if step_s else None
    return row


def table_row(r: dict) -> list:
    p = r.get("profile") or {}
    kinds = list((r.get("by_kind_ms_per_step") or {}).items())[:KINDS_SHOWN]
    return [
        r["row"],
        r["strategy"],
        "on" if r["mirror"] else "off",
        r.get("step_s_profiled"),
        p.get("device_ms_per_step"),
        r.get("gpu_busy_fraction"),
        ", ".join(f"{k} {v:.1f}" for k, v in kinds) if kinds else "—",
        r.get("launches_per_step"),
        r.get("memcpy_per_step"),
    ]


def _diff(a: dict, b: dict) -> dict:
    return difference({"by_kind_ms_per_step": a}, {"by_kind_ms_per_step": b})


def explain(rows: dict) -> tuple[dict, list[str]]:
    """The per-kind differences and the notes that say, from these numbers only, what they show."""
    f, d, n = (rows[k] for k in ("moe_prof_fsdp", "moe_prof_distopt", "moe_prof_fsdp_nomirror"))
    comp: dict = {}
    notes: list[str] = []
    if f.get("profile") and d.get("profile"):
        fp, dp = f["profile"], d["profile"]
        gap = _diff(f["by_kind_ms_per_step"], d["by_kind_ms_per_step"])
        comp["fsdp_minus_distopt_ms_per_step"] = gap
        comp["fsdp_minus_distopt_total_ms_per_step"] = round(fp["device_ms_per_step"] - dp["device_ms_per_step"], 3)
        comp["launches_fsdp_over_distopt"] = (
            round(f["launches_per_step"] / d["launches_per_step"], 3) if d["launches_per_step"] else None
        )
        notes.append(
            f"The step is bound by the host, not the GPU: the GPU runs kernels for {fp['device_ms_per_step']:.1f} ms of "
            f"FSDP's {1e3 * f['step_s_profiled']:.0f} ms step ({100 * f['gpu_busy_fraction']:.0f}% busy) and "
            f"{dp['device_ms_per_step']:.1f} ms of the distributed optimizer's {1e3 * d['step_s_profiled']:.0f} ms "
            f"({100 * d['gpu_busy_fraction']:.0f}%); the rest is the host issuing work (Python, the MoE dispatch, "
            "hooks, kernel launches). So a difference in step time between the strategies on this job measures "
            "host-side work, and GPU kernel time is not where FSDP loses."
        )
        spread = [r["step_spread"] for r in (f, d) if r.get("step_spread") is not None]
        if spread:
            notes.append(
                f"Step time under the profiler: FSDP/distributed optimizer = {f['step_s_profiled'] / d['step_s_profiled']:.2f}, "
                f"while one strategy's own timed steps differ by up to {100 * max(spread):.0f}% (the runs shared the "
                "machine's CPUs with other rehearsals importing Bridge): on a host-bound step the ratio is not a "
                "property of the strategy."
            )
        adds = ", ".join(f"{k} {v:+.1f}" for k, v in list(gap.items())[:5])
        notes.append(
            f"GPU kernel time per step, FSDP minus the distributed optimizer: "
            f"{comp['fsdp_minus_distopt_total_ms_per_step']:+.1f} ms in all; by kind (ms): {adds}."
        )
        notes.append(
            f"Kernels and copies issued per step: FSDP {f['launches_per_step']:,}, the distributed optimizer "
            f"{d['launches_per_step']:,} ({100 * ((comp['launches_fsdp_over_distopt'] or 1) - 1):+.0f}%); device-to-device "
            f"memcpys among them: {f['memcpy_per_step']:,} against {d['memcpy_per_step']:,}."
        )
    if f.get("profile") and n.get("profile"):
        extra = f["launches_per_step"] - n["launches_per_step"]
        extra_memcpy = f["memcpy_per_step"] - n["memcpy_per_step"]
        comp["mirror_extra_launches_per_step"] = extra
        comp["mirror_extra_memcpy_per_step"] = extra_memcpy
        part = ""
        if d.get("profile"):
            fsdp_extra = f["launches_per_step"] - d["launches_per_step"]
            comp["mirror_share_of_extra_launches"] = round(extra / fsdp_extra, 3) if fsdp_extra else None
            if fsdp_extra > 0:
                part = f", {100 * extra / fsdp_extra:.0f}% of what FSDP issues beyond the distributed optimizer"
        notes.append(
            f"The fake backend's share: the collective mirror copies this rank's shard into every slot of each "
            f"all-gather, one copy per slot (64 at a data-parallel size of 64), where a real all-gather is one NCCL "
            f"kernel. With the mirror off FSDP issues {n['launches_per_step']:,} kernels and copies per step: the "
            f"mirror adds {extra:,} ({extra_memcpy:,} memcpys){part}."
        )
        notes.append(
            "FSDP without the mirror is not a compute comparison on a MoE job: its all-to-all token counts are read "
            f"from memory nobody wrote, so the experts' GEMMs change shape (GEMM time {n['by_kind_ms_per_step'].get('gemm', 0):.1f} "
            f"ms per step against {f['by_kind_ms_per_step'].get('gemm', 0):.1f} ms with the mirror)."
        )
    return comp, notes


def build(raw: Path) -> dict:
    rows = {name: run_row(raw, name) for name in ROWS}
    comp, notes = explain(rows)
    top = {name: (r.get("profile") or {}).get("top_kernels", [])[:10] for name, r in rows.items() if r.get("profile")}
    driver = _read(raw / "driver.json") or {}
    device = next((r["device"] for r in rows.values() if r.get("device")), None)
    rel = raw_store.logical(raw) or str(raw)
    return {
        "benchmark": raw.name,
        "title": "Megatron FSDP against the distributed optimizer on a MoE job, profiled: GPU kernel time per step by "
        "kind, the host-bound share, and the fake backend's part (Qwen3-30B-A3B layer shapes, 16 layers, EP 8, "
        "rank 0 of 64)",
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
