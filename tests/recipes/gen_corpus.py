#!/usr/bin/env python3
"""Build every Megatron-Bridge recipe for real and record what Bridge says about it, with and without Megatron FSDP.

Run where Megatron-Bridge imports (a CUDA machine with Transformer Engine). For each recipe function that
``megatron.bridge.recipes`` exports, the script

1. calls it with its default arguments and writes ``ConfigContainer.to_yaml()`` (absolute paths of the
   machine rewritten to ``/workspace/...``) as ``yaml/<recipe>.yaml``;
2. records Bridge's own verdict - ``runtime_config_update()`` (environment defaults, mixed precision,
   data-parallel size, comm overlap, ``ConfigContainer.validate()``) on a deep copy - for
   ``as_shipped``: the recipe as it is;
   ``fsdp_keep_load``: plus the five Megatron FSDP settings (dist/ddp.use_megatron_fsdp,
   optim_grads_params, average_in_collective=False, ckpt_format=fsdp_dtensor), checkpoint.load kept;
   ``fsdp_load_none``: the same with checkpoint.load=None;
   ``roundtrip``: the written YAML loaded back with ``ConfigContainer.from_yaml`` (a control for the next two);
   ``enabled_rebuilt``: the output of ``scripts/mfsdp.py enable`` loaded back the same way;
   ``enabled_overrides``: the keys that ``enable`` changed, applied onto a fresh copy of the recipe object
   (the primary check: ``from_yaml`` cannot rebuild PEFT configs, whose ``peft.params_to_save`` is a set);
   for recipes with a ``peft`` section, which Bridge rejects without a base model, also ``peft_pretrained_*``
   (as shipped / FSDP keep-load / FSDP load=None) and ``enabled_overrides_pretrained``, with
   ``checkpoint.pretrained_checkpoint`` set to an existing folder, as a user must;
   where ``enable`` refuses for a decision only the user can take (PP>1: ``--set-pp-1``; PEFT: the base model's
   path; a batch that no longer divides by micro-batch x DP: the nearest valid value enable names), it runs again
   with that decision taken (``enable.decided``) and its output gets the verdicts. ``enable`` runs without
   ``--gpus``, so it judges the batch sizes at the smallest world of the recipe's layout: the world of the verdicts;
   where the recipe's name states another GPU count, ``enable --gpus <that count>`` runs too (``enable_named``)
   and Bridge judges its output at that world (``enabled_overrides_named``);
   ``--corpus DIR`` runs ``enable`` on the committed corpus file instead of the fresh YAML (and records whether
   the two are the same), so the recorded enabled verdicts are those of the files the tests read;
3. counts parameters of the built model (meta device, rank 0 of a fake process group) at TP=PP=EP=1 and at the
   recipe's own layout, for one recipe per family first, then for every other pretrain model while time lasts
   (``--params-only``: nothing else). Settings that only choose kernels (``COUNT_NEUTRAL_SETTINGS``: APEX's
   gradient-accumulation fusion, userbuffers, DeepEP, fused DSA) are turned off first; without mamba-ssm a hybrid
   model is tried with megatron-core's stand-in for its gated RMSNorm (that weight counted from its shape); on
   megatron-core 0.19.2 the stand-in itself fails (StopIteration at ssm/mamba_mixer.py:417), which is recorded.

World size. ``validate()`` reads the world size (``WORLD_SIZE`` when no process group exists). Each verdict runs at
the smallest world the recipe's layout allows: lcm(TP*PP*CP, ETP*EP*PP) (``world_min``), and again at the GPU count in
the recipe's name (``..._256gpu_...``) when that differs and is a multiple of it (``world_named``).

Robustness. Recipes run in worker processes (``--jobs``), each importing Bridge once and taking every n-th recipe of
the sorted list. Each recipe has a time limit (``signal.alarm``); a worker that dies or stops making progress is
killed, the recipe it was on is recorded as a failure, and a new worker takes the rest. A global deadline stops
everything in time and records what was not reached. Results are written as they come: one JSON line per recipe.
Hugging Face configs come from ``tests/recipes/hf_configs`` laid out as an offline hub cache; Bridge's hub-config
loader is called with ``max_retries=0`` there (offline, a retry cannot find a file the cache lacks).

Output (under --out): ``recipes.json`` (every exported name, its function, family, alias-of), ``verdicts.jsonl``,
``params.jsonl``, ``failures.jsonl``, ``yaml/``, ``enabled/`` (enable's YAML), ``enable/`` (enable's JSON report),
``summary.json`` and ``summary.md``, ``logs/`` (each worker's stderr tail).

    python3 tests/recipes/gen_corpus.py --out RESULTS [--only 'llama3*,qwen3_30b*'] [--jobs 10]
    python3 tests/recipes/gen_corpus.py --out RESULTS --corpus tests/fixtures/recipes/yaml   # re-record verdicts
    python3 tests/recipes/gen_corpus.py --out RESULTS --params-only --param-jobs 8          # only the counts
    python3 tests/recipes/gen_corpus.py --out RESULTS --validate-yaml a.yaml b.yaml   # Bridge's verdict on YAMLs
    python3 tests/recipes/gen_corpus.py --help                                       # works without Bridge
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as _dt
import fnmatch
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HF_CONFIGS = Path(__file__).resolve().parent / "hf_configs"
MFSDP = ROOT / "scripts" / "mfsdp.py"
WORKSPACE = "/workspace"  # what the machine's own paths become in the written YAML files

# The five settings that turn Megatron FSDP on in Bridge 0.6.2.
FSDP_SETTINGS = (
    ("dist.use_megatron_fsdp", True),
    ("ddp.use_megatron_fsdp", True),
    ("ddp.data_parallel_sharding_strategy", "optim_grads_params"),
    ("ddp.average_in_collective", False),
    ("checkpoint.ckpt_format", "fsdp_dtensor"),
)
# Values worth having next to each verdict (read from the written YAML; missing keys are left out).
KEY_SETTINGS = (
    "model.tensor_model_parallel_size",
    "model.pipeline_model_parallel_size",
    "model.virtual_pipeline_model_parallel_size",
    "model.context_parallel_size",
    "model.expert_model_parallel_size",
    "model.expert_tensor_parallel_size",
    "model.sequence_parallel",
    "model.num_layers",
    "model.num_moe_experts",
    "model.moe_token_dispatcher_type",
    "model.moe_grouped_gemm",
    "model.multi_latent_attention",
    "model.cuda_graph_impl",
    "model.cuda_graph_scope",
    "model.recompute_granularity",
    "model.transformer_impl",
    "model.init_model_with_meta_device",
    "model.gradient_accumulation_fusion",
    "model.fp8",
    "model.fp8_recipe",
    "model.fp8_param",
    "model.overlap_moe_expert_parallel_comm",
    "mixed_precision",
    "optimizer.optimizer",
    "optimizer.use_distributed_optimizer",
    "ddp.use_distributed_optimizer",
    "ddp.overlap_grad_reduce",
    "ddp.overlap_param_gather",
    "ddp.use_megatron_fsdp",
    "ddp.data_parallel_sharding_strategy",
    "dist.use_megatron_fsdp",
    "checkpoint.ckpt_format",
    "checkpoint.load",
    "checkpoint.save",
    "checkpoint.pretrained_checkpoint",
    "peft",
    "train.global_batch_size",
    "train.micro_batch_size",
    "dataset.seq_length",
    "comm_overlap",
)
# Settings that choose kernels or communication overlap but not one parameter's shape: parameter counting turns
# them off, since the machine that counts need not have the kernels (APEX, DeepEP, fused DSA, userbuffers).
COUNT_NEUTRAL_SETTINGS = (
    ("gradient_accumulation_fusion", False),  # APEX's fused_weight_gradient_mlp_cuda (tensor_parallel/layers.py)
    ("tp_comm_overlap", False),  # Transformer Engine userbuffers: initialize_ub() before layer construction
    ("defer_embedding_wgrad_compute", False),  # refused without PP (model_parallel_config.py); TP=PP=1 counts
    ("moe_enable_deepep", False),  # DeepEP / HybridEP dispatchers: token routing, not weights
    ("dsa_kernel_backend", "none"),  # fused DSA kernels: attention maths, not weights
)
COUNT_NEUTRAL_DISPATCHER = "alltoall"  # replaces the "flex" token dispatcher (DeepEP/HybridEP) when counting
# A real, empty folder stands for the base model a PEFT recipe needs (Bridge asserts the path exists); the
# written records show it as this path.
PRETRAINED_DIR = "pretrained_checkpoint"
RECIPE_TIMEOUT_S = 90  # one recipe: build + 3-5 verdicts + enable; the slowest seen builds take a few seconds
ENABLE_TIMEOUT_S = 60
PARAM_TASK_TIMEOUT_S = 120  # one meta-device model build
DEADLINE_S = 330  # the whole run (all workers); what is left is recorded as not reached
STALL_SLACK_S = 45  # a worker silent this long past a recipe's limit is killed
IMPORT_ALLOWANCE_S = (
    120  # extra silence allowed before a worker has imported Bridge (10-20 s alone, more when 13 start)
)
REVISION_RE = re.compile(r"""["']([0-9a-f]{40})["']""")  # pinned hub revisions in Bridge's recipe sources
GPU_IN_NAME_RE = re.compile(r"_(\d+)gpu_")
HELPER_MODULES = ("utils", "common", "run_plugins")  # megatron.bridge.recipes.<these>: helpers, not recipes
ERR_CHARS = 1200
LOG_KEEP_BYTES = 20000


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%H:%M:%S")


def log(msg: str) -> None:
    print(f"[gen_corpus {_now()}] {msg}", flush=True)


# --------------------------------------------------------------------------- pure helpers (tested on CPU)


def hf_snapshot_hash(text: str) -> str:
    """A stable 40-hex 'commit' for a config file, so the cache layout is the same on every run."""
    return hashlib.sha1(text.encode()).hexdigest()


def layout_hf_cache(src: Path, hf_home: Path, revisions: tuple[str, ...] = ()) -> dict[str, str]:
    """Lay ``src/<org>/<name>/*.json`` out as an offline Hugging Face hub cache under ``hf_home/hub``.

    huggingface_hub resolves ``<id>`` offline through ``models--<org>--<name>/refs/main`` (a commit hash) and
    ``snapshots/<hash>/<file>``; a pinned ``revision=<40 hex>`` is looked up directly as ``snapshots/<rev>``, so each
    pinned revision Bridge's recipes name gets a snapshot too. Returns {model id: main hash}.
    """
    hub = hf_home / "hub"
    out: dict[str, str] = {}
    for cfg in sorted(src.glob("*/*/config.json")):
        model_dir = cfg.parent
        model_id = f"{model_dir.parent.name}/{model_dir.name}"
        files = sorted(p for p in model_dir.iterdir() if p.is_file() and p.suffix == ".json")
        digest = hf_snapshot_hash("".join(p.read_text() for p in files))
        repo = hub / f"models--{model_dir.parent.name}--{model_dir.name}"
        for rev in (digest, *revisions):
            snap = repo / "snapshots" / rev
            snap.mkdir(parents=True, exist_ok=True)
            for p in files:
                shutil.copyfile(p, snap / p.name)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(digest)
        out[model_id] = digest
    return out


def offline_env(hf_home: Path) -> dict[str, str]:
    """Environment that keeps transformers / huggingface_hub off the network and on our cache."""
    return {
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(hf_home / "hub"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "MEGATRON_CONFIG_LOCK_DIR": str(hf_home / "locks"),  # Bridge's config loader locks under ~/.cache otherwise
    }


def tree_digest(folder: Path) -> str:
    """sha256 over the relative paths and bytes of every .py file under ``folder`` (sorted)."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def rewrite_paths(text: str, prefixes: list[str], target: str = WORKSPACE) -> str:
    """Replace each machine prefix (longest first, whole path components only) with ``target``."""
    for prefix in sorted({p.rstrip("/") for p in prefixes if p and p.rstrip("/")}, key=len, reverse=True):
        text = re.sub(re.escape(prefix) + r"(?![\w.-])", target, text)
    return text


def recipe_stem(name: str) -> str:
    """File stem of a recipe: its function name without the ``_config`` suffix (it starts with the model family)."""
    return name.removesuffix("_config")


def match_only(name: str, pattern: str | None) -> bool:
    """``--only``: comma-separated shell globs; a bare word matches as a substring."""
    if not pattern:
        return True
    for pat in (p.strip() for p in pattern.split(",")):
        if not pat:
            continue
        if any(c in pat for c in "*?["):
            if fnmatch.fnmatchcase(name, pat):
                return True
        elif pat in name:
            return True
    return False


def min_world(tp: int, pp: int, cp: int, ep: int = 1, etp: int | None = None) -> int:
    """Smallest world size megatron-core accepts for this layout: dense TP*PP*CP and expert ETP*EP*PP both divide it."""
    tp, pp, cp, ep = (max(1, int(x or 1)) for x in (tp, pp, cp, ep))
    etp = max(1, int(etp)) if etp else tp
    return math.lcm(tp * pp * cp, etp * ep * pp)


def named_world(name: str) -> int | None:
    """The GPU count a recipe's name states (``llama3_70b_pretrain_32gpu_h100_bf16_config`` -> 32)."""
    m = GPU_IN_NAME_RE.search(name + "_")
    return int(m.group(1)) if m else None


def shard(items: list, k: int, n: int) -> list:
    """Every n-th item starting at k (items sorted by name, so each family spreads over the workers)."""
    return [x for i, x in enumerate(items) if i % n == k]


def flatten(d, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and scalars are leaves; ``_target_`` keys kept."""
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(flatten(v, key))
            else:
                out[key] = v
    else:
        out[prefix] = d
    return out


def changed_keys(before: dict, after: dict) -> dict:
    """Dotted keys whose value differs (or that appear/disappear) between two nested dicts: {key: [old, new]}."""
    a, b = flatten(before), flatten(after)
    missing = object()
    out = {}
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, missing), b.get(key, missing)
        if va != vb:
            out[key] = [None if va is missing else va, None if vb is missing else vb]
    return out


def param_group(name: str) -> str:
    """Which bucket a parameter's dotted name belongs to, for the per-rank split."""
    if ".shared_experts." in name:
        return "shared_experts"
    if ".experts." in name:
        return "experts"
    if "output_layer" in name:
        return "output_layer"
    if "embedding" in name:
        return "embedding"
    return "other"


def short_path(filename: str) -> str:
    """Trim a source path to the package-relative part (megatron/..., transformers/...)."""
    if filename.startswith(str(ROOT) + "/"):
        return filename[len(str(ROOT)) + 1 :]
    for marker in ("/megatron/", "/transformers/", "/huggingface_hub/", "/torch/", "/transformer_engine/"):
        if marker in filename:
            return marker[1:] + filename.split(marker, 1)[1]
    return filename


def exc_record(exc: BaseException, seconds: float | None = None) -> dict:
    """Exception type, message, the raising frame and the innermost Megatron frame (file:line), cause chain."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    raise_site = f"{short_path(frames[-1].filename)}:{frames[-1].lineno}" if frames else None
    megatron = [f for f in frames if "/megatron/" in f.filename]
    where = f"{short_path(megatron[-1].filename)}:{megatron[-1].lineno}" if megatron else raise_site
    causes: list[dict] = []
    c = exc.__cause__ or exc.__context__
    while c is not None and len(causes) < 4:
        cf = traceback.extract_tb(c.__traceback__) if c.__traceback__ else []
        causes.append(
            {
                "type": type(c).__name__,
                "error": (str(c) or repr(c))[:ERR_CHARS],
                "raise_site": f"{short_path(cf[-1].filename)}:{cf[-1].lineno}" if cf else None,
            }
        )
        c = c.__cause__ or c.__context__
    rec = {
        "ok": False,
        "error_type": type(exc).__name__,
        "error": (str(exc) or repr(exc))[:ERR_CHARS],
        "where": where,
        "raise_site": raise_site,
    }
    if causes:
        rec["causes"] = causes
    if seconds is not None:
        rec["seconds"] = round(seconds, 2)
    return rec


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut short by a killed worker
    return out


def progress_state(progress: list[dict]) -> tuple[set, str | None]:
    """From a worker's progress lines: the names it finished, and the one it started but did not finish."""
    done, current = set(), None
    for ev in progress:
        if ev.get("event") == "start":
            current = ev["name"]
        elif ev.get("event") == "done":
            done.add(ev["name"])
            if current == ev["name"]:
                current = None
    return done, current


def append_jsonl(path: Path, obj: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(obj, default=str) + "\n")


class RecipeTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise RecipeTimeout("time limit reached")


class time_limit:
    """signal.alarm around a block (main thread only); nests by restoring the outer alarm's remainder."""

    def __init__(self, seconds: int):
        self.seconds = max(1, int(seconds))

    def __enter__(self):
        self.old = signal.signal(signal.SIGALRM, _alarm)
        self.outer = signal.alarm(self.seconds)
        self.t0 = time.monotonic()

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.old)
        if self.outer:
            signal.alarm(max(1, self.outer - int(time.monotonic() - self.t0)))
        return False


# --------------------------------------------------------------------------- Bridge side (worker processes)


def _import_bridge():
    """``megatron.bridge.recipes`` and the errors met importing it.

    The package's ``__init__`` star-imports every family; one family that fails to import (a missing optional
    dependency) would otherwise cost every recipe. Then the ``__init__``'s import statements are replayed one by
    one into a namespace, under a package object whose ``__init__`` is not run, and each failure is recorded."""
    import types

    import torch  # noqa: F401  (first: it loads libnccl that Transformer Engine's library needs)

    try:
        from megatron.bridge import recipes

        return recipes, []
    except Exception as exc:  # noqa: BLE001
        errors = [{"module": "megatron.bridge.recipes", **exc_record(exc)}]
    import megatron.bridge

    base = Path(next(iter(megatron.bridge.__path__))) / "recipes"
    for name in [m for m in sys.modules if m == "megatron.bridge.recipes" or m.startswith("megatron.bridge.recipes.")]:
        sys.modules.pop(name, None)
    pkg = types.ModuleType("megatron.bridge.recipes")
    pkg.__path__ = [str(base)]
    pkg.__package__ = "megatron.bridge.recipes"
    sys.modules["megatron.bridge.recipes"] = pkg
    ns = types.ModuleType("megatron.bridge.recipes")  # what the package would have exported
    tree = ast.parse((base / "__init__.py").read_text())
    for node in tree.body:  # replay each top-level import statement on its own
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        code = compile(ast.Module(body=[node], type_ignores=[]), str(base / "__init__.py"), "exec")
        try:
            exec(code, ns.__dict__)  # noqa: S102  (Bridge's own import lines)
        except Exception as exc:  # noqa: BLE001
            errors.append({"module": getattr(node, "module", None) or ast.unparse(node), **exc_record(exc)})
    return ns, errors


def bridge_revisions() -> tuple[str, ...]:
    """Every pinned 40-hex hub revision in the installed Bridge's recipe sources (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("megatron.bridge")
    if not spec or not spec.submodule_search_locations:
        return ()
    recipes_dir = Path(next(iter(spec.submodule_search_locations))) / "recipes"
    revs = set()
    for py in recipes_dir.rglob("*.py"):
        revs.update(REVISION_RE.findall(py.read_text(errors="replace")))
    return tuple(sorted(revs))


def enumerate_recipes(recipes_mod) -> list[dict]:
    """Every public function exported by megatron.bridge.recipes: family, defining module, alias-of, callable?"""
    import inspect

    rows, first_name = [], {}
    for name in sorted(vars(recipes_mod)):
        obj = getattr(recipes_mod, name)
        if name.startswith("_") or not inspect.isfunction(obj):
            continue
        mod = getattr(obj, "__module__", "") or ""
        if not mod.startswith("megatron.bridge.recipes."):
            continue
        parts = mod.split(".")
        family = parts[3] if len(parts) > 3 else mod
        try:
            sig = inspect.signature(obj)
            required = [
                p.name
                for p in sig.parameters.values()
                if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
        except (TypeError, ValueError):
            required = []
        key = id(obj)
        rows.append(
            {
                "name": name,
                "function": f"{mod}.{obj.__qualname__}",
                "family": family,
                "required_args": required,
                "alias_of": None,
                "helper": family in HELPER_MODULES,
                "_key": key,
            }
        )
    # The canonical name of a function is its own __name__ when exported, else the first exported name.
    by_key: dict[int, list[dict]] = {}
    for r in rows:
        by_key.setdefault(r["_key"], []).append(r)
    for group in by_key.values():
        own = [r for r in group if r["function"].rsplit(".", 1)[-1] == r["name"]]
        canon = (own or group)[0]["name"]
        first_name[group[0]["_key"]] = canon
        for r in group:
            r["alias_of"] = None if r["name"] == canon else canon
    for r in rows:
        r.pop("_key")
    return rows


def _get(obj, dotted: str):
    for part in dotted.split("."):
        if obj is None:
            return None
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
    return obj


def apply_setting(cfg, dotted: str, value) -> None:
    """``section.key`` = value on a container; a dict (env_vars) gets the key; unknown fields raise."""
    *parents, leaf = dotted.split(".")
    obj = cfg
    for name in parents:
        obj = obj[name] if isinstance(obj, dict) else getattr(obj, name)
        if obj is None:
            raise AttributeError(f"{dotted}: {name} is None in this config")
    if isinstance(obj, dict):
        obj[leaf] = value
        return
    if not hasattr(obj, leaf):
        raise AttributeError(f"{type(obj).__name__} has no field {leaf!r} ({dotted})")
    setattr(obj, leaf, value)


def layout_of(cfg) -> dict:
    m = cfg.model

    def g(k, d=None):
        return getattr(m, k, d)

    lay = {
        "tp": g("tensor_model_parallel_size", 1) or 1,
        "pp": g("pipeline_model_parallel_size", 1) or 1,
        "vp": g("virtual_pipeline_model_parallel_size"),
        "cp": g("context_parallel_size", 1) or 1,
        "ep": g("expert_model_parallel_size", 1) or 1,
        "etp": g("expert_tensor_parallel_size"),
    }
    lay["world_min"] = min_world(lay["tp"], lay["pp"], lay["cp"], lay["ep"], lay["etp"])
    return lay


class Verdicts:
    """Runs Bridge's runtime_config_update on copies of one built recipe, restoring process state after each."""

    def __init__(self, base_env: dict):
        self.base_env = base_env

    def run(self, make_cfg, world: int, mutate=None) -> dict:
        import torch
        from megatron.bridge.training.config import runtime_config_update

        t0 = time.monotonic()
        os.environ.clear()
        os.environ.update(self.base_env)
        os.environ.update({"WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0"})
        try:
            try:
                cfg = make_cfg()
            except RecipeTimeout:
                raise
            except BaseException as exc:  # noqa: BLE001  (the config could not even be made: not validate()'s verdict)
                rec = exc_record(exc, time.monotonic() - t0)
                rec.update(stage="make_config", world=world)
                return rec
            if mutate:
                try:
                    mutate(cfg)
                except (AttributeError, KeyError, TypeError) as exc:  # our change could not be applied: no verdict
                    rec = exc_record(exc, time.monotonic() - t0)
                    rec.update(error_type="OverrideError", error=f"{type(exc).__name__}: {rec['error']}", world=world)
                    return rec
            runtime_config_update(cfg)
            return {"ok": True, "world": world, "seconds": round(time.monotonic() - t0, 2)}
        except RecipeTimeout:
            raise
        except BaseException as exc:  # noqa: BLE001  (SystemExit / AssertionError are verdicts too)
            rec = exc_record(exc, time.monotonic() - t0)
            rec.update(stage="runtime_config_update", world=world)
            return rec
        finally:
            os.environ.clear()
            os.environ.update(self.base_env)
            with contextlib.suppress(Exception):  # a deterministic recipe's validate() turns it on globally
                torch.use_deterministic_algorithms(False)


def _fsdp(keep_load: bool):
    def mutate(cfg):
        for key, value in FSDP_SETTINGS:
            apply_setting(cfg, key, value)
        if not keep_load:
            apply_setting(cfg, "checkpoint.load", None)

    return mutate


def pretrained_path() -> str:
    """The stand-in base-model folder (created on first use, under the run's scratch folder)."""
    path = Path(os.environ.get("GEN_CORPUS_TMP") or tempfile.gettempdir()) / PRETRAINED_DIR
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def _pretrained(then=None):
    """checkpoint.pretrained_checkpoint = an existing folder (what a PEFT user sets), then ``then``."""

    def mutate(cfg):
        apply_setting(cfg, "checkpoint.pretrained_checkpoint", pretrained_path())
        if then is not None:
            then(cfg)

    return mutate


def _overrides(changes: dict):
    """Apply enable's changed keys onto a recipe object (leaves only; _target_ keys skipped)."""

    def mutate(cfg):
        for key, (_old, new) in changes.items():
            if key.split(".")[-1] == "_target_":
                continue
            apply_setting(cfg, key, new)

    return mutate


def _from_yaml(path: Path):
    from megatron.bridge.training.config import ConfigContainer

    return lambda: ConfigContainer.from_yaml(str(path))


# enable refuses (exit 1, nothing written) while an error needs the user's decision; for these the corpus run takes
# the decision a user would, so that enable's output gets a verdict too (the others stay refused). Each maps the
# refusing finding to the arguments that decide it.
_FIRST_KV = re.compile(r"^([A-Za-z_][\w.]*=\d+)\b")


def _first_fix(finding: dict) -> list[str]:
    """The nearest valid value a batch-size finding names first (``train.global_batch_size=64, or ...``)."""
    m = _FIRST_KV.match(str(finding.get("fix") or ""))
    return [m.group(1)] if m else []


DECISIONS = {
    "MFSDP-PIPELINE-PARALLEL": lambda f: ["--set-pp-1"],  # PP=1: Megatron FSDP's mesh has no pipeline axis
    "MFSDP-PEFT-NEEDS-PRETRAINED": lambda f: [f"checkpoint.pretrained_checkpoint={pretrained_path()}"],
    # the batch no longer divides by micro-batch x DP at the world (DP grew with PP=1): the nearest valid training
    # batch enable names (the eval batch follows it), so Bridge judges enable's DP arithmetic at that world
    "MFSDP-TRAIN-BATCH-DP": _first_fix,
    "MFSDP-EVAL-BATCH-DP": lambda f: ["--fit-eval-batch"],
}
DECISION_ROUNDS = 3  # a decision can reveal the next one (PP=1 makes the batch too small for the grown DP)


def _enable(args: list[str]) -> dict:
    cmd = [sys.executable, str(MFSDP), "enable", *args]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=ENABLE_TIMEOUT_S, cwd=str(ROOT), check=False)
    except subprocess.TimeoutExpired:
        return {"rc": None, "error": f"timed out after {ENABLE_TIMEOUT_S}s", "stdout": "", "stderr": ""}
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}


