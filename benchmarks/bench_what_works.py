#!/usr/bin/env python3
"""What works with Megatron FSDP: Bridge's own recipes taken through the skill's route, planned on the CPU, run on one GPU.

Three steps, each its own command:

``--plan`` (CPU, no GPU, no Bridge): chooses from the recipe corpus (``tests/fixtures/recipes``: 208 configs that
Megatron-Bridge 0.6.2's recipe functions built, and Bridge's own verdict on each) one representative recipe per
model family and mode (pretrain, sft, peft), and takes each through the route SKILL.md gives, with the command-line
tools exactly as a user runs them:

1. ``check CONFIG --gpus N`` on the recipe as shipped;
2. ``enable CONFIG --gpus N`` with the decisions a user takes when it refuses (``--set-pp-1`` for pipeline
   parallelism, keeping the rest of the layout; the base model's path for PEFT; the nearest valid batch it names);
3. ``check`` of what ``enable`` wrote;
4. ``memory ENABLED --gpus N --gpu-mem-gib 140``: the predicted state between steps and peak of the strategy the
   config runs;
5. ``rehearse ENABLED --world-size N --perf ... --dry-run``: the engine command of rank 0 of the real world (and,
   once per family whose recipe ships with PP > 1, the as-shipped layout with Megatron FSDP's settings as the
   first rank of the last pipeline stage, which records the wrap failure PP > 1 meets).

N is the GPU count the recipe's name states (``..._16gpu_...``), else the smallest world its layout allows. The plan
(``benchmarks/what_works_plan.json``) holds one row per recipe in the result schema (measured fields null), the
expected outcome with its reason, what each row needs on the GPU machine (mamba-ssm, a MoE dispatcher), the
engine commands, a GPU-time estimate, and the rows packed into batches that each fit one 10-minute GPU call.

``--run --batch K --out DIR`` (the GPU machine, with Megatron-Bridge): for each row of batch K it runs the same CPU
route again (so the enabled YAML is made on that machine by the same tools, and a plan that no longer matches
``enable`` is reported), probes which optional packages are present, applies a labelled fallback only where one
is missing (the all-to-all MoE dispatcher in place of DeepEP/HybridEP; megatron-core's PyTorch DSA kernels in
place of the fused ones), then runs the engine commands. Several engine processes start at once so that their
imports of Bridge (30-60 s of CPU each) overlap, but every engine takes the GPU lock (``MFSDP_GPU_LOCK``) once its
config is validated and holds it to its exit, so models are built, wrapped and timed one row at a time; the lock
wait and hold of each run are recorded (``timing_exclusive``). Each run is its own process group, stopped
(SIGTERM, then SIGKILL) at its row's timeout or the batch's budget, so no engine outlives the call. Written per
row, small files only: ``DIR/rows/<id>/row.json`` (commands, exit codes, walls, fallbacks, the ``rehearse
--format json`` summary of each run), the engines' ``report.json`` and ``run_config.yaml``, and the tail of each
log; ``DIR/batch.json`` for the batch.

``--collect DIR [DIR ...] --out benchmarks/results/what_works_1xh200.json``: turns raw batches into result rows
(merging with rows already in the file, so each batch lands as it is measured). A row is measured only from a
raw file; rows with no raw file are not written.

Timing is compute only (the fake backend moves no data); memory is this rank's, as ``rehearse`` reports it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from bench_rehearse import stop_process_group as stop_group  # noqa: E402  (the rehearsal matrix's own stop)
from mfsdp_gpu import workload  # noqa: E402  (which step and mock data the engine drives: one definition)
from mfsdp_lib import what_works  # noqa: E402  (the lookup's model fingerprint: one definition)

MFSDP = SCRIPTS / "mfsdp.py"
CORPUS = ROOT / "tests" / "fixtures" / "recipes"
HF_CONFIGS = ROOT / "tests" / "recipes" / "hf_configs"  # the Hugging Face configs the corpus was built with
sys.path.insert(0, str(ROOT / "tests"))

from recipes import enable_corpus  # noqa: E402  (the decisions a user takes when enable refuses: one definition)

PLAN_PATH = ROOT / "benchmarks" / "what_works_plan.json"
RESULTS_PATH = ROOT / "benchmarks" / "results" / "what_works_1xh200.json"
PLAN_SCHEMA = "mfsdp-what-works-plan/1"
RAW_SCHEMA = "mfsdp-what-works-raw/1"
RESULT_SCHEMA = "mfsdp-what-works/1"

MODES = ("pretrain", "sft", "peft")
BLACKWELL_ONLY = r"_(fp8mx|mxfp8|nvfp4)"  # recipe-name precisions an H100/H200 cannot run
PHASES = ("validate", "wrap", "optimizer", "first_steps", "save", "load")
GPU_MEM_GIB = 140  # one H200: 143,771 MiB as torch reports it = 140.4 GiB
FITS_FRACTION = 0.95  # a predicted peak above this share of the GPU is expected not to fit (allocator, NCCL)
WARMUP, TIMED = 1, 2  # one untimed step (allocates the optimizer state), two timed: "wrap and first steps"
MAX_TIMED_MICROBATCHES = 4  # a step of 32 micro-batches took 114 s on one H100; fewer keep a row within a call
STRATEGY = "optim_grads_params"  # what enable sets
PEFT_BASE = "/workspace/base_model"  # the base-model path a PEFT user gives; the rehearsal reads nothing from it

# One GPU call is 10 minutes: the budget leaves room for the machine's start-up, the CPU route on the machine
# and copying the results back.
BATCH_BUDGET_S = 480
IMPORT_S = 45  # importing Bridge before a process reaches the GPU (hidden for all but the first run)
# Calibrated on the driver's first GPU run (11 rows on an H100, raw what_works_trial_1xh100): small models held the
# GPU 14-19 s in all, two timed steps included; a 7 B rank with 63 GiB of state spent about 70 s saving and loading.
ROW_FIXED_S = 20  # validate, build (meta-device for large models), wrap, optimizer set-up, teardown
SAVE_LOAD_S = 10  # a checkpoint round trip: the fixed part ...
SAVE_LOAD_S_PER_GIB = 1.0  # ... and writing then reading one rank's state, about 1 GiB/s both ways together
MAMBA_FIRST_S = 120  # Triton compiles the Mamba kernels on their first use (once per machine: its cache is reused)
EARLY_FAIL_S = 20  # a row expected to fail at validate: the config is built and refused before any model exists
ROW_UNKNOWN_S = 180  # a row whose size memory cannot give (a layer kind it does not size): a generous figure
EFFECTIVE_TFLOPS = 300.0  # planning figure for a dense bf16 model on an H200 (about 30 % of its peak)
# MoE under the rehearsal runs far below it: Qwen3-30B-A3B's first step (32 micro-batches of 4096 tokens, 3.3 B
# active parameters) took 114 s on one H100 as rank 0 of 16, about 21 TFLOP/s. Planning figure, not a measurement.
EFFECTIVE_TFLOPS_MOE = 20.0
RECOMPUTE_FACTOR = 4 / 3  # full recompute runs the forward twice: 8 instead of 6 FLOPs per parameter and token
ROW_CAP_S = 300  # a row's GPU time the timing batch aims at (a 10-minute call holds a few)
MAX_CONCURRENT = 4  # engines alive at once: imports overlap; only one holds the GPU (the lock)
STAGGER_S = 3.0  # start runs a little apart, so that they reach the lock in plan order
START_MARGIN_S = 30  # no run starts this close to the budget's end (it could not even import Bridge)
LOG_TAIL_BYTES = 64 * 1024  # what comes back of each engine log: the end, where the failure is

# Model families: the recipe name's prefix, most specific first. Finer than the corpus's own families (its
# "qwen" holds dense, MoE and hybrid-attention models; its "nemotronh" holds five model lines).
FAMILIES = (
    ("deepseek_v2", r"deepseek_v2"),
    ("deepseek_v3", r"deepseek_v3"),
    ("deepseek_v4", r"deepseek_v4"),
    ("gemma2", r"gemma2_"),
    ("gemma3", r"gemma3_"),
    ("glm", r"glm\d"),
    ("gpt_oss", r"gpt_oss_"),
    ("gpt", r"(gpt3_|vanilla_gpt_)"),
    ("llama2", r"llama2_"),
    ("llama3", r"llama3"),
    ("nemotron_3_5_lightning", r"nemotron_3_5_lightning"),
    ("nemotron_3_nano", r"nemotron_3_nano"),
    ("nemotron_3_super", r"nemotron_3_super"),
    ("nemotron_3_ultra", r"nemotron_3_ultra"),
    ("nemotron_nano_v2", r"nemotron_nano_\d+b_v2"),
    ("nemotronh", r"nemotronh_"),
    ("olmoe", r"olmoe_"),
    ("qwen3_vl", r"qwen3_vl_"),
    ("qwen35_vl", r"qwen35_vl_"),
    ("qwen35", r"qwen35_text_"),
    ("qwen3_next", r"qwen3_next_"),
    ("qwen3_moe", r"qwen3_\d+b_a\d+b_"),
    ("qwen3", r"qwen3_"),
    ("qwen2", r"qwen2"),
    ("wan", r"wan_"),
)

# The model families as users name them (the matrix's coverage is counted over these x mode): each recipe family
# above belongs to one. A family of FAMILIES missing here fails tests/test_bench_what_works.py.
FAMILY_GROUPS = {
    "Llama": ("llama2", "llama3"),
    "Qwen": ("qwen2", "qwen3", "qwen3_moe", "qwen3_next", "qwen35"),
    "Qwen-VL": ("qwen3_vl", "qwen35_vl"),
    "DeepSeek": ("deepseek_v2", "deepseek_v3", "deepseek_v4"),
    "GLM": ("glm",),
    "GPT-OSS": ("gpt_oss",),
    "Gemma": ("gemma2", "gemma3"),
    "OLMoE": ("olmoe",),
    "Nemotron-H / Nemotron 3": (
        "nemotronh",
        "nemotron_nano_v2",
        "nemotron_3_nano",
        "nemotron_3_super",
        "nemotron_3_ultra",
        "nemotron_3_5_lightning",
    ),
    "Wan": ("wan",),
    "GPT-3": ("gpt",),
}


def group_of(family: str | None) -> str | None:
    return next((g for g, members in FAMILY_GROUPS.items() if family in members), None)


# The Megatron FSDP settings enable writes, applied to an as-shipped PP layout for the last-stage probe.
FSDP_OVERRIDES = (
    "dist.use_megatron_fsdp=true",
    "ddp.use_megatron_fsdp=true",
    f"ddp.data_parallel_sharding_strategy={STRATEGY}",
    "ddp.average_in_collective=false",
    "checkpoint.ckpt_format=fsdp_dtensor",
)

# Labelled fallbacks, applied on the GPU machine only where the package the recipe asks for is missing.
# MoE: megatron-core's flex dispatcher needs DeepEP (deepep backend: deep_ep.Buffer) or its HybridEP
# (hybridep backend: deep_ep.HybridEPBuffer) (megatron/core/transformer/moe/fused_a2a.py, the module-level
# imports; token_dispatcher.py refuses with "DeepEP is not installed" / "HybridEP is not installed").
DISPATCHER_FALLBACK = "model.moe_token_dispatcher_type=alltoall"
# DSA: dsa_kernel_backend=cudnn/tilelang need fused kernels; megatron/core/utils.py ::
# _validate_dsa_kernel_backend_dependencies names "dsa_kernel_backend=none to use the PyTorch fallback".
DSA_FALLBACK = "model.dsa_kernel_backend=none"

# What a probe of the GPU machine's Python reports (printed as one JSON line).
PROBE = r"""
import importlib.util as u, json
out = {}
try:
    import deep_ep
    out["deep_ep"] = hasattr(deep_ep, "Buffer")
    out["hybrid_ep"] = hasattr(deep_ep, "HybridEPBuffer")
