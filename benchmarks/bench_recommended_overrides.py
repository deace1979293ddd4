#!/usr/bin/env python3
"""Every override the skill tells a user to set, each rehearsed on a small job of the kind it is meant for.

Advice checked only on the CPU is not known to work: ``ddp.megatron_fsdp_main_grads_dtype=fp32``, given as an
override, passes ``check`` and crashes when the model is wrapped (the override path leaves the string a string on
a field whose default is None). So each ``KEY=VALUE`` the skill recommends is applied to a job and run through
model wrap and two training steps on one GPU.

Where the overrides come from (``extract()``), so that a new one cannot be missed (the test regenerates this list
and fails on any override the committed plan does not cover):

* the rule table (``scripts/mfsdp_lib/rules``): each rule's ``fix``; a fix computed from the config (a callable)
  is read from its source (``e.origin('KEY')}=VALUE`` and literal ``KEY=VALUE``);
* what ``enable`` and ``enable --perf`` write (``scripts/mfsdp_lib/enable.py``): the minimal and perf settings, the
  pipeline-only keys ``--set-pp-1`` resets, and every ``change("KEY", VALUE, ...)`` with literal values (the
  calls whose key or value comes from the config or the command line are listed in ``ENABLE_COMPUTED``);
* SKILL.md and every ``references/*.md`` but the generated record of measurements (``what-works.md``): ``section.key=value`` with a Bridge ``ConfigContainer`` section, the
  Python form ``cfg.section.key = value``, and ``mixed_precision=PRESET``.

Each (key, value) gets a job (``job_for``): a dense Llama-shaped trunk (preset ``tiny``), the MoE trunk with
EP 8 (``qwen3-moe-16l``), the hybrid Mamba trunk (``nemotronh-small``, needs mamba-ssm), LoRA on the dense trunk,
FP8 (current scaling, which Hopper runs), the dense trunk with a ``comm_overlap`` section for ``comm_overlap.*``
settings (a preset has none, and the rules that advise them fire only where a recipe has one), or a save/load round
trip for checkpoint settings, and the NCCL user buffers and NCCL group options, at a real world of 1
(``REAL_WORLD``: why); all under
Megatron FSDP ``optim_grads_params``, the others as rank 0 of a fake world of 8 (where data-parallel sharding
applies). Values the text shows as what fails (a refused setting in a pitfall, a symptom) are listed in
``NOT_RECOMMENDED`` with the reason; placeholders (a user's path) and settings that need hardware the H100/H200
lacks (MXFP8 is Blackwell's) are planned as not run, with why.

    python3 benchmarks/bench_recommended_overrides.py --plan                  # CPU: benchmarks/recommended_overrides_plan.json
    python3 benchmarks/bench_recommended_overrides.py --run --batch 1,2 --out RAW   # GPU machine: batches in one call

The run uses the same scheduler as the what-works batches (``bench_what_works.run_engines``: overlapping imports,
each engine in its own process group), but no run is timed, so ``GPU_SLOTS`` engines hold the GPU at once (one
lock per slot). Result:
``benchmarks/results/recommended_overrides_1xh200.json`` (``--collect RAW ... --out``).
"""

from __future__ import annotations

import argparse
import ast
import glob
import inspect
import json
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import raw_store  # noqa: E402  (beside this script: the raw results are read from their archive)

PLAN_PATH = ROOT / "benchmarks" / "recommended_overrides_plan.json"
RESULTS_PATH = ROOT / "benchmarks" / "results" / "recommended_overrides_1xh200.json"
PLAN_SCHEMA = "mfsdp-recommended-overrides-plan/1"
RESULT_SCHEMA = "mfsdp-recommended-overrides/1"
WORLD = 8  # data-parallel sharding applies; the MoE trunk's EP 8 fits it
# Jobs that run a real world of 1 (a real NCCL group) instead of the fake world:
# - checkpoint settings: there the load restores what was saved and the forward loss is compared across it. In a
#   fake world of 8 the checkpoint's metadata holds none of the model's or optimizer's tensor keys (one process
#   stands for eight), so a load matches nothing: the default partial load passes without restoring a tensor,
#   and checkpoint.strict_fsdp_dtensor_load=true fails on the first key;
# - NCCL user buffers (ddp.nccl_ub): they register a memory pool with the NCCL group
#   (ProcessGroupNCCL.register_mem_pool), which the fake backend does not have;
# - NCCL group options (dist.high_priority_stream_groups): megatron-core hands ProcessGroupNCCL.Options to
#   torch.distributed.new_group for the listed groups (parallel_state.create_group, called from
#   initialize_model_parallel), and the fake backend's creator accepts only its own Options (TypeError at
#   Bridge's initialize, measured).
REAL_WORLD = 1
REAL_WORLD_KINDS = ("checkpoint", "nccl_ub", "nccl_options")
NCCL_OPTION_KEYS = ("dist.high_priority_stream_groups",)
ITERS = 2  # "through wrap and two steps"
BATCH_BUDGET_S = 480
# Engines alive at once: Bridge's import (30-50 s of one core) dominates a small job's run, and the GPU machine
# has 16 cores; and engines on the GPU at once: no run here is timed, each small job holds a few GiB, so three
# share the GPU with room to spare (one at a time left the GPU idle between imports).
MAX_CONCURRENT = 10
GPU_SLOTS = 3