def refused_findings(json_text: str) -> list[dict] | None:
    """The error findings of ``enable --emit json`` when it refuses; None when it does not (or the text is not JSON)."""
    try:
        data = json.loads(json_text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not data.get("refused"):
        return None
    return [f for f in data.get("findings", []) if isinstance(f, dict) and f.get("severity") == "error"]


def refused_rules(json_text: str) -> list[str] | None:
    """The error rules of ``enable --emit json`` when it refuses; None when it does not (or the text is not JSON)."""
    found = refused_findings(json_text)
    return None if found is None else sorted({str(f["rule"]) for f in found})


def decisions_for(findings: list[dict], taken: list[str]) -> list[str]:
    """Arguments that decide the refusing findings (DECISIONS), those already taken left out; in rule order."""
    out: list[str] = []
    rules_found = {str(f.get("rule")) for f in findings}
    for f in sorted(findings, key=lambda f: str(f.get("rule"))):
        if f.get("rule") == "MFSDP-EVAL-BATCH-DP" and "MFSDP-TRAIN-BATCH-DP" in rules_found:
            continue  # the eval batch follows the training one: deciding that decides both
        if str(f.get("rule")).endswith("-BATCH-DP") and "MFSDP-PIPELINE-PARALLEL" in rules_found:
            continue  # judged at the pipeline layout: decided once PP=1 has set the data-parallel size
        decide = DECISIONS.get(str(f.get("rule")))
        for arg in decide(f) if decide else []:
            key = arg.split("=", 1)[0]
            if arg not in out and not any(t.split("=", 1)[0] == key for t in taken + out):
                out.append(arg)
    return out


def run_enable(raw_yaml: Path, out_yaml: Path, json_out: Path, extra: tuple[str, ...] = ()) -> dict:
    """Our tool's ``enable`` on the recipe YAML: exit code and output, its JSON report; when it refuses for a
    decision in DECISIONS, again with that decision taken (``decided``; up to DECISION_ROUNDS rounds, as a
    decision can reveal the next), so the output still gets a verdict. ``extra``: arguments of every run
    (``--gpus N``)."""
    j = _enable([str(raw_yaml), *extra, "--emit", "json"])
    json_out.write_text(j["stdout"])
    rec: dict = {"json_rc": j["rc"]}
    found = refused_findings(j["stdout"])
    if found is not None:
        rec["refused_rules"] = sorted({str(f["rule"]) for f in found})
    first = _enable([str(raw_yaml), *extra, "-o", str(out_yaml)])
    rec.update(rc=first["rc"], stdout=first["stdout"][-4000:], stderr=first["stderr"][-2000:])
    if "error" in first:
        rec["error"] = first["error"]
    taken: list[str] = []
    for _ in range(DECISION_ROUNDS):
        more = decisions_for(found or [], taken)
        if out_yaml.exists() or not more:
            break
        taken += more
        jd = _enable([str(raw_yaml), *extra, *taken, "--emit", "json"])
        found = refused_findings(jd["stdout"])
        second = _enable([str(raw_yaml), *extra, *taken, "-o", str(out_yaml)])
        rec["decided"] = {
            "args": list(taken),
            "rc": second["rc"],
            "stdout": second["stdout"][-4000:],
            "stderr": second["stderr"][-2000:],
        }
        if found is not None:
            rec["decided"]["refused_rules"] = sorted({str(f["rule"]) for f in found})
    rec["output"] = out_yaml.exists()
    return rec


def process_recipe(
    row: dict,
    fn,
    out: Path,
    prefixes: list[str],
    verdicts: Verdicts,
    hf_calls: list,
    rec: dict,
    corpus: Path | None = None,
) -> dict:
    """Fills ``rec`` in place, so a time limit reached half-way keeps what was already found."""
    import copy

    import yaml

    name = row["name"]
    stem = recipe_stem(name)
    rec.update(recipe=name, family=row["family"], function=row["function"], aliases=row.get("aliases", []))
    hf_calls.clear()
    t0 = time.monotonic()
    try:
        cfg = fn()
    except RecipeTimeout:
        raise
    except BaseException as exc:  # noqa: BLE001
        rec["build"] = exc_record(exc, time.monotonic() - t0)
        rec["hf_ids"] = list(hf_calls)
        return rec
    rec["build"] = {"ok": True, "seconds": round(time.monotonic() - t0, 2), "type": type(cfg).__name__}
    rec["hf_ids"] = list(hf_calls)
    try:
        rec["layout"] = layout_of(cfg)
    except Exception as exc:  # noqa: BLE001
        rec["layout"] = exc_record(exc)
        return rec

    work = Path(tempfile.mkdtemp(prefix=f"{stem}.", dir=os.environ.get("GEN_CORPUS_TMP")))
    raw: Path | None = work / f"{stem}.yaml"
    try:
        cfg.to_yaml(str(raw))
    except RecipeTimeout:
        raise
    except BaseException as exc:  # noqa: BLE001
        rec["to_yaml"] = exc_record(exc)
        raw = None
    if raw is not None:
        text = raw.read_text()
        (out / "yaml" / f"{stem}.yaml").write_text(rewrite_paths(text, prefixes))
        rec["yaml"] = f"yaml/{stem}.yaml"
        rec["yaml_bytes"] = len(text)
        try:
            doc = yaml.safe_load(text)
            rec["settings"] = {k: _get(doc, k) for k in KEY_SETTINGS if _get(doc, k) is not None}
        except Exception as exc:  # noqa: BLE001
            doc = None
            rec["settings"] = {"yaml_load_error": str(exc)[:300]}

    def fresh():
        try:
            return copy.deepcopy(cfg)
        except Exception:  # noqa: BLE001  (fall back to building the recipe again)
            return fn()

    worlds = {"world_min": rec["layout"]["world_min"]}
    nw = named_world(name)
    if nw and nw != worlds["world_min"] and nw % worlds["world_min"] == 0:
        worlds["world_named"] = nw
    rec["worlds"] = worlds
    v = rec["verdicts"] = {}
    w = worlds["world_min"]
    v["as_shipped"] = verdicts.run(fresh, w)
    v["fsdp_keep_load"] = verdicts.run(fresh, w, _fsdp(True))
    v["fsdp_load_none"] = verdicts.run(fresh, w, _fsdp(False))
    peft = getattr(cfg, "peft", None) is not None
    if peft:  # as a user must: point checkpoint.pretrained_checkpoint at the base model
        rec["pretrained_checkpoint"] = f"{WORKSPACE}/{PRETRAINED_DIR}"
        v["peft_pretrained_as_shipped"] = verdicts.run(fresh, w, _pretrained())
        v["peft_pretrained_fsdp_keep_load"] = verdicts.run(fresh, w, _pretrained(_fsdp(True)))
        v["peft_pretrained_fsdp_load_none"] = verdicts.run(fresh, w, _pretrained(_fsdp(False)))
    if "world_named" in worlds:
        wn = worlds["world_named"]
        rec["verdicts_named_world"] = {
            "as_shipped": verdicts.run(fresh, wn),
            "fsdp_keep_load": verdicts.run(fresh, wn, _fsdp(True)),
            "fsdp_load_none": verdicts.run(fresh, wn, _fsdp(False)),
        }
    if raw is None:
        return rec
    v["roundtrip"] = verdicts.run(_from_yaml(raw), w)
    enabled = work / f"{stem}.enabled.yaml"
    enable_input = raw
    if corpus is not None:  # enable runs on the corpus file (the one the tests read), when it has this recipe
        corpus_yaml = corpus / f"{stem}.yaml"
        if corpus_yaml.is_file():
            enable_input = corpus_yaml
            ctext = corpus_yaml.read_text()
            rec["corpus_yaml_same"] = ctext == rewrite_paths(text, prefixes)
            doc = yaml.safe_load(ctext)
        else:
            rec["corpus_yaml_same"] = None
    rec["enable"] = run_enable(enable_input, enabled, out / "enable" / f"{stem}.json")
    if enabled.exists():
        etext = enabled.read_text()
        (out / "enabled" / f"{stem}.yaml").write_text(rewrite_paths(etext, prefixes))
        rec["enabled_yaml"] = f"enabled/{stem}.yaml"
        v["enabled_rebuilt"] = verdicts.run(_from_yaml(enabled), w)
        if doc is not None:
            try:
                changes = changed_keys(doc, yaml.safe_load(etext))
                rec["enable"]["changed"] = {k: [_clip(a), _clip(b)] for k, (a, b) in changes.items()}
                v["enabled_overrides"] = verdicts.run(fresh, w, _overrides(changes))
                if peft:
                    v["enabled_overrides_pretrained"] = verdicts.run(fresh, w, _pretrained(_overrides(changes)))
            except RecipeTimeout:
                raise
            except Exception as exc:  # noqa: BLE001
                v["enabled_overrides"] = exc_record(exc)
    if nw and nw != w and doc is not None:
        # the GPU count the recipe's name states, given to enable as a user would (--gpus): enable's DP arithmetic
        # at that world, judged by Bridge at that world
        named = work / f"{stem}.enabled_named.yaml"
        rec["enable_named"] = run_enable(
            enable_input, named, out / "enable" / f"{stem}.named.json", ("--gpus", str(nw))
        )
        rec["enable_named"]["world"] = nw
        if named.exists():
            try:
                changes = changed_keys(doc, yaml.safe_load(named.read_text()))
                rec["enable_named"]["changed"] = {k: [_clip(a), _clip(b)] for k, (a, b) in changes.items()}
                mutate = _overrides(changes)
                v["enabled_overrides_named"] = verdicts.run(fresh, nw, _pretrained(mutate) if peft else mutate)
            except RecipeTimeout:
                raise
            except Exception as exc:  # noqa: BLE001
                v["enabled_overrides_named"] = exc_record(exc)
    shutil.rmtree(work, ignore_errors=True)
    return rec


def _clip(v, n: int = 300):
    """A value for the JSON record: long strings cut, anything not JSON-native as its repr."""
    if isinstance(v, str):
        return v[:n]
    if v is None or isinstance(v, (bool, int, float)):
        return v
    text = json.dumps(v, default=str)
    return v if len(text) <= n else text[:n]


HF_LOADER_MODULES = (  # modules that import Bridge's retrying config loader by name
    "megatron.bridge.models.conversion.auto_bridge",
    "megatron.bridge.models.hf_pretrained.causal_lm",
    "megatron.bridge.models.hf_pretrained.masked_lm",
)


def _no_hub_retries() -> None:
    """Offline, a failed config load cannot succeed on retry; Bridge's loader would sleep 1+2+4 s first."""
    import importlib

    for name in HF_LOADER_MODULES:
        try:
            mod = importlib.import_module(name)
            orig = mod.safe_load_config_with_retry
        except Exception:  # noqa: BLE001, S112  (a layout change: keep Bridge's own behaviour)
            continue

        def once(*args, _orig=orig, **kwargs):
            kwargs["max_retries"] = 0
            return _orig(*args, **kwargs)

        setattr(mod, "safe_load_config_with_retry", once)  # noqa: B010  (a module found by name)


def _hook_hf_calls(hf_calls: list) -> None:
    """Record which hub ids each recipe reads (AutoBridge.from_hf_pretrained's first argument)."""
    _no_hub_retries()
    try:
        from megatron.bridge import AutoBridge
    except Exception:  # noqa: BLE001
        return
    orig = AutoBridge.from_hf_pretrained.__func__

    def wrapped(cls, path, *a, **kw):
        hf_calls.append(str(path) + (f"@{kw['revision']}" if kw.get("revision") else ""))
        return orig(cls, path, *a, **kw)

    AutoBridge.from_hf_pretrained = classmethod(wrapped)


def worker_main(a) -> int:
    out = Path(a.out)
    k, n = (int(x) for x in a.shard.split("/"))
    tag = f"w{k}" if not a.tag else a.tag
    progress = out / "progress" / f"{tag}.jsonl"
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)  # Megatron FSDP asserts it unset or > 1
    t0 = time.monotonic()
    recipes_mod, import_errors = _import_bridge()
    append_jsonl(progress, {"event": "imported", "seconds": round(time.monotonic() - t0, 1)})
    if import_errors and not (out / "import_errors.json").exists():
        (out / "import_errors.json").write_text(json.dumps(import_errors, indent=1, default=str) + "\n")
    rows = enumerate_recipes(recipes_mod)
    if not (out / "recipes.json").exists():  # the first worker to get here writes it (atomically)
        tmp = out / f"recipes.json.{tag}.tmp"
        tmp.write_text(json.dumps(rows, indent=1) + "\n")
        os.replace(tmp, out / "recipes.json")
    aliases: dict[str, list] = {}
    for r in rows:
        if r["alias_of"]:
            aliases.setdefault(r["alias_of"], []).append(r["name"])
    todo = [r for r in rows if not r["alias_of"] and not r["helper"]]
    todo = [
        r
        for r in todo
        if match_only(r["name"], a.only) or any(match_only(x, a.only) for x in aliases.get(r["name"], []))
    ]
    skip = set(json.loads(Path(a.exclude_file).read_text())) if a.exclude_file else set()
    mine = [r for r in shard(todo, k, n) if r["name"] not in skip]
    prefixes = [os.getcwd(), os.environ.get("GEN_CORPUS_TMP", ""), os.environ.get("HF_HOME", ""), str(Path.home())]
    base_env = dict(os.environ)
    verdicts = Verdicts(base_env)
    hf_calls: list = []
    _hook_hf_calls(hf_calls)
    corpus = Path(a.corpus).resolve() if a.corpus else None
    for r in mine:
        r["aliases"] = aliases.get(r["name"], [])
        append_jsonl(progress, {"event": "start", "name": r["name"], "t": _now()})
        t1 = time.monotonic()
        if r["required_args"]:
            rec = {
                "recipe": r["name"],
                "family": r["family"],
                "function": r["function"],
                "build": {"ok": False, "error_type": "NeedsArguments", "error": f"required: {r['required_args']}"},
            }
        else:
            fn = getattr(recipes_mod, r["name"])
            rec = {"recipe": r["name"], "family": r["family"], "function": r["function"]}
            try:
                with time_limit(a.recipe_timeout):
                    process_recipe(r, fn, out, prefixes, verdicts, hf_calls, rec, corpus)
            except RecipeTimeout as exc:
                limit = exc_record(exc)
                limit["error"] = f"recipe time limit ({a.recipe_timeout}s) reached"
                if "build" in rec:  # built: the limit hit a later step; keep the verdicts found so far
                    rec["timeout"] = limit
                else:
                    rec["build"] = limit
            except BaseException as exc:  # noqa: BLE001
                rec["crash"] = exc_record(exc)
        rec["seconds"] = round(time.monotonic() - t1, 2)
        rec["worker"] = tag
        rec = json.loads(rewrite_paths(json.dumps(rec, default=str), prefixes))  # no machine paths in the record
        append_jsonl(out / "parts" / f"verdicts.{tag}.jsonl", rec)
        append_jsonl(progress, {"event": "done", "name": r["name"], "t": _now()})
        ok = rec.get("build", {}).get("ok")
        vs = rec.get("verdicts", {})
        print(
            f"[{tag} {_now()}] {r['name']}: build {'ok' if ok else rec.get('build', {}).get('error_type')}"
            + ("".join(f" {key}={'ok' if x.get('ok') else x.get('error_type')}" for key, x in vs.items()))
            + f" ({rec['seconds']}s)",
            flush=True,
        )
    append_jsonl(progress, {"event": "finished"})
    return 0