except Exception:
    out["deep_ep"] = out["hybrid_ep"] = False
out["mamba_ssm"] = u.find_spec("mamba_ssm") is not None
out["fla"] = u.find_spec("fla") is not None
out["flash_mla"] = u.find_spec("flash_mla") is not None
out["tilelang"] = u.find_spec("tilelang") is not None
print(json.dumps(out))
"""


# --------------------------------------------------------------------------------------------------- helpers


def stamp(msg: str) -> None:
    t = _dt.datetime.now(_dt.timezone.utc).strftime("%H:%M:%S")
    print(f"[bench_what_works {t}] {msg}", flush=True)


def family_of(recipe: str) -> str | None:
    for name, pattern in FAMILIES:
        if re.match(pattern, recipe):
            return name
    return None


def mode_of(recipe: str) -> str | None:
    """pretrain / sft / peft from the recipe's name (Bridge names every recipe function after its mode)."""
    m = re.search(r"_(pretrain|sft|peft)(_|$)", recipe)
    return m.group(1) if m else None


def named_world(recipe: str) -> int | None:
    m = re.search(r"_(\d+)gpu(_|$)", recipe)
    return int(m.group(1)) if m else None


def _get(d, path: str, default=None):
    for part in path.split("."):
        if not isinstance(d, dict):
            return default
        d = d.get(part)
    return default if d is None else d


def kinds_of(cfg: dict, family: str | None) -> list[str]:
    """What kind of job a recipe is, from its config's own fields (the matrix's columns of interest)."""
    model = cfg.get("model") or {}
    out = []
    if model.get("num_moe_experts"):
        out.append("moe")
    if model.get("multi_latent_attention"):
        out.append("mla")
    pattern = str(model.get("hybrid_layer_pattern") or model.get("hybrid_override_pattern") or "")
    if "M" in pattern:
        out.append("hybrid")
    target = str(model.get("_target_") or "")
    if "qwen_vl" in target or "VLModelProvider" in target:
        out.append("vlm")
    if "diffusion" in target:
        out.append("diffusion")
    if cfg.get("peft"):
        out.append("peft")
    mp = str(_get(cfg, "mixed_precision", "") if not isinstance(cfg.get("mixed_precision"), dict) else "")
    recipe_fp8 = _get(cfg, "mixed_precision.fp8") or model.get("fp8")
    if "fp8" in mp or recipe_fp8:
        out.append("fp8")
    return out


