#!/usr/bin/env python3
"""Turn raw what-works batches into ``benchmarks/results/what_works_1xh200.json``.

    python3 benchmarks/what_works_result.py RAW_BATCH [RAW_BATCH ...] --out benchmarks/results/what_works_1xh200.json

RAW_BATCH is a folder ``benchmarks/bench_what_works.py --run`` wrote (copied into
``benchmarks/results/raw/what_works_1xh200/batch_K``). Each row of the result is the plan's row
(``benchmarks/what_works_plan.json``: recipe, family, mode, world size, layouts, ``check`` before and after, what
``enable`` changed, ``memory``'s prediction) with the measured fields filled from the row's raw file only:

* ``phases``: the engine's phases folded into the matrix's six. ``validate`` is the config's build and Bridge's
  ``validate()``; ``wrap`` is process-group set-up, model build and Megatron FSDP's wrap; ``optimizer``;
  ``first_steps`` is the data set-up and the steps; ``save`` and ``load`` only with ``--save-load``. A phase the
  run never reached is "not run".
* ``first_error``: ``{message, where, rule, phase, category}`` from the rehearsal's explanation; ``rule`` is the
  ``check`` rule that explains it, or "no rule" (a gap in the rule table).
* ``memory_gib``: measured between steps and peak allocated on the rehearsed rank, beside ``memory``'s prediction;
  ``memory_check`` compares them with the stated tolerance (state 3 %, peak 5 %, never under by more than 1 %). A row
  whose run changed its config in a labelled deviation (``AS_RUN_OVERRIDES``: the unfused Mamba path) also holds
  ``memory``'s prediction for the job as it ran (``predicted_*_as_run``, ``as_run``), and is checked against that.
* ``tokens_per_s_per_gpu``: compute only, from the timed steps; null when a timed step's loss was not finite
  (such a step runs faster than a real one and would overstate the figure) or no step was timed;
  ``predicted_tokens_per_s_per_gpu``: ``rehearse --perf``'s range from its link model.

Rows already in ``--out`` are kept unless a raw batch holds the same row again (the later batch wins). Nothing is
written for a row without a raw file: a planned row is not a result.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import raw_store  # noqa: E402  (beside this script: the raw results are read from their archive)
from mfsdp_lib import what_works  # noqa: E402

PLAN = ROOT / "benchmarks" / "what_works_plan.json"
SCHEMA = what_works.SCHEMA
PHASES = what_works.PHASES
STATE_TOL = 0.03  # memory's stated tolerance between steps
PEAK_TOL = 0.05  # ... and at the peak
UNDER_TOL = 0.01  # never under the measurement by more than this
# A rehearsal's labelled deviations that change the job's config, as the KEY=VALUE that runs it. A deviated row's
# measurement is compared with ``memory``'s prediction for the job as it ran (``memory_gib.predicted_*_as_run``), the
# plan's prediction for the config as written staying beside it: without causal-conv1d the GPU machine turns the
# memory-efficient Mamba path off (scripts/mfsdp_gpu/mamba.py ``mamba_deviations``), and ``memory`` counts the
# unfused path's extra activations when told (memory/terms.py ``mamba_unfused_extra_bytes``).
AS_RUN_OVERRIDES = {"mamba-mem-eff-path-off": "model.use_mamba_mem_eff_path=false"}
# The engine's phases, folded into the matrix's (scripts/mfsdp_gpu/phases.py and rehearse.py name them).
PHASE_MAP = {
    "import": "validate",
    "config": "validate",
    "validate": "validate",
    "initialize_process_group": "wrap",
    "setup_start": "wrap",
    "initialize": "wrap",
    "tokenizer": "wrap",
    "model_build": "wrap",
    "model_wrap": "wrap",
    "optimizer": "optimizer",
    "data": "first_steps",
    "train": "first_steps",
    "save": "save",
    "load": "load",
}
# Row fields carried from the plan as they are.
PLAN_FIELDS = (
    "id",
    "recipe",
    "family",
    "mode",
    "kinds",
    "world_size",
    "layout_before",
    "layout_after",
    "check_before",
    "check_after",
    "changes",
    "fingerprint",
    "expected",
    "needs",
)


# The engine phase that closes each matrix phase: the matrix phase passed only when this one did.
FINAL = {
    "validate": "validate",
    "wrap": "model_wrap",
    "optimizer": "optimizer",
    "first_steps": "train",
    "save": "save",
    "load": "load",
}


def fold_phases(engine_phases: list[dict], asked_save_load: bool) -> dict:
    """The six matrix phases from the engine's ``[{name, status}]`` (in run order): failed when one of its engine
    phases failed (or was cut off while running), passed when its closing phase passed, else not run. A phase
    this table does not name belongs to the matrix phase before it (a failure is never dropped)."""
    groups: dict[str, list] = {p: [] for p in PHASES}
    status: dict[str, object] = {}
    current = "validate"
    for p in engine_phases or []:
        if not isinstance(p, dict):
            continue
        name = str(p.get("name"))
        current = PHASE_MAP.get(name, current)
        groups[current].append(p.get("status"))
        status[name] = p.get("status")
    out = {}
    for phase in PHASES:
        if any(s in ("failed", "running") for s in groups[phase]):
            out[phase] = "failed"
        elif status.get(FINAL[phase]) == "passed":
            out[phase] = "passed"
        else:
            out[phase] = "not run"
    if not asked_save_load:
        out["save"] = out["load"] = "not run"
    return out


# First errors of recipes that fail whatever the data-parallel strategy (no rule of ours quotes them, and none
# should: check is about Megatron FSDP): the message's start -> why, shown with the row.
NOT_FSDP = {
    "Invalid choices for recompute_modules": "the recipe as shipped names a selective-recompute module that "
    "megatron-core 0.19.2 does not accept (TransformerConfig.__post_init__); it fails with or without Megatron FSDP",
    "Apex must be installed to use FusedLayerNorm.": "the recipe builds Bridge's full Transformer Engine layer spec "
    "(model.use_transformer_engine_full_layer_spec=true), whose final norm is megatron-core's FusedLayerNorm, and "
    "the GPU machine has no Apex (NVIDIA's PyTorch containers do): a missing package, not a verdict on Megatron "
    "FSDP; with Apex the row is to be measured again",
}

# First errors whose cause is not established (the message's end -> why, category "open"): shown with the row
# as failing where it stopped, never as a verdict on Megatron FSDP.
OPEN_CAUSE = {
    "CUDA Error: device-side assert triggered": "a device-side assert (the run's log: an index out of bounds in a "
    "GPU indexing kernel) in the first training step; whether the recipe or the one-GPU rehearsal causes it (under "
    "the fake backend a kernel can be handed values no rank computed) is not established, so this is not yet a "
    "verdict on Megatron FSDP",
}


# First errors whose cause runs beyond the row established, scoped to the recipe (row id, the message's end): why,
# with the raw runs that show it. The cause lies outside Megatron FSDP, so it is shown as category "not-fsdp".
CAUSE_RAW_WAN14B = "benchmarks/results/raw/wan14b_cause_1gpu"
ESTABLISHED_CAUSE = {
    ("wan_14b_sft_8gpu_h100_bf16", "CUDA Error: device-side assert triggered"): (
        "the recipe's TP 2 with sequence parallelism, at CP 4, on THD batches. Bridge's Wan model scatters the video "
        "tokens for sequence parallelism but not the text context (WanModel.forward), and the cross-attention's "
        "key/value projection, a column-parallel linear layer, gathers its input over the TP ranks: each rank's keys "
        "and values hold the context twice while `cu_seqlens_kv_padded` counts it once. In the backward of "
        "Transformer Engine 2.20.2's context-parallel attention, `get_thd_padding_mask` (which zeroes THD padding) "
        "then indexes past the sequence table for the extra rows; with blocking launches the assert is raised there. "
        "The same job without sequence parallelism, at TP 1, or at CP 1 trains; with all-to-all context parallelism "
        "it runs 2 steps, then its loss is NaN (the five runs: " + CAUSE_RAW_WAN14B + "). Any data-parallel strategy "
        "meets it: not a verdict on Megatron FSDP",
        CAUSE_RAW_WAN14B,
    ),
}


def first_error(rank: dict, report: dict | None = None, row_id: str | None = None) -> dict | None:
    """The run's first error as the matrix shows it. The rule is the one recorded with the run; when none was,
    the engine report's raw failure (type, message, frames) is explained again with the current rule table
    (``mfsdp_lib.runs.rehearse.explain_failure``), so a rule added after the run names its cause."""
    f = rank.get("failure")
    if not isinstance(f, dict):
        return None
    rule, category = f.get("rule"), f.get("category")
    raw_failure = (report or {}).get("first_failure") if isinstance(report, dict) else None
    if not rule and isinstance(raw_failure, dict):
        from mfsdp_lib.runs.rehearse import explain_failure

        again = explain_failure(raw_failure, (report or {}).get("request")) or {}
        if again.get("rule"):
            rule, category = again["rule"], again.get("category")
    message = str(f.get("message") or "")
    why = next((w for start, w in NOT_FSDP.items() if message.startswith(start)), None)
    evidence = None
    established = next(
        (c for (rid, end), c in ESTABLISHED_CAUSE.items() if rid == row_id and message.rstrip().endswith(end)), None
    )
    if established:
        why, evidence = established
        category = "not-fsdp"
    elif why:
        category = "not-fsdp"
    elif open_why := next((w for end, w in OPEN_CAUSE.items() if message.rstrip().endswith(end)), None):
        why, category = open_why, "open"
    return {
        "message": message[:500],
        "type": f.get("type"),
        "where": f.get("site"),
        "phase": f.get("phase"),
        "rule": rule or "no rule",
        "category": category,
        "why": why or f.get("why"),
        **({"evidence": evidence} if evidence else {}),
    }


def nonfinite_timed(report: dict | None, warmup: int) -> int | None:
    """How many timed steps had a non-finite loss (from the engine report's train phase), or None if unknown."""
    if not isinstance(report, dict):
        return None
    train = (report.get("phases") or {}).get("train") or {}
    losses = train.get("losses")
    if not isinstance(losses, list):
        return None
    timed = losses[warmup:]
    return sum(1 for x in timed if not (isinstance(x, (int, float)) and math.isfinite(x)))


def forward_only(report: dict | None) -> bool:
    """True when no timed step ran a backward: every step's gradient norm in the engine report is 0.0.

    A recipe that freezes the whole model but a part its rehearsal data never reaches (Qwen3-VL's pretrain freezes
    the language and vision models and trains the mergers; the rehearsal feeds text) gives a loss that needs no
    gradient, and megatron-core's ``schedules.backward_step`` skips the backward (``if
    output_tensor[0].requires_grad``). Such a step's peak and throughput are of a forward pass, not of training."""
    steps = ((report or {}).get("memory") or {}).get("steps") if isinstance(report, dict) else None
    norms = [s.get("grad_norm") for s in steps or [] if isinstance(s, dict)]
    return bool(norms) and all(isinstance(n, (int, float)) and n == 0.0 for n in norms)


def as_run_overrides(deviations) -> list[str]:
    """The KEY=VALUE overrides of a run's labelled deviations that change its config (``AS_RUN_OVERRIDES``)."""
    return [
        AS_RUN_OVERRIDES[d["id"]] for d in deviations or [] if isinstance(d, dict) and d.get("id") in AS_RUN_OVERRIDES
    ]


def memory_as_run(enabled: Path, world, overrides: list[str]) -> dict | None:
    """``memory``'s state and peak (GiB) of the configured strategy for ``enabled`` with ``overrides`` at ``world``
    GPUs, asked as the plan asks it (``bench_what_works.memory_route``); None when it gives none."""
    from bench_what_works import memory_route

    if not enabled.is_file() or not isinstance(world, int):
        return None
    got = memory_route(enabled, world, ROOT, overrides)
    if got.get("error"):
        return None
    return {"predicted_state_as_run": got.get("predicted_state"), "predicted_peak_as_run": got.get("predicted_peak")}


def memory_check(mem: dict, forward_only_steps: bool = False) -> dict | None:
    """Relative errors of ``memory`` against the measurement, and whether they are within the tolerance.

    A row run with a config-changing deviation is compared with the prediction for the job as it ran
    (``*_as_run``). ``memory`` predicts a training step; where the measured steps ran no backward
    (``forward_only``) the measured peak is a forward pass's, so the prediction is only held never to be below it."""
    out: dict[str, object] = {}
    ok = True
    for key, tol in (("state", STATE_TOL), ("peak", PEAK_TOL)):
        p = mem.get(f"predicted_{key}_as_run", mem.get(f"predicted_{key}"))
        m = mem.get(f"measured_{key}")
        if not isinstance(p, (int, float)) or not isinstance(m, (int, float)) or m <= 0:
            out[f"{key}_error"] = None
            continue
        err = (p - m) / m
        out[f"{key}_error"] = round(err, 4)
        if key == "peak" and forward_only_steps:
            ok = ok and err >= -UNDER_TOL
            continue
        ok = ok and abs(err) <= tol and err >= -UNDER_TOL
    if all(v is None for v in out.values()):
        return None
    if forward_only_steps:
        out["peak_forward_only"] = True
    out["within_tolerance"] = ok
    out["tolerance"] = {"state": STATE_TOL, "peak": PEAK_TOL, "under": UNDER_TOL}
    return out


def repo_path(path: Path) -> str:
    """A folder as the results file names it: its recorded name in the raw-results archive, else relative to the
    repository root when it is inside it."""
    named = raw_store.logical(path)
    if named:
        return named
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def _read(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def result_row(plan_row: dict, raw: dict, batch_dir: Path, batch: dict | None) -> dict:
    """One result row: the plan's fields, then what the raw file measured."""
    row = {k: plan_row.get(k) for k in PLAN_FIELDS}
    runs = raw.get("runs") or []
    main = next((r for r in runs if r.get("name") == "rehearse"), None)
    probe = next((r for r in runs if r.get("name") == "pp_probe"), None)
    rank = run_rank(main) if main and main.get("summary") else {}
    report = _read(batch_dir / main["dir"] / "report.json") if main and main.get("dir") else None
    asked_sl = bool(plan_row.get("save_load"))
    phases_run = fold_phases(rank.get("phases") or [], asked_sl)
    row["phases"] = phases_run
    row["first_error"] = first_error(rank, report, row.get("id")) if rank else None
    cut = cut_after_steps(main) if main else None
    if main and cut:  # the steps passed, then the call's time ran out: the phase it cut was not run, nothing failed
        phases_run[cut] = "not run"
        row["first_error"] = None
        row["cut"] = {"phase": cut, "by": "time limit of the GPU call", "wall_s": main.get("wall_s")}
    elif main and main.get("stopped"):
        row["first_error"] = row["first_error"] or {
            "message": f"stopped: {main['stopped']}",
            "type": None,
            "where": None,
            "phase": None,
            "rule": "no rule",
            "category": "time",
        }
    pred = plan_row.get("memory_gib") or {}
    mem = rank.get("memory") or {}
    memory_gib = {
        "predicted_state": pred.get("predicted_state"),
        "measured_state": mem.get("between_steps_gib"),
        "predicted_peak": pred.get("predicted_peak"),
        "measured_peak": mem.get("peak_allocated_gib"),
    }
    phases: dict = row["phases"] or {}
    if phases.get("wrap") != "passed" and not memory_gib["measured_peak"]:
        memory_gib["measured_peak"] = None  # nothing was built: no measurement, not a measured 0
    overrides = as_run_overrides(rank.get("deviations"))
    if overrides and phases.get("first_steps") == "passed":
        ran = memory_as_run(batch_dir / "rows" / str(raw.get("id")) / "enabled.yaml", row.get("world_size"), overrides)
        if ran:
            memory_gib.update(ran, as_run=overrides)
    row["memory_gib"] = memory_gib
    # memory predicts training: compared only where the steps ran
    row["forward_only_steps"] = forward_only(report)
    row["memory_check"] = (
        memory_check(memory_gib, bool(row["forward_only_steps"])) if phases.get("first_steps") == "passed" else None
    )
    perf = rank.get("perf") or {}
    # The perf summary's count (mfsdp_lib.perf.report.timed_numerics) when the run has one: it holds the engine's
    # verdict, with +inf losses under finite gradient norms from the fake backend's tensor-parallel
    # cross-entropy counted as finite (loss_inf_tp_steps); else the losses the engine recorded.
    # Only when the summary checked the timed losses (a report that predates them has none: then every recorded
    # loss is counted here).
    counted = perf.get("nonfinite_timed_steps")
    bad: int | None
    if isinstance(counted, int) and not isinstance(counted, bool) and perf.get("timed_losses"):
        bad = counted
    else:
        bad = nonfinite_timed(report, int(((report or {}).get("request") or {}).get("warmup") or 0))
    tps = perf.get("tokens_per_s_per_gpu") if perf.get("available") else None
    row["nonfinite_timed_steps"] = bad
    row["loss_inf_tp_steps"] = list(perf.get("loss_inf_tp_steps") or [])
    # a step that ran no backward (forward_only) is not a training step: its rate would overstate training's, as a
    # non-finite step's would; the raw report keeps it
    no_rate = bool(bad) or bool(row.get("forward_only_steps"))
    row["tokens_per_s_per_gpu"] = None if no_rate else (round(tps, 1) if isinstance(tps, (int, float)) else None)
    rng = ((perf.get("prediction") or {}).get("tokens_per_s_per_gpu") or {}) if not no_rate else {}
    row["predicted_tokens_per_s_per_gpu"] = {
        "low": round(rng["low"], 1) if isinstance(rng.get("low"), (int, float)) else None,
        "high": round(rng["high"], 1) if isinstance(rng.get("high"), (int, float)) else None,
    }
    prep = raw.get("prepare") or {}
    row["fallbacks"] = list(prep.get("fallbacks") or [])
    row["rehearsal_overrides"] = list(plan_row.get("rehearsal_overrides") or [])
    row["deviations"] = [d.get("id") for d in rank.get("deviations") or [] if isinstance(d, dict)]
    row["stale_plan"] = bool(prep.get("stale"))
    row["prepare_error"] = prep.get("error")  # the CPU route failed on the GPU machine: nothing ran
    if probe is not None:
        prank = run_rank(probe)
        if stopped_by_budget(probe):  # cut before it reached a verdict: nothing to record
            row["pp_probe"] = {"role": probe.get("role"), "phases": None, "first_error": None, "cut": True}
        else:
            row["pp_probe"] = {
                "role": probe.get("role"),
                "phases": fold_phases(prank.get("phases") or [], False),
                "first_error": first_error(prank),
            }
    row["measured"] = {
        "device": rank.get("device"),
        "batch": raw.get("batch"),
        "started_utc": (batch or {}).get("started_utc"),
        "wall_s": (main or {}).get("wall_s"),
        "timing_exclusive": (batch or {}).get("timing_exclusive"),
        "engines_at_once": (batch or {}).get("max_concurrent"),
        "raw": repo_path(batch_dir / "rows" / str(row["id"])),
    }
    return row


# Runs that failed on a fault of the rehearsal or of the GPU machine's set-up, not of the recipe under Megatron
# FSDP, each fixed since: matched on the first error's message (its start), kept as raw evidence and listed in
# the result's ``rehearsal_faults`` with the fix, never as the recipe's verdict; the row is measured again, and the
# fault stays on record with ``measured_again`` (the raw run that now gives the row).
REHEARSAL_FAULTS = (
    {
        "message": "dsa_kernel_backend must be one of: none, tilelang, cudnn.",
        "fault": "the engine read the DSA fallback model.dsa_kernel_backend=none as null",
        "fixed": "the engine reads KEY=VALUE as Hydra does: only null is None (mfsdp_gpu.args.parse_value)",
    },
    {
        "message": "CUDA device, driver and/or toolkit version does not support comm+GEMM overlap with CUDA Multicast",
        "fault": "Transformer Engine's userbuffers (comm_overlap.tp_comm_overlap) need real tensor-parallel peers",
        "fixed": "a fake world turns the overlap off as the labelled deviation tp-comm-overlap-off",
    },
    {
        "message": "WanModel.forward() missing 4 required positional arguments",
        "fault": "the rehearsal drove Bridge's GPT forward step on mock GPT data; Wan trains with its own step and data",
        "fixed": "the engine drives Wan recipes through Bridge's WanForwardStep on Bridge's Wan mock data "
        "(mfsdp_gpu.workload); on the GPU the steps now reach WanModel.forward and Bridge's flow-matching loss",
    },
    {
        "message": "Loss exploded: nan",
        "fault": "context-parallel ring attention read K/V that no rank wrote: under the fake backend a "
        "point-to-point receive moves no data, and the mirror did not cover point-to-point",
        "fixed": "the mirror pairs each receive with this rank's send on the same group "
        "(mfsdp_gpu.collectives.P2PPairs)",
    },
    {
        "message": "FLA is not installed",
        "fault": "the GPU machine lacked flash-linear-attention, which gated delta net layers import",
        "fixed": "fla-core is installed with the GPU machine's optional wheels; without it the engine refuses in "
        "one line before the build (mfsdp_gpu.kernels.missing_for)",
    },
)


def rehearsal_fault(row: dict) -> dict | None:
    """The known, fixed fault a measured row failed on, or None."""
    message = str((row.get("first_error") or {}).get("message") or "")
    return next((f for f in REHEARSAL_FAULTS if message.startswith(f["message"])), None)


def batch_timing_exclusive(batch_dir: Path) -> bool | None:
    """Whether every run of a raw batch that used the GPU held the one GPU lock, read again from the raw runs.

    The batch's own ``timing_exclusive`` (batch.json) was written on the GPU machine; batches written before runs
    recorded their last phase counted a run that failed Bridge's validate (no lock taken, no GPU used) as one that
    held no lock. Here each run's last phase is read from its engine report, and
    ``bench_what_works.timing_exclusive`` decides."""
    from bench_what_works import last_phase, timing_exclusive

    runs = []
    for raw_path in sorted((batch_dir / "rows").glob("*/row.json")):
        raw = _read(raw_path)
        for run in (raw or {}).get("runs") or [] if isinstance(raw, dict) else []:
            window = dict(run.get("window") or {})
            if "last_phase" not in window and run.get("dir"):
                report = _read(batch_dir / str(run["dir"]) / "report.json")
                window["last_phase"] = last_phase(report) if isinstance(report, dict) else None
            runs.append({**run, "window": window})
    return timing_exclusive(runs)


# The matrix phases a cut by the GPU call's time limit may fall in and still leave a row: they come after the
# training steps, so everything the matrix asks first (validate, wrap, optimizer, steps, memory, throughput) was
# measured; the cut phase is shown as not run, with the cut named.
CUT_LEAVES_A_ROW = ("save", "load")


def stopped_by_budget(run: dict) -> bool:
    """Whether the batch's budget stopped the run or kept it from starting (bench_what_works: "budget",
    "not started: budget")."""
    return "budget" in str(run.get("stopped") or "")


def run_rank(run: dict) -> dict:
    """The rank summary of a raw run (bench_what_works.summarize_run: one rank per run)."""
    return (((run.get("summary") or {}).get("ranks")) or [{}])[0]


def cut_after_steps(run: dict) -> str | None:
    """The phase (save or load) in which the batch's budget cut a run whose training steps had passed, else None."""
    if not stopped_by_budget(run):
        return None
    phases = fold_phases(run_rank(run).get("phases") or [], True)
    if phases.get("first_steps") != "passed":
        return None
    return next((p for p in CUT_LEAVES_A_ROW if phases.get(p) == "failed"), None)


def ran_to_a_verdict(run: dict) -> bool:
    """Whether a raw run ended by itself (or at its row's own timeout), or was cut by the batch's budget only after
    its training steps had passed (``cut_after_steps``). Any other run the GPU call's budget stopped says nothing
    of the recipe, so it never gives or replaces a row."""
    if run.get("exit") is None:
        return False
    return not stopped_by_budget(run) or cut_after_steps(run) is not None


def collect(batch_dirs: list[Path], plan: dict, existing: dict | None) -> dict:
    by_id = {r["id"]: r for r in plan["rows"]}
    rows = {r["id"]: r for r in (existing or {}).get("rows", []) if isinstance(r, dict) and "id" in r}
    faults = {f["id"]: f for f in (existing or {}).get("rehearsal_faults", []) if isinstance(f, dict) and "id" in f}
    for d in batch_dirs:
        batch = _read(d / "batch.json")
        if isinstance(batch, dict):  # read again from the runs (batch_timing_exclusive: why)
            batch["timing_exclusive"] = batch_timing_exclusive(d)
        for raw_path in sorted((d / "rows").glob("*/row.json")):
            raw = _read(raw_path)
            if not isinstance(raw, dict) or raw.get("id") not in by_id:
                continue
            if not any(ran_to_a_verdict(run) for run in raw.get("runs") or []):
                continue  # the batch's budget ran out before or during this row: no verdict (an earlier one stays)
            row = result_row(by_id[raw["id"]], raw, d, batch)
            fault = rehearsal_fault(row)
            if fault:
                faults[row["id"]] = {
                    "id": row["id"],
                    "raw": (row.get("measured") or {}).get("raw"),
                    "first_error": row.get("first_error"),
                    "phases": row.get("phases"),
                    "fault": fault["fault"],
                    "fixed": fault["fixed"],
                }
                rows.pop(row["id"], None)
                continue
            if row.get("cut") and row["id"] in rows and not rows[row["id"]].get("cut"):
                continue  # a cut run does not replace a row that ran every phase it was asked
            if row["id"] in faults:  # measured again since the fix: the fault stays on record, answered
                faults[row["id"]]["measured_again"] = (row.get("measured") or {}).get("raw")
            rows[row["id"]] = row
    order = [r["id"] for r in plan["rows"]]
    ordered = sorted(rows.values(), key=lambda r: order.index(r["id"]) if r["id"] in order else len(order))
    out = report_shape(ordered, batch_dirs)
    out["rehearsal_faults"] = sorted(faults.values(), key=lambda f: order.index(f["id"]) if f["id"] in order else 0)
    pending = [f for f in faults.values() if not f.get("measured_again")]
    if pending:
        out["notes"].append(
            f"Not in the matrix yet: {len(pending)} run(s) that failed on a fault of the rehearsal or of the GPU "
            "machine's set-up, fixed since (rehearsal_faults: the error, the fault and the fix); they are measured again."
        )
    if len(pending) < len(faults):
        out["notes"].append(
            f"{len(faults) - len(pending)} row(s) failed first on a fault of the rehearsal or of the machine's set-up "
            "and were measured again after the fix (rehearsal_faults: the fault, the fix, and measured_again: the "
            "raw run that gives the row)."
        )
    return out


# The display table of BENCHMARK.md (benchmarks/make_report.py): the project's result shape, with the rows as
# records (every field above) and ``table_rows`` the cells shown.
COLUMNS = [
    "recipe",
    "mode",
    "GPUs",
    "layout (before -> after)",
    "check before/after",
    "verdict",
    "state GiB (pred.)",
    "peak GiB (pred.)",
    "tokens/s/GPU (pred. range)",
    "first error (rule)",
]


def _lay(layout) -> str:
    if not isinstance(layout, dict):
        return "?"
    return " ".join(f"{k.upper()}{layout.get(k)}" for k in ("tp", "pp", "cp", "ep", "dp"))


def _fig(measured, predicted) -> str:
    m = f"{measured:.2f}" if isinstance(measured, (int, float)) else "-"
    p = f"{predicted:.2f}" if isinstance(predicted, (int, float)) else "-"
    return f"{m} ({p})"


def table_row(row: dict) -> list:
    mem = row.get("memory_gib") or {}
    rng = row.get("predicted_tokens_per_s_per_gpu") or {}
    tps = row.get("tokens_per_s_per_gpu")
    err = row.get("first_error") or {}
    cb, ca = row.get("check_before") or {}, row.get("check_after") or {}
    return [
        row.get("recipe"),
        row.get("mode"),
        row.get("world_size"),
        f"{_lay(row.get('layout_before'))} -> {_lay(row.get('layout_after'))}",
        f"{cb.get('exit')}/{ca.get('exit')}",
        what_works.verdict(row),
        _fig(mem.get("measured_state"), mem.get("predicted_state_as_run", mem.get("predicted_state"))),
        _fig(mem.get("measured_peak"), mem.get("predicted_peak_as_run", mem.get("predicted_peak"))),
        (f"{tps:,.0f}" if isinstance(tps, (int, float)) else "-")
        + (f" ({rng['low']:,.0f}-{rng['high']:,.0f})" if isinstance(rng.get("low"), (int, float)) else ""),
        f"{str(err.get('message') or '').splitlines()[0][:120]} ({err.get('rule')})" if err.get("message") else "",
    ]


def report_shape(rows: list[dict], batch_dirs: list[Path]) -> dict:
    measured = [r for r in rows if what_works.measured(r)]
    devices = sorted(
        {str((r.get("measured") or {}).get("device")) for r in measured if (r.get("measured") or {}).get("device")}
    )
    dates = sorted(str((r.get("measured") or {}).get("started_utc") or "")[:10] for r in measured)
    return {
        "benchmark": "what_works_1xh200",
        "title": "What works with Megatron FSDP: Bridge 0.6.2's recipes through the skill's route, rehearsed on one GPU",
        "date": dates[-1] if dates and dates[-1] else None,
        "machine": ", ".join(devices) + " (one GPU: rank 0 of each recipe's world on a fake process group)"
        if devices
        else None,
        "command": "python3 benchmarks/bench_what_works.py --run --batch K --out RAW (one GPU call per batch), then "
        "python3 benchmarks/what_works_result.py RAW... --out benchmarks/results/what_works_1xh200.json",
        "columns": COLUMNS,
        "rows": rows,
        "table_rows": [table_row(r) for r in rows],
        "notes": [
            "Route per recipe: check; enable (--set-pp-1 where the recipe uses PP); check; memory; rehearse --perf as "
            "rank 0 of the recipe's world size (compute only: the fake process group moves no data).",
            f"Measured rows: {len(measured)} of {len(rows)}; tokens/s/GPU is left out where a timed step's loss or "
            "gradient norm was not finite (a +inf loss under a finite gradient norm with tensor parallelism is the "
            "fake backend's cross-entropy reduction, not the step's: loss_inf_tp_steps, counted).",
        ],
        "raw": "benchmarks/results/raw/what_works_1xh200",
        "schema": SCHEMA,
        "generated_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "generated_by": "python3 benchmarks/what_works_result.py " + " ".join(repo_path(d) for d in batch_dirs),
        "plan": "benchmarks/what_works_plan.json",
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("batches", nargs="+", help="raw batch folders written by bench_what_works.py --run")
    ap.add_argument("--plan", default=str(PLAN))
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    plan = _read(Path(a.plan))
    if not isinstance(plan, dict) or "rows" not in plan:
        print(f"what_works_result: {a.plan} is not a what-works plan", file=sys.stderr)
        return 2
    dirs = [raw_store.resolve(b) for b in a.batches]
    missing = [str(d) for d in dirs if not (d / "rows").is_dir()]
    if missing:
        print(f"what_works_result: not a raw batch (no rows/): {', '.join(missing)}", file=sys.stderr)
        return 2
    out = Path(a.out)
    result = collect(dirs, plan, _read(out) if out.exists() else None)
    if not result["rows"]:
        print("what_works_result: no row was measured; nothing written", file=sys.stderr)
        return 1
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"{len(result['rows'])} rows -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