# --------------------------------------------------------------------------- parameter counting (worker)


def param_tasks(rows: list[dict], only: str | None) -> list[dict]:
    """Priority order: one recipe per family (both layouts), then each other pretrain model (prefix before
    ``_pretrain``), both layouts. Each task lists fallback candidates in case the first does not build."""
    canon = [
        r
        for r in rows
        if not r["alias_of"] and not r["helper"] and not r["required_args"] and match_only(r["name"], only)
    ]
    by_family: dict[str, list[dict]] = {}
    for r in canon:
        by_family.setdefault(r["family"], []).append(r)

    def rank(r):  # pretrain before fine-tuning, bf16 before low precision, fewest GPUs (smallest model) first
        n = r["name"]
        low_precision = any(x in n for x in ("fp8", "fp4", "mxfp", "low_precision"))
        return ("pretrain" not in n, low_precision, named_world(n) or 10**6, n)

    tasks, seen_models = [], set()
    for fam in sorted(by_family):
        cands = sorted(by_family[fam], key=rank)[:4]
        for layout in ("tp1", "recipe"):
            tasks.append({"family": fam, "layout": layout, "candidates": [c["name"] for c in cands], "phase": 1})
        seen_models.add(cands[0]["name"].split("_pretrain")[0])
    extra = []
    for fam in sorted(by_family):
        for r in sorted(by_family[fam], key=rank):
            if "pretrain" not in r["name"]:
                continue
            model = r["name"].split("_pretrain")[0]
            if model in seen_models:
                continue
            seen_models.add(model)
            for layout in ("tp1", "recipe"):
                extra.append({"family": fam, "layout": layout, "candidates": [r["name"]], "phase": 2})
    return tasks + extra