def layout_of(cfg: dict, world: int) -> dict:
    model = cfg.get("model") or {}
    tp = int(model.get("tensor_model_parallel_size") or 1)
    pp = int(model.get("pipeline_model_parallel_size") or 1)
    cp = int(model.get("context_parallel_size") or 1)
    ep = int(model.get("expert_model_parallel_size") or 1)
    mp = tp * pp * cp
    return {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "dp": world // mp if world % mp == 0 else None}


def load_yaml(path: Path) -> dict:
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    return data if isinstance(data, dict) else {}


def verdicts() -> dict[str, dict]:
    """The corpus's record per recipe, by YAML stem."""
    out = {}
    with open(CORPUS / "verdicts.jsonl", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec.get("yaml"):
                out[Path(rec["yaml"]).stem] = rec
    return out


def corpus_verdict(rec: dict) -> dict | None:
    """Bridge's verdict on enable's output for this recipe (at the named world when there was one)."""
    v = rec.get("verdicts") or {}
    for key in ("enabled_overrides_named", "enabled_overrides_pretrained", "enabled_overrides"):
        if key in v:
            return {"key": key, **v[key]}
    return None


def hf_config_args(rec: dict) -> list[str]:
    """``--hf-config ID=PATH`` for each Hugging Face id the recipe function reads (recipe route only)."""
    out = []
    for hf_id in rec.get("hf_ids") or []:
        model_id = hf_id.split("@", 1)[0]
        path = HF_CONFIGS / model_id / "config.json"
        if path.is_file():
            out += ["--hf-config", f"{model_id}={path}"]
    return out


def cli(*args: str, cwd: Path | None = None, timeout: int = 300) -> tuple[int, str, str]:
    p = subprocess.run(
        [sys.executable, str(MFSDP), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(cwd or ROOT),
        check=False,
    )
    if p.returncode not in (0, 1, 2):  # a crash of the tool itself is not a verdict: never record it as one
        raise RuntimeError(f"mfsdp.py {' '.join(args[:2])} exited {p.returncode}: {p.stderr.strip()[-500:]}")
    return p.returncode, p.stdout, p.stderr


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------------- choice


def _rank(stem: str, rec: dict) -> tuple:
    """Lower is more representative: a precision an H100/H200 runs (MXFP8 and NVFP4 are Blackwell's); Bridge
    accepts enable's output; a name whose GPU count the layout divides; an H100 recipe; bf16; no variant suffix
    (long context, deterministic, Muon, packed data); then the fewest GPUs (cheapest to rehearse)."""
    v = corpus_verdict(rec) or {}
    tail = re.sub(r"^.*?_(pretrain|sft|peft)", "", stem)
    tail = re.sub(r"_\d+gpu|_h100|_bf16|_\d+nodes|_mock", "", tail)
    world, world_min = named_world(stem), int((rec.get("layout") or {}).get("world_min") or 1)
    return (
        bool(re.search(BLACKWELL_ONLY, stem)),
        not v.get("ok", False),
        bool(world and world % world_min),
        bool(re.search(r"_(gb200|gb300|b200)", stem)),
        bool(re.search(r"_fp8", stem)),
        bool(tail),
        world is None,
        world or 0,
        stem,
    )


def choose(records: dict[str, dict]) -> list[tuple[str, str, str]]:
    """(family, mode, recipe stem) for each family and mode the corpus has, one representative each."""
    groups: dict[tuple[str, str], list[str]] = {}
    for stem, rec in records.items():
        if not (rec.get("build") or {}).get("ok"):
            continue
        fam, mode = family_of(stem), mode_of(stem)
        if fam and mode:
            groups.setdefault((fam, mode), []).append(stem)
    out = []
    for (fam, mode), stems in sorted(
        groups.items(), key=lambda kv: ([f for f, _ in FAMILIES].index(kv[0][0]), MODES.index(kv[0][1]))
    ):
        best = min(stems, key=lambda s: _rank(s, records[s]))
        out.append((fam, mode, best))
    return out


# --------------------------------------------------------------------------------------------------- CPU route


def _decisions(findings: list[dict], taken: list[str]) -> list[str]:
    """A user's answers to enable's refusals: PP first, then the batch at the new DP, never a key twice; the
    corpus tool's decisions (tests/recipes/enable_corpus.py), with this plan's PEFT base."""
    return enable_corpus._decisions(findings, taken, peft_base=PEFT_BASE)


def _check(path: Path, world: int, cwd: Path) -> dict:
    rc, out, err = cli("check", str(path), "--gpus", str(world), "--format", "json", cwd=cwd)
    rep = _json(out) or {}
    findings = rep.get("findings") or []
    return {
        "exit": rc,
        "errors": sorted({f["rule"] for f in findings if f.get("severity") == "error"}),
        "warnings": sorted({f["rule"] for f in findings if f.get("severity") == "warning"}),
        "infos": sorted({f["rule"] for f in findings if f.get("severity") == "info"}),
        **({"stderr": err.strip()[-500:]} if rc == 2 else {}),
    }


def enable_route(src: Path, world: int, out_yaml: Path, cwd: Path) -> dict:
    """``enable`` with a user's decisions (up to three rounds: each decision can reveal the next)."""
    extra: list[str] = []
    rep: dict = {}
    rc = None
    for _ in range(3):
        rc, out, _err = cli("enable", str(src), "--gpus", str(world), *extra, "--emit", "json", cwd=cwd)
        rep = _json(out) or {}
        errors = [f for f in rep.get("findings") or [] if f.get("severity") == "error"]
        more = _decisions(errors, extra) if rc != 0 else []
        if not more:
            break
        extra += more
    written = False
    if rc == 0:
        wrc, _o, _e = cli("enable", str(src), "--gpus", str(world), *extra, "-o", str(out_yaml), "--force", cwd=cwd)
        written = wrc == 0 and out_yaml.is_file()
    return {
        "args": extra,
        "exit": rc,
        "written": written,
        "changes": {c["path"]: c.get("new") for c in rep.get("changes") or []},
        "refused": sorted({f["rule"] for f in rep.get("findings") or [] if f.get("severity") == "error"}),
    }


def memory_route(path: Path, world: int, cwd: Path, overrides: list[str] | None = None) -> dict:
    """``memory`` of the enabled config at the job's world: the configured strategy's state and peak (GiB);
    ``overrides`` (KEY=VALUE) ask it about the job as a run changed it."""
    rc, out, err = cli(
        "memory",
        str(path),
        *(overrides or []),
        "--gpus",
        str(world),
        "--gpu-mem-gib",
        str(GPU_MEM_GIB),
        "--format",
        "json",
        cwd=cwd,
    )
    rep = _json(out)
    if not isinstance(rep, dict) or rep.get("ok") is False:  # unusable input: its JSON error object, or none
        return {"exit": rc, "error": (err or out).strip()[-400:]}
    rows = rep.get("strategies") or []
    row = next((r for r in rows if r.get("configured")), None) or next(
        (r for r in rows if r.get("name") == STRATEGY), None
    )
    if row is None:
        return {"exit": rc, "error": "memory printed no row for the configured strategy"}
    terms = (rep.get("model") or {}).get("params_by_term") or {}
    return {
        "exit": rc,
        "strategy": row.get("name"),
        "predicted_state": row.get("after_step_gib"),
        "predicted_peak": row.get("total_gib"),
        "params": (rep.get("model") or {}).get("params"),
        "expert_params": terms.get("experts"),
        "parallelism": rep.get("parallelism"),
    }


def dry_run(args: list[str], cwd: Path) -> dict:
    """``rehearse ... --dry-run``: the engine commands it would run (each as an argument list)."""
    rc, out, err = cli("rehearse", *args, "--dry-run", cwd=cwd)
    cmds = [shlex.split(line) for line in out.splitlines() if line.strip() and not line.startswith("#")]
    roles = [line[2:].strip() for line in out.splitlines() if line.startswith("# ")]
    return {"exit": rc, "commands": cmds, "roles": roles, **({"error": err.strip()[-400:]} if rc else {})}


def timing_overrides(cfg: dict, layout: dict, mem: dict, max_micro: int = MAX_TIMED_MICROBATCHES) -> list[str]:
    """A global batch of fewer micro-batches per data-parallel rank when the recipe's own would not fit a GPU call.

    The most micro-batches (at most ``max_micro``) whose estimated step keeps the row within ``ROW_CAP_S``;
    labelled in the row: the per-micro-batch compute is the job's, the optimizer step is shared by fewer
    micro-batches, so tokens/s is a little low (the safe side)."""
    mbs = int(_get(cfg, "train.micro_batch_size", 1) or 1)
    gbs = int(_get(cfg, "train.global_batch_size", 0) or 0)
    dp = layout.get("dp") or 1
    micro = gbs // (dp * mbs) if gbs else 1
    per_micro = micro_batch_seconds(cfg, mem, layout)
    want = max(1, min(micro, max_micro))
    while want > 1 and (WARMUP + TIMED) * want * per_micro > ROW_CAP_S - ROW_FIXED_S:
        want -= 1
    if gbs and want < micro:
        return [f"train.global_batch_size={dp * mbs * want}"]
    return []


def micro_batch_seconds(cfg: dict, mem: dict, layout: dict) -> float:
    """One micro-batch's forward and backward on this rank, from the model's FLOPs (a planning figure).

    Per token, this rank computes the dense part split by TP, plus the routed experts' share: with balanced
    routing a rank's experts receive top-k x its tokens' worth of expert work, whatever EP is."""
    model = cfg.get("model") or {}
    params = float(mem.get("params") or 0)
    experts = float(mem.get("expert_params") or 0)
    n_exp = int(model.get("num_moe_experts") or 0)
    topk = int(model.get("moe_router_topk") or 0)
    tp = layout.get("tp") or 1
    active = (params - experts) / tp + (experts / n_exp * topk if n_exp else 0)
    seq = int(_get(cfg, "dataset.seq_length", 0) or model.get("seq_length") or 4096)
    cp = layout.get("cp") or 1
    mbs = int(_get(cfg, "train.micro_batch_size", 1) or 1)
    recompute = RECOMPUTE_FACTOR if model.get("recompute_granularity") == "full" else 1.0
    rate = (EFFECTIVE_TFLOPS_MOE if n_exp else EFFECTIVE_TFLOPS) * 1e12
    return 6.0 * active * seq / cp * mbs * recompute / rate


def needs_of(cfg: dict) -> dict:
    model = cfg.get("model") or {}
    dispatcher = model.get("moe_token_dispatcher_type")
    backend = model.get("moe_flex_dispatcher_backend")
    pattern = str(model.get("hybrid_layer_pattern") or model.get("hybrid_override_pattern") or "")
    dsa = model.get("dsa_kernel_backend")
    return {
        "mamba_ssm": "M" in pattern,
        "moe_dispatcher": f"flex/{backend}" if dispatcher == "flex" and model.get("num_moe_experts") else None,
        "dsa_kernels": dsa if dsa and dsa != "none" else None,
        # gated delta net layers import flash-linear-attention (mfsdp_gpu.kernels.GDN_MODULE): fla-core's wheel
        "fla": model.get("experimental_attention_variant") == "gated_delta_net",
        # Bridge's full Transformer Engine layer spec builds its final norm as Apex's fused layer norm
        # (mfsdp_gpu.kernels.FULL_TE_SPEC_KEY: why)
        "apex": model.get("use_transformer_engine_full_layer_spec") is True,
    }


def estimate_gpu_s(cfg: dict, mem: dict, layout: dict, needs: dict, save_load: bool, timed_gbs: int | None) -> int:
    """Seconds this row holds the GPU (a planning figure: see ``micro_batch_seconds``)."""
    mbs = int(_get(cfg, "train.micro_batch_size", 1) or 1)
    dp = layout.get("dp") or 1
    gbs = timed_gbs or int(_get(cfg, "train.global_batch_size", mbs * dp) or mbs * dp)
    micro = max(1, gbs // (dp * mbs))
    if not mem.get("params"):
        t = float(ROW_UNKNOWN_S)
    else:
        t = ROW_FIXED_S + (WARMUP + TIMED) * micro * micro_batch_seconds(cfg, mem, layout)
    if save_load:
        t += SAVE_LOAD_S + SAVE_LOAD_S_PER_GIB * float(mem.get("predicted_state") or 0.0)
    return int(math.ceil(t))


def diffusion_outcome(cfg: dict) -> dict | None:
    """A diffusion row: Wan models run Bridge's WanForwardStep on Bridge's Wan mock data (the engine's
    ``mfsdp_gpu.workload``), so they go on to the memory check like any row (None), with a note of the latent
    tokens the mock feeds; any other diffusion model still meets the GPT step it cannot run."""
    model = cfg.get("model") or {}
    if model.get("_target_") != workload.WAN_PROVIDER:
        return {
            "outcome": "fails (rehearsal limit)",
            "why": "the rehearsal drives Bridge's GPT forward step for every model but Wan "
            f"({workload.WAN_STEP}); this diffusion model trains with its own step and data",
        }
    return None


def diffusion_note(cfg: dict) -> str | None:
    """What a Wan row's rehearsal runs, and how its mock batch compares with the sequence memory assumed."""
    model = cfg.get("model") or {}
    if model.get("_target_") != workload.WAN_PROVIDER:
        return None
    data = cfg.get("dataset") or {}
    fields = {k: int(data.get(k) or workload.WAN_MOCK_DEFAULTS[k]) for k in workload.WAN_MOCK_SHAPE_FIELDS}
    tokens = workload.wan_latent_tokens(fields)
    seq = model.get("seq_length")
    note = (
        f"Wan: Bridge's WanForwardStep on its own Wan mock data, {tokens} latent tokens per micro-batch "
        f"({fields['F_latents']}x{fields['H_latents']}x{fields['W_latents']} latents, patches "
        f"{fields['patch_temporal']}x{fields['patch_spatial']}x{fields['patch_spatial']}); no tokens/s for diffusion"
    )
    if isinstance(seq, int) and tokens > seq:
        note += f"; memory's prediction counts model.seq_length={seq} tokens, fewer than the mock feeds"
    return note


def expected_outcome(row: dict, rec: dict, cfg: dict) -> dict:
    """What the row is expected to do on the GPU, and why (from the CPU route and Bridge's recorded verdict)."""
    v = corpus_verdict(rec) or {}
    if not row["enable"]["written"]:
        return {"outcome": "refused by enable", "why": "enable still refuses: " + ", ".join(row["enable"]["refused"])}
    if row["check_after"]["errors"]:
        return {"outcome": "refused by check", "why": "check after enable: " + ", ".join(row["check_after"]["errors"])}
    if not v.get("ok", True):
        err = str(v.get("error") or "").splitlines()[0][:200]
        if "dsa_kernel_backend" in err:
            return {"outcome": "passes with the DSA fallback", "why": f"Bridge on the recording machine: {err}"}
        return {
            "outcome": "fails at validate",
            "why": f"Bridge's verdict on enable's output: {v.get('error_type')}: {err}",
        }
    if "diffusion" in row["kinds"]:
        diffusion = diffusion_outcome(cfg)
        if diffusion is not None:
            return diffusion
    if re.search(BLACKWELL_ONLY, row["id"]):
        return {"outcome": "fails (hardware)", "why": "MXFP8/NVFP4 training needs a Blackwell GPU"}
    peak = row["memory_gib"]["predicted_peak"]
    if isinstance(peak, (int, float)) and peak > FITS_FRACTION * GPU_MEM_GIB:
        return {"outcome": "does not fit one H200", "why": f"memory predicts a peak of {peak} GiB for one rank"}
    notes = []
    if row["needs"]["mamba_ssm"]:
        notes.append("needs mamba-ssm on the GPU machine")
    if row["needs"].get("fla"):
        notes.append("needs flash-linear-attention (fla-core) on the GPU machine")
    if row["needs"].get("apex"):
        notes.append("needs Apex's fused layer norm on the GPU machine (the full Transformer Engine layer spec)")
    if row["needs"]["moe_dispatcher"]:
        notes.append(f"the recipe's {row['needs']['moe_dispatcher']} dispatcher needs DeepEP; without it, all-to-all")
    if row["memory_gib"]["predicted_peak"] is None:
        notes.append(
            "memory gives no prediction: " + str(row["memory_route"].get("error", "")).split("error: ")[-1][:160]
        )
    if diffusion_note(cfg):
        notes.append(str(diffusion_note(cfg)))
    if "vlm" in row["kinds"]:
        notes.append(
            "vision-language: mock text-only batches through the GPT step (the vision tower is built, not fed)"
        )
    return {"outcome": "passes", "why": "; ".join(notes) or "check exits 0 after enable and Bridge validates it"}


def plan_row(fam: str, mode: str, stem: str, rec: dict, work: Path) -> dict:
    """One row of the plan: the whole CPU route for one recipe."""
    src = CORPUS / "yaml" / f"{stem}.yaml"
    cfg = load_yaml(src)
    world_named = named_world(stem)
    world = world_named or int((rec.get("layout") or {}).get("world_min") or 1)
    rowdir = work / stem
    rowdir.mkdir(parents=True, exist_ok=True)
    enabled = rowdir / "enabled.yaml"
    row: dict = {
        "id": stem,
        "recipe": rec.get("recipe") or f"{stem}_config",
        "function": rec.get("function"),
        "family": fam,
        "corpus_family": rec.get("family"),
        "mode": mode,
        "kinds": kinds_of(cfg, fam),
        "fingerprint": list(what_works.fingerprint(cfg) or []) or None,
        "world_size": world,
        "world_source": "the recipe's name" if world_named else "the smallest world the recipe's layout allows",
        "layout_before": layout_of(cfg, world),
    }
    row["check_before"] = _check(src, world, rowdir)
    row["enable"] = enable_route(src, world, enabled, rowdir)
    ecfg = load_yaml(enabled) if row["enable"]["written"] else cfg
    row["layout_after"] = layout_of(ecfg, world) if row["enable"]["written"] else None
    row["check_after"] = _check(enabled, world, rowdir) if row["enable"]["written"] else None
    row["changes"] = row["enable"]["changes"]
    mem = memory_route(enabled, world, rowdir) if row["enable"]["written"] else {"error": "nothing enabled"}
    row["memory_route"] = {k: v for k, v in mem.items() if k not in ("predicted_state", "predicted_peak")}
    row["phases"] = dict.fromkeys(PHASES, "not run")
    row["first_error"] = None
    row["memory_gib"] = {
        "predicted_state": mem.get("predicted_state"),
        "measured_state": None,
        "predicted_peak": mem.get("predicted_peak"),
        "measured_peak": None,
    }
    row["tokens_per_s_per_gpu"] = None
    row["predicted_tokens_per_s_per_gpu"] = {"low": None, "high": None}
    row["needs"] = needs_of(ecfg)
    # the rehearsal's source: enable's YAML where Bridge rebuilt it from YAML on the recording machine; else the
    # recipe function with enable's changes as overrides (from_yaml cannot rebuild PEFT configs: a set in
    # peft.params_to_save is not an OmegaConf value)
    rebuilt = ((rec.get("verdicts") or {}).get("enabled_rebuilt") or {}).get("ok")
    via_recipe = bool(rebuilt is False and "peft" in row["kinds"])
    row["rehearsal_overrides"] = timing_overrides(ecfg, row["layout_after"] or row["layout_before"], mem)
    row["probe_overrides"] = timing_overrides(cfg, row["layout_before"], mem, max_micro=1)
    row["expected"] = expected_outcome(row, rec, cfg)
    row["source"] = {
        "kind": "recipe" if via_recipe else "yaml",
        "why": "ConfigContainer.from_yaml cannot rebuild this config (peft.params_to_save holds a set): the recipe "
        "function with enable's changes as KEY=VALUE"
        if via_recipe
        else "enable's YAML",
    }
    row["save_load"] = False  # set per family below
    row["pp_probe"] = None
    return row


def engine_args(row: dict, yaml_path: Path, out_dir: Path, python: str, fallbacks: list[str]) -> list[str]:
    """``rehearse`` arguments for the enabled job as rank 0 of its world (without --dry-run)."""
    if row["source"]["kind"] == "recipe":
        fn = row["function"] or ""
        mod, _, name = fn.rpartition(".")
        src = ["--recipe", f"{mod}:{name}", *[f"{k}={_cli_value(v)}" for k, v in row["changes"].items()]]
        for item in hf_config_args_for(row):
            src += ["--hf-config", item]
    else:
        src = [str(yaml_path)]
    args = [*src, "--world-size", str(row["world_size"]), "--rank-position", "0", "--perf"]
    args += ["--warmup", str(WARMUP), "--iters", str(TIMED), "--python", python, "--out", str(out_dir)]
    if row["save_load"]:
        args.append("--save-load")
    return args + fallbacks + list(row["rehearsal_overrides"])


def probe_args(row: dict, src_yaml: Path, out_dir: Path, python: str, fallbacks: list[str]) -> list[str]:
    """The as-shipped PP layout with Megatron FSDP's settings, as the first rank of the last pipeline stage."""
    args = [str(src_yaml), *FSDP_OVERRIDES, "--world-size", str(row["world_size"]), "--rank-position", "last"]
    args += ["--iters", str(WARMUP + TIMED), "--python", python, "--out", str(out_dir)]
    return args + fallbacks + list(row.get("probe_overrides") or [])


def hf_config_args_for(row: dict) -> list[str]:
    """The row's ``--hf-config`` arguments with the repository's configs at their path on this machine."""
    out = []
    for item in row.get("hf_config_args") or []:
        model_id, sep, path = item.partition("=")
        out.append(f"{model_id}={ROOT / path}" if sep and not os.path.isabs(path) else item)
    return out


def _cli_value(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def relative_commands(cmds: list[list[str]], mapping: dict[str, str]) -> list[str]:
    """Commands as text with this machine's folders replaced by placeholders (the plan is machine-free)."""
    out = []
    for cmd in cmds:
        text = shlex.join(cmd)
        for old in sorted(mapping, key=len, reverse=True):
            text = text.replace(old, mapping[old])
        out.append(text)
    return out


# The order rows reach the GPU: first the kinds users ask about most and the tools know least (MoE with EP,
# MLA, hybrid Mamba, vision-language, PEFT), then the dense families, then the rehearsal's known limits.
BATCH_ORDER = (
    "qwen3_moe",
    "deepseek_v3",
    "olmoe",
    "gpt_oss",
    "nemotron_3_nano",
    "nemotronh",
    "qwen3_vl",
    "llama3",
    "glm",
    "deepseek_v2",
    "qwen3_next",
    "qwen35",
    "qwen35_vl",
    "nemotron_3_5_lightning",
    "nemotron_3_super",
    "nemotron_3_ultra",
    "nemotron_nano_v2",
    "qwen3",
    "qwen2",
    "gemma2",
    "gemma3",
    "llama2",
    "gpt",
    "deepseek_v4",
    "wan",
)


def batch_priority(row: dict) -> tuple:
    fam = row["family"]
    return (BATCH_ORDER.index(fam) if fam in BATCH_ORDER else len(BATCH_ORDER), MODES.index(row["mode"]))


def make_batches(rows: list[dict], budget_s: int = BATCH_BUDGET_S) -> list[dict]:
    """Rows in plan order, packed into batches whose GPU time plus one unhidden import fits ``budget_s``.

    Rows expected not to run on the GPU (refused by enable or check, or not fitting one H200) go nowhere.
    A row too long for any batch gets a batch of its own (its timeout is then the budget)."""
    batches: list[dict] = []
    cur: list[str] = []
    cur_s = IMPORT_S
    mamba = False  # the batch already pays the Mamba kernels' first compile
    for row in rows:
        if not row.get("gpu_run"):
            continue
        t = int(row["estimate_gpu_s"]) + int((row.get("pp_probe") or {}).get("estimate_gpu_s") or 0)
        first_mamba = bool(row["needs"].get("mamba_ssm")) and not mamba
        if cur and cur_s + t + (MAMBA_FIRST_S if first_mamba else 0) > budget_s:
            batches.append({"batch": len(batches) + 1, "rows": cur, "estimated_s": cur_s})
            cur, cur_s, mamba = [], IMPORT_S, False
            first_mamba = bool(row["needs"].get("mamba_ssm"))
        cur.append(row["id"])
        cur_s += t + (MAMBA_FIRST_S if first_mamba else 0)
        mamba = mamba or first_mamba
    if cur:
        batches.append({"batch": len(batches) + 1, "rows": cur, "estimated_s": cur_s})
    return batches


def build_plan(work: Path, only: list[str] | None = None, jobs: int = 2) -> dict:
    records = verdicts()
    chosen = choose(records)
    if only:
        chosen = [c for c in chosen if c[2] in only]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        rows = list(pool.map(lambda c: plan_row(c[0], c[1], c[2], records[c[2]], work), chosen))
    for row in rows:
        hf = hf_config_args(records[row["id"]]) if row["source"]["kind"] == "recipe" else []
        row["hf_config_args"] = [a.replace(str(ROOT) + "/", "") for a in hf if a != "--hf-config"]
    # one save/load row per family: the family's row predicted to need the least memory, among those expected
    # to pass; one PP probe per family: its first row whose recipe ships with PP > 1
    by_family: dict[str, list[dict]] = {}
    for row in rows:
        by_family.setdefault(row["family"], []).append(row)
    for fam_rows in by_family.values():
        ok = [r for r in fam_rows if r["expected"]["outcome"].startswith("passes")]
        if ok:
            min(ok, key=lambda r: r["memory_gib"]["predicted_peak"] or 1e9)["save_load"] = True
        pp = [r for r in fam_rows if (r["layout_before"]["pp"] or 1) > 1 and r["source"]["kind"] == "yaml"]
        if pp:
            pp[0]["pp_probe"] = {"rank_position": "last", "expected": "fails at model_wrap (MFSDP-PIPELINE-PARALLEL)"}
    for row in rows:
        row["gpu_run"] = row["expected"]["outcome"] not in (
            "refused by enable",
            "refused by check",
            "does not fit one H200",
        )
        timed_gbs = None
        for o in row["rehearsal_overrides"]:
            if o.startswith("train.global_batch_size="):
                timed_gbs = int(o.split("=", 1)[1])
        cfg = load_yaml(work / row["id"] / "enabled.yaml") if row["enable"]["written"] else {}
        mem = {**row["memory_route"], **row["memory_gib"]}
        if not mem.get("params"):  # the GPU-time estimate only: the same model's count from another mode's row
            twin = next(
                (r for r in rows if r["fingerprint"] == row["fingerprint"] and r["memory_route"].get("params")), None
            )
            if twin is not None:
                mem.update(
                    params=twin["memory_route"]["params"], expert_params=twin["memory_route"].get("expert_params")
                )
        early = row["expected"]["outcome"] in ("fails at validate", "fails (hardware)")
        row["estimate_gpu_s"] = (
            EARLY_FAIL_S
            if early
            else estimate_gpu_s(
                cfg, mem, row["layout_after"] or row["layout_before"], row["needs"], row["save_load"], timed_gbs
            )
        )
        if row["pp_probe"]:
            row["pp_probe"]["estimate_gpu_s"] = ROW_FIXED_S
        # the engine commands, from rehearse --dry-run (paths made machine-free)
        rowdir = work / row["id"]
        fb = fallbacks_for(row, {"deep_ep": False, "hybrid_ep": False, "flash_mla": False, "tilelang": False})
        row["fallbacks_if_missing"] = fb
        dr = dry_run(engine_args(row, rowdir / "enabled.yaml", rowdir / "rehearse", "python3", fb), rowdir)
        mapping = {str(rowdir): "$OUT/rows/" + row["id"], str(ROOT) + "/": ""}
        row["dry_run"] = {
            "exit": dr["exit"],
            "roles": dr["roles"],
            "commands": relative_commands(dr["commands"], mapping),
        }
        if dr.get("error"):
            row["dry_run"]["error"] = dr["error"]
        if row["pp_probe"]:
            src = CORPUS / "yaml" / f"{row['id']}.yaml"
            pr = dry_run(probe_args(row, src, rowdir / "pp_probe", "python3", fb), rowdir)
            row["pp_probe"]["dry_run"] = {
                "exit": pr["exit"],
                "roles": pr["roles"],
                "commands": relative_commands(pr["commands"], mapping),
            }
        row["memory_route"].pop("parallelism", None)
    batches = make_batches(sorted(rows, key=batch_priority))
    for b in batches:
        for rid in b["rows"]:
            next(r for r in rows if r["id"] == rid)["batch"] = b["batch"]
    return {
        "schema": PLAN_SCHEMA,
        "generated_by": "python3 benchmarks/bench_what_works.py --plan",
        "corpus": "tests/fixtures/recipes (Megatron-Bridge 0.6.2 recipe dumps)",
        "corpus_digest": corpus_digest(),
        "gpu": {"kind": "1x H200", "memory_gib": GPU_MEM_GIB},
        "route": [
            "check RECIPE.yaml --gpus N",
            "enable RECIPE.yaml --gpus N [--set-pp-1] [decisions] -o ENABLED.yaml",
            "check ENABLED.yaml --gpus N",
            f"memory ENABLED.yaml --gpus N --gpu-mem-gib {GPU_MEM_GIB}",
            f"rehearse ENABLED.yaml --world-size N --rank-position 0 --perf --warmup {WARMUP} --iters {TIMED} "
            "[--save-load] [fallbacks] [timing batch]",
        ],
        "estimates": {
            "basis": f"planning figures, not measurements: {EFFECTIVE_TFLOPS:.0f} TFLOP/s effective, "
            f"{ROW_FIXED_S} s fixed per row, {SAVE_LOAD_S} s per save/load, {MAMBA_FIRST_S} s for Mamba kernels' "
            f"first compile, one {IMPORT_S} s import per batch; batch budget {BATCH_BUDGET_S} s",
        },
        "batches": batches,
        "rows": rows,
    }


def fallbacks_for(row: dict, probe: dict) -> list[str]:
    """The labelled fallbacks this row needs on a machine whose optional packages are ``probe``."""
    out = []
    disp = row["needs"].get("moe_dispatcher")
    if disp:
        backend = disp.split("/", 1)[1]
        have = probe.get("hybrid_ep") if backend == "hybridep" else probe.get("deep_ep")
        if not have:
            out.append(DISPATCHER_FALLBACK)
    dsa = row["needs"].get("dsa_kernels")
    if dsa:
        have = probe.get("flash_mla") if dsa == "cudnn" else probe.get("tilelang")
        if not have:
            out.append(DSA_FALLBACK)
    return out


def corpus_digest() -> str:
    h = hashlib.sha256()
    for p in sorted((CORPUS / "yaml").glob("*.yaml")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------------------------------- GPU run


def probe_machine(python: str) -> dict:
    try:
        p = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False)
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def prepare_row(row: dict, out: Path, python: str, probe: dict) -> dict:
    """The CPU route again on this machine, and the engine runs of this row (argument lists)."""
    rowdir = out / "rows" / row["id"]
    rowdir.mkdir(parents=True, exist_ok=True)
    src = CORPUS / "yaml" / f"{row['id']}.yaml"
    enabled = rowdir / "enabled.yaml"
    en = enable_route(src, row["world_size"], enabled, rowdir)
    fb = fallbacks_for(row, probe)
    prep = {
        "enable": en,
        "stale": en["changes"] != row["changes"] or en["args"] != row["enable"]["args"],
        "fallbacks": fb,
        "runs": [],
    }
    if row["source"]["kind"] == "yaml" and not en["written"]:
        prep["error"] = "enable wrote nothing on this machine"
        return prep
    dr = dry_run(engine_args(row, enabled, rowdir / "rehearse", python, fb), rowdir)
    for role, cmd in zip(dr["roles"], dr["commands"], strict=False):
        prep["runs"].append({"name": "rehearse", "role": role, "command": cmd, "dir": cmd[cmd.index("--out") + 1]})
    if row.get("pp_probe"):
        pr = dry_run(probe_args(row, src, rowdir / "pp_probe", python, fb), rowdir)
        for role, cmd in zip(pr["roles"], pr["commands"], strict=False):
            prep["runs"].append({"name": "pp_probe", "role": role, "command": cmd, "dir": cmd[cmd.index("--out") + 1]})
    if dr.get("error"):
        prep["error"] = dr["error"]
    return prep


def lock_path(out: Path, slot: int, slots: int) -> Path:
    """The GPU lock of one slot: ``gpu.lock`` when there is one slot (timed rows), ``gpu.lock.K`` otherwise."""
    return out / "gpu.lock" if slots <= 1 else out / f"gpu.lock.{slot}"


def child_env(out: Path, slot: int = 0, slots: int = 1) -> dict:
    """The engines' environment. With ``slots`` > 1 (untimed runs, such as the recommended overrides) run i takes
    lock ``i % slots``, so up to ``slots`` engines hold the GPU at once; an engine then does not wait for the
    others' memory to be freed when it takes its lock (they are alive, not exiting)."""
    from mfsdp_gpu.perf import GPU_FREE_MARGIN_ENV, GPU_LOCK_ENV

    env = dict(os.environ)
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)  # Megatron FSDP needs it unset or > 1
    env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="2", HF_HUB_OFFLINE="1")
    env[GPU_LOCK_ENV] = str(lock_path(out, slot, slots))
    if slots > 1:
        env[GPU_FREE_MARGIN_ENV] = "inf"
    return env


def tail_file(path: Path, limit: int = LOG_TAIL_BYTES) -> None:
    """Keep only the last ``limit`` bytes of a log (what comes back from the GPU machine is small)."""
    try:
        size = path.stat().st_size
    except OSError:
        return
    if size <= limit:
        return
    with open(path, "rb") as fh:
        fh.seek(size - limit)
        data = fh.read()
    path.write_bytes(b"[... %d bytes cut ...]\n" % (size - limit) + data)


def summarize_run(run: dict, links) -> dict:
    """The ``rehearse --format json`` summary of one engine run (the library the CLI itself uses)."""
    from mfsdp_lib.runs import rehearse as rh

    return rh.summarize([(run["dir"], run["role"])], command=[rh.quoted(run["command"])], links=links)


def lock_window(run_dir: str) -> dict | None:
    """The lock this run took (the engine records it in its report; it takes it after validate and holds it until
    it exits, so no two runs' builds, wraps or timed steps overlap) and the run's start and end."""
    try:
        rep = json.loads((Path(run_dir) / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {
        "gpu_lock": rep.get("gpu_lock"),
        "last_phase": last_phase(rep),
        "started_utc": rep.get("started_utc"),
        "finished_utc": rep.get("finished_utc"),
    }


# The engine's phases before it takes the GPU lock (scripts/mfsdp_gpu/rehearse.py takes it right after validate):
# a run that ended in one of them built, wrapped and timed nothing, so it cannot have overlapped a timed run.
PHASES_BEFORE_LOCK = ("initialize_process_group", "import", "config", "validate")


def last_phase(report: dict) -> str | None:
    """The last phase the engine's report names (its phases are written in the order they ran)."""
    phases = report.get("phases")
    if isinstance(phases, dict) and phases:
        return str(list(phases)[-1])
    return None


def run_engines(runs: list[dict], out: Path, budget_s: int, max_concurrent: int, gpu_slots: int = 1) -> list[dict]:
    """Run engine commands (``{name, role, dir, command}``), at most ``max_concurrent`` alive, within the budget.

    Each starts in its own process group with ``MFSDP_GPU_LOCK`` set, so imports overlap while one engine at a
    time holds the GPU (``gpu_slots`` at a time for untimed runs: see :func:`child_env`); a run still alive at
    the deadline is stopped (its group: no engine outlives the call), and runs not started by then are recorded
    as such. Returns one record per run, in the order given."""
    deadline = time.time() + budget_s
    envs = [child_env(out, k, gpu_slots) for k in range(max(1, gpu_slots))]
    queue = list(enumerate(runs))
    running: list[tuple[int, dict, subprocess.Popen, float]] = []
    records: list[dict] = [{} for _ in runs]
    while queue or running:
        now = time.time()
        while queue and len(running) < max_concurrent and now < deadline - START_MARGIN_S:
            i, run = queue.pop(0)
            Path(run["dir"]).mkdir(parents=True, exist_ok=True)
            log = open(Path(run["dir"]) / "log.txt", "w", encoding="utf-8")  # noqa: SIM115 (the child holds it)
            proc = subprocess.Popen(
                run["command"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=envs[i % len(envs)],
                cwd=str(ROOT),
                start_new_session=True,
            )
            log.close()
            running.append((i, run, proc, time.time()))
            stamp(f"{run.get('id', '')} {run['name']}: started (pid {proc.pid})")
            time.sleep(STAGGER_S)
            now = time.time()
        for item in list(running):
            i, run, proc, started = item
            rc = proc.poll()
            why = None
            if rc is None and time.time() > deadline:
                why = "budget"
                stamp(f"{run.get('id', '')} {run['name']}: stopping (budget)")
                stop_group(proc)
                rc = proc.poll()
                rc = -9 if rc is None else rc
            if rc is None:
                continue
            running.remove(item)
            records[i] = {
                "name": run["name"],
                "role": run["role"],
                "command": shlex.join(run["command"]),
                "exit": rc,
                "wall_s": round(time.time() - started, 1),
                "stopped": why,
                "window": lock_window(run["dir"]),
                "dir": os.path.relpath(run["dir"], out),
            }
            stamp(f"{run.get('id', '')} {run['name']}: exit {rc} after {time.time() - started:.0f} s")
        if queue and time.time() >= deadline - START_MARGIN_S:
            for i, run in queue:
                records[i] = {"name": run["name"], "role": run["role"], "exit": None, "stopped": "not started: budget"}
            queue = []
        time.sleep(0.5)
    for k in range(max(1, gpu_slots)):
        lock_path(out, k, gpu_slots).unlink(missing_ok=True)
    return records


def run_batch(plan: dict, batch: int, out: Path, python: str, budget_s: int, max_concurrent: int) -> dict:
    spec = next((b for b in plan["batches"] if b["batch"] == batch), None)
    if spec is None:
        raise SystemExit(f"bench_what_works: no batch {batch} in the plan (it has {len(plan['batches'])})")
    out.mkdir(parents=True, exist_ok=True)
    rows = [next(r for r in plan["rows"] if r["id"] == rid) for rid in spec["rows"]]
    t0 = time.time()
    probe = probe_machine(python)
    stamp(f"batch {batch}: {len(rows)} rows, budget {budget_s} s; optional packages: {probe}")
    preps = {}
    runs: list[dict] = []
    for row in rows:
        try:
            prep = prepare_row(row, out, python, probe)
        except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:  # one row never stops the batch
            (out / "rows" / row["id"]).mkdir(parents=True, exist_ok=True)
            prep = {"error": f"{type(exc).__name__}: {exc}"[:500], "stale": None, "fallbacks": [], "runs": []}
        preps[row["id"]] = prep
        if prep["stale"]:
            stamp(f"{row['id']}: enable's changes differ from the plan's (recorded as stale)")
        runs += [{"id": row["id"], **run} for run in prep["runs"]]
    records = run_engines(runs, out, int(budget_s - (time.time() - t0)), max_concurrent)
    from mfsdp_lib.perf import predict as perf_predict

    links = perf_predict.Links(perf_predict.DGX_NVLINK_GBPS, perf_predict.DGX_IB_GBPS, perf_predict.DGX_GPUS_PER_NODE)
    for run, rec in zip(runs, records, strict=True):
        if rec.get("exit") is not None:
            rec["summary"] = summarize_run(run, links)
            tail_file(Path(run["dir"]) / "log.txt")
    for row in rows:
        prep = preps[row["id"]]
        raw = {
            "schema": RAW_SCHEMA,
            "id": row["id"],
            "batch": batch,
            "plan_digest": plan.get("corpus_digest"),
            "probe": probe,
            "prepare": {k: v for k, v in prep.items() if k != "runs"},
            "runs": [rec for run, rec in zip(runs, records, strict=True) if run["id"] == row["id"]],
        }
        (out / "rows" / row["id"] / "row.json").write_text(json.dumps(raw, indent=1) + "\n", encoding="utf-8")
    summary = {
        "schema": RAW_SCHEMA,
        "batch": batch,
        "started_utc": _dt.datetime.fromtimestamp(t0, _dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(time.time() - t0, 1),
        "budget_s": budget_s,
        "max_concurrent": max_concurrent,
        "probe": probe,
        "rows": spec["rows"],
        "timing_exclusive": timing_exclusive(records),
    }
    (out / "batch.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    stamp(f"batch {batch} done in {summary['wall_s']:.0f} s; raw files in {out}")
    return summary


def timing_exclusive(runs: list[dict]) -> bool | None:
    """True when every run that used the GPU held the same GPU lock (so their builds, wraps and timed steps never
    overlapped). A run that took no lock and ended before the lock is taken (``PHASES_BEFORE_LOCK``: a recipe that
    fails Bridge's validate, a pipeline probe) used no GPU time and does not count; a run that took no lock and got
    further (or left no report) does, and makes the batch not exclusive."""
    started = [r for r in runs if r.get("exit") is not None]
    on_gpu = [
        r
        for r in started
        if (r.get("window") or {}).get("gpu_lock")
        or (r.get("window") or {}).get("last_phase") not in PHASES_BEFORE_LOCK
    ]
    if not on_gpu:
        return None
    locks = {(r.get("window") or {}).get("gpu_lock") for r in on_gpu}
    return len(locks) == 1 and None not in locks


# --------------------------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--plan", action="store_true", help="write the plan (CPU only)")
    mode.add_argument("--run", action="store_true", help="run one batch of the plan on this machine's GPU")
    mode.add_argument("--list", action="store_true", help="print the plan's batches and rows")
    ap.add_argument("--plan-file", default=str(PLAN_PATH), help="the plan (default: %(default)s)")
    ap.add_argument("--batch", type=int, help="--run: the batch number")
    ap.add_argument(
        "--rows", default=None, help="--run: comma-separated row ids instead of a batch (rows a batch left)"
    )
    ap.add_argument("--out", help="--run: a new folder for the raw files")
    ap.add_argument("--only", default=None, help="--plan: comma-separated recipe stems (a partial plan, for tests)")
    ap.add_argument("--work", default=None, help="--plan: folder for the enabled YAMLs (default: a temporary one)")
    # the engines' budget; a 600 s call also holds the probe, the CPU route and the summaries
    ap.add_argument("--budget-s", type=int, default=BATCH_BUDGET_S + 30)
    ap.add_argument("--max-concurrent", type=int, default=MAX_CONCURRENT)
    ap.add_argument("--python", default=sys.executable, help="--run: the interpreter with Megatron-Bridge")
    a = ap.parse_args(argv)
    if a.plan:
        with tempfile.TemporaryDirectory(prefix="what-works-") as tmp:
            work = Path(a.work or tmp)
            plan = build_plan(work, only=a.only.split(",") if a.only else None)
        Path(a.plan_file).write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")
        stamp(f"{len(plan['rows'])} rows, {len(plan['batches'])} batches -> {a.plan_file}")
        return 0
    plan = json.loads(Path(a.plan_file).read_text(encoding="utf-8"))
    if plan.get("schema") != PLAN_SCHEMA:
        raise SystemExit(f"bench_what_works: {a.plan_file} is not a plan ({PLAN_SCHEMA})")
    if a.list:
        for b in plan["batches"]:
            print(f"batch {b['batch']}: about {b['estimated_s']} s: {', '.join(b['rows'])}")
        skipped = [r["id"] for r in plan["rows"] if not r.get("gpu_run")]
        if skipped:
            print(f"not run on the GPU: {', '.join(skipped)}")
        return 0
    if (a.batch is None) == (a.rows is None) or not a.out:
        ap.error("--run needs --batch K (or --rows ID,...) and --out DIR")
    out = Path(a.out).resolve()
    if out.exists() and any(out.iterdir()):
        ap.error(f"--out {a.out}: exists and is not empty")
    if a.rows is not None:
        ids = [x for x in a.rows.split(",") if x]
        unknown = [x for x in ids if x not in {r["id"] for r in plan["rows"]}]
        if unknown:
            ap.error(f"--rows: not in the plan: {', '.join(unknown)}")
        plan = {**plan, "batches": [{"batch": 0, "rows": ids, "estimated_s": None}]}
        a.batch = 0
    run_batch(plan, a.batch, out, a.python, a.budget_s, a.max_concurrent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
