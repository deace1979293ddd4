"""One rehearsal's performance, and the ``--compare`` table, from the engine's ``perf`` record.

The engine (``rehearse --perf``) writes into each rank's ``report.json`` a ``perf`` object:
the timed steps' durations (CUDA events, after warm-up), split into forward/backward and
optimizer; the step's shape (micro-batches, micro-batch size, sequence length, global
batch, world and parallel sizes); Bridge's model FLOPs per step; the job's precision and
the GPU's name; and the collective log (:mod:`.collectives`). This module turns it into
what a user reads:

* measured compute: median step time with its spread (min, max, relative spread) over the
  timed steps, per step and per micro-batch, and the compute-only throughput it implies
  (tokens/s/GPU, model TFLOP/s/GPU, MFU);
* counted communication per step, per kind and group;
* the predicted step-time range and throughput range (:mod:`.predict`).

Non-finite steps: a timed step whose loss or gradient norm is NaN or infinite (under the fake
backend a weight nobody wrote can hold NaN; such a step skips work and runs faster) is left out of
every figure; ``nonfinite_timed_steps`` counts them and :func:`warning` is the line a report puts
first. When every timed step is non-finite, there is no figure.

``--perf-micro-batches K`` (the record's ``scaling``): the engine ran K of the step's M
micro-batches; each timed step becomes optimizer + (step - optimizer) x M/K (:func:`scale_step`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from . import collectives, flops, predict

PERF_SCHEMA = "mfsdp-perf/1"


def _stats(values: Sequence[float]) -> dict | None:
    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    if not vals:
        return None
    med = statistics.median(vals)
    return {
        "median": med,
        "min": min(vals),
        "max": max(vals),
        "spread": (max(vals) - min(vals)) / med if med else None,
        "n": len(vals),
    }


# What a rank's perf record counts rather than times (sizes and byte widths): still true of a run whose values
# went non-finite, so a withdrawn figure keeps them beside its communication log.
_COUNT_KEYS = (
    "world_size",
    "micro_batches",
    "params",
    "local_params",
    "params_in_layers",
    "param_gather_bytes",
    "grad_reduce_bytes",
    "fsdp_main_grads_bytes",
    "fsdp_grad_comm_bytes",
)


def summarize(perf: Mapping | None, links: predict.Links | None = None) -> dict:
    """The perf summary of one rank (see the module docstring); ``available`` False with why."""
    if not isinstance(perf, Mapping) or perf.get("schema") != PERF_SCHEMA:
        return {
            "available": False,
            "why": "no perf record (the run stopped before its timed steps, or ran without --perf)",
        }
    links = links or predict.Links()
    numerics = timed_numerics(perf)
    keep = numerics["finite_mask"]
    scaling = perf.get("scaling") if isinstance(perf.get("scaling"), Mapping) else None
    raw_steps = _kept(perf.get("step_times_s") or [], keep)
    raw_opt = _kept(perf.get("optimizer_times_s") or [], keep)
    step_times = [scale_step(t, o, scaling) for t, o in zip(raw_steps, _pad(raw_opt, len(raw_steps)), strict=True)]
    step = _stats(step_times)
    if step is None:
        why = perf.get("error") or "no timed step finished"
        out_na: dict = {"available": False, "why": why, **_numerics_out(numerics)}
        if numerics["nonfinite_timed_steps"] and not any(keep):
            out_na["why"] = (
                f"every timed step had a non-finite loss or gradient norm ({numerics['nonfinite_timed_steps']})"
            )
            # what was counted does not depend on the values: the collective log still holds
            log = perf.get("collectives")
            if isinstance(log, Mapping):
                try:
                    out_na["communication"] = {
                        "available": True,
                        **collectives.aggregate(log, int(perf.get("world_size") or 1)),
                    }
                except collectives.LogError as exc:
                    out_na["communication"] = {"available": False, "why": str(exc)}
                # the sizes the counted volumes are checked against: counts too, independent of the values
                out_na.update({k: perf.get(k) for k in _COUNT_KEYS})
                out_na["parallel"] = {k: perf.get(k) for k in ("data_parallel_size", "tp", "cp", "pp", "ep")}
        return out_na
    m = int(perf.get("micro_batches") or 1)
    fb = _stats([scale_step(t, 0.0, scaling) for t in _kept(perf.get("fwd_bwd_times_s") or [], keep)])
    opt = _stats(raw_opt)
    world = int(perf.get("world_size") or 1)
    gbs = perf.get("global_batch_size")
    seq = perf.get("seq_length")
    tokens = gbs * seq / world if gbs and seq else None
    f_step = perf.get("model_flops_per_step")
    f_gpu = f_step / world if isinstance(f_step, (int, float)) else None
    compute = step["median"]
    tflops = f_gpu / compute / 1e12 if f_gpu else None
    out: dict = {
        "available": True,
        "device": perf.get("device"),
        "precision": perf.get("precision"),
        "world_size": world,
        "parallel": {k: perf.get(k) for k in ("data_parallel_size", "tp", "cp", "pp", "ep")},
        "micro_batches": m,
        "global_batch_size": gbs,
        "seq_length": seq,
        "warmup_steps": perf.get("warmup_steps"),
        "timed_steps": perf.get("timed_steps"),
        **_numerics_out(numerics),
        "scaling": dict(scaling) if scaling else None,
        "compute": {
            "step_s": step,
            "micro_batch_s": {k: (v / m if k in ("median", "min", "max") else v) for k, v in step.items()},
            "fwd_bwd_s": fb,
            "optimizer_s": opt,
            "basis": "CUDA events around each timed step on this rank; under the fake backend no data moves, "
            "so this is compute (and launch) time only",
        },
        "tokens_per_step_per_gpu": tokens,
        "tokens_per_s_per_gpu": tokens / compute if tokens else None,
        **({"tokens_why": perf["tokens_why"]} if perf.get("tokens_why") else {}),
        "model_flops_per_step": f_step,
        "flops_source": perf.get("flops_source"),
        "model_tflops_per_gpu": tflops,
        "mfu": flops.mfu(tflops, perf.get("device"), perf.get("precision") or "bf16"),
        "recorder": perf.get("recorder"),
    }
    # what the analytic volumes need (mfsdp_lib.perf.volumes.Job), passed through as recorded
    for key in (
        "params",
        "params_scope",
        "local_params",
        "params_in_layers",
        "param_gather_bytes",
        "grad_reduce_bytes",
        "fsdp_main_grads_bytes",
        "fsdp_grad_comm_bytes",
    ):
        out[key] = perf.get(key)
    log = perf.get("collectives")
    if isinstance(log, Mapping):
        try:
            agg = collectives.aggregate(log, world)
        except collectives.LogError as exc:
            out["communication"] = {"available": False, "why": str(exc)}
            agg = None
    else:
        agg = None
        out["communication"] = {"available": False, "why": "no collective log recorded"}
    if agg is not None:
        out["communication"] = {"available": True, **agg}
        out["prediction"] = predict.predict(
            compute,
            agg["bytes_per_step"],
            agg["groups"],
            links,
            tokens_per_step_per_gpu=tokens,
            flops_per_step_per_gpu=f_gpu,
        )
    return out


def timed_numerics(perf: Mapping) -> dict:
    """Which timed steps count: ``finite_mask`` (one per timed step), the losses, the count left out.

    Read from the record's ``timed_losses`` / ``timed_grad_norms``; a record written before they
    existed has none, and then nothing is known (``checked`` False) and every step counts."""
    n = len(perf.get("step_times_s") or [])
    got = perf.get("timed_losses")
    norms = perf.get("timed_grad_norms")
    checked = isinstance(got, list) and len(got) == n
    losses: list = list(got) if checked and isinstance(got, list) else []
    flagged = set(perf.get("nonfinite_steps") or [])  # the engine's own verdict, by iteration
    # +inf losses under finite gradient norms that the engine traced to the fake backend's tensor-parallel
    # cross-entropy reduction (mfsdp_gpu.perf.timed_numerics): the step computed on finite values
    exempt = set(perf.get("loss_inf_tp_steps") or [])
    timed = list(perf.get("timed_steps") or [])
    mask = []
    for i in range(n):
        x = losses[i] if checked else None
        g = norms[i] if isinstance(norms, list) and i < len(norms) else None
        it = timed[i] if i < len(timed) else None
        loss_bad = _nonfinite(x) and not (it in exempt and not _nonfinite(g))
        mask.append(not (loss_bad or _nonfinite(g) or it in flagged))
    return {
        "checked": checked,
        "loss_inf_tp_steps": sorted(exempt),
        "timed_losses": losses if checked else None,
        "finite_mask": mask,
        "nonfinite_timed_steps": sum(1 for ok in mask if not ok),
        "excluded_steps": [s for s, ok in zip(perf.get("timed_steps") or [], mask, strict=False) if not ok],
    }


def _nonfinite(v) -> bool:
    """NaN or infinite, as a number or as the text a JSON report holds it in ("nan", "inf", "-inf":
    JSON has no such numbers, so the engine's report writes them as strings)."""
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            return False
    return isinstance(v, (int, float)) and not math.isfinite(v)


def _kept(values: Sequence, keep: Sequence[bool]) -> list:
    return [v for v, ok in zip(values, list(keep) + [True] * len(values), strict=False) if ok]


def _pad(values: Sequence, n: int) -> list:
    return list(values[:n]) + [None] * (n - len(values))


def _numerics_out(numerics: Mapping) -> dict:
    return {
        "timed_losses": numerics["timed_losses"],
        "losses_checked": numerics["checked"],
        "nonfinite_timed_steps": numerics["nonfinite_timed_steps"],
        "excluded_steps": numerics["excluded_steps"],
        "loss_inf_tp_steps": numerics["loss_inf_tp_steps"],
    }


def scale_step(step_s, optimizer_s, scaling: Mapping | None):
    """One timed step scaled to the whole step: optimizer + (step - optimizer) x M/K (unchanged without
    ``scaling``, or when its optimizer time is unknown and the step is not a forward/backward time)."""
    if not isinstance(step_s, (int, float)):
        return step_s
    if not scaling:
        return step_s
    k, m = scaling.get("micro_batches_run"), scaling.get("micro_batches_full")
    if not k or not m:
        return step_s
    opt = optimizer_s if isinstance(optimizer_s, (int, float)) else 0.0
    return opt + (step_s - opt) * m / k


def loss_note(p: Mapping) -> str | None:
    """The line a report adds when timed steps reported a +inf loss under a finite gradient norm with tensor
    parallelism (``timed_numerics``): counted, and said."""
    steps = p.get("loss_inf_tp_steps") or []
    if not steps:
        return None
    return (
        f"NOTE: {len(steps)} timed step(s) reported a loss of +inf with a finite gradient norm (steps "
        f"{', '.join(map(str, steps))}): tensor parallelism under the fake backend, where the cross-entropy's "
        "target logit is read from a rank that does not own it; the reported loss, not the computation: counted"
    )


def warning(p: Mapping) -> str | None:
    """The line a report puts first when timed steps were left out for non-finite numerics."""
    n = p.get("nonfinite_timed_steps") or 0
    if not n:
        return None
    ex = p.get("excluded_steps") or []
    return (
        f"WARNING: {n} timed step(s) had a non-finite loss or gradient norm (steps {', '.join(map(str, ex))}): "
        "left out of every figure below (a NaN step skips work and runs faster)"
        + ("; no finite timed step is left" if not p.get("available") else "")
    )


# --------------------------------------------------------------------------- text


def gb(x) -> str:
    """Bytes in decimal units (1 GB = 1e9 bytes, as bandwidths in GB/s)."""
    if x is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"


def _s(x) -> str:
    return "-" if x is None else (f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s")


def _rng(d, fmt) -> str:
    if not d:
        return "-"
    return f"{fmt(d['low'])} .. {fmt(d['high'])}"


def render(p: Mapping, indent: str = "  ") -> list[str]:
    """Text lines for one rank's perf summary."""
    if not p.get("available"):
        return [f"{indent}perf: not available ({p.get('why')})"]
    c = p["compute"]
    st = c["step_s"]
    sc = p.get("scaling")
    lines = [f"{indent}{warning(p)}"] if warning(p) else []
    if loss_note(p):
        lines.append(f"{indent}{loss_note(p)}")
    if sc:
        lines.append(
            f"{indent}scaled: {sc.get('micro_batches_run')} of the step's {sc.get('micro_batches_full')} "
            "micro-batches ran per timed step; step = optimizer + (step - optimizer) x M/K "
            "(communication counted over the micro-batches run)"
        )
    lines += [
        f"{indent}perf on {p.get('device')} ({p.get('precision')}), {p.get('micro_batches')} micro-batches/step, "
        f"{st['n']} timed steps after {p.get('warmup_steps')} warm-up:",
        f"{indent}  compute per step {_s(st['median'])} (min {_s(st['min'])}, max {_s(st['max'])}, spread "
        f"{100 * (st['spread'] or 0):.1f}%); per micro-batch {_s(c['micro_batch_s']['median'])}"
        + (f"; optimizer {_s(c['optimizer_s']['median'])}" if c.get("optimizer_s") else ""),
    ]
    tps = p.get("tokens_per_s_per_gpu")
    tf = p.get("model_tflops_per_gpu")
    mfu = (p.get("mfu") or {}).get("mfu")
    lines.append(
        f"{indent}  compute-only: {tps:,.0f} tokens/s/GPU"
        if tps
        else f"{indent}  compute-only: tokens/s/GPU -" + (f" ({p['tokens_why']})" if p.get("tokens_why") else "")
    )
    if tf:
        peak = (p.get("mfu") or {}).get("peak_tflops")
        lines[-1] += f", {tf:.0f} model TFLOP/s/GPU" + (
            f", MFU {100 * mfu:.1f}% of {peak:.0f} {p.get('precision')} peak" if mfu is not None else ""
        )
    comm = p.get("communication") or {}
    if comm.get("available"):
        lines.append(f"{indent}  communication per step (bus bytes, this rank):")
        for kind, inner in comm["bytes_per_step"].items():
            parts = ", ".join(f"{g} {gb(b)}" for g, b in inner.items() if b)
            if parts:
                lines.append(f"{indent}    {kind:<15} {parts}")
        if not comm.get("total_bytes_per_step"):
            lines.append(f"{indent}    none (every group of this job has one rank)")
    else:
        lines.append(f"{indent}  communication: not counted ({comm.get('why')})")
    pr = p.get("prediction")
    if pr:
        lk = pr["links"]
        lines.append(
            f"{indent}  predicted step time {_rng(pr['step_time_s'], _s)} (perfect overlap .. none; "
            f"links {lk['intra_node_gbps']:g} GB/s NVLink, {lk['inter_node_gbps']:g} GB/s per-GPU network, "
            f"{lk['gpus_per_node']} GPUs/node)"
        )
        lines.append(
            f"{indent}  communication {_s(pr['communication_s'])} in all; exposed at best "
            f"{_s(pr['exposed_communication_s']['low'])}"
        )
        if pr.get("tokens_per_s_per_gpu"):
            lines.append(f"{indent}  predicted tokens/s/GPU {_rng(pr['tokens_per_s_per_gpu'], lambda x: f'{x:,.0f}')}")
    return lines


# --------------------------------------------------------------------------- --compare


def compare_row(label: str, strategy: str, variant: str | None, rank_summary: Mapping | None) -> dict:
    """One row of the ``--compare`` table from one rehearsed rank's summary."""
    row: dict = {"label": label, "strategy": strategy, "variant": variant}
    if not rank_summary:
        row.update(result="failed", why="no report")
        return row
    row["result"] = rank_summary.get("result")
    pp = rank_summary.get("perf") or {}
    row["nonfinite_timed_steps"] = pp.get("nonfinite_timed_steps")
    f = rank_summary.get("failure")
    if f:
        row["why"] = f"{f.get('phase')}: {f.get('type')}: {str(f.get('message'))[:160]}"
        if f.get("category") == "memory":
            row["fits"] = False
    mem = rank_summary.get("memory") or {}
    row["peak_reserved_gib"] = mem.get("peak_reserved_gib")
    row["peak_allocated_gib"] = mem.get("peak_allocated_gib")
    n = rank_summary.get("nccl") or {}
    if row["peak_reserved_gib"] is not None and n.get("allowance_gib") is not None:
        row["peak_with_nccl_gib"] = round(row["peak_reserved_gib"] + n["allowance_gib"], 2)
    p = rank_summary.get("perf") or {}
    if p.get("available"):
        row["compute_step_s"] = p["compute"]["step_s"]["median"]
        row["compute_spread"] = p["compute"]["step_s"]["spread"]
        row["tokens_per_s_per_gpu"] = p.get("tokens_per_s_per_gpu")
        row["mfu"] = (p.get("mfu") or {}).get("mfu")
        comm = p.get("communication") or {}
        row["comm_bytes_per_step"] = comm.get("bytes_per_step")
        row["comm_total_bytes"] = comm.get("total_bytes_per_step")
        pr = p.get("prediction") or {}
        row["step_time_s"] = pr.get("step_time_s")
        row["predicted_tokens_per_s_per_gpu"] = pr.get("tokens_per_s_per_gpu")
    return row


def render_compare(rows: Sequence[Mapping]) -> list[str]:
    head = (
        f"{'strategy / variant':<34} {'peak GiB':>8} {'compute':>9} {'comm/step':>10} "
        f"{'step time (overlap..none)':>26} {'tokens/s/GPU predicted':>24} {'compute-only':>12}"
    )
    lines = [head, "-" * len(head)]
    bad = [r for r in rows if r.get("nonfinite_timed_steps")]
    if bad:
        lines.insert(
            0,
            "WARNING: non-finite timed steps left out of the figures in "
            + ", ".join(f"{r['label']} ({r['nonfinite_timed_steps']})" for r in bad),
        )
    for r in rows:
        label = r["label"][:34]
        if r.get("result") != "passed":
            why = "does not fit (out of memory)" if r.get("fits") is False else (r.get("why") or "failed")
            lines.append(f"{label:<34} {'-':>8} {why}")
            continue
        peak = r.get("peak_with_nccl_gib") or r.get("peak_reserved_gib")
        tps = r.get("tokens_per_s_per_gpu")
        measured = f"{tps:,.0f}" if tps else "-"
        lines.append(
            f"{label:<34} {peak if peak is not None else '-':>8} {_s(r.get('compute_step_s')):>9} "
            f"{gb(r.get('comm_total_bytes')):>10} {_rng(r.get('step_time_s'), _s):>26} "
            f"{_rng(r.get('predicted_tokens_per_s_per_gpu'), lambda x: f'{x:,.0f}'):>24} "
            f"{measured:>12}"
        )
    lines.append(
        "peak GiB: peak reserved + NCCL allowance on the rehearsed rank; compute: median measured step (no "
        "communication); comm: bus bytes per step; step time: perfect overlap .. no overlap"
    )
    return lines