def prepare_model_config(cfg, world: int) -> str:
    """Finish the model config the way training does before it builds the model: ``runtime_config_update`` (mixed
    precision sets params/pipeline dtypes, ``validate()`` finalizes the provider). When validation rejects the layout
    (e.g. a comm-overlap setting that needs TP > 1 after we set TP=1), apply mixed precision and finalize directly."""
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    saved = dict(os.environ)
    os.environ.update({"WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0"})
    try:
        runtime_config_update(cfg)
        return "runtime_config_update"
    except Exception as exc:  # noqa: BLE001
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        os.environ.clear()
        os.environ.update(saved)
    mp = cfg.mixed_precision
    if mp is not None:
        if isinstance(mp, str):
            mp = get_mixed_precision_config(mp)
        mp.finalize()
        mp.setup(cfg.model, cfg.optimizer, cfg.ddp)
    if hasattr(cfg.model, "finalize"):
        cfg.model.finalize()
    return f"mixed precision + finalize (runtime_config_update raised {why})"


def count_neutral(cfg) -> list[str]:
    """Turn off what only chooses kernels (COUNT_NEUTRAL_SETTINGS) on the model and comm-overlap configs."""
    done = []
    for section in ("model", "comm_overlap"):
        obj = getattr(cfg, section, None)
        if obj is None:
            continue
        for attr, val in COUNT_NEUTRAL_SETTINGS:
            if hasattr(obj, attr) and getattr(obj, attr) not in (val, None):
                setattr(obj, attr, val)
                done.append(f"{section}.{attr}={val}")
    m = cfg.model
    if getattr(m, "moe_token_dispatcher_type", None) == "flex":
        m.moe_token_dispatcher_type = COUNT_NEUTRAL_DISPATCHER
        done.append(f"model.moe_token_dispatcher_type={COUNT_NEUTRAL_DISPATCHER}")
    return done


