"""THE rule table: every Megatron FSDP constraint, checked all at once.

Bridge's ``ConfigContainer.validate()`` asserts on the first problem only, and some
constraints live outside it (Megatron-Core's DDP and Transformer configs, the
Megatron-FSDP wrapper, the environment). This module restates each one as a table
entry, ``Rule(...)``, so ``check`` reports every problem in one pass, and so a
newcomer finds a rule in one step: search this file for its id, or for the assert
message quoted in ``source``.

Each rule has:

* ``id``        stable, never reused for another meaning (``MFSDP-CKPT-FORMAT``);
* ``severity``  error / warning / info (see ``findings.SEVERITIES``);
* ``stage``     where the real stack acts on it:
                ``validate`` - Bridge's ``runtime_config_update()`` raises (the differential
                test holds us to Bridge's verdict on these);
                ``runtime``  - Bridge accepts the config, the job fails later (model wrap,
                first step); documented exceptions in the differential test;
                a rule is ``runtime`` only when the failing assert is on the path every
                such job takes (read the code before and after it: Megatron FSDP, for one,
                forces ``fsdp_double_buffer`` itself before its NCCL-UB assert);
                ``rewrite``  - Bridge silently changes the value; we say so;
                ``input``    - a value Bridge accepts silently but is wrong (misspelt enum);
                ``advice``   - a performance / robustness recommendation;
* ``paths``     the dotted keys involved; the first one is what the user should change;
* ``when``      predicate over an ``Eff`` view (effective values after what Bridge
                does before validating: env_vars with setdefault, mixed-precision copy);
* ``message``   callable giving one sentence that names the value found;
* ``fix``       a concrete change, a ``key=value`` where possible;
* ``source``    ``file: symbol: 'assert message'`` in the real wheels (site-packages relative).

``evaluate(cfg, env, gpu_arch)`` returns the findings. The predicates are plain
lambdas over dict look-ups: import cost is what keeps ``check`` within a few
interpreter start-ups, so there is no framework here.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping

from . import schema as S
from .findings import Finding

# GPU architectures whose tuned Bridge recipes ask for CUDA_DEVICE_MAX_CONNECTIONS=1 with
# communication overlap (Bridge's H100 perf recipes: "CUDA stream scheduling for this model and
# parallel layout"); its B200/GB200 recipes use 32. Megatron FSDP forbids 1, hence the advice rule.
PRE_BLACKWELL_ARCHS = ("volta", "ampere", "ada", "hopper")
KNOWN_ARCHS = PRE_BLACKWELL_ARCHS + ("blackwell",)
# Product names people actually type, mapped to their architecture.
ARCH_ALIASES = {
    "v100": "volta",
    "a100": "ampere",
    "a10": "ampere",
    "a30": "ampere",
    "a40": "ampere",
    "l4": "ada",
    "l40": "ada",
    "l40s": "ada",
    "h100": "hopper",
    "h200": "hopper",
    "h800": "hopper",
    "h20": "hopper",
    "gh200": "hopper",
    "b200": "blackwell",
    "b300": "blackwell",
    "gb200": "blackwell",
    "gb300": "blackwell",
}


def normalize_arch(name: str | None) -> str | None:
    """'H100' -> 'hopper'; an architecture name passes through; None for unknown or empty."""
    if not name:
        return None
    key = str(name).strip().lower()
    key = ARCH_ALIASES.get(key, key)
    m = re.match(r"^(?:sm_?)?(\d{2,3})$|^(\d+)\.(\d)$", key)  # sm_90, sm90, 90, 9.0: compute capability
    if m:
        cc = int(m.group(1)) if m.group(1) else int(m.group(2)) * 10 + int(m.group(3))
        key = next((arch for low, arch in _CC_ARCHS if cc >= low), "")
    return key if key in KNOWN_ARCHS else None


# (lowest compute capability x10, architecture), newest first: torch.cuda.get_device_capability().
_CC_ARCHS = ((100, "blackwell"), (90, "hopper"), (89, "ada"), (80, "ampere"), (70, "volta"))

# Checkpoint formats that survive without Gloo process groups / with async save.
DIST_CKPT_FORMATS = ("torch_dist", "fsdp_dtensor")

MAX_CONN = "CUDA_DEVICE_MAX_CONNECTIONS"


class Eff:
    """Effective values the rules read, after what Bridge does before ``validate()``.

    * ``env``: the given environment with the config's ``env_vars`` applied with
      ``setdefault`` (Bridge's ``apply_environment_variables``: the process wins).
    * mixed precision: when ``mixed_precision`` is a preset name or a mapping, its
      fields overwrite same-named fields of ``ddp``/``optimizer``/``model``
      (``MixedPrecisionConfig.setup`` -> ``update_config_with_precision_overrides``),
      and ``origin(path)`` reports the ``mixed_precision.*`` key as the one to change.
    """

    __slots__ = ("cfg", "env", "env_from_config", "gpu_arch", "mp", "_mp_paths")

    def __init__(self, cfg: Mapping, env: Mapping[str, str], gpu_arch: str | None):
        self.cfg = cfg
        self.gpu_arch = normalize_arch(gpu_arch)
        merged = dict(env)
        self.env_from_config = set()  # names whose value came from the config's env_vars
        env_vars = cfg.get("env_vars")
        if isinstance(env_vars, Mapping):
            for name, value in env_vars.items():
                if str(name) not in merged:
                    merged[str(name)] = _env_str(value)
                    self.env_from_config.add(str(name))
        self.env = merged
        self.mp = resolve_mixed_precision(cfg.get("mixed_precision"))
        self._mp_paths = {}
        if self.mp is not None:
            for sec, keys in S.MP_TARGETS.items():
                for k in keys:
                    self._mp_paths[f"{sec}.{k}"] = f"mixed_precision.{k}"

    def get(self, path: str):
        mp_path = self._mp_paths.get(path)
        if mp_path is not None:
            return self.mp.get(mp_path.split(".", 1)[1])
        return raw_get(self.cfg, path)

    def origin(self, path: str) -> str:
        """The key the user must edit to change ``path`` (mixed precision wins over ddp.*)."""
        return self._mp_paths.get(path, path)

    @property
    def fsdp(self) -> bool:
        """Megatron FSDP is on when either flag is (Bridge then sets both)."""
        return bool(self.get("dist.use_megatron_fsdp")) or bool(self.get("ddp.use_megatron_fsdp"))

    @property
    def ckpt_io(self) -> bool:
        """Bridge's guard 'only check if saving or loading'."""
        return self.get("checkpoint.save") is not None or self.get("checkpoint.load") is not None

    @property
    def dist_opt(self) -> bool:
        """Distributed optimizer after Bridge's sync (either flag, or forced by Megatron FSDP)."""
        return (
            self.fsdp
            or bool(self.get("ddp.use_distributed_optimizer"))
            or bool(self.get("optimizer.use_distributed_optimizer"))
        )


def _env_str(value) -> str:
    # Bridge does os.environ.setdefault(name, str(value)): Python's str(), so True -> "True".
    return str(value)


def raw_get(cfg: Mapping, path: str):
    """Value at a dotted path, falling back to the schema default when absent."""
    node = cfg
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            d = S.default(path)
            return None if d == S.FACTORY else d  # computed at construction: unknown here
        node = node[part]
    return node


def resolve_mixed_precision(mp) -> dict | None:
    """The preset's fields (name given) or the mapping's fields over the class defaults."""
    if mp is None:
        return None
    if isinstance(mp, str):
        preset = S.MIXED_PRECISION_PRESETS.get(mp)
        return dict(preset) if preset is not None else None
    if isinstance(mp, Mapping):
        out = dict(S._MP_BASE)
        out.update({k: v for k, v in mp.items() if k in out})
        return out
    return None


class Rule:
    __slots__ = ("id", "severity", "stage", "paths", "when", "message", "fix", "source")

    def __init__(
        self, id: str, severity: str, stage: str, paths: tuple, when: Callable, message: Callable, fix, source: str
    ):
        self.id, self.severity, self.stage, self.paths = id, severity, stage, paths
        self.when, self.message, self.fix, self.source = when, message, fix, source


def _v(e: Eff, path: str) -> str:
    """``path=value`` as the user wrote it (YAML spelling for None/bools)."""
    return f"{e.origin(path)}={fmt(e.get(path))}"


def fmt(value) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def _envfmt(e: Eff, name: str) -> str:
    if name not in e.env:
        return f"{name} unset"
    where = "the config's env_vars" if name in e.env_from_config else "the environment"
    return f"{name}={e.env[name]!r} (from {where})"


# Prefix of a source that is in the Megatron-Bridge repository but not in the wheel (the
# performance harness under scripts/): cited as found there, not checked offline.
GITHUB_ONLY = "Megatron-Bridge repository, not in the wheel:"

# Source anchors reused by several rules.
_FSDP_CFG = f"{S.B_CFG}: ConfigContainer._validate_and_apply_megatron_fsdp_configs"
_VALIDATE = f"{S.B_CFG}: ConfigContainer.validate"
_MFSDP_BUF = "megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py"

RULES: list[Rule] = [
    # ------------------------------------------------------------------ validate: Bridge raises
    Rule(
        "MFSDP-FSDP2-EXCLUSIVE",
        "error",
        "validate",
        ("dist.use_torch_fsdp2", "dist.use_megatron_fsdp"),
        lambda e: bool(e.get("dist.use_megatron_fsdp")) and bool(e.get("dist.use_torch_fsdp2")),
        lambda e: "dist.use_megatron_fsdp=true and dist.use_torch_fsdp2=true: Bridge allows only one FSDP.",
        "dist.use_torch_fsdp2=false",
        f"{_VALIDATE}: ValueError 'use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive.'",
    ),
    Rule(
        "MFSDP-CKPT-FORMAT",
        "error",
        "validate",
        ("checkpoint.ckpt_format", "checkpoint.save", "checkpoint.load"),
        lambda e: e.fsdp and e.ckpt_io and e.get("checkpoint.ckpt_format") != "fsdp_dtensor",
        lambda e: (
            f"Megatron FSDP with a checkpoint directory (save={fmt(e.get('checkpoint.save'))}, "
            f"load={fmt(e.get('checkpoint.load'))}) needs ckpt_format fsdp_dtensor, found "
            f"{fmt(e.get('checkpoint.ckpt_format'))}."
        ),
        "checkpoint.ckpt_format=fsdp_dtensor (or set both checkpoint.save and checkpoint.load to null)",
        f"{_FSDP_CFG}: assert 'Megatron-FSDP requires the fsdp_dtensor checkpointing format!'",
    ),
    Rule(
        "MFSDP-DTENSOR-NEEDS-MFSDP",
        "error",
        "validate",
        ("checkpoint.ckpt_format", "ddp.use_megatron_fsdp"),
        lambda e: (
            e.ckpt_io
            and e.get("checkpoint.ckpt_format") == "fsdp_dtensor"
            and (not e.fsdp or bool(e.get("dist.use_torch_fsdp2")))
        ),
        lambda e: (
            "checkpoint.ckpt_format=fsdp_dtensor is only valid with Megatron FSDP, found "
            f"ddp.use_megatron_fsdp={fmt(e.get('ddp.use_megatron_fsdp'))}, "
            f"dist.use_megatron_fsdp={fmt(e.get('dist.use_megatron_fsdp'))}, "
            f"dist.use_torch_fsdp2={fmt(e.get('dist.use_torch_fsdp2'))}."
        ),
        "checkpoint.ckpt_format=torch_dist, or enable Megatron FSDP (mfsdp.py enable)",
        f"{_VALIDATE}: assert 'fsdp_dtensor checkpoint format only supports Megatron FSDP'",
    ),
    Rule(
        "MFSDP-ENV-MAX-CONNECTIONS",
        "error",
        "validate",
        ("env." + MAX_CONN,),
        lambda e: (
            e.fsdp
            and e.env.get(MAX_CONN) == "1"
            and [
                (
                    f"env_vars.{MAX_CONN}",
                    f"{_envfmt(e, MAX_CONN)}; Megatron FSDP needs it unset or > 1.",
                    f"env_vars.{MAX_CONN}=32",
                )
                if MAX_CONN in e.env_from_config
                else (
                    f"env.{MAX_CONN}",
                    f"{_envfmt(e, MAX_CONN)}; Megatron FSDP needs it unset or > 1.",
                    f"unset {MAX_CONN} in the job's environment (or set it to 32)",
                )
            ]
        ),
        None,
        None,
        f"{_FSDP_CFG}: assert 'FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.'",
    ),
    Rule(
        "MFSDP-MANUAL-REG-NEEDS-NCCL-UB",
        "error",
        "validate",
        ("ddp.fsdp_manual_registration", "ddp.nccl_ub"),
        lambda e: e.fsdp and not e.get("ddp.nccl_ub") and bool(e.get("ddp.fsdp_manual_registration")),
        lambda e: "ddp.fsdp_manual_registration=true without ddp.nccl_ub=true.",
        "ddp.fsdp_manual_registration=false (or ddp.nccl_ub=true)",
        f"{_FSDP_CFG}: assert 'DDP.fsdp_manual_registration requires DDP.nccl_ub!'",
    ),
    Rule(
        "MFSDP-WEIGHT-HASH",
        "error",
        "validate",
        ("train.check_weight_hash_across_dp_replicas_interval", "ddp.data_parallel_sharding_strategy"),
        lambda e: (
            e.fsdp
            and e.get("ddp.data_parallel_sharding_strategy") == "optim_grads_params"
            and e.get("train.check_weight_hash_across_dp_replicas_interval") is not None
        ),
        lambda e: (
            f"{_v(e, 'train.check_weight_hash_across_dp_replicas_interval')} with sharding "
            "optim_grads_params: weights are sharded, there are no replicas to hash."
        ),
        "train.check_weight_hash_across_dp_replicas_interval=null",
        f"{_FSDP_CFG}: assert 'TrainingConfig.check_weight_hash_across_dp_replicas_interval is not supported "
        "with the Megatron-FSDP optim_grads_params sharding strategy'",
    ),
    Rule(
        "MFSDP-TP-PP-DP-MAPPING",
        "error",
        "validate",
        ("dist.use_tp_pp_dp_mapping",),
        lambda e: e.fsdp and bool(e.get("dist.use_tp_pp_dp_mapping")),
        lambda e: "dist.use_tp_pp_dp_mapping=true is not supported with Megatron FSDP.",
        "dist.use_tp_pp_dp_mapping=false",
        f"{_FSDP_CFG}: assert 'use_tp_pp_dp_mapping is not supported with Megatron FSDP'",
    ),
    Rule(
        "MFSDP-ASYNC-FORMAT",
        "error",
        "validate",
        ("checkpoint.async_save", "checkpoint.ckpt_format"),
        lambda e: bool(e.get("checkpoint.async_save")) and e.get("checkpoint.ckpt_format") not in DIST_CKPT_FORMATS,
        lambda e: f"checkpoint.async_save=true with ckpt_format {fmt(e.get('checkpoint.ckpt_format'))}.",
        "checkpoint.ckpt_format=fsdp_dtensor (with Megatron FSDP) or checkpoint.async_save=false",
        f"{_VALIDATE}: assert \"async_save is only supported with ckpt_format='torch_dist','fsdp_dtensor'\"",
    ),
    Rule(
        "MFSDP-ASYNC-NEEDS-SAVE",
        "error",
        "validate",
        ("checkpoint.save", "checkpoint.async_save"),
        lambda e: bool(e.get("checkpoint.async_save")) and e.get("checkpoint.save") is None,
        lambda e: "checkpoint.async_save=true but checkpoint.save is null.",
        "checkpoint.save=/path/to/checkpoints (or checkpoint.async_save=false)",
        f"{S.B_CFG}: CheckpointConfig.finalize: assert 'async_save is enabled, but save is not set. "
        "Set save to a valid path.'",
    ),
    Rule(
        "MFSDP-ASYNC-PERSISTENT-WORKER",
        "error",
        "validate",
        ("checkpoint.use_persistent_ckpt_worker", "checkpoint.async_save"),
        lambda e: bool(e.get("checkpoint.async_save")) and not e.get("checkpoint.use_persistent_ckpt_worker"),
        lambda e: "checkpoint.async_save=true with checkpoint.use_persistent_ckpt_worker=false.",
        "checkpoint.use_persistent_ckpt_worker=true",
        f"{S.B_CFG}: CheckpointConfig.finalize: assert 'async_save requires use_persistent_ckpt_worker=True.'",
    ),
    Rule(
        "MFSDP-HF-EXPORT-DTENSOR",
        "error",
        "validate",
        ("checkpoint.also_save_hf_checkpoint", "checkpoint.ckpt_format"),
        lambda e: (
            bool(e.get("checkpoint.also_save_hf_checkpoint")) and e.get("checkpoint.ckpt_format") == "fsdp_dtensor"
        ),
        lambda e: "checkpoint.also_save_hf_checkpoint=true cannot be combined with ckpt_format fsdp_dtensor.",
        "checkpoint.also_save_hf_checkpoint=false (convert to HF offline from the fsdp_dtensor checkpoint)",
        f'{S.B_CFG}: CheckpointConfig.finalize: ValueError "also_save_hf_checkpoint=True is not supported '
        "together with ckpt_format='fsdp_dtensor'.\"",
    ),
    Rule(
        "MFSDP-HF-EXPORT-LOCAL",
        "error",
        "validate",
        ("checkpoint.non_persistent_ckpt_type", "checkpoint.also_save_hf_checkpoint"),
        lambda e: (
            bool(e.get("checkpoint.also_save_hf_checkpoint"))
            and e.get("checkpoint.non_persistent_ckpt_type") == "local"
        ),
        lambda e: "checkpoint.also_save_hf_checkpoint=true with non_persistent_ckpt_type=local.",
        "checkpoint.non_persistent_ckpt_type=global (or null)",
        f"{S.B_CFG}: CheckpointConfig.finalize: ValueError 'also_save_hf_checkpoint=True is not compatible "
        "with local non-persistent checkpoints.'",
    ),
    Rule(
        "MFSDP-HF-EXPORT-SOURCE",
        "error",
        "validate",
        ("checkpoint.hf_source_path", "checkpoint.also_save_hf_checkpoint"),
        lambda e: (
            bool(e.get("checkpoint.also_save_hf_checkpoint"))
            and not e.get("checkpoint.hf_source_path")
            and not raw_get(e.cfg, "model.hf_model_id")
            and not raw_get(e.cfg, "tokenizer.tokenizer_model")
        ),
        lambda e: (
            "checkpoint.also_save_hf_checkpoint=true but no HF source: hf_source_path, model.hf_model_id "
            "and tokenizer.tokenizer_model are all unset."
        ),
        "checkpoint.hf_source_path=<HF model id or local HF folder>",
        f"{S.B_CFG}: ConfigContainer._validate_hf_checkpoint_export_source: ValueError "
        "'also_save_hf_checkpoint=True requires an HF source to template config/tokenizer files.'",
    ),
    Rule(
        "MFSDP-CKPT-NO-GLOO",
        "error",
        "validate",
        ("checkpoint.ckpt_format", "dist.use_gloo_process_groups"),
        lambda e: (
            not e.get("dist.use_gloo_process_groups")
            and e.dist_opt
            and e.get("checkpoint.ckpt_format") not in DIST_CKPT_FORMATS
        ),
        lambda e: (
            f"dist.use_gloo_process_groups=false with the distributed optimizer"
            f"{' (forced by Megatron FSDP)' if e.fsdp else ''} and ckpt_format "
            f"{fmt(e.get('checkpoint.ckpt_format'))}: legacy checkpointing needs Gloo."
        ),
        "checkpoint.ckpt_format=fsdp_dtensor (Megatron FSDP) or torch_dist",
        f"{_VALIDATE}: assert \"Legacy checkpointing requires ckpt_format='torch_dist' or 'fsdp_dtensor'\"",
    ),
    Rule(
        "MFSDP-MXFP8-REUSE-NEEDS-FP8-GATHER",
        "error",
        "validate",
        ("ddp.reuse_grad_buf_for_mxfp8_param_ag", "ddp.fp8_param_gather"),
        lambda e: bool(e.get("ddp.reuse_grad_buf_for_mxfp8_param_ag")) and not e.get("ddp.fp8_param_gather"),
        lambda e: (
            f"{_v(e, 'ddp.reuse_grad_buf_for_mxfp8_param_ag')} without fp8_param_gather "
            "(checked when the DDP config is finalized, before Megatron FSDP switches it off)."
        ),
        lambda e: f"{e.origin('ddp.reuse_grad_buf_for_mxfp8_param_ag')}=false",
        f"{S.MC_DDP}: DistributedDataParallelConfig.__post_init__ (run by the Bridge ddp.finalize): "
        "assert 'Reuse grad buffer only when keeping params in MXFP8.'",
    ),
    Rule(
        "MFSDP-MXFP8-REUSE-NON-FSDP",
        "error",
        "validate",
        ("mixed_precision.reuse_grad_buf_for_mxfp8_param_ag", "dist.use_megatron_fsdp"),
        lambda e: (
            not e.fsdp
            and e.mp is not None
            and bool(e.mp.get("fp8_param_gather"))
            and e.mp.get("fp8_recipe") == "mxfp8"
            and not e.mp.get("reuse_grad_buf_for_mxfp8_param_ag")
        ),
        lambda e: "Without Megatron FSDP, MXFP8 with fp8_param_gather needs reuse_grad_buf_for_mxfp8_param_ag=true.",
        "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag=true (or enable Megatron FSDP)",
        f"{_VALIDATE}: assert \"When fp8_param_gather=True and fp8_recipe='mxfp8', "
        'reuse_grad_buf_for_mxfp8_param_ag must be set to True"',
    ),
    Rule(
        "MFSDP-DDP-BUCKETS",
        "error",
        "validate",
        ("ddp.num_buckets", "ddp.bucket_size"),
        lambda e: (
            e.get("ddp.num_buckets") is not None
            and (e.get("ddp.bucket_size") is not None or not _int_gt(e.get("ddp.num_buckets"), 0))
        ),
        lambda e: (
            f"{_v(e, 'ddp.num_buckets')} with {_v(e, 'ddp.bucket_size')}: set one of them, and num_buckets must be > 0."
        ),
        "ddp.bucket_size=null (or ddp.num_buckets=null)",
        f"{S.MC_DDP}: DistributedDataParallelConfig.__post_init__: assert 'Cannot specify both num_buckets "
        "and bucket_size' / 'num_buckets must be greater than 0'",
    ),
    Rule(
        "MFSDP-PRECISION-BOTH",
        "error",
        "validate",
        ("model.bf16", "model.fp16"),
        lambda e: (
            (bool(e.get("model.bf16")) and bool(e.get("model.fp16")))
            or (bool(e.get("optimizer.bf16")) and bool(e.get("optimizer.fp16")))
        ),
        lambda e: (
            f"bf16 and fp16 both on ({_v(e, 'model.bf16')}, {_v(e, 'model.fp16')}, "
            f"{_v(e, 'optimizer.bf16')}, {_v(e, 'optimizer.fp16')})."
        ),
        "mixed_precision=bf16_mixed (sets model and optimizer consistently)",
        f"{S.B_CFG}: _validate_mixed_precision_consistency: assert 'Model config cannot have both bf16=True "
        "and fp16=True.'",
    ),
    Rule(
        "MFSDP-PRECISION-AWARE-MISMATCH",
        "error",
        "validate",
        ("optimizer.bf16", "optimizer.use_precision_aware_optimizer"),
        lambda e: (
            bool(e.get("optimizer.use_precision_aware_optimizer"))
            and (
                (bool(e.get("model.bf16")) and not e.get("optimizer.bf16"))
                or (bool(e.get("model.fp16")) and not e.get("optimizer.fp16"))
                or (
                    not e.get("model.bf16")
                    and not e.get("model.fp16")
                    and (bool(e.get("optimizer.bf16")) or bool(e.get("optimizer.fp16")))
                )
            )
        ),
        lambda e: (
            f"optimizer.use_precision_aware_optimizer=true with model precision ({_v(e, 'model.bf16')}, "
            f"{_v(e, 'model.fp16')}) different from the optimizer's ({_v(e, 'optimizer.bf16')}, "
            f"{_v(e, 'optimizer.fp16')})."
        ),
        "set optimizer.bf16/optimizer.fp16 equal to model.bf16/model.fp16 (a mixed_precision preset does it)",
        f"{S.B_CFG}: _validate_mixed_precision_consistency: assert 'optimizer.bf16=True must be set when "
        "model.bf16=True and use_precision_aware_optimizer=True.'",
    ),
    Rule(
        "MFSDP-PRECISION-AWARE-NEEDS-DIST-OPT",
        "error",
        "validate",
        ("optimizer.use_distributed_optimizer", "optimizer.use_precision_aware_optimizer"),
        lambda e: (
            bool(e.get("optimizer.use_precision_aware_optimizer")) and not e.get("optimizer.use_distributed_optimizer")
        ),
        lambda e: (
            "optimizer.use_precision_aware_optimizer=true with optimizer.use_distributed_optimizer=false: "
            "checked when the optimizer config is finalized, before Megatron FSDP would turn it on."
        ),
        "optimizer.use_distributed_optimizer=true",
        f"{S.MC_OPT}: OptimizerConfig.__post_init__ (run by the Bridge optimizer.finalize): "
        "assert '--use-precision-aware-optimizer only supported with distributed optimizer'",
    ),
    Rule(
        "MFSDP-PRECISION-AWARE-ADAM",
        "error",
        "validate",
        ("optimizer.optimizer", "optimizer.use_precision_aware_optimizer"),
        lambda e: bool(e.get("optimizer.use_precision_aware_optimizer")) and e.get("optimizer.optimizer") != "adam",
        lambda e: f"optimizer.use_precision_aware_optimizer=true with {_v(e, 'optimizer.optimizer')}.",
        "optimizer.optimizer=adam (or optimizer.use_precision_aware_optimizer=false)",
        f"{S.MC_OPT}: OptimizerConfig.__post_init__: assert '--use-precision-aware-optimizer only supported with adam'",
    ),
    Rule(
        "MFSDP-RECOMPUTE-FULL-METHOD",
        "error",
        "validate",
        ("model.recompute_method", "model.recompute_granularity"),
        lambda e: e.get("model.recompute_granularity") == "full" and e.get("model.recompute_method") is None,
        lambda e: "model.recompute_granularity=full with model.recompute_method=null.",
        "model.recompute_method=uniform (or block; with model.recompute_num_layers)",
        f'{S.MC_TC}: TransformerConfig.__post_init__: ValueError \'recompute_method must be "block" or "uniform"\'',
    ),
    Rule(
        "MFSDP-RECOMPUTE-FULL-NUM-LAYERS",
        "error",
        "validate",
        ("model.recompute_num_layers", "model.recompute_granularity"),
        lambda e: e.get("model.recompute_granularity") == "full" and e.get("model.recompute_num_layers") is None,
        lambda e: "model.recompute_granularity=full with model.recompute_num_layers=null.",
        "model.recompute_num_layers=1 (between 1 and the layers per pipeline rank)",
        f"{S.MC_TC}: TransformerConfig.__post_init__: ValueError 'recompute_num_layers must be between "
        "1 and num_layers_per_pipeline_rank'",
    ),
    Rule(
        "MFSDP-RECOMPUTE-SELECTIVE-NUM-LAYERS",
        "error",
        "validate",
        ("model.recompute_num_layers", "model.recompute_granularity"),
        lambda e: (
            e.get("model.recompute_granularity") == "selective" and e.get("model.recompute_num_layers") is not None
        ),
        lambda e: f"model.recompute_granularity=selective with {_v(e, 'model.recompute_num_layers')}.",
        "model.recompute_num_layers=null",
        f"{S.MC_TC}: TransformerConfig.__post_init__: ValueError 'recompute_num_layers must be None.'",
    ),
    Rule(
        "MFSDP-CPU-OFFLOAD-PP",
        "error",
        "validate",
        ("model.cpu_offloading", "model.pipeline_model_parallel_size"),
        lambda e: bool(e.get("model.cpu_offloading")) and _int_gt(e.get("model.pipeline_model_parallel_size"), 1),
        lambda e: f"model.cpu_offloading=true with {_v(e, 'model.pipeline_model_parallel_size')}.",
        "model.pipeline_model_parallel_size=1 (or model.cpu_offloading=false)",
        f"{S.MC_TC}: TransformerConfig.__post_init__ (run by model.finalize): ValueError 'Currently there is "
        "no support for Pipeline parallelism with CPU offloading'",
    ),
    Rule(
        "MFSDP-CPU-OFFLOAD-RECOMPUTE",
        "error",
        "validate",
        ("model.recompute_granularity", "model.cpu_offloading"),
        lambda e: bool(e.get("model.cpu_offloading")) and e.get("model.recompute_granularity") is not None,
        lambda e: f"model.cpu_offloading=true with {_v(e, 'model.recompute_granularity')}.",
        "model.recompute_granularity=null (or model.cpu_offloading=false)",
        f"{S.MC_TC}: TransformerConfig.__post_init__: ValueError 'CPU offloading does not work when "
        "activation recomputation is enabled'",
    ),
    Rule(
        "MFSDP-CPU-OFFLOAD-LAYERS",
        "error",
        "validate",
        ("model.cpu_offloading_num_layers", "model.num_layers"),
        lambda e: bool(e.get("model.cpu_offloading")) and _bad_offload_layers(e),
        lambda e: (
            f"{_v(e, 'model.cpu_offloading_num_layers')} must be >= 0 and < "
            f"model.num_layers={fmt(e.get('model.num_layers'))}."
        ),
        lambda e: f"model.cpu_offloading_num_layers={max(0, _as_int(e.get('model.num_layers'), 1) - 1)}",
        f"{S.MC_TC}: TransformerConfig.__post_init__: ValueError 'CPU offloading can be done only for layers "
        "less than {num_layers}'",
    ),
    Rule(
        "MFSDP-CPU-OFFLOAD-FINE-GRAINED",
        "error",
        "validate",
        ("model.fine_grained_activation_offloading", "model.cpu_offloading"),
        lambda e: bool(e.get("model.cpu_offloading")) and bool(e.get("model.fine_grained_activation_offloading")),
        lambda e: "model.cpu_offloading=true together with model.fine_grained_activation_offloading=true.",
        "choose one: model.fine_grained_activation_offloading=false or model.cpu_offloading=false",
        f"{S.MC_TC}: TransformerConfig.__post_init__: assert 'fine_grained_activation_offloading cannot be "
        "enabled with cpu_offloading.'",
    ),
    Rule(
        "MFSDP-FINE-GRAINED-OFFLOAD-MODULES",
        "error",
        "validate",
        ("model.offload_modules", "model.fine_grained_activation_offloading"),
        lambda e: bool(e.get("model.fine_grained_activation_offloading")) and not e.get("model.offload_modules"),
        lambda e: (
            f"model.fine_grained_activation_offloading=true with {_v(e, 'model.offload_modules')}: nothing to offload."
        ),
        "model.offload_modules=[core_attn,attn_proj] (or model.fine_grained_activation_offloading=false)",
        f"{S.MC_TC}: TransformerConfig.__post_init__: "
        "'assert self.offload_modules is not None and len(self.offload_modules) > 0'",
    ),
    Rule(
        "MFSDP-CPU-OFFLOAD-CUDA-GRAPH",
        "error",
        "validate",
        ("model.cuda_graph_impl", "model.cpu_offloading"),
        lambda e: (
            bool(e.get("model.cpu_offloading")) and e.get("model.cuda_graph_impl") not in ("none", "full_iteration")
        ),
        lambda e: f"model.cpu_offloading=true with {_v(e, 'model.cuda_graph_impl')}.",
        "model.cuda_graph_impl=none (or model.cpu_offloading=false)",
        f"{S.MC_TC}: TransformerConfig.__post_init__: ValueError 'CUDA graphs not supported with CPU offloading.'",
    ),
    Rule(
        "MFSDP-FINE-GRAINED-OFFLOAD-IMPL",
        "error",
        "validate",
        ("model.transformer_impl", "model.fine_grained_activation_offloading"),
        lambda e: (
            bool(e.get("model.fine_grained_activation_offloading"))
            and e.get("model.transformer_impl") != "transformer_engine"
        ),
        lambda e: f"fine-grained activation offloading with {_v(e, 'model.transformer_impl')}.",
        "model.transformer_impl=transformer_engine",
        f"{S.B_CFG}: _validate_fine_grained_activation_offloading: ValueError 'Fine-grained activation "
        "offloading is only supported with transformer_engine implementation.'",
    ),
    Rule(
        "MFSDP-FINE-GRAINED-OFFLOAD-ENV",
        "error",
        "validate",
        ("env.NVTE_CPU_OFFLOAD_V1", "model.fine_grained_activation_offloading"),
        lambda e: (
            bool(e.get("model.fine_grained_activation_offloading"))
            and e.get("model.transformer_impl") == "transformer_engine"
            and e.env.get("NVTE_CPU_OFFLOAD_V1", "0") != "1"
        ),
        lambda e: (
            f"fine-grained activation offloading with {_envfmt(e, 'NVTE_CPU_OFFLOAD_V1')} "
            "(Transformer Engine >= 2.10 then offloads weights too)."
        ),
        "env_vars.NVTE_CPU_OFFLOAD_V1=1 (or export NVTE_CPU_OFFLOAD_V1=1)",
        f"{S.B_CFG}: _validate_fine_grained_activation_offloading: ValueError 'For fine-grained activation "
        "offloading with TE >= 2.10.0, NVTE_CPU_OFFLOAD_V1 environment variable should be set to 1'",
    ),
    # ------------------------------------------------------------------ input: accepted silently, wrong
    Rule(
        "MFSDP-ENUM",
        "error",
        "input",
        ("ddp.data_parallel_sharding_strategy",),
        lambda e: [
            (
                p,
                f"{p}={fmt(v)} is not one of {', '.join(c)}; Bridge stores it without checking and the "
                "job fails later (or silently does something else).",
                f"{p}={_closest(v, c)}",
            )
            for p, v, c in _bad_enums(e)
        ],
        None,
        None,
        f"{S.MC_DDP}: DistributedDataParallelConfig.data_parallel_sharding_strategy docstring "
        "\"Valid values are 'no_shard', 'optim', 'optim_grads', 'optim_grads_params'.\"; Literal types in "
        f"{S.MT_TRAIN} and {S.MC_TC} (Bridge stores any string without checking)",
    ),
    # ------------------------------------------------------------------ runtime: accepted, fails later
    Rule(
        "MFSDP-FSDP2-DDP-FLAG",
        "error",
        "runtime",
        ("dist.use_torch_fsdp2", "ddp.use_megatron_fsdp"),
        lambda e: (
            not e.get("dist.use_megatron_fsdp")
            and bool(e.get("ddp.use_megatron_fsdp"))
            and bool(e.get("dist.use_torch_fsdp2"))
        ),
        lambda e: (
            "ddp.use_megatron_fsdp=true with dist.use_torch_fsdp2=true: Bridge's exclusivity check reads "
            "only dist.use_megatron_fsdp, then turns it on; wrapping the model then fails."
        ),
        "dist.use_torch_fsdp2=false and dist.use_megatron_fsdp=true",
        "megatron/training/models/dist_utils.py: _ddp_wrap: ValueError 'Using use_megatron_fsdp and "
        f"use_torch_fsdp2 at the same time is not supported.'; {_VALIDATE} checks only dist.use_megatron_fsdp "
        "before _validate_and_apply_megatron_fsdp_configs sets it",
    ),
    Rule(
        "MFSDP-HSDP-OUTER-NEEDS-FULL-SHARD",
        "error",
        "runtime",
        ("ddp.data_parallel_sharding_strategy", "ddp.outer_dp_sharding_strategy"),
        lambda e: (
            e.fsdp
            and e.get("ddp.outer_dp_sharding_strategy") != "no_shard"
            and _int_gt(e.get("ddp.num_distributed_optimizer_instances"), 1)
            and e.get("ddp.data_parallel_sharding_strategy") != "optim_grads_params"
        ),
        lambda e: (
            f"{_v(e, 'ddp.outer_dp_sharding_strategy')} (hybrid FSDP) needs "
            f"data_parallel_sharding_strategy optim_grads_params, found "
            f"{fmt(e.get('ddp.data_parallel_sharding_strategy'))}."
        ),
        "ddp.data_parallel_sharding_strategy=optim_grads_params (or ddp.outer_dp_sharding_strategy=no_shard)",
        f"{_MFSDP_BUF}: NotImplementedError '[Megatron-FSDP] Optimizer fully-sharded HFSDP is only supported "
        "with full-sharding on DP-Shard.'",
    ),
    Rule(
        "MFSDP-HSDP-OUTER-WITHOUT-HSDP",
        "error",
        "runtime",
        ("ddp.outer_dp_sharding_strategy", "ddp.num_distributed_optimizer_instances"),
        lambda e: (
            e.fsdp
            and e.get("ddp.outer_dp_sharding_strategy") != "no_shard"
            and not _int_gt(e.get("ddp.num_distributed_optimizer_instances"), 1)
        ),
        lambda e: (
            f"{_v(e, 'ddp.outer_dp_sharding_strategy')} with "
            f"{_v(e, 'ddp.num_distributed_optimizer_instances')}: hybrid FSDP is off, so the outer "
            "strategy has no group to shard over."
        ),
        "ddp.outer_dp_sharding_strategy=no_shard (or num_distributed_optimizer_instances > 1 for HSDP)",
        "megatron/bridge/perf_recipes/nemotronh/common.py: _apply_nemotron_3_ultra_fsdp_hsdp "
        "'the first param all-gather hits a None HSDP helper buffer'; "
        "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py: "
        "'enable_hsdp = self.ddp_config.num_distributed_optimizer_instances > 1'",
    ),
    # ------------------------------------------------------------------ warnings
    Rule(
        "MFSDP-FSDP2-EXPERIMENTAL",
        "warning",
        "runtime",
        ("dist.use_torch_fsdp2",),
        lambda e: bool(e.get("dist.use_torch_fsdp2")) and not e.fsdp,
        lambda e: (
            "dist.use_torch_fsdp2=true: PyTorch FSDP2 is not in a stable release stage in Megatron; "
            "validate() accepts it, problems show only once the job runs. This skill covers Megatron FSDP."
        ),
        "dist.use_torch_fsdp2=false, then mfsdp.py enable",
        f"{S.MT_COMMON}: DistributedInitConfig.use_torch_fsdp2 docstring 'It is still not in a stable release "
        "stage, and may therefore contain bugs or other potential issues.'",
    ),
    Rule(
        "MFSDP-AVG-IN-COLLECTIVE",
        "warning",
        "rewrite",
        ("ddp.average_in_collective", "ddp.disable_symmetric_registration"),
        lambda e: (
            e.fsdp and bool(e.get("ddp.average_in_collective")) and not e.get("ddp.disable_symmetric_registration")
        ),
        lambda e: (
            "ddp.average_in_collective=true: Bridge turns it off for Megatron FSDP (NCCL symmetric registration)."
        ),
        "ddp.average_in_collective=false",
        f"{_FSDP_CFG}: 'average_in_collective not supported with NCCL symmetric registration. Deactivating...'",
    ),
    Rule(
        "MFSDP-NO-SHARD",
        "warning",
        "advice",
        ("ddp.data_parallel_sharding_strategy",),
        lambda e: e.fsdp and e.get("ddp.data_parallel_sharding_strategy") == "no_shard",
        lambda e: "Megatron FSDP with data_parallel_sharding_strategy=no_shard shards nothing (no memory saving).",
        "ddp.data_parallel_sharding_strategy=optim_grads_params",
        f"{S.MC_DDP}: DistributedDataParallelConfig.data_parallel_sharding_strategy (default 'no_shard')",
    ),
    Rule(
        "MFSDP-SHARDING-WITHOUT-FSDP",
        "warning",
        "advice",
        ("ddp.data_parallel_sharding_strategy", "ddp.use_megatron_fsdp"),
        lambda e: not e.fsdp and e.get("ddp.data_parallel_sharding_strategy") not in ("no_shard", None),
        lambda e: (
            f"{_v(e, 'ddp.data_parallel_sharding_strategy')} is ignored: Megatron FSDP is off "
            "(only Megatron FSDP reads the sharding strategy)."
        ),
        "dist.use_megatron_fsdp=true ddp.use_megatron_fsdp=true (mfsdp.py enable), or drop the strategy",
        f"{S.B_CFG}: ConfigContainer._validate_and_apply_megatron_fsdp_configs and "
        "megatron/core/optimizer/__init__.py: 'if ddp_config.use_megatron_fsdp:' (the only readers, "
        "with megatron_fsdp itself)",
    ),
    Rule(
        "MFSDP-ENV-MAX-CONN-TP-OVERLAP",
        "warning",
        "advice",
        ("env." + MAX_CONN, "model.tp_comm_overlap"),
        lambda e: (
            e.fsdp
            and e.gpu_arch in PRE_BLACKWELL_ARCHS
            and e.env.get(MAX_CONN) != "1"
            and (bool(e.get("model.tp_comm_overlap")) or _co(e, "tp_comm_overlap"))
        ),
        lambda e: (
            f"TP communication overlap on {e.gpu_arch} wants {MAX_CONN}=1, which Megatron FSDP forbids "
            f"({_envfmt(e, MAX_CONN)}): overlap will be poor."
        ),
        "comm_overlap.tp_comm_overlap=false (or run on Blackwell, where the two do not conflict)",
        f"{_FSDP_CFG}: assert 'FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.'; "
        "megatron/bridge/perf_recipes/deepseek/h100/deepseek_v3.py: env_vars '# CUDA stream scheduling for this "
        "model and parallel layout.' with CUDA_DEVICE_MAX_CONNECTIONS 1 on H100 (the B200/GB200 perf recipes use 32)",
    ),
    Rule(
        "MFSDP-NCCL-UB-EXPANDABLE-SEGMENTS",
        "warning",
        "validate",
        ("env.PYTORCH_CUDA_ALLOC_CONF", "ddp.nccl_ub"),
        lambda e: (
            bool(e.get("ddp.nccl_ub"))
            and "expandable_segments:True" in e.env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",")
        ),
        lambda e: (
            f"ddp.nccl_ub=true with {_envfmt(e, 'PYTORCH_CUDA_ALLOC_CONF')}: rejected with PyTorch older than 2.11."
        ),
        "remove expandable_segments:True from PYTORCH_CUDA_ALLOC_CONF / env_vars (or use PyTorch >= 2.11)",
        f"{S.MC_DDP}: DistributedDataParallelConfig.__post_init__: ValueError 'PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:True is currently not supported with nccl_ub'",
    ),
    Rule(
        "MFSDP-KEEP-FP8-TRANSPOSE-CACHE",
        "warning",
        "advice",
        ("ddp.keep_fp8_transpose_cache",),
        lambda e: e.fsdp and bool(e.get("ddp.keep_fp8_transpose_cache")),
        lambda e: "ddp.keep_fp8_transpose_cache=true keeps an FP8 transpose per parameter: more memory under FSDP.",
        "ddp.keep_fp8_transpose_cache=false",
        "megatron/bridge/perf_recipes/nemotronh/common.py: _apply_nemotron_3_ultra_fsdp_hsdp "
        "'cfg.ddp.keep_fp8_transpose_cache = False' next to 'cfg.ddp.use_megatron_fsdp = True'; "
        f"{GITHUB_ONLY} scripts/performance/utils/overrides.py: _set_megatron_fsdp_overrides (the same)",
    ),
    Rule(
        "MFSDP-DEFER-EMBEDDING-WGRAD",
        "warning",
        "advice",
        ("comm_overlap.defer_embedding_wgrad_compute",),
        lambda e: e.fsdp and _co(e, "defer_embedding_wgrad_compute"),
        lambda e: (
            "comm_overlap.defer_embedding_wgrad_compute=true: Bridge's performance harness turns it off for Megatron FSDP."
        ),
        "comm_overlap.defer_embedding_wgrad_compute=false",
        f"{S.B_CO}: CommOverlapConfig.defer_embedding_wgrad_compute; {GITHUB_ONLY} "
        "scripts/performance/utils/overrides.py: _set_megatron_fsdp_overrides: 'Disabling deferring embedding "
        "wgrad compute because it cannot work with FSDP together.'",
    ),
    Rule(
        "MFSDP-CUSTOM-FSDP-DEPRECATED",
        "warning",
        "advice",
        ("ddp.use_custom_fsdp",),
        lambda e: bool(e.get("ddp.use_custom_fsdp")),
        lambda e: "ddp.use_custom_fsdp=true is deprecated and ignored by Bridge's checks.",
        "ddp.use_custom_fsdp=false, ddp.use_megatron_fsdp=true, dist.use_megatron_fsdp=true",
        f"{S.MC_DDP}: DistributedDataParallelConfig.use_custom_fsdp docstring 'The flag `use_custom_fsdp` is "
        "deprecated and will be removed in future versions.'",
    ),
    # ------------------------------------------------------------------ info: what Bridge will change
    Rule(
        "MFSDP-FLAGS-SYNC",
        "info",
        "rewrite",
        ("dist.use_megatron_fsdp", "ddp.use_megatron_fsdp"),
        lambda e: bool(e.get("dist.use_megatron_fsdp")) != bool(e.get("ddp.use_megatron_fsdp")),
        lambda e: (
            f"dist.use_megatron_fsdp={fmt(e.get('dist.use_megatron_fsdp'))} and ddp.use_megatron_fsdp="
            f"{fmt(e.get('ddp.use_megatron_fsdp'))} differ; Bridge turns both on."
        ),
        "dist.use_megatron_fsdp=true ddp.use_megatron_fsdp=true",
        f"{_FSDP_CFG}: 'self.dist.use_megatron_fsdp = True' / 'self.ddp.use_megatron_fsdp = True'",
    ),
    Rule(
        "MFSDP-DIST-OPT-FORCED",
        "info",
        "rewrite",
        ("ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"),
        lambda e: (
            e.fsdp and not (e.get("ddp.use_distributed_optimizer") and e.get("optimizer.use_distributed_optimizer"))
        ),
        lambda e: (
            f"{_v(e, 'ddp.use_distributed_optimizer')}, {_v(e, 'optimizer.use_distributed_optimizer')}: "
            "Megatron FSDP always uses the distributed optimizer; Bridge turns both on."
        ),
        "ddp.use_distributed_optimizer=true optimizer.use_distributed_optimizer=true",
        f"{_FSDP_CFG}: 'use_distributed_optimizer=True is required for Megatron-FSDP. Activating...'",
    ),
    Rule(
        "MFSDP-MXFP8-REUSE-OFF",
        "info",
        "rewrite",
        ("ddp.reuse_grad_buf_for_mxfp8_param_ag", "optimizer.reuse_grad_buf_for_mxfp8_param_ag"),
        lambda e: (
            e.fsdp
            and (
                bool(e.get("ddp.reuse_grad_buf_for_mxfp8_param_ag"))
                or bool(e.get("optimizer.reuse_grad_buf_for_mxfp8_param_ag"))
            )
        ),
        lambda e: "reuse_grad_buf_for_mxfp8_param_ag is not implemented for Megatron FSDP; Bridge turns it off.",
        lambda e: f"{e.origin('ddp.reuse_grad_buf_for_mxfp8_param_ag')}=false",
        f"{_FSDP_CFG}: 'reuse_grad_buf_for_mxfp8_param_ag not implemented for Megatron FSDP. Deactivating...'",
    ),
    Rule(
        "MFSDP-DECOUPLED-GRAD",
        "info",
        "rewrite",
        ("ddp.megatron_fsdp_use_decoupled_grad",),
        lambda e: (
            e.fsdp
            and bool(e.get("optimizer.use_precision_aware_optimizer"))
            and not e.get("ddp.megatron_fsdp_use_decoupled_grad")
        ),
        lambda e: (
            "optimizer.use_precision_aware_optimizer=true: Bridge sets ddp.megatron_fsdp_use_decoupled_grad=true "
            "(gradients in param.decoupled_grad)."
        ),
        "ddp.megatron_fsdp_use_decoupled_grad=true",
        f"{_FSDP_CFG}: 'Megatron-FSDP installs gradients in `param.decoupled_grad` when using FusedAdam.'",
    ),
    Rule(
        "MFSDP-NCCL-UB-MANUAL-REG",
        "info",
        "rewrite",
        ("ddp.fsdp_manual_registration", "ddp.nccl_ub"),
        lambda e: e.fsdp and bool(e.get("ddp.nccl_ub")) and not e.get("ddp.fsdp_manual_registration"),
        lambda e: "ddp.nccl_ub=true: Bridge sets ddp.fsdp_manual_registration=true (registration is slow otherwise).",
        "ddp.fsdp_manual_registration=true",
        f"{_FSDP_CFG}: '# Without manual registration, UBR is really slow.'",
    ),
    Rule(
        "MFSDP-NCCL-UB-DOUBLE-BUFFER",
        "info",
        "rewrite",
        ("ddp.fsdp_double_buffer", "ddp.nccl_ub"),
        lambda e: (
            e.fsdp
            and bool(e.get("ddp.nccl_ub"))
            and not e.get("ddp.fsdp_double_buffer")
            and not e.get("ddp.megatron_fsdp_max_pool_double_buffer")
        ),
        lambda e: (
            "ddp.nccl_ub=true: Megatron FSDP turns ddp.fsdp_double_buffer on (user-buffer registration needs "
            "persistent buffers), which costs memory the estimate should include."
        ),
        "ddp.fsdp_double_buffer=true",
        f"{_MFSDP_BUF}: ParamAndGradBuffer.__init__ '# Since the user buffer registration requires (non-dynamic) "
        "persistent memory,' then 'self.ddp_config.fsdp_double_buffer = True'",
    ),
    Rule(
        "MFSDP-META-DEVICE-INIT",
        "info",
        "advice",
        ("model.init_model_with_meta_device",),
        lambda e: e.fsdp and not e.get("model.init_model_with_meta_device"),
        lambda e: (
            "model.init_model_with_meta_device=false: the full model is materialised on each GPU before sharding."
        ),
        "model.init_model_with_meta_device=true",
        "megatron/bridge/perf_recipes/nemotronh/common.py: _apply_nemotron_3_ultra_fsdp_hsdp "
        "(cfg.model.init_model_with_meta_device = True)",
    ),
]

