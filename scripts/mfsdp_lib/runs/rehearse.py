"""Rehearsals: launch the one-GPU engine, read its reports, say what they mean.

``scripts/rehearse_train.py`` (the engine) runs a job's real Megatron-Bridge setup and a
few training steps on ONE GPU as rank R of a world of N, under PyTorch's ``fake``
process-group backend: every allocation is real, no data moves. It writes a
``report.json`` phase by phase. This module is the part that needs no GPU:

* which rank positions to rehearse (``rank_positions``): ranks that hold different
  things are rehearsed one process each (with pipeline parallelism the first and the
  last stage differ: embedding vs output layer and loss); ranks that hold the same
  things are not repeated;
* the exact engine command for each (``engine_command``), shown by ``--dry-run``;
* the verdict from the reports (``summarize``): each phase's status, the first failure
  with the rule id and fix ``check`` uses for the same cause (``explain_failure``), the
  measured memory per rank beside ``memory``'s prediction, an NCCL allowance on its own
  line, what was done to MoE collectives, and the parity verdict of ``--parity``;
* the text and JSON renderings.

Why an allowance for NCCL: the fake backend creates no communicators, so their buffers
are never allocated and no measurement can show them. The allowance counts the process
groups of size > 1 this rank belongs to (each becomes an NCCL communicator the first
time a collective runs on it) and multiplies by the receive buffers NCCL sets up per
communicator with its defaults (``NCCL_PER_COMMUNICATOR_BYTES`` below). It is labelled
an allowance: an upper-side figure, not a measurement.

Standard library only (YAML through ``config_io``); the memory model and the rule table
are imported lazily, so a broken optional part never hides the run's own verdict.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from collections.abc import Mapping, Sequence

GIB = 1024**3
REPORT_SCHEMA = "mfsdp-rehearse/1"  # the JSON this module renders (one object for all ranks)
ENGINE_SCHEMA = "rehearse-run/1"  # what the engine writes per process
ENGINE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "rehearse_train.py")

# NCCL's receive buffers per connection with default settings (src/init.cc of NCCL 2.x):
# DEFAULT_BUFFSIZE (Simple protocol) 4 MiB, DEFAULT_LL_BUFFSIZE = 8 lines x 512 threads x 8 steps
# x 16 B = 512 KiB, DEFAULT_LL128_BUFFSIZE = 120 elements x 640 threads x 8 steps x 8 B = 4,915,200 B.
NCCL_BUFFER_BYTES_PER_CONNECTION = (1 << 22) + 8 * 512 * 8 * 16 + 120 * 640 * 8 * 8
# One receive connection per channel (the ring's previous rank) and up to 32 channels (NCCL's
# MAXCHANNELS on NVLink machines of this generation). Tree, NVLS and all-to-all peers add to it;
# lazy connection (NCCL_RUNTIME_CONNECT, default on since 2.22) can leave some unallocated.
NCCL_CHANNELS = 32
NCCL_PER_COMMUNICATOR_BYTES = NCCL_CHANNELS * NCCL_BUFFER_BYTES_PER_CONNECTION  # ~294 MiB
NCCL_BASIS = (
    "process groups of size > 1 this rank belongs to x {per:.2f} GiB per communicator "
    "({ch} channels x NCCL's default LL + LL128 + Simple receive buffers, src/init.cc); "
    "an allowance, not a measurement: the fake backend creates no communicators"
)

# Rule ids the failure explanations point to (the same ids `check` reports). When the
# installed rule table has the id, its fix text is used; the text here is the fallback.
RULE_PIPELINE = "MFSDP-PIPELINE-PARALLEL"
RULE_DTYPE_STRING = "MFSDP-DTYPE-STRING"
RULE_CUDA_GRAPH_TE_RNG = "MFSDP-CUDA-GRAPH-TE-RNG"

# What the engine's own settings mean for the user (shown once, under the verdict).
LIMITS = (
    "under the fake backend (world > 1) losses mean nothing and time per step is compute only (no data moves; "
    "--perf prices the communication separately); memory, shapes, wrapping and the code paths taken are real",
)


# --------------------------------------------------------------------------- planning


def pipeline_size(cfg: Mapping | None, overrides: Sequence[str] = ()) -> int:
    """``model.pipeline_model_parallel_size`` from the overrides, else the config, else 1."""
    for item in overrides:
        key, _, value = item.partition("=")
        if key.strip() in ("model.pipeline_model_parallel_size", "model.transformer.pipeline_model_parallel_size"):
            try:
                return max(1, int(value))
            except ValueError:
                return 1
    model = (cfg or {}).get("model") if isinstance(cfg, Mapping) else None
    for sect in (model, (model or {}).get("transformer") if isinstance(model, Mapping) else None):
        if isinstance(sect, Mapping) and isinstance(sect.get("pipeline_model_parallel_size"), int):
            return max(1, sect["pipeline_model_parallel_size"])
    return 1


def rank_positions(world: int, pp: int, wanted: Sequence[str] = ("auto",)) -> list[tuple[int, str]]:
    """The ranks to rehearse, each with what it stands for.

    Megatron orders ranks tp-cp-ep-dp-pp by default (pipeline outermost), so the first
    pipeline stage is ranks ``0 .. N/PP - 1`` and the last ``N - N/PP .. N - 1``. Within a
    stage every rank holds the same shapes (data-parallel ranks shard the same tensors
    evenly), so one rank per distinct stage role is enough: the first stage (embedding)
    and, with PP > 1, the last (output layer, loss). ``wanted``: ``auto`` (those), ``first``,
    ``last`` or explicit rank numbers.
    """
    if world < 1:
        raise ValueError("--world-size must be at least 1")
    if pp < 1 or world % pp:
        raise ValueError(f"world size {world} is not a multiple of the pipeline size {pp}")
    last = world - world // pp
    out: dict[int, str] = {}
    for w in wanted:
        if w == "auto":
            out.setdefault(0, "first pipeline stage" if pp > 1 else "every rank holds the same shapes")
            if pp > 1:
                out.setdefault(last, "last pipeline stage")
        elif w == "first":
            out.setdefault(0, "first pipeline stage" if pp > 1 else "rank 0")
        elif w == "last":
            out.setdefault(last, "last pipeline stage" if pp > 1 else f"rank {last}")
        else:
            try:
                r = int(w)
            except ValueError:
                raise ValueError(f"--rank-position {w!r}: expected auto, first, last or a rank number") from None
            if not 0 <= r < world:
                raise ValueError(f"--rank-position {r}: outside a world of {world}")
            stage = r // (world // pp)
            out.setdefault(r, f"pipeline stage {stage}" if pp > 1 else f"rank {r}")
    return sorted(out.items())


def engine_command(
    *,
    source: Sequence[str],
    world: int,
    rank: int,
    out_dir: str,
    iters: int,
    overrides: Sequence[str] = (),
    strategy: str | None = None,
    extra: Sequence[str] = (),
    python: str | None = None,
) -> list[str]:
    """The engine's argument list for one rank (``source``: ``["--yaml", PATH]`` and the like)."""
    cmd = [python or sys.executable, ENGINE, *source, "--world-size", str(world), "--rank", str(rank)]
    cmd += ["--iters", str(iters)]
    if strategy:
        cmd += ["--strategy", strategy]
    cmd += list(extra)
    cmd += list(overrides)
    cmd += ["--out", out_dir]
    return cmd