def vocab_for_count(cfg) -> tuple[int, str]:
    """Training sets model.vocab_size from the tokenizer (training/setup.py); use the tokenizer config's size when
    it states one, else count with one vocabulary row and say so (embedding/output then count per row)."""
    tok = getattr(cfg, "tokenizer", None)
    size = getattr(tok, "vocab_size", None) if tok is not None else None
    if isinstance(size, int) and size > 0:
        return size, f"vocab_size from tokenizer config ({size})"
    return 1, "vocab_size unknown without the tokenizer: counted with 1 row (embedding/output counts are per row)"


def build_meta(m):
    return m.provide_distributed_model(
        wrap_with_ddp=False, init_model_with_meta_device=True, mixed_precision_wrapper=None, bf16=True
    )


def count_params(recipes_mod, name: str, layout: str) -> dict:
    import gc

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    cfg = getattr(recipes_mod, name)()
    m = cfg.model
    own = layout_of(cfg)
    if layout == "tp1":
        for attr, val in (
            ("tensor_model_parallel_size", 1),
            ("pipeline_model_parallel_size", 1),
            ("virtual_pipeline_model_parallel_size", None),
            ("pipeline_model_parallel_layout", None),
            ("context_parallel_size", 1),
            ("expert_model_parallel_size", 1),
            ("expert_tensor_parallel_size", None),
            ("sequence_parallel", False),
            ("num_layers_in_first_pipeline_stage", None),
            ("num_layers_in_last_pipeline_stage", None),
            ("account_for_embedding_in_pipeline_split", False),
            ("account_for_loss_in_pipeline_split", False),
        ):
            if hasattr(m, attr):
                setattr(m, attr, val)
    neutral = count_neutral(cfg)
    vocab_note = None
    if getattr(m, "vocab_size", 0) is None:
        m.vocab_size, vocab_note = vocab_for_count(cfg)
    lay = layout_of(cfg)
    world = lay["world_min"]
    prep = prepare_model_config(cfg, world)
    neutral += count_neutral(cfg)  # again: runtime_config_update may copy comm-overlap settings back
    if dist.is_initialized():
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    torch.cuda.set_device(0)
    os.environ.update({"WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0"})
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        m.initialize_model_parallel(seed=0, create_gloo_process_groups=False)  # gloo needs a real store
        mamba_stub = None
        try:
            chunks = build_meta(m)
        except ImportError as exc:
            if "MambaSSM" not in str(exc):
                raise
            # mamba-ssm absent: its kernels run only in forward; MambaMixer's weights are plain torch parameters
            # except the gated RMSNorm, which is counted from its known shape (weight of d_inner_local_tp).
            mamba_stub = f"built without mamba-ssm ({type(exc).__name__}: {str(exc)[:120]})"
            import megatron.core.ssm.mamba_mixer as mixer

            mixer.HAVE_MAMBA_SSM = True
            chunks = build_meta(m)
        extra_mamba_norm = 0
        if mamba_stub:
            from megatron.core.ssm.mamba_mixer import MambaMixer

            for chunk in chunks:
                for mod in chunk.modules():
                    if isinstance(mod, MambaMixer) and getattr(mod, "rmsnorm", False):
                        norm = getattr(mod, "norm", None)
                        if not isinstance(norm, torch.nn.Module):  # the library's MagicMock stand-in
                            extra_mamba_norm += int(mod.d_inner_local_tp)
        groups = {"embedding": 0, "output_layer": 0, "experts": 0, "shared_experts": 0, "other": 0}
        total, seen, on_gpu = 0, set(), 0
        for chunk in chunks:
            for pname, p in chunk.named_parameters():
                if id(p) in seen:
                    continue
                seen.add(id(p))
                total += p.numel()
                groups[param_group(pname)] += p.numel()
                if p.device.type != "meta":
                    on_gpu += p.numel()
        total += extra_mamba_norm
        groups["other"] += extra_mamba_norm
        n_chunks = len(chunks)
        del chunks  # free the materialized parts (embeddings) before the next build
        return {
            "count_neutral_settings": neutral,
            "vocab_note": vocab_note,
            "mamba": None if not mamba_stub else {"note": mamba_stub, "gated_rmsnorm_weights_added": extra_mamba_norm},
            "layout": lay,
            "recipe_layout": own,
            "world": world,
            "model_chunks_on_rank0": n_chunks,
            "numel_rank0": total,
            "split_rank0": groups,
            "numel_materialized_rank0": on_gpu,
            "provider": type(m).__name__,
            "prepared_by": prep,
            "vocab_size": getattr(m, "vocab_size", None),
            "share_embeddings_and_output_weights": getattr(m, "share_embeddings_and_output_weights", None),
        }
    finally:
        parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()
        torch.cuda.empty_cache()


