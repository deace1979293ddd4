"""Turning Megatron FSDP on in a Bridge config, and saying exactly what changed.

``plan(cfg)`` returns the list of ``Change(path, old, new, why)`` that makes an
effective config (``config_io.load_effective``) a valid Megatron FSDP config:

1. the minimal enablement (``MINIMAL_OVERRIDES``): both ``use_megatron_fsdp`` flags,
   the sharding strategy, ``average_in_collective`` off, and the ``fsdp_dtensor``
   checkpoint format (the only one Bridge accepts for Megatron FSDP when a job saves
   or loads, and the one Megatron FSDP's sharded state is written in);
2. what follows from the config: ``checkpoint.save`` to ``--save-dir``; the HF side
   export off (not supported with ``fsdp_dtensor``); settings Bridge would reject with
   Megatron FSDP (``fsdp_manual_registration`` without ``nccl_ub``, weight-hash checks
   with full sharding, TP-PP-DP mapping, FSDP2); and what only fails when Megatron-Core
   wraps the model, where the fix changes no result of training: double buffering with
   the expert-parallel A2A overlap, single grouped expert weights, the CUDA-graph-safe
   mode of Megatron FSDP for CUDA graphs, meta-device init with ``no_shard`` or PEFT;
   the NaN-in-loss check that Bridge forbids with full-iteration CUDA graphs;
3. a fix-point pass: any error the rule table still reports whose fix is one plain
   ``key=value`` in the ddp/dist/checkpoint/train/rerun_state_machine plumbing is applied, so the output
   passes ``check``; errors that need a decision (pipeline parallelism, the optimizer,
   offloading, precision, the PEFT base checkpoint) are left, and the CLI refuses to emit
   a config while any error remains (``blocking``).

``checkpoint.load`` and ``checkpoint.pretrained_checkpoint`` are never changed: clearing
``load`` (what Bridge's perf recipes do) silently turns auto-resume after a preemption
off. Where ``load`` may hold checkpoints of the earlier format, ``advice`` says what to do
(convert them, or use a fresh directory) and how ``mfsdp.py ckpt`` tells which applies.

Pipeline parallelism has no axis in Megatron FSDP's device mesh, so a config with
``pipeline_model_parallel_size > 1`` is refused unless the caller asks for
``set_pp1=True``, which sets PP to 1 (and drops the pipeline-only layout keys) and says so.

Batch sizes and the world size. On the same GPUs, PP 1 multiplies data parallelism (Bridge:
DP = world / (TP x PP x CP)), and the global batches must stay multiples of micro-batch x DP
(megatron-core's micro-batch calculator for training, Bridge's ``validate()`` for evaluation).
A config file does not hold the world size: the caller gives it (``--gpus N``), or ``job_world``
takes the smallest world on which both the given layout and the result can run. A batch that
does not divide there divides at no world the job can use, so enable refuses (the batch rules
in ``rules/parallel.py`` name the numbers); the batch sizes are the user's decision
(``KEY=VALUE``), except that ``fit_eval_batch=True`` moves ``validation.eval_global_batch_size``
to the nearest valid value and scales ``validation.eval_iters`` to keep the samples evaluated.

Applying the plan to YAML edits the user's text in place (``yaml_edit``): only the
changed values' lines are touched, comments and key order stay. Only when the file
cannot be edited line-wise (flow style, a value that is a block) is it re-dumped, and
the caller is told that comments were lost.

``apply_to_object(obj, overrides)`` sets the same dotted attributes on a real Bridge
``ConfigContainer`` (live mode, inside a container where Bridge imports).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from . import config_io, rules
from . import schema as S
from .findings import InputError

STRATEGIES = ("optim_grads_params", "optim_grads", "optim", "no_shard")

MINIMAL_OVERRIDES: dict[str, object] = {
    "dist.use_megatron_fsdp": True,
    "ddp.use_megatron_fsdp": True,
    "ddp.data_parallel_sharding_strategy": "optim_grads_params",
    "ddp.average_in_collective": False,
    "checkpoint.ckpt_format": "fsdp_dtensor",
}

# Why each minimal override is there, in one line (shown to the user).
_WHY = {
    "dist.use_megatron_fsdp": "turns Megatron FSDP on for model wrapping (Bridge syncs it with ddp.use_megatron_fsdp)",
    "ddp.use_megatron_fsdp": "turns Megatron FSDP on in the DDP config (the flag Megatron-Core's wrapper reads)",
    "ddp.data_parallel_sharding_strategy": "shards optimizer state, gradients and parameters (ZeRO-3 style); "
    "the strategy that saves the most memory",
    "ddp.average_in_collective": "not supported with NCCL symmetric registration; Bridge would switch it off anyway",
    "checkpoint.ckpt_format": "Megatron FSDP saves and loads only fsdp_dtensor checkpoints "
    "(Bridge asserts it whenever save or load is set)",
}

# Extra settings Bridge's performance recipes apply next to Megatron FSDP (``--perf``).
# Not included: model.gradient_accumulation_fusion=True, which the perf harness sets but which
# Megatron-Core's FSDP adapter only allows with Transformer Engine >= 2.10 and Bridge's nemotronh
# recipe turns off with BF16 main gradients: it depends on the install, so it is left to the user.
# Not included either: ddp.keep_fp8_transpose_cache=False, which the perf recipes write but which is
# the default (megatron-core DistributedDataParallelConfig) and saves memory, not time; and the
# buffering knobs (fsdp_double_buffer, suggested_communication_unit_size, nccl_ub), which trade memory
# for overlap per model and are measured, not assumed (references/tuning.md).
PERF_OVERRIDES: dict[str, tuple] = {
    "model.init_model_with_meta_device": (
        True,
        "build the model on the meta device and materialise only each rank's "
        "shard (Bridge's perf recipes do this with Megatron FSDP)",
    ),
}

# Keys that only mean something with pipeline parallelism, and their value without it
# (MCore ModelParallelConfig / TransformerConfig): --set-pp-1 resets the ones a recipe set.
PIPELINE_ONLY_KEYS: dict[str, object] = {
    "model.virtual_pipeline_model_parallel_size": None,
    "model.pipeline_model_parallel_layout": None,
    "model.num_layers_in_first_pipeline_stage": None,
    "model.num_layers_in_last_pipeline_stage": None,
    "model.account_for_embedding_in_pipeline_split": False,
    "model.account_for_loss_in_pipeline_split": False,
}

# Sections whose keys the fix-point pass may change on its own: the distributed and
# checkpoint plumbing that Megatron FSDP dictates. Model shape, parallel sizes, precision
# and offloading are trade-offs the user decides; errors there are reported instead.
FIX_POINT_SECTIONS = ("ddp", "dist", "checkpoint", "train", "rerun_state_machine")

# Errors the fix-point pass never fixes although their fix is a key=value: each is a choice the user makes (the
# training batch changes the optimisation; the world size is the job's). enable refuses while they remain.
NEEDS_DECISION = frozenset({"MFSDP-TRAIN-BATCH-DP", "MFSDP-EVAL-BATCH-DP", "MFSDP-WORLD-LAYOUT"})

# Fix-point pass: at most this many rounds (each round fixes >= 1 error or stops).
MAX_FIX_ROUNDS = 8
# A rule's fix that is one plain assignment, optionally followed by "(or ...)" advice.
_FIX_KV = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)=(\S+)(?:\s+\(.*\))?$")


class Change:
    __slots__ = ("path", "old", "new", "why")

    def __init__(self, path: str, old, new, why: str):
        self.path, self.old, self.new, self.why = path, old, new, why

    def to_dict(self) -> dict:
        return {"path": self.path, "old": self.old, "new": self.new, "why": self.why}

    def __repr__(self) -> str:
        return f"Change({self.path}: {self.old!r} -> {self.new!r})"


def _set(cfg: dict, path: str, value) -> None:
    sec, _, key = path.partition(".")
    if not key:
        cfg[sec] = value
        return
    node = cfg.get(sec)
    if sec == "mixed_precision" and isinstance(node, str):
        node = dict(S.MIXED_PRECISION_PRESETS[node])
    node = dict(node) if isinstance(node, dict) else {}
    if "." in key:  # model.transformer.X (GPTModelConfig): copy each level on the way down
        first, rest = key.split(".", 1)
        sub = node.get(first)
        node[first] = sub = dict(sub) if isinstance(sub, dict) else {}
        _set(sub, rest, value) if "." in rest else sub.__setitem__(rest, value)
        cfg[sec] = node
        return
    node[key] = value
    cfg[sec] = node


def _where(cfg: Mapping, path: str) -> str:
    """The key that holds ``path``: ``model.X`` lives in ``model.transformer.X`` for a GPTModelConfig."""
    if path.startswith("model."):
        model = cfg.get("model")
        key = path.split(".", 1)[1]
        if isinstance(model, Mapping) and isinstance(model.get("transformer"), Mapping) and key in model["transformer"]:
            return f"model.transformer.{key}"
    return path


def plan(
    cfg: Mapping,
    strategy: str = "optim_grads_params",
    save_dir: str | None = None,
    perf: bool = False,
    env: Mapping[str, str] | None = None,
    set_pp1: bool = False,
    gpus: int | None = None,
    fit_eval_batch: bool = False,
    given: Mapping | None = None,
) -> list[Change]:
    """The changes that enable Megatron FSDP on ``cfg`` (not modified), in the order applied.

    ``gpus``: the job's world size, when the caller knows it (see ``job_world``; ``given``: the config whose layout
    sets the world when ``gpus`` is not given, default ``cfg``). ``fit_eval_batch``: move
    ``validation.eval_global_batch_size`` to the nearest multiple of eval micro-batch x DP at that world, and
    scale ``validation.eval_iters`` to keep the samples evaluated. Only real changes are returned: a step that
    ends where the config started is dropped.
    """
    if strategy not in STRATEGIES:
        raise config_io.input_error(f"--strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    work = _deep_copy(cfg)
    changes: list[Change] = []

    def change(path: str, new, why: str) -> None:
        path = _where(work, path)
        old = config_io.get(work, path, S.default(path))
        if old == new and type(old) is type(new):
            return
        for c in changes:
            if c.path == path:  # a later step revises an earlier one: keep one entry
                c.new, c.why = new, why
                break
        else:
            changes.append(Change(path, old, new, why))
        _set(work, path, new)

    for path, value in MINIMAL_OVERRIDES.items():
        if path == "ddp.data_parallel_sharding_strategy":
            value = strategy
        change(path, value, _WHY[path])

    if save_dir is not None:
        change("checkpoint.save", save_dir, "where the fsdp_dtensor checkpoints go (--save-dir)")
    if config_io.get(work, "checkpoint.also_save_hf_checkpoint"):
        change(
            "checkpoint.also_save_hf_checkpoint",
            False,
            "the HF side export is not supported with fsdp_dtensor; convert the checkpoint offline instead",
        )
    if config_io.get(work, "dist.use_torch_fsdp2"):
        change("dist.use_torch_fsdp2", False, "PyTorch FSDP2 and Megatron FSDP are mutually exclusive")
    if config_io.get(work, "dist.use_tp_pp_dp_mapping"):
        change("dist.use_tp_pp_dp_mapping", False, "not supported with Megatron FSDP (Bridge asserts)")
    if config_io.get(work, "ddp.fsdp_manual_registration") and not config_io.get(work, "ddp.nccl_ub"):
        change("ddp.fsdp_manual_registration", False, "it requires ddp.nccl_ub=true (Bridge asserts)")
    if (
        strategy == "optim_grads_params"
        and config_io.get(work, "train.check_weight_hash_across_dp_replicas_interval") is not None
    ):
        change(
            "train.check_weight_hash_across_dp_replicas_interval",
            None,
            "with full sharding there are no weight replicas to hash (Bridge asserts)",
        )
    for path in ("ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"):
        if not config_io.get(work, path):
            change(path, True, "Megatron FSDP always uses the distributed optimizer (Bridge would force it)")
    env_vars = config_io.get(work, "env_vars") or {}
    if isinstance(env_vars, Mapping) and str(env_vars.get(rules.MAX_CONN, "")) == "1":
        change(
            f"env_vars.{rules.MAX_CONN}",
            32,
            "Megatron FSDP needs CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 (Bridge asserts); 32 is what "
            "Bridge's recipes use",
        )
    if set_pp1 and rules.pp_size(rules.Eff(work, {}, None)) > 1:
        change(
            "model.pipeline_model_parallel_size",
            1,
            "--set-pp-1: Megatron FSDP's device mesh has no pipeline axis (wrapping fails with PP > 1); "
            "each GPU now holds every layer's shard, so re-check memory ('mfsdp.py memory')",
        )
        for path, off in PIPELINE_ONLY_KEYS.items():
            if config_io.get(work, _where(work, path), off) != off:
                change(path, off, "--set-pp-1: only meaningful with pipeline parallelism")
    _plan_runtime_fixes(work, change, strategy, perf)

    # Fix-point pass over the rule table: apply every remaining single key=value fix.
    for _ in range(MAX_FIX_ROUNDS):
        progressed = False
        for f in rules.evaluate(work, dict(env or {}), None):
            if f.severity != "error" or f.path.startswith("env.") or f.rule in NEEDS_DECISION:
                continue
            m = _FIX_KV.match(f.fix.strip())
            if not m:
                continue
            path, raw = m.group(1), m.group(2)
            if path.split(".", 1)[0] not in FIX_POINT_SECTIONS:
                continue  # model / optimizer / precision choices are the user's decision: reported, not made
            if path.startswith("mixed_precision.") and not isinstance(work.get("mixed_precision"), dict):
                continue  # a preset name: Bridge's own setup keeps it consistent; never half-expand it
            try:
                value = config_io.coerce(path, config_io.parse_value(raw))
            except InputError:
                continue
            if config_io.get(work, path, S.default(path)) == value:
                continue
            change(path, value, f"{f.rule}: {f.message}")
            progressed = True
        if not progressed:
            break
    if fit_eval_batch:
        world, how = job_world(cfg if given is None else given, work, gpus)
        p = rules.eval_batch_problem(rules.Eff(work, {}, None, world, how))
        if p is not None:
            change(
                "validation.eval_global_batch_size",
                p["nearest"],
                f"--fit-eval-batch: at {world} GPUs ({how}) evaluation takes eval_micro_batch_size {p['embs']} x "
                f"data-parallel size {p['dp']} = {p['step']} samples per step; {p['egbs']} is not a multiple, "
                f"{p['nearest']} is the nearest (Bridge's validate() asserts it)",
            )
            iters = config_io.get(work, "validation.eval_iters")
            if isinstance(iters, int) and not isinstance(iters, bool) and iters > 0:
                new_iters = max(1, -(-iters * p["egbs"] // p["nearest"]))  # ceil: at least as many samples
                change(
                    "validation.eval_iters",
                    new_iters,
                    f"--fit-eval-batch: {iters} x {p['egbs']} = {iters * p['egbs']} samples were evaluated; "
                    f"{new_iters} x {p['nearest']} = {new_iters * p['nearest']} now",
                )
    return [c for c in changes if not _same(c.old, c.new)]


def job_world(given: Mapping, result: Mapping, gpus: int | None = None) -> tuple[int, str]:
    """(world size, how it was found) that the batch-size rules judge the result at.

    ``gpus`` when given. Otherwise the smallest world on which both the given config and the result can
    run (lcm of each layout's smallest world): for ``--set-pp-1`` that is the given layout's, the GPUs the
    job had. A batch that does not divide at that world divides at none of its multiples.
    """
    if gpus is not None:
        return gpus, "given with --gpus"
    w_in = rules.min_world(rules.Eff(given, {}, None))
    w_out = rules.min_world(rules.Eff(result, {}, None))
    world = w_in * w_out // _gcd(w_in, w_out)
    return world, "assumed: the smallest world this config's layout allows; give the job's GPU count with --gpus N"


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _same(a, b) -> bool:
    return a == b and type(a) is type(b)


def _plan_runtime_fixes(work: dict, change, strategy: str, perf: bool) -> None:
    """Settings that only fail when Megatron-Core wraps the model, fixed where the fix is safe.

    Safe means: the same model trains to the same result; only buffering, graph capture
    bookkeeping or initialisation changes. Each ``why`` names the rule that would fire.
    """
    e = rules.Eff(work, {}, None)
    peft = e.get("peft") is not None
    if rules.moe_ep_overlap(e):
        for path in ("ddp.fsdp_double_buffer", "ddp.megatron_fsdp_max_pool_double_buffer"):
            if e.get(path):
                change(
                    path,
                    False,
                    "MFSDP-MOE-OVERLAP-DOUBLE-BUFFER: the expert-parallel A2A overlap does not support FSDP double "
                    "buffering (the wrapper asserts); costs the fixed buffer pool (and NCCL user buffers), not overlap "
                    "(the all-gather prefetch is no longer capped at one unit ahead) or correctness",
                )
    for path in ("model.moe_single_grouped_weight", "model.moe_single_grouped_bias"):
        if e.get(path):
            change(
                path,
                False,
                "MFSDP-MOE-SINGLE-GROUPED-WEIGHT: Megatron FSDP cannot hold Transformer Engine grouped tensors; "
                "the experts keep the same weights, stored one tensor per expert",
            )
    impl = e.get("model.cuda_graph_impl")
    if impl in ("local", "transformer_engine", "full_iteration") and not e.get("ddp.megatron_fsdp_cuda_graph_mode"):
        change(
            "ddp.megatron_fsdp_cuda_graph_mode",
            True,
            f"cuda_graph_impl={impl}: keeps the gradient references graph replay needs (what Megatron-LM sets)",
        )
    if rules.cuda_graph_needs_te_rng(e):
        change(
            "model.use_te_rng_tracker",
            True,
            f"MFSDP-CUDA-GRAPH-TE-RNG: cuda_graph_impl={impl} builds only with Transformer Engine's RNG tracker "
            "(the model build asserts; dropout draws from TE's graph-safe generator)",
        )
    if impl == "full_iteration" and e.get("ddp.fsdp_all_gather_in_start_param_sync"):
        change(
            "ddp.fsdp_all_gather_in_start_param_sync",
            False,
            "MFSDP-FULL-ITER-CUDA-GRAPH: no all-gather outside the captured iteration (what Megatron-LM sets)",
        )
    meta_ok = strategy != "no_shard" and not peft
    if perf:
        for path, (value, why) in PERF_OVERRIDES.items():
            if path == "model.init_model_with_meta_device" and not meta_ok:
                continue  # fails with no_shard (nothing to materialise) and with PEFT (weights load before wrap)
            change(path, value, why)
    co = work.get("comm_overlap")
    if isinstance(co, Mapping) and co.get("defer_embedding_wgrad_compute"):
        change(
            "comm_overlap.defer_embedding_wgrad_compute",
            False,
            "MFSDP-DEFER-EMBEDDING-WGRAD: Bridge's performance harness turns it off because it cannot work with "
            "Megatron FSDP; only the embedding gradient's overlap is lost",
        )
    if not meta_ok and e.get("model.init_model_with_meta_device"):
        rule = "MFSDP-NO-SHARD-META-INIT" if strategy == "no_shard" else "MFSDP-PEFT-META-DEVICE"
        change(
            "model.init_model_with_meta_device",
            False,
            f"{rule}: meta-device init fails here "
            + ("(no_shard materialises nothing)" if strategy == "no_shard" else "(PEFT loads weights before wrapping)"),
        )


def advice(
    cfg: Mapping, changes: list[Change], gpus: int | None = None, world: tuple[int, str] | None = None
) -> list[str]:
    """What the user must know about the checkpoints the result will load (kept, never cleared)."""
    result = apply(cfg, changes)
    out = []
    old_format = config_io.get(cfg, "checkpoint.ckpt_format", S.default("checkpoint.ckpt_format"))
    new_format = config_io.get(result, "checkpoint.ckpt_format")
    load = config_io.get(result, "checkpoint.load")
    if load is not None and old_format != new_format:
        out.append(
            f"checkpoint.load={load} is kept, so the job still resumes after a preemption. If that directory "
            f"already holds {old_format} checkpoints of an earlier run, resuming fails Bridge's format check "
            f"(ckpt_format {new_format}): convert them to {new_format}, or point checkpoint.load and "
            f"checkpoint.save at a fresh directory. `mfsdp.py ckpt {shlex.quote(str(load))} --expect {new_format}` tells which applies "
            f"(exit 0: {new_format}, resumes; 1: another format; 2: nothing there yet, the job starts fresh)."
        )
    pp = next((c for c in changes if c.path.endswith(".pipeline_model_parallel_size") and c.new == 1), None)
    if pp is not None and isinstance(pp.old, int) and pp.old > 1 and gpus is None:
        size = (world or job_world(cfg, result, None))[0]
        dp = rules.data_parallel(rules.Eff(result, {}, None, size, "assumed"))
        out.append(
            f"--set-pp-1: on the same GPUs data parallelism is {pp.old}x larger. The batch sizes were checked at "
            f"{size} GPUs (DP {dp[1] if dp else '?'}), the smallest world this layout allows; the job's own GPU count "
            "may need other batch sizes: give it with --gpus N and run enable again."
        )
    pretrained = config_io.get(result, "checkpoint.pretrained_checkpoint")
    if pretrained is not None and config_io.get(result, "peft") is not None and new_format == "fsdp_dtensor":
        out.append(
            f"checkpoint.pretrained_checkpoint={pretrained} is kept: PEFT loads it as {new_format} unless it is a "
            "Hugging Face folder, so a torch_dist base checkpoint fails at load. Use the Hugging Face folder (or "
            f"convert it). `mfsdp.py ckpt {shlex.quote(str(pretrained))}` tells its format."
        )
    return out


def blocking(findings) -> list:
    """The error findings that make the result unable to start: ``enable`` emits no config while any remain."""
    return [f for f in findings if f.severity == "error"]


def overrides_of(changes: list[Change]) -> dict[str, object]:
    return {c.path: c.new for c in changes}


def apply(cfg: Mapping, changes: list[Change]) -> dict:
    """A copy of the effective config with the changes applied."""
    work = _deep_copy(cfg)
    for c in changes:
        _set(work, c.path, c.new)
    return work


def _deep_copy(obj):
    # copy.deepcopy keeps shared sub-objects shared (its memo), so a YAML file with
    # aliases (&a / *a), even an alias bomb, copies in linear time.
    import copy

    return copy.deepcopy(obj)


def apply_to_object(obj, overrides: Mapping[str, object]) -> None:
    """Set dotted attributes (``ddp.use_megatron_fsdp``) on a real Bridge ``ConfigContainer``.

    ``env_vars.NAME`` sets a key of the ``env_vars`` dict. A missing attribute raises
    ``InputError`` naming it (a typo must not be silently added to the object).
    """
    for path, value in overrides.items():
        parts = path.split(".")
        target = obj
        for p in parts[:-1]:
            if isinstance(target, dict):
                target = target.setdefault(p, {})
                continue
            if not hasattr(target, p):
                raise config_io.input_error(f"{path}: {type(target).__name__} has no attribute '{p}'")
            target = getattr(target, p)
            if target is None:
                raise config_io.input_error(f"{path}: '{p}' is None in this config; set it to a config object first")
        last = parts[-1]
        if isinstance(target, dict):
            target[last] = value
        elif not hasattr(target, last):
            raise config_io.input_error(f"{path}: {type(target).__name__} has no attribute '{last}'")
        else:
            setattr(target, last, value)


# --------------------------------------------------------------------------- rendering


def _plain_scalar(value) -> str | None:
    """null / true / false / numbers, spelt the same in YAML and in Hydra overrides; None for strings."""
    if value is None or isinstance(value, bool):
        return rules.fmt(value)
    if isinstance(value, (int, float)):
        return repr(value)
    return None


def yaml_scalar(value) -> str:
    """A YAML scalar that parses back to ``value`` (plain when safe, else double-quoted)."""
    import yaml

    plain = _plain_scalar(value)
    if plain is not None:
        return plain
    s = str(value)
    try:
        if s and s.strip() == s and "#" not in s and ": " not in s and yaml.safe_load(s) == s:
            return s
    except yaml.YAMLError:
        pass
    # PyYAML's own double-quoted style: escapes whatever YAML needs escaped, on one line.
    return yaml.safe_dump(s, default_style='"', width=float("inf"), allow_unicode=True).rstrip("\n")


def hydra_value(value) -> str:
    """A Hydra override value that parses back to ``value`` (quoted when it has special characters)."""
    plain = _plain_scalar(value)
    if plain is not None:
        return plain
    s = str(value)
    if re.match(r"^[A-Za-z0-9_./:@+-]+$", s) and config_io.parse_value(s) == s:
        return s
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def render_overrides(changes: list[Change]) -> str:
    """Hydra lines; a key new to ``env_vars`` gets Hydra's '+' (Bridge parses overrides in struct mode)."""
    return "".join(
        f"{'+' if c.path.startswith('env_vars.') and c.old is None else ''}{c.path}={hydra_value(c.new)}\n"
        for c in changes
    )


def render_python(changes: list[Change]) -> str:
    lines = ["# Megatron FSDP overrides for a Megatron-Bridge ConfigContainer `cfg` (generated by mfsdp.py enable)\n"]
    for c in changes:
        sec, _, key = c.path.partition(".")
        if sec == "env_vars":
            lines.append(f"cfg.env_vars[{key!r}] = {c.new!r}\n")
        elif sec == "mixed_precision":
            lines.append(f"cfg.mixed_precision.{key} = {c.new!r}  # after get_mixed_precision_config()\n")
        else:
            lines.append(f"cfg.{c.path} = {c.new!r}\n")
    return "".join(lines)


class NeedsRedump(Exception):
    """The text cannot be edited line-wise at this path."""


_TOP = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):(.*)$")