def batch_list(text: str) -> list[int]:
    """``--batch``'s value: ``3`` or ``1,2,3`` (also ``1+2``)."""
    try:
        out = [int(x) for x in text.replace("+", ",").split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give batch numbers, such as 2 or 1,2,3") from None
    if not out:
        raise argparse.ArgumentTypeError("give at least one batch number")
    return out


RUN_GPU_S = {  # planning figures
    "dense": 15,
    "lora": 15,
    "fp8": 20,
    "checkpoint": 35,
    "comm_overlap": 15,
    "nccl_ub": 15,
    "nccl_options": 15,
    "moe": 60,
    "hybrid": 90,
}
IMPORT_S = 45

# The Bridge sections a KEY=VALUE may start with (mfsdp_lib.schema.CONTAINER_KEYS, minus the provider hook).
from mfsdp_lib import enable as enable_mod  # noqa: E402
from mfsdp_lib import rules  # noqa: E402
from mfsdp_lib.schema import CONTAINER_KEYS  # noqa: E402

SECTIONS = tuple(k for k in CONTAINER_KEYS if k != "optimizer_config_override_provider")
# A bracketed list or a braced Hydra dict ({_target_:torch.float32,_call_:false}) is one value: taken whole.
_LIST_KV = re.compile(
    r"(?<![\w.$/-])((?:{})(?:\.[A-Za-z_][A-Za-z0-9_]*)+)=(\[[^\]\s]*\]|\{{[^}}\s]*\}})".format("|".join(SECTIONS))
)
_KV = re.compile(
    r"(?<![\w.$/-])((?:{})(?:\.[A-Za-z_][A-Za-z0-9_]*)+)\s?=\s?([^\s`'\",;)\]]+)".format("|".join(SECTIONS))
)
_PRESET = re.compile(r"(?<![\w.$/-])(mixed_precision)=([a-z0-9_]+)(?![\w.])")
_PY = re.compile(r"\bcfg\.((?:{})(?:\.[A-Za-z_][A-Za-z0-9_]*)+)\s*=\s*([^\s#]+)".format("|".join(SECTIONS)))
_ORIGIN = re.compile(r"origin\('([\w.]+)'\)\}=(\w+)")

# Calls of enable.py's change() whose key or value is not a literal, by the source text of their key argument:
# (how many such calls, where their KEY=VALUE comes from). A new non-literal call fails the extraction test.
ENABLE_COMPUTED = {
    "path": (
        4,
        "loops over MINIMAL_OVERRIDES, PERF_OVERRIDES and PIPELINE_ONLY_KEYS (extracted from the dicts), "
        "and the fix-point pass over the rule table (extracted from the rules)",
    ),
    "'checkpoint.save'": (1, "--save-dir DIR: the user's folder"),
    "f'env_vars.{rules.MAX_CONN}'": (1, "env_vars.CUDA_DEVICE_MAX_CONNECTIONS=32"),
    "'validation.eval_global_batch_size'": (1, "--fit-eval-batch: the nearest valid value at the job's world"),
    "'validation.eval_iters'": (1, "--fit-eval-batch: scaled to keep the samples evaluated"),
}

# Values the text shows as what fails or as a symptom, not as advice: (key, value) -> why it is not rehearsed.
NOT_RECOMMENDED = {
    ("checkpoint.also_save_hf_checkpoint", "true"): "SKILL.md's pitfall: refused with fsdp_dtensor",
    ("checkpoint.ckpt_format", "torch_dist"): "the format Megatron FSDP refuses (a pitfall and a rule message)",
    ("dist.use_torch_fsdp2", "true"): "FSDP2, exclusive with Megatron FSDP (fsdp2.md describes it)",
    ("model.cpu_offloading", "true"): "troubleshooting's symptom: offloading refused with recompute or PP > 1",
    ("model.gradient_accumulation_fusion", "true"): "SKILL.md's pitfall: needs APEX and Transformer Engine >= 2.10",
    ("ddp.fsdp_manual_registration", "true"): "a rule's condition (it needs ddp.nccl_ub), not advice",
    ("model.pipeline_model_parallel_size", "2"): "rehearse.md's example of the PP failure",
    ("ddp.grad_reduce_in_fp32", "true"): "memory.md: ignored under Megatron FSDP (gradients reduce in bf16)",
    ("ddp.megatron_fsdp_main_grads_dtype", "null"): "memory.md describes the default, not an override",
    ("model.transformer_impl", "transformer_engine"): "a rule's condition (Transformer Engine is the default)",
    ("model.cuda_graph_impl", "full_iteration"): "a rule's condition: full-iteration graphs need their own set-up",
    ("optimizer.optimizer", "muon"): "families.md: Muon is refused with Megatron FSDP",
    # perf.md quotes the rehearsal's one-line refusal for a recipe that already sets the flex dispatcher
    (
        "model.moe_token_dispatcher_type",
        "flex",
    ): "perf.md quotes the refusal for a recipe that sets it (DeepEP/HybridEP)",
    ("model.moe_flex_dispatcher_backend", "hybridep"): "perf.md quotes the refusal for a recipe that sets it",
    ("model.use_mamba_mem_eff_path", "false"): "memory.md: how a measured run ran (no causal-conv1d), not advice",
}

# Settings that mean something only beside another one: applied together.
# Full-iteration CUDA graphs need all of their settings (families.md, rules MFSDP-FULL-ITER-*, and the TE RNG
# tracker every CUDA graph needs on a GPT model, MFSDP-CUDA-GRAPH-TE-RNG: without it the model build asserts).
FULL_ITERATION = [
    "model.cuda_graph_impl=full_iteration",
    "model.use_te_rng_tracker=true",
    "ddp.megatron_fsdp_cuda_graph_mode=true",
    "ddp.fsdp_all_gather_in_start_param_sync=false",
    "rerun_state_machine.check_for_nan_in_loss=false",
]
PER_LAYER_GRAPHS = ["model.cuda_graph_impl=transformer_engine", "model.use_te_rng_tracker=true"]
CONTEXT: dict[str | tuple[str, str], list[str]] = {
    "ddp.nccl_ub": ["ddp.fsdp_double_buffer=true"],
    "ddp.megatron_fsdp_cuda_graph_mode": PER_LAYER_GRAPHS,
    "model.use_te_rng_tracker": ["model.cuda_graph_impl=transformer_engine"],
    "ddp.fsdp_all_gather_in_start_param_sync": FULL_ITERATION,
    "rerun_state_machine.check_for_nan_in_loss": FULL_ITERATION,
    "model.sequence_parallel": ["model.tensor_model_parallel_size=2"],  # sequence parallelism splits over TP
    "ddp.outer_dp_sharding_strategy": ["ddp.num_distributed_optimizer_instances=2"],  # HSDP's outer group
    # full recompute needs a method and a layer count (megatron-core's TransformerConfig.__post_init__ checks both:
    # rules MFSDP-RECOMPUTE-FULL-METHOD and -FULL-NUM-LAYERS fire together on a config that sets only the granularity)
    ("model.recompute_granularity", "full"): ["model.recompute_method=uniform", "model.recompute_num_layers=1"],
    "model.recompute_method": ["model.recompute_granularity=full", "model.recompute_num_layers=1"],
    "model.recompute_num_layers": ["model.recompute_granularity=full", "model.recompute_method=uniform"],
    # a null layer count is the fix for selective recompute (MFSDP-RECOMPUTE-SELECTIVE-NUM-LAYERS), not for full
    ("model.recompute_num_layers", "null"): ["model.recompute_granularity=selective"],
    # the optimizer config is finalized before Bridge turns the distributed optimizer on for Megatron FSDP, so the
    # precision-aware optimizer needs it set (MFSDP-PRECISION-AWARE-NEEDS-DIST-OPT; enable writes it)
    ("optimizer.use_precision_aware_optimizer", "true"): ["optimizer.use_distributed_optimizer=true"],
}


def context_for(key: str, value: str) -> list[str]:
    """The settings an override is applied with (``CONTEXT``: by key and value first, then by key), less itself."""
    given = CONTEXT.get((key, value), CONTEXT.get(key, []))
    return [c for c in given if c.split("=", 1)[0] != key]


# Generated references that record measurements, not advice: the what-works matrix lists the settings its runs
# were made with (a dispatcher fallback, a shorter timed batch), which no user is told to set.
MEASUREMENT_RECORDS = ("what-works.md",)
OVERRIDE_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*=")  # a KEY=VALUE word of an engine command line
FP8 = "mixed_precision=bf16_with_fp8_current_scaling_mixed"  # FP8 current scaling: Hopper runs it
BLACKWELL_ONLY = ("mxfp8", "nvfp4", "fp4")


def _norm(value: str) -> str:
    """One spelling per value: quotes and trailing punctuation of the prose dropped, booleans lower-case, and
    ``null`` or Python's ``None`` as null. A lower-case ``none`` stays the string it is on Bridge's override path
    (Hydra reads only ``null`` as null): ``model.cuda_graph_impl=none`` and ``model.dsa_kernel_backend=none`` name
    a choice, and as null they fail (megatron-core: "Invalid cuda graph implementation: None")."""
    v = value.strip().rstrip(".:;)'\"").strip("'\"")
    low = v.lower()
    if low in ("true", "false"):
        return low
    if v in ("null", "None", "NULL"):
        return "null"
    return v


def _placeholder(value: str) -> bool:
    return bool(re.match(r"^(<|/|\$|~|[A-Z_]{2,}$)", value)) or value in ("DST", "SRC", "FORMAT")


def _pairs(text: str, patterns) -> list[tuple[str, str]]:
    """(key, value) of each KEY=VALUE in ``text``; a bracketed list or braced dict value is taken whole."""
    lists = {m.start(): (m.group(1), m.group(2)) for m in _LIST_KV.finditer(text)}
    out = list(lists.values())
    for pat in patterns:
        out += [(m.group(1), m.group(2)) for m in pat.finditer(text) if m.start() not in lists]
    return out


def _add(found: dict, key: str, value: str, where: str, origin: str, topic: str | None = None) -> None:
    rec = found.setdefault(
        (key, _norm(value)), {"key": key, "value": _norm(value), "origins": [], "rule_topics": [], "where": []}
    )
    if origin not in rec["origins"]:
        rec["origins"].append(origin)
    if topic and topic not in rec["rule_topics"]:
        rec["rule_topics"].append(topic)
    if where not in rec["where"]:
        rec["where"].append(where)


def from_rules(found: dict) -> None:
    for r in rules.RULES:
        if isinstance(r.fix, str):
            text = r.fix
        elif callable(r.fix):
            try:
                text = inspect.getsource(r.fix)
            except (OSError, TypeError):
                text = ""
            for m in _ORIGIN.finditer(text):
                _add(found, m.group(1), m.group(2), f"rule {r.id}", "rules", r.topic)
        else:
            continue
        for key, value in _pairs(text, (_KV, _PRESET)):
            _add(found, key, value, f"rule {r.id}", "rules", r.topic)


def _literal(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return _MISSING


_MISSING = object()


def _text(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def enable_calls() -> tuple[list[tuple[str, object, int]], list[tuple[int, str]]]:
    """(key, value, line) of every change() call in enable.py with literal key and value (keys bound by a
    ``for path in (...)`` loop over literals count as literal); and (line, key argument's source) of the others."""
    src = Path(enable_mod.__file__).read_text(encoding="utf-8")
    tree = ast.parse(src)
    literal, other = [], []
    loops: dict[int, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            vals = _literal(node.iter)
            if isinstance(vals, (tuple, list)) and all(isinstance(x, str) for x in vals):
                for sub in ast.walk(node):
                    loops[id(sub)] = list(vals)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "change"):
            continue
        if len(node.args) < 2:
            continue
        key, value = _literal(node.args[0]), _literal(node.args[1])
        keys = [key] if isinstance(key, str) else loops.get(id(node), [])
        if keys and value is not _MISSING:
            literal += [(k, value, node.lineno) for k in keys]
        else:
            other.append((node.lineno, ast.unparse(node.args[0])))
    return literal, other


def from_enable(found: dict) -> None:
    for key, value in enable_mod.MINIMAL_OVERRIDES.items():
        _add(found, key, _text(value), "enable (the five settings)", "enable")
    for key, (value, _why) in enable_mod.PERF_OVERRIDES.items():
        _add(found, key, _text(value), "enable --perf", "enable")
    _add(found, "model.pipeline_model_parallel_size", "1", "enable --set-pp-1", "enable")
    for key, value in enable_mod.PIPELINE_ONLY_KEYS.items():
        _add(found, key, _text(value), "enable --set-pp-1", "enable")
    _add(found, f"env_vars.{rules.MAX_CONN}", "32", "enable (env_vars)", "enable")
    literal, _other = enable_calls()
    for key, value, line in literal:
        _add(found, key, _text(value), f"scripts/mfsdp_lib/enable.py:{line}", "enable")


def from_text(found: dict) -> None:
    files = [
        ROOT / "SKILL.md",
        *sorted(
            Path(p) for p in glob.glob(str(ROOT / "references" / "*.md")) if Path(p).name not in MEASUREMENT_RECORDS
        ),
    ]
    for f in files:
        rel = f.relative_to(ROOT).as_posix()
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            for key, value in _pairs(line, (_KV, _PRESET, _PY)):
                _add(found, key, value, f"{rel}:{i}", "text")


def extract() -> list[dict]:
    """Every (key, value) the skill recommends, with where each is said; sorted by key and value."""
    found: dict = {}
    from_rules(found)
    from_enable(found)
    from_text(found)
    return [found[k] for k in sorted(found)]


def job_for(key: str, value: str, topics: list[str] | None = None) -> dict:
    """The small job this override is meant for (the rule's topic first, then the key), or why it is not run."""
    low = f"{key}={value}".lower()
    topics = topics or []
    if (key, value) in NOT_RECOMMENDED:
        return {"kind": None, "why": NOT_RECOMMENDED[(key, value)]}
    if _placeholder(value) or ("{" in value and not value.startswith("{_")):  # {N} templates; {_target_:...} is a value
        return {"kind": None, "why": "a value the user supplies (a path, a count computed from the job)"}
    if any(b in low for b in BLACKWELL_ONLY):
        return {"kind": None, "why": "MXFP8/FP4 need a Blackwell GPU; the H100/H200 cannot run them"}
    if "moe" in topics or "moe" in low or "expert" in low:
        kind = "moe"
    elif "mamba" in low or "hybrid" in low:
        kind = "hybrid"
    elif "peft" in topics or key.startswith("peft.") or "lora" in low:
        kind = "lora"
    elif "fp8" in low:
        kind = "fp8"
    elif key.startswith("checkpoint."):
        kind = "checkpoint"
    elif key.startswith("comm_overlap."):
        kind = "comm_overlap"
    elif key == "ddp.nccl_ub":
        kind = "nccl_ub"
    elif key in NCCL_OPTION_KEYS:
        kind = "nccl_options"
    else:
        kind = "dense"
    return {"kind": kind, "why": None}


def engine_command(kind: str, overrides: list[str], out_dir: str, python: str = "python3") -> list[str]:
    """The engine command (the one ``rehearse`` runs) for a job kind with ``overrides`` on top."""
    from mfsdp_lib.runs import rehearse as rh

    preset = {"moe": "qwen3-moe-16l", "hybrid": "nemotronh-small"}.get(kind, "tiny")
    extra = []
    if kind == "lora":
        extra += ["--peft", "lora"]
    if kind == "moe":
        extra += ["--balanced-routing"]
    if kind == "checkpoint":
        extra += ["--save-load"]
    if kind == "comm_overlap":
        extra += ["--comm-overlap-section"]
    base = [FP8] if kind == "fp8" else []
    return rh.engine_command(
        source=["--model-preset", preset],
        world=REAL_WORLD if kind in REAL_WORLD_KINDS else WORLD,
        rank=0,
        out_dir=out_dir,
        iters=ITERS,
        overrides=[*base, *overrides],
        strategy="optim_grads_params",
        extra=extra,
        python=python,
    )


def _plan_command(cmd: list[str]) -> str:
    """The command as the plan states it: from the repository root, machine paths dropped, quoted for a shell (a
    braced value such as {_target_:torch.float32,_call_:false} would otherwise be brace-expanded)."""
    return shlex.join(cmd).replace(str(ROOT) + "/", "")


def _slug(key: str, value: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{key}={value}")[:120]


def build_plan() -> dict:
    rows = []
    for rec in extract():
        job = job_for(rec["key"], rec["value"], rec["rule_topics"])
        row = {**rec, "id": _slug(rec["key"], rec["value"]), "job": job["kind"], "not_run_why": job["why"]}
        if job["kind"]:
            context = context_for(rec["key"], rec["value"])
            override = f"{rec['key']}={rec['value']}"
            row["overrides"] = [*context, override]
            row["command"] = _plan_command(engine_command(job["kind"], row["overrides"], f"$OUT/{row['id']}"))
            row["expected"] = (
                "fails at model_wrap: the string reaches the FSDP mixed-precision policy"
                if rec["key"].endswith("_dtype") and rec["value"] in ("fp32", "bf16", "fp16")
                else "passes wrap and two steps"
            )
            row["estimate_gpu_s"] = RUN_GPU_S[job["kind"]]
        rows.append(row)
    # baselines: each job kind under enable's five settings alone (the engine's --strategy optim_grads_params
    # applies MINIMAL_OVERRIDES), so that a failure of an override run is the override's own, and enable's
    # settings are executed on every kind of job (dense, MoE with EP, hybrid, LoRA, FP8, save/load)
    kinds = sorted(RUN_GPU_S)
    baselines = [
        {
            "id": f"baseline_{k}",
            "job": k,
            "overrides": [],
            "command": _plan_command(engine_command(k, [], f"$OUT/baseline_{k}")),
            "estimate_gpu_s": RUN_GPU_S[k],
        }
        for k in kinds
    ]
    runnable = baselines + [r for r in rows if r["job"]]
    batches: list[dict] = []
    cur: list[str] = []
    cur_s = IMPORT_S
    for r in runnable:
        if cur and cur_s + r["estimate_gpu_s"] > BATCH_BUDGET_S:
            batches.append({"batch": len(batches) + 1, "rows": cur, "estimated_s": cur_s})
            cur, cur_s = [], IMPORT_S
        cur.append(r["id"])
        cur_s += r["estimate_gpu_s"]
    if cur:
        batches.append({"batch": len(batches) + 1, "rows": cur, "estimated_s": cur_s})
    return {
        "schema": PLAN_SCHEMA,
        "generated_by": "python3 benchmarks/bench_recommended_overrides.py --plan",
        "world_size": WORLD,
        "iters": ITERS,
        "strategy": "optim_grads_params",
        "result_file": str(RESULTS_PATH.relative_to(ROOT)),
        "enable_computed": {k: why for k, (_n, why) in ENABLE_COMPUTED.items()},
        "baselines": baselines,
        "overrides": rows,
        "batches": batches,
    }


def batch_rows(plan: dict, batches: list[int]) -> list[str]:
    """The row ids of the given plan batches, in plan order (a missing batch is an error, not an empty list)."""
    rows: list[str] = []
    for batch in batches:
        spec = next((b for b in plan["batches"] if b["batch"] == batch), None)
        if spec is None:
            raise SystemExit(f"bench_recommended_overrides: no batch {batch} (the plan has {len(plan['batches'])})")
        rows += spec["rows"]
    return rows


def run_batch(
    plan: dict,
    batch: int | list[int],
    out: Path,
    python: str,
    budget_s: int,
    max_concurrent: int,
    gpu_slots: int = 1,
) -> dict:
    """Run one or several plan batches into ``out`` (one folder per row). No run is timed, so with ``gpu_slots``
    > 1 that many engines hold the GPU at once (each is a small job; a wrap and two steps decide the verdict)."""
    import bench_what_works as bw

    batches = batch if isinstance(batch, list) else [batch]
    rows = {r["id"]: r for r in [*plan["baselines"], *plan["overrides"]]}
    want = batch_rows(plan, batches)
    runs: list[dict] = []
    for rid in want:
        r = rows[rid]
        d = out / rid
        runs.append(
            {
                "id": rid,
                "name": "rehearse",
                "role": "rank 0",
                "dir": str(d),
                "command": engine_command(r["job"], r["overrides"], str(d), python),
            }
        )
    probe = bw.probe_machine(python)
    records = bw.run_engines(runs, out, budget_s, max_concurrent, gpu_slots)
    for run, rec in zip(runs, records, strict=True):
        if rec.get("exit") is not None:
            rec["summary"] = bw.summarize_run(run, None)
            bw.tail_file(Path(run["dir"]) / "log.txt")
        date = ((rec.get("window") or {}).get("started_utc")) or None
        Path(run["dir"]).mkdir(parents=True, exist_ok=True)  # a run the budget never started has no folder yet
        (Path(run["dir"]) / "row.json").write_text(
            json.dumps({"id": run["id"], "probe": probe, "date": date, **rec}, indent=1) + "\n"
        )
    summary = {
        "batch": batch,
        "rows": want,
        "probe": probe,
        "max_concurrent": max_concurrent,
        "gpu_slots": gpu_slots,
        "timing_exclusive": bw.timing_exclusive(records),
    }
    (out / "batch.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def ran_overrides(command: str | None) -> list[str] | None:
    """The KEY=VALUE words of a recorded engine command line (``engine_command``), in order; None without one."""
    if not isinstance(command, str):
        return None
    return [w for w in shlex.split(command) if "=" in w and not w.startswith("-") and OVERRIDE_WORD.match(w)]


def job_words(command: str | None) -> list[str] | None:
    """A recorded or planned engine command as the job it runs: the words after the engine script, without the
    ``--out`` folder (the interpreter, the checkout's path and the output folder differ between machines)."""
    if not isinstance(command, str):
        return None
    words = shlex.split(command)
    start = next((i + 1 for i, w in enumerate(words) if w.endswith("rehearse_train.py")), 0)
    out: list[str] = []
    skip = False
    for w in words[start:]:
        if skip:
            skip = False
        elif w == "--out":
            skip = True
        else:
            out.append(w)
    return out


def not_applied(run_dir: Path, overrides: list[str] | None) -> list[str]:
    """The overrides the run's recorded config does not hold as given: a Hydra list (``[core_attn,attn_proj]``)
    that reached the config as text. Read from the engine's ``run_config.yaml`` (the config it trained), field by
    field; a run without one, or a key it does not record, says nothing."""
    import yaml

    from mfsdp_lib import config_io

    try:
        cfg = yaml.safe_load((run_dir / "run_config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return []
    out = []
    for word in overrides or []:
        key, _, value = word.partition("=")
        want = config_io.parse_value(value)
        node = cfg
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(want, list) and isinstance(node, str):
            out.append(f"{key}={value} reached the config as the text {node!r}, not a list")
    return out


# The result fields that send a run back to be run again, each with the note that lists its runs.
RERUN_NOTES = (
    (
        "plan_changed",
        "Runs whose job the plan has changed since (plan_changed: a fix they led to, in the text, the rules and the "
        "job; planned_overrides is the job now)",
    ),
    (
        "rehearsal_fault",
        "Runs that trained a config other than the advice, a fault of the rehearsal fixed since (rehearsal_fault)",
    ),
)


def collect(dirs: list[Path], plan: dict, existing: dict | None) -> dict:
    """Result rows (one per override and baseline run) from raw batches; later batches win."""
    import what_works_result as wr

    # a run whose override the plan no longer rehearses (now listed as not advice, with why) is left out
    by_id = {r["id"]: r for r in [*plan["baselines"], *plan["overrides"]] if r.get("job")}
    out = {r["id"]: r for r in (existing or {}).get("rows", []) if isinstance(r, dict) and r.get("id") in by_id}
    # earlier runs a later one replaced after a flag or a failure: kept on record with the run that answers them
    superseded = {h["raw"]: h for h in (existing or {}).get("superseded", []) if isinstance(h, dict) and h.get("raw")}
    for d in dirs:
        for p in sorted(d.glob("*/row.json")):
            raw = json.loads(p.read_text(encoding="utf-8"))
            r = by_id.get(raw.get("id"))
            if r is None:
                continue
            unfinished = raw.get("exit") is None or bool(raw.get("stopped"))
            if unfinished and r["id"] in out:
                continue  # the batch's budget ended before this run did: it keeps what an earlier batch found
            rank = ((raw.get("summary") or {}).get("ranks") or [{}])[0]
            phases = wr.fold_phases(rank.get("phases") or [], r.get("job") == "checkpoint")
            given = ran_overrides(raw.get("command"))
            ran_job, planned_job = job_words(raw.get("command")), job_words(r.get("command"))
            # a run that trained a config other than the advice (a value the engine read differently from Bridge's
            # override path, since fixed) is no verdict on the advice: not run, with the fault, to run again
            fault = not_applied(p.parent, given)
            before = out.get(r["id"])
            if before and (before.get("rehearsal_fault") or before.get("plan_changed") or before["result"] == "failed"):
                superseded[before["raw"]] = {
                    "id": r["id"],
                    "raw": before["raw"],
                    "result": before["result"],
                    "plan_changed": before.get("plan_changed"),
                    "rehearsal_fault": before.get("rehearsal_fault"),
                    "first_error": (before.get("first_error") or {}).get("message"),
                    "measured_again": wr.repo_path(p.parent),
                }
            out[r["id"]] = {
                "id": r["id"],
                "key": r.get("key"),
                "value": r.get("value"),
                "where": r.get("where"),
                "job": r["job"],
                # what the engine was given (its command line), not what the plan says today
                "overrides": given if given is not None else r["overrides"],
                # the plan's job for this override changed after the run (a fix the run led to): run it again
                "plan_changed": ran_job != planned_job
                if ran_job is not None and planned_job is not None
                else (given is not None and given != r["overrides"]),
                "planned_overrides": r["overrides"],
                # an engine that never reached a phase (refused: no CUDA, no Bridge) ran nothing: no verdict
                "result": ("passed" if rank.get("result") == "passed" else "failed")
                if rank.get("phases") and not unfinished and not fault
                else "not run",
                "rehearsal_fault": "; ".join(fault) or None,
                "phases": phases,
                "first_error": wr.first_error(rank, wr._read(p.parent / "report.json")),
                "device": rank.get("device"),
                "date": str(raw.get("date") or "")[:10] or None,
                "raw": wr.repo_path(p.parent),
            }
    order = [r["id"] for r in [*plan["baselines"], *plan["overrides"]]]
    rows = sorted(out.values(), key=lambda r: order.index(r["id"]) if r["id"] in order else len(order))
    devices = sorted({str(r.get("device")) for r in rows if r.get("device")})
    dates = sorted(str(r.get("date") or "") for r in rows if r.get("date"))
    ran = [r for r in rows if r.get("result") in ("passed", "failed")]
    return {
        "benchmark": "recommended_overrides_1xh200",
        "title": "Every override the skill recommends, rehearsed through wrap and two steps on the job it is meant for",
        "date": dates[-1] if dates else None,
        "machine": ", ".join(devices)
        + f" (rank 0 of a fake world of {WORLD}; the {', '.join(REAL_WORLD_KINDS[:-1])} and {REAL_WORLD_KINDS[-1]} jobs"
        f" at a real world of {REAL_WORLD})"
        if devices
        else None,
        "command": "python3 benchmarks/bench_recommended_overrides.py --run --batch K --out RAW (one GPU call per "
        "batch), then --collect RAW... --out benchmarks/results/recommended_overrides_1xh200.json",
        "columns": ["override", "job", "with", "result", "first error (rule)"],
        "rows": rows,
        "table_rows": [
            [
                f"{r['key']}={r['value']}" if r.get("key") else r["id"],
                r["job"],
                ", ".join(o for o in r["overrides"] if o != f"{r.get('key')}={r.get('value')}"),
                r["result"]
                + (" (its job has changed since: run again)" if r.get("plan_changed") else "")
                + (
                    f" (the rehearsal's fault, fixed: {r['rehearsal_fault']}; run again)"
                    if r.get("rehearsal_fault")
                    else ""
                ),
                f"{(r['first_error'] or {}).get('message', '')[:120]} ({(r['first_error'] or {}).get('rule')})"
                if r.get("first_error") and r["result"] != "not run"
                else "",
            ]
            for r in rows
        ],
        "notes": [
            f"{len(ran)} of {len(rows)} runs reached a phase; {sum(r['result'] == 'failed' for r in ran)} failed.",
            *(
                f"{why}: {', '.join(ids)}. They are run again."
                for field, why in RERUN_NOTES
                if (ids := [r["id"] for r in rows if r.get(field)])
            ),
            f"{sum(1 for r in plan['overrides'] if not r['job'])} recommended values are not run (listed in "
            "not_run with why: a user's path, a value the text shows failing, MXFP8 on Hopper).",
            *(
                [
                    f"{len(superseded)} earlier runs failed, were flagged (plan_changed, rehearsal_fault) or both, and "
                    "were run again after the fix (superseded: each earlier run, what it met, and measured_again: "
                    "the run that replaced it)."
                ]
                if superseded
                else []
            ),
        ],
        "superseded": sorted(superseded.values(), key=lambda h: (h["id"], h["raw"])),
        "raw": "benchmarks/results/raw/recommended_overrides_1xh200",
        "schema": RESULT_SCHEMA,
        "generated_by": "python3 benchmarks/bench_recommended_overrides.py --collect "
        + " ".join(wr.repo_path(d) for d in dirs),
        "not_run": [
            {"key": r["key"], "value": r["value"], "why": r["not_run_why"]} for r in plan["overrides"] if not r["job"]
        ],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--plan", action="store_true")
    mode.add_argument("--run", action="store_true")
    mode.add_argument("--collect", nargs="+", metavar="RAW")
    ap.add_argument("--plan-file", default=str(PLAN_PATH))
    ap.add_argument(
        "--batch", type=batch_list, help="a plan batch, or several joined by commas (1,2,3): one folder, one budget"
    )
    ap.add_argument("--rows", help="--run: comma-separated row ids instead of batches (runs a batch left, reruns)")
    ap.add_argument("--out")
    # the engines' budget; a 600 s call also holds the probe, the CPU route and the summaries
    ap.add_argument("--budget-s", type=int, default=BATCH_BUDGET_S + 30)
    ap.add_argument(
        "--max-concurrent", type=int, default=MAX_CONCURRENT, help=f"engines alive at once (default {MAX_CONCURRENT})"
    )
    ap.add_argument(
        "--gpu-slots", type=int, default=GPU_SLOTS, help=f"engines on the GPU at once (default {GPU_SLOTS})"
    )
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args(argv)
    if a.plan:
        plan = build_plan()
        Path(a.plan_file).write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")
        run = sum(1 for r in plan["overrides"] if r["job"])
        print(
            f"{len(plan['overrides'])} overrides ({run} to rehearse), {len(plan['batches'])} batches -> {a.plan_file}"
        )
        return 0
    plan = json.loads(Path(a.plan_file).read_text(encoding="utf-8"))
    if a.collect:
        if not a.out:
            ap.error("--collect needs --out")
        out = Path(a.out)
        existing = json.loads(out.read_text()) if out.exists() else None
        res = collect([raw_store.resolve(d) for d in a.collect], plan, existing)
        if not res["rows"]:
            print("bench_recommended_overrides: nothing measured; nothing written", file=sys.stderr)
            return 1
        out.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
        return 0
    if (a.batch is None) == (a.rows is None) or not a.out:
        ap.error("--run needs --batch K (or --rows ID,...) and --out DIR")
    if a.max_concurrent < 1 or a.gpu_slots < 1:
        ap.error("--max-concurrent and --gpu-slots must be at least 1")
    if a.rows is not None:
        known = {r["id"] for r in [*plan["baselines"], *plan["overrides"]] if r.get("job")}
        ids = [x for x in a.rows.split(",") if x]
        unknown = [x for x in ids if x not in known]
        if unknown:
            ap.error(f"--rows: not a run of the plan: {', '.join(unknown)}")
        plan = {**plan, "batches": [{"batch": 0, "rows": ids, "estimated_s": None}]}
        a.batch = [0]
    out = Path(a.out).resolve()
    if out.exists() and any(out.iterdir()):
        ap.error(f"--out {a.out}: exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    run_batch(plan, a.batch, out, a.python, a.budget_s, a.max_concurrent, a.gpu_slots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