def param_worker_main(a) -> int:
    out = Path(a.out)
    k, n = (int(x) for x in a.shard.split("/"))
    tag = a.tag or f"p{k}"
    progress = out / "progress" / f"{tag}.jsonl"
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    recipes_mod, _ = _import_bridge()
    _no_hub_retries()
    append_jsonl(progress, {"event": "imported"})
    rows = enumerate_recipes(recipes_mod)
    if not (out / "recipes.json").exists():  # --params-only: no recipe worker writes it
        tmp = out / f"recipes.json.{tag}.tmp"
        tmp.write_text(json.dumps(rows, indent=1) + "\n")
        os.replace(tmp, out / "recipes.json")
    tasks = param_tasks(rows, a.only)
    skip = set(json.loads(Path(a.exclude_file).read_text())) if a.exclude_file else set()
    for t in shard(tasks, k, n):
        tid = f"{t['family']}:{t['candidates'][0]}:{t['layout']}"
        if tid in skip:
            continue
        append_jsonl(progress, {"event": "start", "name": tid, "t": _now()})
        rec = {"family": t["family"], "layout_kind": t["layout"], "phase": t["phase"], "tried": []}
        for cand in t["candidates"]:
            t0 = time.monotonic()
            try:
                with time_limit(a.param_timeout):
                    res = count_params(recipes_mod, cand, t["layout"])
                rec.update(recipe=cand, ok=True, seconds=round(time.monotonic() - t0, 2), **res)
                break
            except BaseException as exc:  # noqa: BLE001
                rec["tried"].append({"recipe": cand, **exc_record(exc, time.monotonic() - t0)})
                rec.update(recipe=cand, ok=False)
        append_jsonl(out / "parts" / f"params.{tag}.jsonl", rec)
        append_jsonl(progress, {"event": "done", "name": tid, "t": _now()})
        print(
            f"[{tag} {_now()}] params {tid}: "
            + (f"rank0 {rec.get('numel_rank0'):,} at world {rec.get('world')}" if rec["ok"] else "failed"),
            flush=True,
        )
    append_jsonl(progress, {"event": "finished"})
    return 0


# --------------------------------------------------------------------------- --validate-yaml


def validate_yaml_main(a) -> int:
    """Bridge's verdict on arbitrary YAML files (e.g. a later version of ``enable``'s outputs)."""
    import yaml

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    import torch  # noqa: F401  (before Transformer Engine, which Bridge imports)

    verdicts = Verdicts(dict(os.environ))
    res_path = out / "validate_yaml.jsonl"
    workspace = a.workspace or os.getcwd()
    for f in a.validate_yaml:
        src = Path(f)
        rec: dict = {"file": str(f)}
        try:
            text = src.read_text()
            # /workspace/... paths in the fixtures are this machine's cwd again
            tmp = Path(tempfile.mkdtemp(prefix="validate.")) / src.name
            tmp.write_text(text.replace(WORKSPACE + "/", workspace.rstrip("/") + "/"))
            doc = yaml.safe_load(text) or {}
            m = doc.get("model", {}) if isinstance(doc, dict) else {}
            world = a.world or min_world(
                m.get("tensor_model_parallel_size", 1),
                m.get("pipeline_model_parallel_size", 1),
                m.get("context_parallel_size", 1),
                m.get("expert_model_parallel_size", 1),
                m.get("expert_tensor_parallel_size"),
            )
            with time_limit(a.recipe_timeout):
                rec["verdict"] = verdicts.run(_from_yaml(tmp), world)
        except BaseException as exc:  # noqa: BLE001
            rec["verdict"] = exc_record(exc)
        append_jsonl(res_path, rec)
        v = rec["verdict"]
        log(f"{f}: {'ok' if v.get('ok') else v.get('error_type') + ': ' + str(v.get('error'))[:160]}")
    log(f"wrote {res_path}")
    return 0


# --------------------------------------------------------------------------- --install (no Bridge needed)

# What of a run goes into the repository's fixtures; the rest (enable's YAML output, worker logs) is regenerated
# by the tests or only matters on the machine that ran.
INSTALL_FILES = ("recipes.json", "verdicts.jsonl", "failures.jsonl", "summary.json", "summary.md")
ENABLE_OUT_KEEP = 600  # characters of enable's stdout kept per recipe (its decision, not the whole listing)