def _top_rest(line: str, path: str) -> str:
    """What follows ``section:`` on a top-level line (found by ``_TOP`` before; re-dump if it no longer matches)."""
    m = _TOP.match(line.rstrip("\r\n"))
    if m is None:
        raise NeedsRedump(path)
    return m.group(2)


def _is_content(line: str) -> bool:
    s = line.strip()
    return bool(s) and not s.startswith("#")


def _split_comment(rest: str) -> tuple[str, str]:
    """(value, ' # comment') for the text after 'key:'; comments only after whitespace."""
    m = re.search(r"\s+#", rest)
    if m and rest[: m.start()].count('"') % 2 == 0 and rest[: m.start()].count("'") % 2 == 0:
        return rest[: m.start()], rest[m.start() :]
    return rest, ""


def _edit_one(lines: list[str], path: str, value) -> list[str]:
    parts = path.split(".")
    if len(parts) > 2:
        raise NeedsRedump(path)
    sec = parts[0]
    nl = "\n"
    sec_idx = None
    for i, line in enumerate(lines):
        m = _TOP.match(line.rstrip("\r\n"))
        if m and m.group(1) == sec:
            sec_idx = i
            break
    scalar = yaml_scalar(value)
    if len(parts) == 1:
        if sec_idx is None:
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += nl
            return lines + [f"{sec}: {scalar}{nl}"]
        rest = _top_rest(lines[sec_idx], path)
        val, comment = _split_comment(rest)
        if not val.strip() or val.strip().startswith(("|", ">", "&", "!")):
            raise NeedsRedump(path)
        lines[sec_idx] = f"{sec}: {scalar}{comment}{nl}"
        return lines
    key = parts[1]
    if sec_idx is None:
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += nl
        return lines + [f"{sec}:{nl}", f"  {key}: {scalar}{nl}"]
    rest = _top_rest(lines[sec_idx], path)
    val, comment = _split_comment(rest)
    if val.strip():
        if val.strip() in ("null", "~", "{}"):
            lines[sec_idx] = f"{sec}:{comment}{nl}"
            lines.insert(sec_idx + 1, f"  {key}: {scalar}{nl}")
            return lines
        raise NeedsRedump(path)  # flow mapping or a scalar section (e.g. a mixed-precision preset name)
    end = len(lines)
    indent = None
    for j in range(sec_idx + 1, len(lines)):
        line = lines[j]
        if not _is_content(line):
            continue
        ind = len(line) - len(line.lstrip(" "))
        if ind == 0:
            end = j
            break
        if indent is None:
            indent = ind
    if indent is None:
        indent = 2
    pat = re.compile(r"^" + " " * indent + re.escape(key) + r":(.*)$")
    for j in range(sec_idx + 1, end):
        m = pat.match(lines[j].rstrip("\r\n"))
        if not m:
            continue
        val, comment = _split_comment(m.group(1))
        # a block value (children on the next lines) or a multi-line scalar cannot be edited here
        nxt = next((lines[k] for k in range(j + 1, end) if _is_content(lines[k])), None)
        if (
            not val.strip()
            or val.strip().startswith(("|", ">", "&", "*", "!", "[", "{"))
            or (nxt is not None and len(nxt) - len(nxt.lstrip(" ")) > indent)
        ):
            raise NeedsRedump(path)
        lines[j] = f"{' ' * indent}{key}: {scalar}{comment}{nl}"
        return lines
    # not present: insert after the section's last content line
    last = sec_idx
    for j in range(sec_idx + 1, end):
        if _is_content(lines[j]):
            last = j
    if not lines[last].endswith("\n"):
        lines[last] += nl
    lines.insert(last + 1, f"{' ' * indent}{key}: {scalar}{nl}")
    return lines


def yaml_edit(text: str, data: Mapping, changes: list[Change]) -> tuple[str, bool]:
    """Apply changes to YAML text in place; (new text, edited_in_place). Falls back to a re-dump."""
    import yaml

    expected = _deep_copy(dict(data))
    for c in changes:
        _set(expected, c.path, c.new)
    try:
        lines = text.splitlines(keepends=True)
        for c in changes:
            lines = _edit_one(lines, c.path, c.new)
        new = "".join(lines)
        if config_io.parse_yaml(new, "edited") == expected:
            return new, True
    except (NeedsRedump, InputError):
        pass
    return yaml.safe_dump(expected, sort_keys=False, default_flow_style=False), False