RULES_BY_ID = {r.id: r for r in RULES}

# Enum-typed paths the MFSDP-ENUM rule checks (every schema field with choices).
ENUM_PATHS = tuple(p for p, rec in S.FIELDS.items() if rec[2] is not None)


def _bad_enums(e: Eff) -> list:
    out = []
    for p in ENUM_PATHS:
        sec = p.split(".", 1)[0]
        if sec == "mixed_precision" and not isinstance(e.cfg.get("mixed_precision"), Mapping):
            continue
        v = raw_get(e.cfg, p)
        rec = S.FIELDS[p]
        if v is None and rec[3]:
            continue
        if v not in rec[2]:
            out.append((p, v, rec[2]))
    return out


def _closest(value, choices) -> str:
    import difflib

    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.0)
    return close[0] if close else choices[0]


def _as_int(v, fallback: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else fallback


def _int_gt(v, n: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > n


def _bad_offload_layers(e: Eff) -> bool:
    n, k = e.get("model.cpu_offloading_num_layers"), e.get("model.num_layers")
    if not isinstance(n, int) or not isinstance(k, int):
        return False
    return n < 0 or n >= k


def _co(e: Eff, key: str) -> bool:
    co = e.cfg.get("comm_overlap")
    return isinstance(co, Mapping) and bool(co.get(key))


def evaluate(cfg: Mapping, env: Mapping[str, str], gpu_arch: str | None = None) -> list[Finding]:
    """Every finding for an effective config (``config_io.load_effective``) and environment."""
    e = Eff(cfg, env, gpu_arch)
    found = []
    for r in RULES:
        try:
            hit = r.when(e)
        except (TypeError, ValueError, AttributeError):
            hit = False  # a value of an unexpected shape: config_io reports those as input errors
        if not hit:
            continue
        if isinstance(hit, list):  # a rule over many paths (enums): one finding per (path, message, fix)
            for path, message, fix in hit:
                found.append(Finding(r.id, r.severity, path, message, fix, {"stage": r.stage, "source": r.source}))
            continue
        fix = r.fix(e) if callable(r.fix) else r.fix
        found.append(
            Finding(r.id, r.severity, e.origin(r.paths[0]), r.message(e), fix, {"stage": r.stage, "source": r.source})
        )
    return found


# ---------------------------------------------------------------------------------------------
# Fields for the differential test (role `gpu` generates configs over these with real Bridge).
# Each entry: dotted path -> candidate values, invalid ones included. Values are YAML/Hydra
# spellings as they would appear in ``section.key=value`` overrides. Vary them over the
# base_run_config.yaml; keep parallel sizes fixed (one GPU: TP*PP*CP must divide world size 1).
DIFFERENTIAL_FIELDS: dict[str, list] = {
    "dist.use_megatron_fsdp": [True, False],
    "ddp.use_megatron_fsdp": [True, False],
    "ddp.data_parallel_sharding_strategy": [
        "no_shard",
        "optim",
        "optim_grads",
        "optim_grads_params",
        "optim_grad_params",
    ],  # the last is misspelt on purpose
    "ddp.average_in_collective": [True, False],
    "ddp.disable_symmetric_registration": [False, True],
    "ddp.use_distributed_optimizer": [True, False],
    "optimizer.use_distributed_optimizer": [True, False],
    "ddp.nccl_ub": [False, True],
    "ddp.fsdp_manual_registration": [False, True],
    "ddp.fsdp_double_buffer": [False, True],
    "ddp.reuse_grad_buf_for_mxfp8_param_ag": [False, True],
    "ddp.num_buckets": [None, 4],
    "optimizer.use_precision_aware_optimizer": [False, True],
    "dist.use_torch_fsdp2": [False, True],
    "dist.use_tp_pp_dp_mapping": [False, True],
    "dist.use_gloo_process_groups": [True, False],
    "checkpoint.ckpt_format": ["torch_dist", "fsdp_dtensor", "torch", "torch_dcp"],
    "checkpoint.save": [None, "/tmp/mfsdp_diff_ckpt"],
    "checkpoint.load": [None, "/tmp/mfsdp_diff_ckpt"],
    "checkpoint.async_save": [False, True],
    "checkpoint.use_persistent_ckpt_worker": [True, False],
    "checkpoint.also_save_hf_checkpoint": [False, True],
    "train.check_weight_hash_across_dp_replicas_interval": [None, 100],
    "model.cpu_offloading": [False, True],
    "model.cpu_offloading_num_layers": [0, 1, 1000],
    "model.recompute_granularity": [None, "full", "selective"],
    "model.fine_grained_activation_offloading": [False, True],
    "model.offload_modules": [None, ["core_attn"]],
    "optimizer.optimizer": ["adam", "sgd"],
    "mixed_precision": ["bf16_mixed", "fp16_mixed", "bf16_with_mxfp8_mixed"],
}
# Environment variables the rules read: name -> candidate values (None = unset). The generator
# should unset every name here that a case does not give, so Bridge sees exactly the case's env.
DIFFERENTIAL_ENV: dict[str, list] = {
    MAX_CONN: [None, "1", "32"],
    "NVTE_CPU_OFFLOAD_V1": [None, "1"],
    "PYTORCH_CUDA_ALLOC_CONF": [None, "expandable_segments:True"],
}