def lean_verdict(rec: dict) -> dict:
    """A verdict line for the fixtures: enable's long output cut, run-local fields dropped."""
    rec = {k: v for k, v in rec.items() if k not in ("enabled_yaml", "worker")}

    def cut(run: dict) -> dict:
        run = dict(run)
        for key in ("stdout", "stderr"):
            if isinstance(run.get(key), str) and len(run[key]) > ENABLE_OUT_KEEP:
                run[key] = run[key][:ENABLE_OUT_KEEP] + "[...]"
        if isinstance(run.get("decided"), dict):
            run["decided"] = cut(run["decided"])
        return run

    for key in ("enable", "enable_named"):
        if isinstance(rec.get(key), dict):
            rec[key] = cut(rec[key])
    return rec


def install(results: Path, into: Path, params_from: Path | None = None) -> dict:
    """Copy a run's results into the fixtures folder (``yaml/`` replaced); ``params_from``: take ``params.jsonl``
    from another run (a ``--params-only`` one). Returns what was written, for the log."""
    results, into = Path(results), Path(into)
    missing = [f for f in INSTALL_FILES if not (results / f).is_file()]
    if missing or not (results / "yaml").is_dir():
        raise FileNotFoundError(f"{results}: not a finished run (missing {missing or ['yaml/']})")
    into.mkdir(parents=True, exist_ok=True)
    for f in INSTALL_FILES:
        if f == "verdicts.jsonl":
            lines = [json.dumps(lean_verdict(r), sort_keys=True) for r in read_jsonl(results / f)]
            (into / f).write_text("".join(line + "\n" for line in lines))
        else:
            shutil.copyfile(results / f, into / f)
    params = (params_from or results) / "params.jsonl"
    if params.is_file():
        shutil.copyfile(params, into / "params.jsonl")
    if (into / "yaml").is_dir():
        shutil.rmtree(into / "yaml")
    shutil.copytree(results / "yaml", into / "yaml")
    run = json.loads((results / "run.json").read_text()) if (results / "run.json").is_file() else {}
    run.pop("argv", None)  # the machine's folders
    (into / "run.json").write_text(json.dumps(run, indent=1, sort_keys=True) + "\n")
    size = sum(p.stat().st_size for p in into.rglob("*") if p.is_file())
    return {"yaml_files": len(list((into / "yaml").glob("*.yaml"))), "bytes": size}


# --------------------------------------------------------------------------- orchestrator


class Slot:
    """One worker process and the shard it owns; respawned on death with what it finished excluded."""

    def __init__(self, kind: str, k: int, n: int, a, out: Path, env: dict, workdir: Path):
        self.kind, self.k, self.n, self.a, self.out, self.env, self.workdir = kind, k, n, a, out, env, workdir
        self.generation = 0
        self.excluded: set = set()
        self.failures: list[dict] = []
        self.finished = False
        self.proc: subprocess.Popen | None = None
        self.spawn()

    @property
    def tag(self) -> str:
        return f"{'w' if self.kind == 'recipes' else 'p'}{self.k}.{self.generation}"

    def spawn(self) -> None:
        a, out = self.a, self.out
        excl = out / "progress" / f"exclude.{self.tag}.json"
        excl.write_text(json.dumps(sorted(self.excluded)))
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--out",
            str(out),
            "--_worker" if self.kind == "recipes" else "--_param-worker",
            "--_shard",
            f"{self.k}/{self.n}",
            "--_tag",
            self.tag,
            "--_exclude-file",
            str(excl),
            "--recipe-timeout",
            str(a.recipe_timeout),
            "--param-timeout",
            str(a.param_timeout),
        ]
        if a.only:
            cmd += ["--only", a.only]
        if a.corpus:
            cmd += ["--corpus", a.corpus]
        self.out_path = out / "logs" / f"{self.tag}.out"
        self.err_path = out / "logs" / f"{self.tag}.err"
        with open(self.out_path, "w") as fo, open(self.err_path, "w") as fe:
            # own session: a kill takes the worker's children (enable runs) with it
            self.proc = subprocess.Popen(
                cmd, stdout=fo, stderr=fe, env=self.env, cwd=str(self.workdir), start_new_session=True
            )
        self.offset = 0
        self.last_size = -1
        self.last_activity = time.monotonic()

    def progress(self) -> list[dict]:
        return read_jsonl(self.out / "progress" / f"{self.tag}.jsonl")

    def pump(self) -> None:
        """Echo the worker's new output lines; growth of its output or progress files counts as activity."""
        try:
            with open(self.out_path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            chunk = b""
        end = chunk.rfind(b"\n")
        if end >= 0:
            for line in chunk[: end + 1].decode(errors="replace").splitlines():
                print(line, flush=True)
            self.offset += end + 1
        prog = self.out / "progress" / f"{self.tag}.jsonl"
        size = self.offset + (prog.stat().st_size if prog.exists() else 0)
        if size != self.last_size:
            self.last_size = size
            self.last_activity = time.monotonic()

    def limit(self) -> float:
        per = self.a.recipe_timeout if self.kind == "recipes" else self.a.param_timeout * 4
        imported = any(e.get("event") == "imported" for e in self.progress())
        return per + self.a.stall_slack + (0 if imported else IMPORT_ALLOWANCE_S)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the worker leads its own session (start_new_session)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait()

    def handle_exit(self, reason: str, respawn: bool) -> None:
        """The worker is gone: keep what it did, blame the in-flight item, and start again past it."""
        prog = self.progress()
        done, current = progress_state(prog)
        finished = any(e.get("event") == "finished" for e in prog)
        self.excluded |= done
        if finished:
            self.finished = True
            return
        if current:
            self.excluded.add(current)
            self.failures.append(
                {
                    "kind": self.kind,
                    "name": current,
                    "reason": reason,
                    "worker": self.tag,
                    "stderr_tail": _tail(self.err_path),
                }
            )
        elif not any(e.get("event") == "imported" for e in prog):
            self.failures.append(
                {
                    "kind": self.kind,
                    "name": None,
                    "reason": f"worker failed before importing Bridge: {reason}",
                    "worker": self.tag,
                    "stderr_tail": _tail(self.err_path),
                }
            )
            self.finished = True  # the import itself fails: retrying would fail the same way
            return
        if respawn and self.generation < 20:
            self.generation += 1
            self.spawn()
        else:
            self.finished = True


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def orchestrate(a) -> int:
    t_start = time.monotonic()
    out = Path(a.out).resolve()
    for sub in ("yaml", "enabled", "enable", "parts", "progress", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="gen_corpus."))
    hf_home, workdir = tmp / "hf", tmp / "work"
    workdir.mkdir(parents=True)
    revisions = bridge_revisions()
    cache = layout_hf_cache(HF_CONFIGS, hf_home, revisions)
    log(f"offline HF cache: {len(cache)} model configs x {1 + len(revisions)} snapshots under {hf_home}")
    env = dict(os.environ)
    env.update(offline_env(hf_home))
    env.update({"GEN_CORPUS_TMP": str(tmp), "PYTHONUNBUFFERED": "1"})
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    (out / "run.json").write_text(
        json.dumps(
            {
                "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "argv": sys.argv,
                "hf_models": cache,
                "pinned_revisions": revisions,
                "scripts_sha256": tree_digest(ROOT / "scripts"),  # which check/enable the enable verdicts judge
                "corpus": bool(a.corpus),
                "params_only": a.params_only,
                "jobs": a.jobs,
                "param_jobs": a.param_jobs,
                "recipe_timeout_s": a.recipe_timeout,
                "deadline_s": a.deadline,
                "environment": {  # what the recipes' env_vars defaults (setdefault) would not override
                    k: v
                    for k, v in os.environ.items()
                    if k.startswith(("NCCL_", "TORCH_NCCL", "PYTORCH_CUDA", "CUDA_DEVICE_MAX", "NVTE_"))
                },
            },
            indent=1,
        )
    )
    slots = [] if a.params_only else [Slot("recipes", k, a.jobs, a, out, env, workdir) for k in range(a.jobs)]
    if a.param_jobs and not a.no_params:
        slots += [Slot("params", k, a.param_jobs, a, out, env, workdir) for k in range(a.param_jobs)]
    log(
        f"started {0 if a.params_only else a.jobs} recipe worker(s) and {0 if a.no_params else a.param_jobs} parameter worker(s)"
    )
    deadline = t_start + a.deadline
    while True:
        live = [s for s in slots if not s.finished]
        if not live:
            break
        now = time.monotonic()
        for s in live:
            s.pump()
            rc = s.proc.poll() if s.proc is not None else -1
            if rc is not None:
                s.pump()
                s.handle_exit(f"worker exited with code {rc}", respawn=now < deadline)
            elif now - s.last_activity > s.limit():
                s.kill()
                s.handle_exit(f"no progress for {int(now - s.last_activity)}s (killed)", respawn=now < deadline)
            elif now > deadline:
                s.kill()
                s.handle_exit("global deadline reached (killed)", respawn=False)
        time.sleep(0.5)
    for s in slots:
        s.kill()
    return finish(a, out, slots, t_start, tmp)