def parity_command(*, source: Sequence[str], out_dir: str, iters: int, overrides: Sequence[str] = (), python=None):
    """The engine's ``--parity`` run: a real world of 1, DDP against Megatron FSDP, same seed and data."""
    return [python or sys.executable, ENGINE, *source, "--parity", "--iters", str(iters), *overrides, "--out", out_dir]


def quoted(cmd: Sequence[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)


# --------------------------------------------------------------------------- failures


def _rule_fix(rule_id: str, fallback: str) -> str:
    try:
        from ..rules import RULES_BY_ID

        rule = RULES_BY_ID.get(rule_id)
    except Exception:  # the rule table is optional here: the fallback says the same
        rule = None
    if rule is not None and isinstance(rule.fix, str):
        return rule.fix
    return fallback


def explain_failure(ff: Mapping | None, request: Mapping | None = None) -> dict | None:
    """What a first failure means: its site, the rule id ``check`` uses for the cause, the fix.

    Matching is on the exception type and the frame it came from (the engine records the
    innermost frames in megatron/bridge, megatron/core and megatron_fsdp), plus the request
    where the cause is a setting: never on a loose substring of the whole message.
    """
    if not ff:
        return None
    etype = str(ff.get("type") or "")
    msg = str(ff.get("message") or "")
    frames = ff.get("frames") or {}
    core = str(frames.get("core") or "")
    site = frames.get("core") or frames.get("fsdp") or frames.get("bridge") or frames.get("innermost")
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    first_line = lines[0] if lines else ""
    if len(lines) > 1 and len(lines[-1]) < 200:  # einops and others put the specific reason last
        first_line = f"{first_line} ... {lines[-1]}"
    out = {
        "phase": ff.get("phase"),
        "step": ff.get("step"),
        "type": etype,
        "message": first_line[:400],
        "site": site,
        "rule": None,
        "category": "unknown",
        "why": None,
        "fix": None,
    }
    overrides = list((request or {}).get("overrides") or [])
    if etype == "EinopsError" and "_get_dp_tp_mesh" in core:
        pp = pipeline_size(None, overrides)
        out.update(
            rule=RULE_PIPELINE,
            category="config",
            why=(
                "Megatron FSDP builds its device mesh over the whole world as DP x EP x TP, with no pipeline "
                "axis (mcore_fsdp_adapter._get_dp_tp_mesh)"
                + (f"; the job sets pipeline_model_parallel_size={pp}" if pp > 1 else "")
            ),
            fix=_rule_fix(
                RULE_PIPELINE,
                "model.pipeline_model_parallel_size=1 (absorb the stages with more TP or data parallelism), "
                "or keep the distributed optimizer without Megatron FSDP",
            ),
        )
    elif (
        etype == "AttributeError"
        and first_line == "'str' object has no attribute 'is_floating_point'"
        and any("param_and_grad_buffer.py" in str(f) for f in frames.values())
    ):
        # megatron_fsdp/param_and_grad_buffer.py :: ParamAndGradBuffer._init_each_parameter_group_buffers asserts
        # group.grad_dtype.is_floating_point; a string there is a dtype override Bridge never converted
        out.update(
            rule=RULE_DTYPE_STRING,
            category="config",
            why="a Megatron FSDP dtype setting (ddp.megatron_fsdp_main_grads_dtype or megatron_fsdp_grad_comm_dtype) "
            "reached the wrap as a string: Bridge converts a string to a dtype only over a field that already "
            "holds one, and these default to None",
            fix=_rule_fix(
                RULE_DTYPE_STRING,
                "give the dtype itself: 'ddp.megatron_fsdp_main_grads_dtype={_target_:torch.float32,_call_:false}' "
                "(YAML: {_target_: torch.float32, _call_: false}; Python: torch.float32)",
            ),
        )
    elif (
        etype == "AssertionError"
        and first_line.startswith("Transformer engine's RNG tracker is required for cudagraphs")
        and "gpt_provider.py" in str(frames.get("bridge") or frames.get("innermost") or "")
    ):
        # megatron/bridge/models/gpt_provider.py :: GPTModelProvider.provide asserts use_te_rng_tracker whenever
        # cuda_graph_impl is not "none"; validate() does not check it
        out.update(
            rule=RULE_CUDA_GRAPH_TE_RNG,
            category="config",
            why="CUDA graphs on a GPT-family model need Transformer Engine's RNG tracker (model.use_te_rng_tracker); "
            "the model build asserts it",
            fix=_rule_fix(RULE_CUDA_GRAPH_TE_RNG, "model.use_te_rng_tracker=true"),
        )
    elif etype in ("ImportError", "ModuleNotFoundError") and ("mamba" in core or "MambaSSM" in first_line):
        out.update(
            category="environment",
            why="hybrid (Mamba) layers import mamba-ssm when the model is built; this machine does not have it",
            fix="install mamba-ssm and causal-conv1d into the training image (pip install mamba-ssm causal-conv1d "
            "--no-build-isolation), then rehearse again; for a rehearsal alone mamba-ssm's Triton kernels are "
            "enough (references/rehearse.md, 'Hybrid (Mamba) models')",
        )
    elif etype == "AbsentKernelError":
        out.update(
            category="environment",
            why="something called mamba-ssm's compiled Mamba-1 kernel, which this machine does not have (the "
            "rehearsal let mamba-ssm import without it because megatron-core's Mamba-2 layers do not use it)",
            fix="install mamba-ssm with its CUDA extension (pip install mamba-ssm --no-build-isolation), then "
            "rehearse again",
        )
    elif etype in ("OutOfMemoryError", "torch.OutOfMemoryError") or "CUDA out of memory" in first_line:
        out.update(
            category="memory",
            why="this rank's allocations exceeded the GPU",
            fix="'mfsdp.py memory CONFIG --gpu-mem-gib G' for the strategy and data-parallel size that fit; "
            "model.init_model_with_meta_device=true when it failed while building the model",
        )
    elif etype == "ValueError" and first_line.startswith("No dot product attention backend is available"):
        # transformer_engine/pytorch/attention/dot_product_attention: every backend it may use was ruled out;
        # megatron-core sets which ones it may use from model.attention_backend (language_module.py)
        out.update(
            category="environment",
            why="Transformer Engine found no attention kernel it is allowed to use for these inputs; "
            "model.attention_backend decides which are allowed (flash, the hybrid provider's default, allows "
            "FlashAttention only, which needs the flash-attn package)",
            fix="model.attention_backend=auto (Transformer Engine then picks among flash, cuDNN fused and unfused "
            "attention), or install flash-attn; NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 prints why each was ruled out",
        )
    elif etype == "RuntimeError" and first_line.startswith("Failed to find C compiler"):
        # triton/runtime/build.py: Triton builds its CUDA driver module and kernel launchers with the
        # host's C compiler the first time a Triton kernel runs (mamba-ssm's kernels are Triton)
        out.update(
            category="environment",
            why="Triton compiles a small C module the first time one of its kernels runs (hybrid Mamba layers "
            "run on Triton kernels), and this machine has no C compiler",
            fix="install a C compiler into the image (gcc or clang; or point CC at one), then rehearse again",
        )
    elif etype == "CheckpointException" and "global plan" in msg:
        out.update(
            category="rehearsal-limit",
            why="a save under the fake backend holds one rank's shards only, so torch's global-plan check "
            "cannot pass by construction",
            fix="rehearse save/load with --parity (a real world of 1), or on real GPUs",
        )
    return out


def check_findings(run_config: str | None) -> list[dict]:
    """Error findings of ``check`` on the config the engine actually built (its run_config.yaml)."""
    if not run_config or not os.path.isfile(run_config):
        return []
    try:
        from .. import config_io, rules

        cfg = config_io.load_effective(run_config)
        return [f.to_dict() for f in rules.evaluate(cfg, {}) if f.severity == "error"]
    except Exception:  # a to_yaml() the checker cannot read: the rehearsal's own verdict stands
        return []


# --------------------------------------------------------------------------- memory


def _gib(b) -> float | None:
    return None if b is None else round(float(b) / GIB, 3)


def predicted_memory(run_config: str | None, report: Mapping) -> dict:
    """``memory``'s prediction for this rank's strategy and data-parallel size, or why there is none."""
    facts = report.get("facts") or {}
    strategy = facts.get("strategy")
    dp = facts.get("data_parallel_size")
    if not run_config or not os.path.isfile(run_config):
        return {"available": False, "why": "no run_config.yaml beside the report"}
    if not strategy or not dp:
        return {"available": False, "why": "the run stopped before its strategy and data-parallel size were known"}
    try:
        from .. import config_io, memory

        cfg = config_io.load_yaml(run_config)
        row = memory.report(cfg, dp=int(dp), strategies=(strategy,))["strategies"][0]
    except Exception as exc:  # the model may not know this family: say so, never guess
        return {"available": False, "why": f"memory model: {type(exc).__name__}: {str(exc)[:200]}"}
    return {
        "available": True,
        "strategy": strategy,
        "data_parallel_size": dp,
        "between_steps_gib": row.get("after_step_gib"),
        "peak_gib": row.get("total_gib"),
    }


def nccl_allowance(process_groups: Mapping | None) -> dict | None:
    if not process_groups:
        return None
    n = int(process_groups.get("count_size_gt_1") or 0)
    per = NCCL_PER_COMMUNICATOR_BYTES / GIB
    return {
        "communicators": n,
        "per_communicator_gib": round(per, 3),
        "allowance_gib": round(n * per, 3),
        "basis": NCCL_BASIS.format(per=per, ch=NCCL_CHANNELS),
    }


# --------------------------------------------------------------------------- verdict


def _phases(report: Mapping) -> list[dict]:
    return [
        {"name": name, "status": rec.get("status"), "wall_s": rec.get("wall_s")}
        for name, rec in (report.get("phases") or {}).items()
    ]


def summarize_run(report: Mapping, run_dir: str | None = None, role: str | None = None, links=None) -> dict:
    """One rank's verdict from its engine report (``links``: the --perf link model, when asked)."""
    if report.get("schema") != ENGINE_SCHEMA:
        raise ValueError(f"not a rehearsal report (schema {report.get('schema')!r}, expected {ENGINE_SCHEMA!r})")
    req = report.get("request") or {}
    mem = report.get("memory") or {}
    run_config = os.path.join(run_dir, "run_config.yaml") if run_dir else None
    failure = explain_failure(report.get("first_failure"), req)
    measured = {
        "after_setup_gib": _gib(mem.get("after_setup_bytes")),
        "between_steps_gib": _gib(mem.get("between_steps_bytes")),
        "peak_allocated_gib": _gib(mem.get("peak_allocated_bytes")),
        "peak_reserved_gib": _gib(mem.get("peak_reserved_bytes")),
        "process_nvml_gib": _gib(mem.get("process_used_bytes_nvml")),
    }
    if not mem:  # a failed run: the last phase that recorded memory
        last = [r for r in (report.get("phases") or {}).values() if "allocated_bytes" in r]
        if last:
            measured["peak_allocated_gib"] = _gib(max(r.get("peak_allocated_bytes") or 0 for r in last))
            measured["peak_reserved_gib"] = _gib(max(r.get("peak_reserved_bytes") or 0 for r in last))
    facts = report.get("facts") or {}
    moe = None
    if facts.get("moe") or report.get("mirror_collectives"):
        moe = {
            "mirrored_collectives": list(report.get("mirror_collectives") or []),
            "balanced_routing": bool(req.get("balanced_routing")),
        }
    deviations = [
        {k: d.get(k) for k in ("id", "what", "why", "memory_effect", "time_effect", "extra_activation_bytes") if k in d}
        for d in report.get("deviations") or []
        if isinstance(d, Mapping)
    ]
    mamba = report.get("mamba_ssm") if isinstance(report.get("mamba_ssm"), Mapping) else None
    if failure and failure.get("type") in ("ImportError", "ModuleNotFoundError") and mamba and mamba.get("error"):
        failure["why"] = f"{failure['why']} (mamba-ssm: {mamba['error']})"
    out = {
        "rank": req.get("rank", 0),
        "role": role,
        "world_size": req.get("world_size"),
        "strategy": facts.get("strategy") or req.get("strategy"),
        "source": report.get("source"),
        "result": report.get("result"),
        "phases": _phases(report),
        "failure": failure,
        "check_errors": check_findings(run_config) if failure else [],
        "memory": measured,
        "predicted": predicted_memory(run_config, report),
        "nccl": nccl_allowance(report.get("process_groups")),
        "moe": moe,
        "settings_changed": report.get("settings_summary") or {},
        "hybrid": facts.get("hybrid") if isinstance(facts.get("hybrid"), Mapping) else None,
        "deviations": deviations,
        "save_load": report.get("save_load"),
        "device": report.get("device"),
        "versions": report.get("versions"),
    }
    if out["result"] == "running":  # killed mid-phase: the phase it was in failed
        out["result"] = "failed"
    if links is not None or report.get("perf") is not None:
        from ..perf import report as perf_report

        out["perf"] = perf_report.summarize(report.get("perf"), links)
    return out


def summarize_parity(report: Mapping) -> dict:
    par = report.get("parity") or {}
    legs = report.get("legs") or {}
    return {
        "result": report.get("result"),
        "passed": bool(par.get("passed")),
        "steps_compared": par.get("steps_compared"),
        "max_abs_loss_diff": par.get("max_abs_loss_diff"),
        "atol": par.get("atol"),
        "legs": {
            name: {
                "result": leg.get("result"),
                "between_steps_gib": _gib(leg.get("between_steps_bytes")),
                "peak_allocated_gib": _gib(leg.get("peak_allocated_bytes")),
                "save_load_equal": (leg.get("save_load") or {}).get("equal"),
                "failure": explain_failure(leg.get("first_failure")),
            }
            for name, leg in legs.items()
        },
    }


def read_report(run_dir: str) -> dict | None:
    try:
        with open(os.path.join(run_dir, "report.json"), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def summarize(runs: Sequence[tuple[str, str | None]], parity_dir: str | None = None, command=None, links=None) -> dict:
    """The whole verdict: ``runs`` is ``[(run folder, role), ...]``; a folder without a report fails."""
    ranks: list[dict] = []
    for run_dir, role in runs:
        rep = read_report(run_dir)
        if rep is None:
            ranks.append(
                {
                    "rank": None,
                    "role": role,
                    "result": "failed",
                    "phases": [],
                    "failure": {
                        "phase": "startup",
                        "type": "NoReport",
                        "message": f"no report.json in {run_dir}: the engine did not start (see its log.txt)",
                        "site": None,
                        "rule": None,
                        "category": "unknown",
                        "why": None,
                        "fix": None,
                    },
                }
            )
            continue
        ranks.append(summarize_run(rep, run_dir, role, links))
    parity = None
    if parity_dir:
        rep = read_report(parity_dir)
        parity = summarize_parity(rep) if rep else {"result": "failed", "passed": False, "legs": {}}
    ok = all(r["result"] == "passed" for r in ranks) and (parity is None or parity["passed"])
    return {
        "schema": REPORT_SCHEMA,
        "result": "passed" if ok else "failed",
        "command": command,
        "ranks": ranks,
        "parity": parity,
        "limits": list(LIMITS),
    }


def exit_code(summary: Mapping) -> int:
    """As ``check``: 0 everything passed, 1 a phase or the parity failed."""
    return 0 if summary.get("result") == "passed" else 1


# --------------------------------------------------------------------------- text


def _fmt(x, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.2f}{unit}" if isinstance(x, float) else f"{x}{unit}"


def _loss(x) -> str:
    return "-" if not isinstance(x, (int, float)) or not math.isfinite(x) else f"{x:.4f}"


def render_text(summary: Mapping) -> str:
    lines: list[str] = []
    from ..perf import report as perf_report

    for r in summary.get("ranks") or []:  # non-finite timed steps: said before anything else
        warn = perf_report.warning(r.get("perf") or {})
        if warn:
            lines.append(f"rank {r.get('rank')}: {warn}")
    for r in summary.get("ranks") or []:
        head = f"rank {r.get('rank')} of {r.get('world_size')}"
        if r.get("role"):
            head += f" ({r['role']})"
        if r.get("strategy"):
            head += f", {r['strategy']}"
        if r.get("source"):
            head += f", {r['source']}"
        lines.append(f"{head}: {str(r.get('result')).upper()}")
        ph = r.get("phases") or []
        if ph:
            lines.append(
                "  phases: "
                + ", ".join(f"{p['name']} {'ok' if p['status'] == 'passed' else str(p['status']).upper()}" for p in ph)
            )
        f = r.get("failure")
        if f:
            where = f" in {f['site']}" if f.get("site") else ""
            step = f" (step {f['step']})" if f.get("step") else ""
            lines.append(f"  first failure at {f.get('phase')}{step}: {f.get('type')}: {f.get('message')}{where}")
            if f.get("rule"):
                lines.append(f"  [{f['rule']}] {f.get('why')}")
            elif f.get("why"):
                lines.append(f"  [{f.get('category')}] {f.get('why')}")
            if f.get("fix"):
                lines.append(f"    fix: {f['fix']}")
            for c in r.get("check_errors") or []:
                if c.get("rule") != f.get("rule"):
                    lines.append(f"  check also says [{c['rule']}] {c['message']}")
                    lines.append(f"    fix: {c['fix']}")
        hy = r.get("hybrid")
        if hy:
            if hy.get("mem_eff_path_used"):
                path = "memory-efficient (fused kernel)"
            elif hy.get("mem_eff_path_requested"):
                path = "unfused (the fused kernel cannot run here: see the deviation below)"
            else:
                path = "unfused, as the config asks (use_mamba_mem_eff_path=false)"
            lines.append(f"  hybrid (Mamba): {hy.get('mamba_layers')} Mamba layers; Mamba path: {path}")
        for d in r.get("deviations") or []:
            lines.append(f"  DEVIATION from a production run [{d.get('id')}]: {d.get('what')}")
            lines.append(f"    why: {d.get('why')}")
            lines.append(f"    memory: {d.get('memory_effect')}")
        m = r.get("memory") or {}
        p = r.get("predicted") or {}
        if any(v is not None for v in m.values()):
            until = " (until the failure)" if f else ""
            lines.append(f"  memory per GPU (GiB){until}   measured   predicted by 'memory'")
            rows = (
                ("after setup", m.get("after_setup_gib"), None),
                ("between steps", m.get("between_steps_gib"), p.get("between_steps_gib")),
                ("peak allocated", m.get("peak_allocated_gib"), p.get("peak_gib")),
                ("peak reserved", m.get("peak_reserved_gib"), None),
            )
            for label, meas, pred in rows:
                lines.append(f"    {label:<20} {_fmt(meas):>8}   {_fmt(pred):>8}")
            if not p.get("available"):
                lines.append(f"    (no prediction: {p.get('why')})")
        n = r.get("nccl")
        if n:
            lines.append(
                f"  NCCL allowance: +{n['allowance_gib']:.2f} GiB ({n['communicators']} communicators x "
                f"{n['per_communicator_gib']:.2f} GiB; an allowance, not measured)"
            )
            if m.get("peak_reserved_gib") is not None:
                lines.append(
                    f"    peak reserved + allowance: {m['peak_reserved_gib'] + n['allowance_gib']:.2f} GiB per GPU"
                )
        moe = r.get("moe")
        if moe:
            routing = "balanced (forced, --balanced-routing)" if moe["balanced_routing"] else "as the router decides"
            mir = "mirrored (every rank looks like this one)" if moe["mirrored_collectives"] else "plain fake"
            lines.append(f"  MoE: collectives {mir}; routing {routing}")
        if r.get("perf") is not None:
            from ..perf import report as perf_report

            lines.extend(perf_report.render(r["perf"]))
        sl = r.get("save_load")
        if sl:
            if sl.get("losses_compared") is False:
                how = "; one process stands for the world, so the load restored no tensor (see rehearse.md)"
            elif sl.get("equal") is not None:
                how = f"; forward loss {'equal' if sl['equal'] else 'DIFFERENT'} across it"
            else:
                how = ""
            lines.append(
                f"  save/load: saved iteration {sl.get('saved_iteration')}, resumed {sl.get('resumed_iteration')}" + how
            )
    par = summary.get("parity")
    if par:
        verdict = "PASSED" if par.get("passed") else "FAILED"
        lines.append(
            f"parity (real world of 1, DDP vs Megatron FSDP): {verdict}: max |loss diff| "
            f"{_loss(par.get('max_abs_loss_diff'))} over {par.get('steps_compared')} steps (atol {par.get('atol')})"
        )
        for name, leg in (par.get("legs") or {}).items():
            extra = ""
            if leg.get("save_load_equal") is not None:
                extra = f", save/load {'equal' if leg['save_load_equal'] else 'DIFFERENT'}"
            lines.append(
                f"  {name}: {leg.get('result')}, between steps {_fmt(leg.get('between_steps_gib'))} GiB, "
                f"peak {_fmt(leg.get('peak_allocated_gib'))} GiB{extra}"
            )
    for lim in summary.get("limits") or []:
        lines.append(f"note: {lim}")
    lines.append(f"rehearsal: {str(summary.get('result')).upper()}")
    return "\n".join(lines) + "\n"
