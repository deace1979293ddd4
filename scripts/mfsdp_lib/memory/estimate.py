"""The estimate and the report: all terms together for a config, per strategy.

``estimate`` combines shape, precision, activations and strategy model state into the
peak per GPU; ``report`` is what ``mfsdp.py memory`` prints; ``model_state`` is the
between-steps figure a measured ``memory_allocated()`` is compared with.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import devices
from . import hf as hf_mod
from .common import FP32, GIB, ModelError, _bool, _first, _get, _int, _positive
from .shapes import (
    Counts,
    Lora,
    Shape,
    builtin_shape,
    count_parameters,
    defaulted_keys,
    pipeline_stages,
    shape_from_config,
)
from .strategies import FSDP_STRATEGIES, MAX_DP_SEARCH, STRATEGIES, StrategyMemory, strategy_memory
from .terms import (
    ActivationSettings,
    Precision,
    activation_bytes,
    activation_settings,
    loss_forward_headroom,
    megatron_activation_bytes,
    mtp_activation_bytes,
    precision_from_config,
    rope_cache_bytes,
)

# --------------------------------------------------------------------------- the report

# Run settings a Bridge config may carry in its model section that --hf-config must not drop.
_RUN_KEYS = (
    "seq_length",
    "sequence_parallel",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "init_model_with_meta_device",
    "cpu_offloading",
    "cpu_offloading_num_layers",
    "fp8",
    "fp8_param",
    "attention_backend",
)


@dataclass(frozen=True)
class Parallel:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None


def parallel_from(cfg: Mapping | None, *, dp=None, tp=None, pp=None, cp=None, ep=None) -> Parallel:
    """Explicit sizes win; otherwise the config's ``model.*_parallel_size``; otherwise 1.

    A Bridge config does not store the data-parallel size (it follows from the world
    size), so DP is 1 unless given.
    """

    def pick(value, path, name):
        return _int(value, name) or _int(_get(cfg, path), path) or 1

    etp = _get(cfg, "model.expert_tensor_parallel_size")
    return Parallel(
        dp=pick(dp, "", "dp"),
        tp=pick(tp, "model.tensor_model_parallel_size", "tp"),
        pp=pick(pp, "model.pipeline_model_parallel_size", "pp"),
        cp=pick(cp, "model.context_parallel_size", "cp"),
        ep=pick(ep, "model.expert_model_parallel_size", "ep"),
        etp=_int(etp, "model.expert_tensor_parallel_size") if etp is not None else None,
    )


def configured_strategy(cfg: Mapping | None) -> str | None:
    """The strategy a config selects: Megatron FSDP's sharding strategy, else distopt or ddp.

    None when the config says nothing about it (no ddp, dist or optimizer section: overrides of the model alone)."""
    if cfg is None or not any(s in cfg for s in ("ddp", "dist", "optimizer")):
        return None
    if _bool(_get(cfg, "ddp.use_megatron_fsdp")) or _bool(_get(cfg, "dist.use_megatron_fsdp")):
        return str(_get(cfg, "ddp.data_parallel_sharding_strategy", "no_shard"))
    if _bool(_first(cfg, ("ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"))):
        return "distopt"
    return "ddp"


def _resolve_strategies(strategies: Iterable[str] | str) -> list[str]:
    if isinstance(strategies, str):
        strategies = [strategies]
    chosen: list[str] = []
    for name in strategies:
        names = STRATEGIES if name == "all" else (name,)
        for n in names:
            if n not in STRATEGIES:
                raise ModelError(f"unknown strategy {n!r}; one of {', '.join(STRATEGIES)}, all")
            if n not in chosen:
                chosen.append(n)
    return chosen


# Said in the output of every model with MTP depths (references/memory.md section 5, "Multi-token prediction").
MTP_NOTE = (
    "MTP depths: parameters and activations counted, traced from megatron-core 0.19.2 (per depth the shifted "
    "embedding, the eh_proj input, the inner layer, the final norm, the depth's loss kept for backward, and the "
    "concatenated hidden states), on the last pipeline stage beside the main loss; assumed: the depths sit on the last "
    "stage (no pipeline layout moving them), and the activation calibration of the model's family covers them (no "
    "measured peak is decided by MTP activations)"
)
# Said beside MTP_NOTE when full uniform recompute asks for recompute_num_layers != 1, which the MTP block refuses.
MTP_RECOMPUTE_NOTE = (
    "MTP depths with recompute_granularity full and recompute_method uniform need recompute_num_layers 1: "
    "MultiTokenPredictionLayer._checkpointed_forward (transformer/multi_token_prediction.py:1419-1421) asserts it, "
    "so the first training step fails"
)
# Said in the output of every model with gated delta net layers (references/memory.md, "Gated delta net layers").
GDN_NOTE = (
    "gated delta net layers: their activations are traced from megatron-core 0.19.2 and flash-linear-attention 0.4 "
    "source, not yet measured on a GPU; the calibration takes the largest factor and fixed part of the measured "
    "families (calibration.py)"
)


def check_layout(shape: Shape | None, par: Parallel, model: Mapping | None = None) -> None:
    """Refuse a layout that cannot be built, quoting the rule that refuses it."""
    etp = par.etp or par.tp
    if (par.dp * par.cp * par.tp) % (par.ep * etp):
        raise ModelError(
            f"DP x CP x TP = {par.dp} x {par.cp} x {par.tp} is not divisible by EP x ETP = {par.ep} x {etp}: "
            "the expert grid must tile the same world (world_size % (ETP x EP x PP) == 0, "
            "megatron/core/parallel_state.py:879-885)"
        )
    if shape is None:
        return
    if shape.num_attention_heads % par.tp:
        raise ModelError(
            f"num_attention_heads ({shape.num_attention_heads}) must be a multiple of TP ({par.tp}) "
            "(transformer_config.py:1323)"
        )
    groups = shape.groups
    if not shape.multi_latent_attention and groups % par.tp and par.tp % groups:
        raise ModelError(
            f"num_query_groups ({groups}) must be a multiple or divisor of TP ({par.tp}) (transformer_config.py:1338)"
        )
    model = model or {}
    uneven = any(
        model.get(k)
        for k in (
            "num_layers_in_first_pipeline_stage",
            "num_layers_in_last_pipeline_stage",
            "account_for_embedding_in_pipeline_split",
            "account_for_loss_in_pipeline_split",
            "pipeline_model_parallel_layout",
        )
    )
    if par.pp > 1 and not uneven and shape.num_layers % par.pp:
        raise ModelError(
            f"num_layers ({shape.num_layers}) must be divisible by PP ({par.pp}): the model build asserts it "
            "(transformer/transformer_block.py:150 get_num_layers_to_build); uneven stages need "
            "num_layers_in_first/last_pipeline_stage, account_for_*_in_pipeline_split or pipeline_model_parallel_layout"
        )
    experts = shape.num_moe_experts or 0
    if experts and experts % par.ep:
        raise ModelError(
            f"num_moe_experts ({experts}) must be divisible by EP ({par.ep}) "
            "(transformer/moe/moe_layer.py:185 assert num_moe_experts % ep_size == 0)"
        )
    if not experts and par.ep > 1:
        raise ModelError(f"EP = {par.ep} but the model has no experts (model.num_moe_experts)")
    if any("gdn" in k for k in shape.layer_kinds()):
        split = par.tp * par.cp
        nk, nv = shape.linear_num_key_heads, shape.linear_num_value_heads
        if nk % split or nv % split:
            raise ModelError(
                f"gated delta net heads (linear_num_key_heads {nk}, linear_num_value_heads {nv}) must be divisible "
                f"by TP x CP ({par.tp} x {par.cp}) (transformer_config.py:1373-1382)"
            )
    if "mamba" in shape.layer_kinds():
        heads = shape.mamba_num_heads or (2 * shape.hidden_size) // shape.mamba_head_dim
        if heads % par.tp or shape.mamba_num_groups % par.tp:
            raise ModelError(
                f"Mamba heads ({heads}) and groups ({shape.mamba_num_groups}) must be divisible by TP ({par.tp}) "
                "(ssm/mamba_mixer.py:260, :268)"
            )


def dp_step(par: Parallel) -> int:
    """The data-parallel sizes this layout allows are multiples of this (expert grid tiling)."""
    etp = par.etp or par.tp
    return (par.ep * etp) // math.gcd(par.ep * etp, par.cp * par.tp)


def lora_from_config(cfg: Mapping | None) -> tuple[Lora | None, list[str]]:
    """The ``peft`` section as LoRA adapters (Bridge peft/lora.py LoRA defaults), with notes."""
    peft = _get(cfg, "peft")
    if peft is None:
        return None, []
    if not isinstance(peft, Mapping):
        raise ModelError(
            f"peft must be a section (e.g. {{_target_: megatron.bridge.peft.lora.LoRA, dim: 32}}), got {peft!r}"
        )
    target = str(peft.get("_target_") or "lora").lower()
    notes = []
    if "lora" not in target:
        raise ModelError(f"peft._target_ {peft.get('_target_')!r} is not sized (LoRA, CanonicalLoRA and DoRA are)")
    if "dora" in target:
        notes.append("DoRA sized as LoRA: its magnitude vectors (one per output feature) are not counted")
    modules = peft.get("target_modules") or list(Lora().target_modules)
    if not isinstance(modules, (list, tuple)) or not all(isinstance(x, str) for x in modules):
        raise ModelError(f"peft.target_modules must be a list of module names, got {modules!r}")
    if "canonical" in target:  # linear_q/k/v, linear_fc1_up/gate: the fused modules they adapt
        canon = {
            "linear_q": "linear_qkv",
            "linear_k": "linear_qkv",
            "linear_v": "linear_qkv",
            "linear_fc1_up": "linear_fc1",
            "linear_fc1_gate": "linear_fc1",
        }
        modules = sorted({canon.get(m, m) for m in modules})
        notes.append("CanonicalLoRA sized as LoRA on the fused modules it adapts")
    patterns = [m for m in modules if "*" in m or "." in m]
    if patterns:
        notes.append(f"peft.target_modules patterns {patterns} matched by their last name only (every layer)")
    names = tuple(m.rsplit(".", 1)[-1] for m in modules)
    dim = _int(peft.get("dim", Lora().dim), "peft.dim", default=Lora().dim) or Lora().dim
    # Bridge peft/lora.py LoRA.transform: a grouped GEMM's expert linears (model.moe_grouped_gemm; megatron-core's
    # default False builds one linear per expert) share one adapter when share_expert_adapters (default True) and
    # experts_shared_outer_loras is off; normalize_moe_lora gives expert linears dim // moe_router_topk
    # (utils.py get_effective_lora_dim).
    grouped = _get(cfg, "model.moe_grouped_gemm") is True
    shared = (
        grouped and peft.get("share_expert_adapters", True) is not False and not peft.get("experts_shared_outer_loras")
    )
    if grouped and peft.get("experts_shared_outer_loras"):
        notes.append(
            "experts_shared_outer_loras sized as one adapter per expert (its shared halves counted per expert)"
        )
    expert_dim = None
    if peft.get("normalize_moe_lora"):
        topk = _int(_get(cfg, "model.moe_router_topk"), "model.moe_router_topk", default=0) or 0
        if topk > 0:
            expert_dim = max(1, dim // topk)
    return Lora(target_modules=names, dim=dim, shared_expert_adapter=bool(shared), expert_dim=expert_dim), notes


@dataclass
class Estimate:
    """Everything ``report`` needs; kept separate so callers can read bytes directly."""

    shape: Shape | None
    counts: Counts
    parallel: Parallel
    precision: Precision
    activation: ActivationSettings | None
    activations: float | None  # bytes; None when there is no shape to compute them from
    megatron_lm_activations: float | None  # Megatron-LM's own formula, for comparison
    rows: dict[str, StrategyMemory]
    configured: str | None
    source: str
    notes: list[str]
    lora: Lora | None = None
    loss_headroom: float = 0.0  # terms.loss_forward_headroom: gradient buffers fit in it
    # Shape and precision keys the config left to Bridge's defaults ({"model.KEY": value used}).
    defaults_used: dict | None = None
    # The named model's count when one is known (model.hf_model_id of a built-in shape), and the config's own
    # model section beside a --hf-config / --model that replaced it.
    reference: dict | None = None
    config_model_section: dict | None = None
    # Of ``activations``: what the MTP depths keep (terms.mtp_activation_bytes, over CP), 0 without them.
    mtp_activations: float = 0.0

    @property
    def peft(self) -> bool:
        return self.lora is not None

    def total(self, strategy: str) -> float:
        """Predicted peak bytes (``max_memory_allocated``) for ``strategy`` on the most-loaded GPU:
        the modelled terms plus the calibrated margin (``calibration.py``)."""
        return self.rows[strategy].total(self.activations or 0.0) + calibration_bytes(self, strategy)

    def breakdown(self, strategy: str) -> dict[str, float]:
        """Bytes per modelled term for ``strategy``: params, grads, optimizer, persistent FSDP
        buffers, activations, buffers alive at the peak, the optimizer-step copy, the construction
        peak, and the totals (``model_state``, ``after_step``, ``peak``)."""
        row, act = self.rows[strategy], self.activations or 0.0
        return {
            "params": row.params,
            "grads": row.grads,
            "optimizer": row.optimizer,
            "buffers_persistent": row.buffers_persistent,
            "activations": act,
            "buffers_at_peak": row.buffers_at_peak,
            "buffers_late": row.buffers_late,
            "step_transient": row.step_transient,
            "gathered_after_step": row.gathered_after_step,
            "init_peak": row.init_peak,
            "calibration": calibration_bytes(self, strategy),
            "state_margin": state_margin(self),
            "model_state": row.model_state,
            "after_step": row.after_step + state_margin(self),
            "peak": self.total(strategy),
        }


def _counts_from_params(params: float, par: Parallel, expert_params=None) -> Counts:
    experts = 0.0
    if expert_params is not None:
        experts = _positive(expert_params, "--expert-params", "a number of parameters")
        if experts >= params:
            raise ModelError(f"--expert-params ({experts:g}) must be less than --params ({params:g})")
    per_gpu = (params - experts) / (par.tp * par.pp)
    gpu_experts = experts / (par.ep * (par.etp or par.tp) * par.pp)
    return Counts(
        total=int(round(params)),
        embedding=0,
        output_layer=0,
        layer_dense=[],
        layer_experts=[],
        final_norm=0,
        gpu_dense=per_gpu,
        gpu_experts=gpu_experts,
        gpu_non_unit=0.0,
        gpu_unit=0.0,
        gpu_first_grads=0.0,
        layers_on_gpu=0,
        padded_vocab=0,
    )


def estimate(
    cfg: Mapping | None = None,
    *,
    params=None,
    model=None,
    dp=None,
    tp=None,
    pp=None,
    cp=None,
    ep=None,
    strategies=("all",),
    seq_length=None,
    micro_batch_size=None,
    hf_config=None,
    expert_params=None,
    etp=None,
    gpus=None,
    given=None,
    overrides_only=False,
) -> Estimate:
    """Compute every strategy's bytes; raises ``ModelError`` for unusable input.

    The model comes from (first given): ``model`` (a built-in name), ``params`` (a count;
    ``expert_params`` of it routed experts, needed with EP > 1), ``hf_config`` (a Hugging Face
    ``config.json`` path or its parsed mapping), or ``cfg['model']`` (a Bridge config). Everything
    else (precision, optimizer, PEFT, recompute, parallel sizes) comes from ``cfg``; explicit
    ``dp``/``tp``/``pp``/``cp``/``ep``/``etp`` win. Use ``Estimate.total(strategy)`` for the
    predicted peak and ``Estimate.breakdown(strategy)`` for the per-term bytes. ``given``: the dotted
    keys the user wrote (file and overrides), to tell which shape and precision keys came from Bridge's
    defaults (``Estimate.defaults_used``); None takes the config's model section as written.
    ``overrides_only``: ``cfg`` holds only KEY=VALUE overrides (no file, no recipe under them): every key they
    leave out is assumed as without a config.
    """
    if cfg is not None and not isinstance(cfg, Mapping):
        raise ModelError("config must be a mapping of sections ({'model': {...}, 'ddp': {...}})")
    sources = [n for n, v in (("--model", model), ("--params", params), ("--hf-config", hf_config)) if v is not None]
    if len(sources) > 1:
        raise ModelError(f"give one of --model, --params, --hf-config (got {', '.join(sources)})")
    par = parallel_from(cfg, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    own_section = _get(cfg, "model")  # the config's own model section, before --hf-config replaces it
    if gpus is not None:
        world = _int(gpus, "--gpus") or 1
        model_size = par.tp * par.pp * par.cp
        if world % model_size:
            raise ModelError(
                f"--gpus {world} is not divisible by TP x PP x CP = {par.tp} x {par.pp} x {par.cp} "
                "(megatron/core/parallel_state.py:822: world_size must be divisible by the model-parallel size)"
            )
        if dp is not None and par.dp * model_size != world:
            raise ModelError(
                f"--dp {par.dp} x TP {par.tp} x PP {par.pp} x CP {par.cp} = {par.dp * model_size} GPUs, not --gpus {world}"
            )
        par = Parallel(world // model_size, par.tp, par.pp, par.cp, par.ep, par.etp)
    if etp is not None:
        par = Parallel(par.dp, par.tp, par.pp, par.cp, par.ep, _int(etp, "etp"))
    notes: list[str] = []
    configured = configured_strategy(cfg)
    shape: Shape | None
    if hf_config is not None:
        data = hf_config if isinstance(hf_config, Mapping) else hf_mod.load_hf_config(hf_config)
        where = "config.json" if isinstance(hf_config, Mapping) else str(hf_config)
        section, hf_notes = hf_mod.model_section_from_hf(data, where)
        notes += hf_notes
        # Activation switches a Bridge bridge sets from the HF config go into the effective config.
        cfg = dict(cfg or {})
        model_cfg = dict(section)
        model_cfg.update({k: v for k, v in (_get(cfg, "model") or {}).items() if k in _RUN_KEYS})
        cfg["model"] = model_cfg
        folder = Path(str(where)) if Path(str(where)).is_dir() else Path(str(where)).parent
        name = str(data.get("_name_or_path") or folder.name or "hf-config")
        shape, source = shape_from_config(section, name), f"Hugging Face config {where}"
    elif model is not None:
        shape, source = builtin_shape(str(model)), f"built-in shape {builtin_shape(str(model)).name}"
    elif params is not None:
        params = _positive(params, "--params", "a number of parameters (e.g. 8.03e9)")
        shape, source = None, "--params"
        notes.append("--params gives no shape: activations and Megatron FSDP buffers are not estimated")
    elif isinstance(_get(cfg, "model"), Mapping):
        model_section = dict(_get(cfg, "model"))
        tokenizer_vocab = _get(cfg, "tokenizer.vocab_size")
        null_tokenizer = _get(cfg, "tokenizer.tokenizer_type") == "NullTokenizer"
        if tokenizer_vocab is not None and (
            model_section.get("vocab_size") is None
            or (null_tokenizer and _bool(_get(cfg, "tokenizer.use_tokenizer_vocab_size")))
        ):
            # Bridge's setup (_validate_and_set_vocab_size): the tokenizer's size, padded. Only a
            # NullTokenizer's size is known from the config; another tokenizer's comes from its files.
            model_section.update(vocab_size=tokenizer_vocab, should_pad_vocab=True)
            notes.append("model.vocab_size from tokenizer.vocab_size, padded as Bridge's setup does")
        shape, source = shape_from_config(model_section), "config model section"
    else:
        raise ModelError("nothing to size: give a CONFIG with a model section, --model NAME or --params N")
    model_cfg_section = _get(cfg, "model") if isinstance(_get(cfg, "model"), Mapping) else {}
    check_layout(shape, par, model_cfg_section)
    if shape is not None and any("gdn" in k for k in shape.layer_kinds()):
        notes.append(GDN_NOTE)
    stages = pipeline_stages(model_cfg_section, shape.num_layers, par.pp) if shape is not None else None
    lora, lora_notes = lora_from_config(cfg)
    notes += lora_notes
    if shape is not None:
        if shape.num_layers < par.pp:
            raise ModelError(f"pipeline size {par.pp} exceeds num_layers {shape.num_layers}")
        counts = count_parameters(shape, par.tp, par.pp, par.ep, par.etp, lora=lora, stages=stages)
        if counts.mtp:
            notes.append(MTP_NOTE)
    else:
        if lora is not None:
            raise ModelError(
                "a peft section needs the model's shape to size its adapters: give a config, --hf-config or --model"
            )
        if par.ep > 1 and expert_params is None:
            raise ModelError(
                f"--params with EP = {par.ep}: say how many of the parameters are routed experts "
                "(--expert-params N), or give a config / --hf-config so they can be counted"
            )
        counts = _counts_from_params(float(params), par, expert_params)
    precision = precision_from_config(cfg)
    defaults_used: dict = {}
    if shape is not None and source == "config model section":
        defaults_used = defaulted_keys(_get(cfg, "model"), shape, given)
    if precision.param_bytes == FP32 and cfg is not None and _precision_defaulted(cfg, given):
        defaults_used["model.bf16"] = False
    elif precision.param_bytes == FP32:
        notes.append(
            "the config enables neither bf16 nor fp16 (model.bf16, mixed_precision): fp32 training "
            "assumed; if your recipe sets mixed_precision, add model.bf16=true"
        )
    reference, section_count = _references(own_section, shape, counts.total, source, given)
    act = activations = megatron_lm = None
    headroom = mtp_act = 0.0
    if shape is not None:
        act = activation_settings(
            cfg,
            shape,
            seq_length=seq_length,
            micro_batch_size=micro_batch_size,
            dp=par.dp,
            builtin=model is not None,
            bare=cfg is None or overrides_only,
            lora_targets=lora.target_modules if lora is not None else None,
        )
        activations = activation_bytes(shape, act, tp=par.tp, pp=par.pp, cp=par.cp, etp=par.etp)
        megatron_lm = megatron_activation_bytes(shape, act, tp=par.tp, pp=par.pp, cp=par.cp)
        headroom = loss_forward_headroom(shape, act, tp=par.tp, pp=par.pp, cp=par.cp)
        mtp_act = mtp_activation_bytes(shape, act, tp=par.tp, etp=par.etp) / par.cp
        uniform = act.recompute_granularity == "full" and act.recompute_method == "uniform"
        if mtp_act and uniform and act.recompute_num_layers != 1:
            notes.append(MTP_RECOMPUTE_NOTE)
    rows = {
        s: strategy_memory(
            s,
            counts,
            precision,
            dp=par.dp,
            cp=par.cp,
            tp=par.tp,
            ep=par.ep,
            etp=par.etp,
            peft=lora is not None,
            loss_headroom=headroom,
        )
        for s in _resolve_strategies(strategies)
    }
    return Estimate(
        shape,
        counts,
        par,
        precision,
        act,
        activations,
        megatron_lm,
        rows,
        configured,
        source,
        notes,
        lora,
        headroom,
        defaults_used,
        reference,
        section_count,
        mtp_act,
    )


# The keys that set the weights' precision: none of them written means Bridge's defaults (bf16 = fp16 = false:
# fp32 weights, 4 bytes per parameter). Bridge's recipes set mixed_precision="bf16_mixed" instead.
PRECISION_KEYS = ("model.bf16", "model.fp16", "optimizer.bf16", "optimizer.fp16", "mixed_precision")


def _precision_defaulted(cfg: Mapping, given) -> bool:
    """No precision key written (``given``; without it, none present in ``cfg``)."""
    if given is None:
        return not any(_get(cfg, k) is not None for k in PRECISION_KEYS)
    return not any(k in given or any(g.startswith(k + ".") for g in given) for k in PRECISION_KEYS)


def _relative(a: float, b: float) -> float:
    return round(a / b - 1, 4) if b else 0.0


def _references(model_section, shape, total: float, source: str, given) -> tuple[dict | None, dict | None]:
    """(the named model's count, the config's own model section's count) where each is known.

    The named model: ``model.hf_model_id`` when it is one of the built-in shapes. The config's section: when
    --hf-config or --model sized another shape while the config also has a countable model section.
    """
    reference = None
    model_section = model_section if isinstance(model_section, Mapping) else None
    model_id = model_section.get("hf_model_id") if model_section else None
    if isinstance(model_id, str) and model_id.strip():
        try:
            named = builtin_shape(model_id.rsplit("/", 1)[-1])
        except ModelError:
            named = None
        if named is not None and (shape is None or shape.name != named.name):
            params = count_parameters(named, 1, 1, 1, None).total
            reference = {
                "name": named.name,
                "source": "model.hf_model_id",
                "id": model_id,
                "params": params,
                "difference": _relative(total, params),
            }
    section = None
    if shape is not None and source != "config model section" and model_section is not None:
        try:
            own = shape_from_config(model_section)
            own_total = count_parameters(own, 1, 1, 1, None).total
        except (ModelError, ValueError, TypeError):
            own = None
        if own is not None:
            section = {
                "params": own_total,
                "difference": _relative(own_total, total),
                "defaults_used": defaulted_keys(model_section, own, given),
            }
    return reference, section


def state_margin(est: Estimate) -> float:
    """Measured bytes allocated between steps beyond the model state (``calibration.py``)."""
    from .calibration import state_margin_bytes

    return state_margin_bytes(est)


def calibration_bytes(est: Estimate, strategy: str, dp: int | None = None, row: StrategyMemory | None = None) -> float:
    """What the modelled terms leave out of the measured peak, as calibrated on real runs (see
    ``calibration.py``); added to the peak only, never to the model state. Never negative."""
    from .calibration import peak_margin_bytes

    return peak_margin_bytes(est, strategy, est.parallel.dp if dp is None else dp, row=row)


def smallest_dp(est: Estimate, strategy: str, gpu_mem_gib: float) -> int | None:
    """Smallest data-parallel size at which ``strategy`` fits in ``gpu_mem_gib`` (None: never).

    Only sizes the layout allows are tried (multiples of ``dp_step``: the expert grid must tile
    the world). Every term but one shrinks or stays as DP grows, so a bisection is exact. The
    exception is ``optim_grads``: its gradient buckets (``max(40e6, 1e6 x DP x CP)`` elements)
    grow with DP, and so does its reduce-scatter queue; it is scanned upwards instead.

    Cost: one ``strategy_memory`` per size tried, and the calibration (two more) only where the
    modelled peak alone fits, since the calibration never lowers it. ``optim_grads`` keeps whole
    weights on every rank whatever the DP, so when those and the activations alone exceed the GPU
    no size is tried at all (a 70 B model in bf16 on 80 GiB: without this, 16,384 sizes, ~10 s,
    which is past an agent CLI's wait for a command).
    """
    limit = gpu_mem_gib * GIB
    act = est.activations or 0.0
    par = est.parallel
    step = dp_step(par)

    def row_at(k: int) -> StrategyMemory:
        return strategy_memory(
            strategy,
            est.counts,
            est.precision,
            dp=k * step,
            cp=par.cp,
            tp=par.tp,
            ep=par.ep,
            etp=par.etp,
            peft=est.peft,
            loss_headroom=est.loss_headroom,
        )

    def fits(k: int) -> bool:
        row = row_at(k)
        peak = row.total(act)
        return peak <= limit and peak + calibration_bytes(est, strategy, k * step, row=row) <= limit

    top = max(1, MAX_DP_SEARCH // step)
    if strategy == "optim_grads":
        if row_at(1).params + act > limit:  # whole weights + activations: a floor no DP lowers
            return None
        return next((k * step for k in range(1, top + 1) if fits(k)), None)
    if not fits(top):
        return None
    lo, hi = 1, top
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo * step


def _kind_summary(kinds: tuple) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in kinds:
        out[k] = out.get(k, 0) + 1
    return out


def modelled_terms(est: Estimate, strategy: str) -> list[str]:
    """The terms this strategy's figure is computed from, each traced to the code that allocates it."""
    p, row = est.precision, est.rows[strategy]
    out = []
    out.append(
        "parameters counted from the model shape ("
        + ", ".join(sorted({k for k in est.counts.terms if est.counts.terms[k]}))
        + ")"
        if est.shape
        else "parameters from --params (no shape)"
    )
    out.append(f"weights: {'FP8 linear weights, ' if p.fp8_params else ''}{p.param_dtype}")
    if est.lora is not None:
        out.append(
            f"PEFT: frozen base weights hold no gradient or optimizer state; LoRA dim {est.lora.dim} adapters train"
        )
    elif est.shape is not None and est.counts.frozen_total:
        frozen = [
            what
            for what, on in (
                ("language model", est.shape.freeze_language_model),
                ("vision model", est.shape.freeze_vision_model),
                ("vision projection", est.shape.freeze_vision_projection),
            )
            if on
        ]
        out.append(
            f"frozen by model.freeze_*: {', '.join(frozen)} ({est.counts.frozen_total:,} parameters hold no "
            "gradient or optimizer state; a frozen decoder's linears save no input)"
        )
    out.append(
        {
            "adam": "Adam: fp32 main weights + two moments",
            "muon": "Muon: one momentum buffer per 2-D weight, the rest on its scalar optimizer",
            "adaptive_muon": "adaptive Muon: two buffers per 2-D weight, the rest on its scalar optimizer",
            "sgd": "SGD: one momentum buffer",
        }[p.optimizer]
        + (f", {p.optimizer_offload_fraction:.0%} offloaded to CPU" if p.optimizer_offload_fraction else "")
    )
    if row.step_transient:
        out.append(
            "optimizer-step transient (fp32 gradient copy" + (", Newton-Schulz" if "muon" in p.optimizer else "") + ")"
        )
    if row.buffers_persistent or row.buffers_at_peak or row.buffers_late:
        out.append("Megatron FSDP buffers: gathered non-unit modules, all-gather window, reduce-scatter queue")
    if est.activations is not None:
        out.append(
            "activations per layer kind (attention/MLA, MLP, MoE dispatch, Mamba, gated delta net) with recompute and PP "
            "in flight" + (", MTP depths and their losses" if est.mtp_activations else "")
        )
    if row.init_peak:
        out.append("model-construction peak (built unsharded on the GPU)")
    if est.shape is not None and est.activation is not None and rope_cache_bytes(est.shape, est.activation.seq_length):
        out.append("Gemma 3's cached local and global rotary tables (4 fp32 tables of sequence x head dim)")
    return out


def assumed_terms(est: Estimate, strategy: str) -> list[str]:
    """What the figure does not compute from the code, and what it takes instead."""
    out = [
        "CUDA context, NCCL buffers and allocator fragmentation are outside max_memory_allocated: fits says tight above 90% of the GPU"
    ]
    if calibration_bytes(est, strategy):
        out.append("calibration_gib: the measured peak's excess over the modelled terms on real runs (calibration.py)")
    if est.shape is None:
        out.append("no shape: activations and Megatron FSDP buffers are not estimated")
    if est.precision.fp8:
        out.append("FP8: TE's scaling factors, amax history and transposed weight copies are not counted")
    if est.parallel.ep > 1:
        out.append("MoE: balanced routing (each rank receives top-k x its tokens); imbalance raises the peak")
    if est.parallel.pp > 1:
        out.append("pipeline: even stages; the most-loaded stage is the first or the last")
    return out


def _gib(x: float | None) -> float | None:
    return None if x is None else round(x / GIB, 3)


def _dtype_name(nbytes: int, half: str = "bf16") -> str:
    return {4: "fp32", 2: half, 1: "fp8"}.get(nbytes, f"{nbytes} bytes")


def assumptions(est: Estimate) -> dict:
    p, a = est.precision, est.activation
    half = "fp16" if p.param_dtype == "fp16" else "bf16"
    out = {
        "params_dtype": p.param_dtype,
        "ddp_distopt_grad_dtype": f"{_dtype_name(p.ddp_grad_bytes, half)} (ddp.grad_reduce_in_fp32)",
        "fsdp_grad_dtype": f"{_dtype_name(p.fsdp_grad_bytes, half)} (ddp.megatron_fsdp_main_grads_dtype; "
        "Megatron FSDP does not read grad_reduce_in_fp32)",
        "fsdp_main_params_dtype": _dtype_name(p.fsdp_main_bytes) if p.fsdp_main_bytes else "none",
        "optimizer": (
            "adam, precision-aware (TE FusedAdam): main "
            f"{_dtype_name(p.master_bytes)}, exp_avg {_dtype_name(p.exp_avg_bytes)}, "
            f"exp_avg_sq {_dtype_name(p.exp_avg_sq_bytes)}"
            if p.precision_aware and p.optimizer == "adam"
            else {
                "adam": "adam: fp32 main weights + fp32 exp_avg + fp32 exp_avg_sq",
                "muon": f"muon{' (layer-wise distributed)' if p.layer_wise else ''}: fp32 main weights + one fp32 "
                f"momentum per 2-D weight; other parameters on {p.muon_scalar_optimizer}",
                "adaptive_muon": f"adaptive muon{' (layer-wise distributed)' if p.layer_wise else ''}: fp32 main "
                f"weights + two fp32 buffers per 2-D weight; other parameters on {p.muon_scalar_optimizer}",
                "sgd": "sgd: fp32 main weights" + (" + one fp32 momentum buffer" if p.sgd_momentum else ""),
            }[p.optimizer]
        ),
        "fp8": ("FP8 compute (linear inputs saved as FP8)" if p.fp8 else "off")
        + ("; FP8 linear weights (fp8_param)" if p.fp8_params else ""),
        "peft": (
            f"LoRA dim {est.lora.dim} on {', '.join(est.lora.target_modules)}: "
            f"{est.counts.lora_total:,} trainable adapter parameters; base weights frozen"
            if est.lora
            else "none"
        ),
        "optimizer_cpu_offload_fraction": p.optimizer_offload_fraction,
        "sharding_degree": f"N = DP x CP = {est.parallel.dp * est.parallel.cp} (experts: DP x CP x TP / (EP x ETP))",
        "gpu": "most-loaded rank: first pipeline stage, embedding included",
        "model_state": "params + grads + optimizer + persistent Megatron FSDP buffers (preserved "
        "embedding/output copies, double buffers); memory_allocated() between steps is "
        "after_step = model state + the optimizer-step fp32 gradient copy, freed only when "
        "the next step zeroes gradients",
        "total": "model state + max(activations + buffers alive at the activation peak, "
        "later reduce-scatter queue, optimizer-step fp32 gradient copy); or the model-construction "
        "peak when larger (optim_grads_params without init_model_with_meta_device)",
        "not_counted": "CUDA context and NCCL memory (outside max_memory_allocated) and allocator "
        "fragmentation: fits says tight above 90% of the GPU (devices.TIGHT_FRACTION); framework workspaces (0.1 GiB) and the measured activation "
        "excess are in calibration_gib (references/memory.md section 13)",
        "sources": [
            "megatron/training/theoretical_memory_usage.py (18 and 6 + 12/N bytes/param; activations)",
            "megatron/bridge/training/utils/theoretical_memory_utils.py (Bridge's estimator, CP division)",
            "megatron_fsdp/param_and_grad_buffer.py (_init_each_parameter_group_buffers, "
            "AllGatherPipeline, GradReducePipeline, update_main_grads)",
            "megatron_fsdp/megatron_fsdp.py (suggested_communication_unit_size, FSDP units)",
            "megatron/core/optimizer/distrib_optimizer.py, optimizer.py, optimizer_config.py",
            "Korthikanti et al. 2022, arXiv:2205.05198, Table 2",
        ],
    }
    if a is not None:
        out.update(
            {
                "seq_length": a.seq_length,
                "micro_batch_size": a.micro_batch_size,
                "num_microbatches": a.num_microbatches,
                "sequence_parallel": a.sequence_parallel and est.parallel.tp > 1,
                "recompute": a.recompute_granularity or "none (flash attention: no s^2 score matrix stored)",
                "cpu_offloaded_activation_layers": a.offload_layers,
                "activation_formula": "Korthikanti et al. 2022 per-tensor decomposition sized for this model "
                "(GQA, gated FFN, dropout, fp32 loss softmax); see references/memory.md",
                "megatron_lm_activations_gib": _gib(est.megatron_lm_activations),
                "mtp_activations_gib": _gib(est.mtp_activations),
                "hidden_dropout": a.hidden_dropout,
                "bias_activation_fusion": a.bias_activation_fusion,
                "gradient_accumulation_fusion": a.gradient_accumulation_fusion,
            }
        )
    if est.notes:
        out["notes"] = list(est.notes)
    return out


def report(
    cfg: Mapping | None = None,
    *,
    params=None,
    model=None,
    dp=None,
    tp=None,
    pp=None,
    cp=None,
    ep=None,
    strategies=("all",),
    seq_length=None,
    micro_batch_size=None,
    gpu_mem_gib=None,
    hf_config=None,
    expert_params=None,
    etp=None,
    gpus=None,
    given=None,
    overrides_only=False,
) -> dict:
    """The JSON object ``mfsdp.py memory --format json`` prints.

    ``{"model", "parallelism", "gpu_mem_gib", "gpu", "strategies": [{"name", "params_gib",
    "grads_gib", "optimizer_gib", "buffers_gib", "activations_gib", "total_gib", "fits", "fit",
    "model_state_gib", "step_transient_gib", "init_peak_gib", "after_step_gib",
    "smallest_dp_that_fits", "configured", "notes"}], "assumptions": {...}}``.
    ``after_step_gib`` (model state + step copy + the layers ``start_param_sync`` gathers
    right after the step) is what ``torch.cuda.memory_allocated()`` shows between training
    steps: Bridge's ``train_step`` zeroes gradients (and drops the copy) only when the next
    step starts. ``gpu_mem_gib`` is a number of GiB or a preset (``devices.GPU_PRESETS``:
    ``h100``, ``h200``). ``fits``: the total is within the card; ``fit``: ``"yes"`` (within
    ``devices.TIGHT_FRACTION`` of it), ``"tight"``, ``"no"``, or ``"n/a (PP > 1)"`` for a Megatron
    FSDP strategy the layout cannot run (``fits`` False). ``smallest_dp_that_fits`` is the smallest
    DP whose ``fit`` is ``"yes"``. All three are None without ``gpu_mem_gib``. Raises ``ModelError``
    (a ValueError) for bad input.
    """
    preset = None
    if gpu_mem_gib is not None:
        gpu_mem_gib, preset = devices.parse_gpu_mem(gpu_mem_gib)
        gpu_mem_gib = _positive(gpu_mem_gib, "--gpu-mem-gib", "a number of GiB")
    est = estimate(
        cfg,
        params=params,
        model=model,
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        strategies=strategies,
        seq_length=seq_length,
        micro_batch_size=micro_batch_size,
        hf_config=hf_config,
        expert_params=expert_params,
        etp=etp,
        gpus=gpus,
        given=given,
        overrides_only=overrides_only,
    )
    act = est.activations
    rows = []
    for name, row in est.rows.items():
        total = est.total(name)
        notes = list(row.notes)
        cannot_run = name in FSDP_STRATEGIES and est.parallel.pp > 1
        if cannot_run:
            notes.append(
                "Megatron FSDP with PP > 1 fails when the model is wrapped (check: MFSDP-PIPELINE-PARALLEL): "
                "_get_dp_tp_mesh (distributed/fsdp/mcore_fsdp_adapter.py:561) factors the world into DP x EP x TP "
                "with no pipeline axis; this row is what it would hold. 'mfsdp.py enable CONFIG --set-pp-1' sets "
                "PP=1 (DP grows to absorb the stages); size that layout with --pp 1"
            )
        if row.init_peak and row.total(act or 0.0) == row.init_peak:
            notes.append(
                "the peak is model construction: the model is built unsharded on each GPU before "
                "sharding; model.init_model_with_meta_device=true avoids it"
            )
        if gpu_mem_gib is None:
            fits, fit, min_dp = None, None, None
        elif cannot_run:
            fits, fit, min_dp = False, devices.FIT_PP, None
        else:
            fits, fit = total <= gpu_mem_gib * GIB, devices.fit(total / GIB, gpu_mem_gib)
            # the smallest size at which the row says "yes": fits with the headroom devices.TIGHT_FRACTION leaves
            min_dp = smallest_dp(est, name, gpu_mem_gib * devices.TIGHT_FRACTION)
        rows.append(
            {
                "name": name,
                "params_gib": _gib(row.params),
                "grads_gib": _gib(row.grads),
                "optimizer_gib": _gib(row.optimizer),
                "buffers_gib": _gib(row.buffers(act or 0.0)),
                "activations_gib": _gib(act),
                "total_gib": _gib(total),
                "fits": fits,
                "fit": fit,
                "model_state_gib": _gib(row.model_state),
                "step_transient_gib": _gib(row.step_transient),
                "init_peak_gib": _gib(row.init_peak),
                "after_step_gib": _gib(row.after_step + state_margin(est)),
                "calibration_gib": _gib(calibration_bytes(est, name)),
                "smallest_dp_that_fits": min_dp,
                "configured": name == est.configured,
                "modelled": modelled_terms(est, name),
                "assumed": assumed_terms(est, name),
                "notes": notes,
            }
        )
    shape = est.shape
    return {
        "model": {
            "name": shape.name if shape else None,
            "source": est.source,
            "params": est.counts.total,
            "params_billions": round(est.counts.total / 1e9, 3),
            "params_per_gpu": round(est.counts.gpu_dense + est.counts.gpu_experts),
            "padded_vocab": est.counts.padded_vocab or None,
            "params_by_term": dict(est.counts.terms),
            "params_per_gpu_by_term": {k: round(v) for k, v in est.counts.gpu_terms.items()},
            "trainable_params": est.counts.lora_total if est.peft else est.counts.total - est.counts.frozen_total,
            "layer_kinds": _kind_summary(est.counts.kinds),
            "pipeline_stage": est.counts.stage,
            "defaults_used": est.defaults_used or {},
            "reference": est.reference,
            "config_model_section": est.config_model_section,
        },
        "parallelism": {
            "dp": est.parallel.dp,
            "tp": est.parallel.tp,
            "pp": est.parallel.pp,
            "cp": est.parallel.cp,
            "ep": est.parallel.ep,
            "etp": est.parallel.etp or est.parallel.tp,
            "dp_multiple_of": dp_step(est.parallel),
        },
        "gpu_mem_gib": gpu_mem_gib,
        "gpu": None if gpu_mem_gib is None else devices.gpu_info(gpu_mem_gib, preset),
        "strategies": rows,
        "assumptions": assumptions(est),
    }


def model_state(cfg: Mapping | None = None, **kwargs) -> dict[str, dict[str, float]]:
    """Model-state bytes per strategy, for comparison with a measured ``memory_allocated()``.

    Same arguments as ``report`` (less ``gpu_mem_gib``). Per strategy: ``params``,
    ``grads``, ``optimizer``, ``buffers_persistent``, ``model_state`` (their sum),
    ``step_transient`` (the fp32 gradient copy alive from the optimizer step to the next
    step's ``zero_grad_buffer``), ``gathered_after_step`` (optim_grads_params at DP x CP > 1:
    the layers ``start_param_sync`` all-gathers for the next forward) and ``after_step``
    (their sum with the model state: what ``memory_allocated()`` reads between steps, e.g.
    in a Bridge step-end callback), in bytes.
    """
    est = estimate(cfg, **kwargs)
    return {
        name: {
            "params": row.params,
            "grads": row.grads,
            "optimizer": row.optimizer,
            "buffers_persistent": row.buffers_persistent,
            "model_state": row.model_state,
            "step_transient": row.step_transient,
            "gathered_after_step": row.gathered_after_step,
            "after_step": row.after_step,
        }
        for name, row in est.rows.items()
    }