def finish(a, out: Path, slots: list, t_start: float, tmp: Path) -> int:
    verdicts = []
    for p in sorted((out / "parts").glob("verdicts.*.jsonl")):
        verdicts += read_jsonl(p)
    params = []
    for p in sorted((out / "parts").glob("params.*.jsonl")):
        params += read_jsonl(p)
    verdicts.sort(key=lambda r: r["recipe"])
    failures = [f for s in slots for f in s.failures]
    rows = json.loads((out / "recipes.json").read_text()) if (out / "recipes.json").exists() else []
    canon = [r for r in rows if not r["alias_of"] and not r.get("helper") and match_only(r["name"], a.only)]
    seen = {r["recipe"] for r in verdicts} | {f["name"] for f in failures if f["kind"] == "recipes"}
    for r in [] if a.params_only else canon:
        if r["name"] not in seen:
            failures.append({"kind": "recipes", "name": r["name"], "reason": "not reached before the deadline"})
    for r in verdicts:
        if not r.get("build", {}).get("ok"):
            b = r.get("build") or r.get("crash") or {}
            failures.append(
                {
                    "kind": "recipes",
                    "name": r["recipe"],
                    "family": r["family"],
                    "reason": "build failed",
                    "error_type": b.get("error_type"),
                    "error": b.get("error"),
                    "where": b.get("where"),
                    "causes": b.get("causes"),
                }
            )
    with open(out / "verdicts.jsonl", "w") as f:
        for r in verdicts:
            f.write(json.dumps(r, default=str) + "\n")
    with open(out / "params.jsonl", "w") as f:
        for r in params:
            f.write(json.dumps(r, default=str) + "\n")
    with open(out / "failures.jsonl", "w") as f:
        for r in failures:
            f.write(json.dumps(r, default=str) + "\n")
    summary = summarize(rows, verdicts, params, failures, a)
    summary["param_tasks_planned"] = len(param_tasks(rows, a.only)) if rows and not a.no_params else 0
    summary["wall_s"] = round(time.monotonic() - t_start, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "summary.md").write_text(summary_md(summary))
    shutil.rmtree(out / "progress", ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    for p in (out / "logs").glob("*"):  # keep the results small: the tail of each worker's log is what matters
        data = p.read_bytes()
        if len(data) > LOG_KEEP_BYTES:
            p.write_bytes(b"[...cut...]\n" + data[-LOG_KEEP_BYTES:])
    log(
        f"done in {summary['wall_s']}s: {summary['recipes_built']}/{summary['recipes_attempted']} recipes built "
        f"in {len(summary['families_built'])} families; {len(params)} parameter counts; {len(failures)} failures "
        f"-> {out}"
    )
    return 0 if verdicts else 1


def summarize(rows, verdicts, params, failures, a) -> dict:
    fam: dict[str, dict] = {}
    for r in rows:
        if r.get("helper"):
            continue
        f = fam.setdefault(r["family"], {"exported": 0, "functions": 0, "built": 0, "failed": 0})
        f["exported"] += 1
        if not r["alias_of"]:
            f["functions"] += 1
    tallies: dict[str, dict] = {}
    for r in verdicts:
        f = fam.setdefault(r["family"], {"exported": 0, "functions": 0, "built": 0, "failed": 0})
        if r.get("build", {}).get("ok"):
            f["built"] += 1
        else:
            f["failed"] += 1
        for key, v in (r.get("verdicts") or {}).items():
            t = tallies.setdefault(key, {"ok": 0, "rejected": 0, "by_error": {}})
            if v.get("ok"):
                t["ok"] += 1
            else:
                t["rejected"] += 1
                sig = f"{v.get('error_type')} @ {v.get('where')}"
                t["by_error"][sig] = t["by_error"].get(sig, 0) + 1
    build_errors: dict[str, int] = {}
    for r in verdicts:
        b = r.get("build") or {}
        if not b.get("ok"):
            sig = f"{b.get('error_type')}: {str(b.get('error'))[:140]}"
            build_errors[sig] = build_errors.get(sig, 0) + 1
    return {
        "exported_names": sum(1 for r in rows if not r.get("helper")),
        "recipe_functions": sum(1 for r in rows if not r["alias_of"] and not r.get("helper")),
        "helper_functions": sorted(r["name"] for r in rows if r.get("helper")),
        "recipes_attempted": len(verdicts),
        "recipes_built": sum(1 for r in verdicts if r.get("build", {}).get("ok")),
        "families_built": sorted(k for k, v in fam.items() if v["built"]),
        "per_family": fam,
        "verdict_tallies": tallies,
        "build_errors": dict(sorted(build_errors.items(), key=lambda kv: -kv[1])),
        "param_counts_ok": sum(1 for p in params if p.get("ok")),
        "param_families_ok": sorted({p["family"] for p in params if p.get("ok")}),
        "failures": len(failures),
        "only": a.only,
    }


def summary_md(s: dict) -> str:
    lines = [
        "# Recipe corpus run",
        "",
        (
            f"{s['recipes_built']} of {s['recipes_attempted']} recipe functions built "
            f"({s['recipe_functions']} functions, {s['exported_names']} exported names); "
            f"{len(s['families_built'])} families; {s['param_counts_ok']} parameter counts; wall {s.get('wall_s')} s."
        ),
        "",
        "| family | exported names | functions | built | failed |",
        "|---|---|---|---|---|",
    ]
    for k, v in sorted(s["per_family"].items()):
        lines.append(f"| {k} | {v['exported']} | {v['functions']} | {v['built']} | {v['failed']} |")
    lines += ["", "| verdict | ok | rejected |", "|---|---|---|"]
    for k, v in s["verdict_tallies"].items():
        lines.append(f"| {k} | {v['ok']} | {v['rejected']} |")
    lines += ["", "## Build errors", ""] + [f"- {n} x {sig}" for sig, n in s["build_errors"].items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Needs Megatron-Bridge (with Transformer Engine and CUDA) except for --help.",
    )
    p.add_argument("--out", required=True, help="results folder (created; files in it are replaced)")
    p.add_argument("--only", help="comma-separated globs or substrings of recipe names (aliases count)")
    p.add_argument("--jobs", type=int, default=10, help="recipe worker processes (default 10)")
    p.add_argument("--param-jobs", type=int, default=3, help="parameter-counting worker processes (default 3)")
    p.add_argument("--no-params", action="store_true", help="skip parameter counting")
    p.add_argument(
        "--params-only", action="store_true", help="only count parameters (no recipe verdicts, no enable runs)"
    )
    p.add_argument(
        "--corpus",
        metavar="DIR",
        help="run enable on DIR/<recipe>.yaml (the committed corpus) instead of the freshly written YAML, and "
        "record whether the two are the same",
    )
    p.add_argument("--recipe-timeout", type=int, default=RECIPE_TIMEOUT_S, help="seconds per recipe")
    p.add_argument("--param-timeout", type=int, default=PARAM_TASK_TIMEOUT_S, help="seconds per model build")
    p.add_argument("--deadline", type=int, default=DEADLINE_S, help="seconds for the whole run (default 330)")
    p.add_argument(
        "--validate-yaml", nargs="+", metavar="FILE", help="only validate these YAML files (ConfigContainer.from_yaml)"
    )
    p.add_argument(
        "--install",
        metavar="RESULTS",
        help="copy a finished run's results into --out (e.g. tests/fixtures/recipes); needs no Bridge",
    )
    p.add_argument("--params-from", metavar="RESULTS", help="--install: take params.jsonl from this run instead")
    p.add_argument("--world", type=int, help="--validate-yaml: world size (default: the smallest the layout allows)")
    p.add_argument("--workspace", help=f"--validate-yaml: real folder for {WORKSPACE}/ paths (default: cwd)")
    # internal: worker processes
    p.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--_param-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--_shard", default="0/1", help=argparse.SUPPRESS)
    p.add_argument("--_tag", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_exclude-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--stall-slack", type=int, default=STALL_SLACK_S, help=argparse.SUPPRESS)
    return p


def parse_args(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    a.worker, a.param_worker = a._worker, a._param_worker
    a.shard, a.tag, a.exclude_file = a._shard, a._tag, a._exclude_file
    if a.jobs < 1:
        p.error("--jobs must be at least 1")
    if a.params_only and (a.no_params or a.param_jobs < 1):
        p.error("--params-only needs --param-jobs >= 1 and no --no-params")
    if a.corpus:
        if not Path(a.corpus).is_dir():
            p.error(f"--corpus {a.corpus}: no such folder")
        a.corpus = str(Path(a.corpus).resolve())  # workers run in a scratch folder
    if a.param_jobs < 0:
        p.error("--param-jobs must be 0 or more")
    if a.recipe_timeout < 5 or a.param_timeout < 5:
        p.error("time limits must be at least 5 seconds")
    if not re.fullmatch(r"\d+/\d+", a.shard) or int(a.shard.split("/")[0]) >= int(a.shard.split("/")[1]):
        p.error("--_shard must be K/N with K < N")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        return worker_main(a)
    if a.param_worker:
        return param_worker_main(a)
    if a.install:
        try:
            done = install(Path(a.install), Path(a.out), Path(a.params_from) if a.params_from else None)
        except (OSError, ValueError) as exc:
            print(f"gen_corpus: {exc}", file=sys.stderr)
            return 2
        log(f"installed {a.install} into {a.out}: {done['yaml_files']} YAML files, {done['bytes']:,} bytes")
        return 0
    if a.validate_yaml:
        return validate_yaml_main(a)
    if not HF_CONFIGS.is_dir():
        print(f"gen_corpus: {HF_CONFIGS} is missing (the offline Hugging Face configs)", file=sys.stderr)
        return 2
    return orchestrate(a)


if __name__ == "__main__":
    sys.exit(main())
