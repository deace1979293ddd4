"""Megatron-Bridge set-up shared by the GPU runs: one place for how a job's config is built and started.

* Strategies: the data-parallel strategy names the command lines take and the settings each
  means. Megatron FSDP's come from ``mfsdp_lib.enable.MINIMAL_OVERRIDES`` (the settings
  ``mfsdp.py enable`` tells users to apply), so a GPU run proves that those settings train, not a
  hand-written copy of them.
* Config containers: a Llama-style (or Nemotron-H-style hybrid) trunk on mock data with
  NullTokenizer, built from a shape (no downloads, no hub: recipes such as
  ``llama3_8b_pretrain_config()`` read the Hugging Face hub); or a job's own YAML or recipe.
* Environment fixes: no APEX in plain PyTorch images (the fused wgrad accumulation kernel is
  missing and ColumnParallelLinear raises at the first step if ``gradient_accumulation_fusion``
  stays True), ``CUDA_DEVICE_MAX_CONNECTIONS`` unset for Megatron FSDP.
* Dotted get/set on a container, and ``Settings``: every change a run makes, with its category
  and reason, for the report.
* Bridge's own ``runtime_config_update`` (ends in ``ConfigContainer.validate()``) and ``setup()``.

torch and megatron are imported inside the functions.
"""

from __future__ import annotations

import os

from .presets import NULL_TOKENIZER_VOCAB, PRESETS, estimate_params
from .report import InputError, jsonable

# Strategy names as the command lines take them. The last three are Megatron FSDP's
# ``ddp.data_parallel_sharding_strategy`` values (megatron_fsdp 0.6.1 also has ``no_shard``,
# which is plain data parallelism through the FSDP wrapper).
FSDP_STRATEGIES = ("optim", "optim_grads", "optim_grads_params")
STRATEGIES = ("ddp", "distopt") + FSDP_STRATEGIES
SHARDING_KEY = "ddp.data_parallel_sharding_strategy"
FSDP_SETTINGS_SOURCE = "mfsdp_lib.enable.MINIMAL_OVERRIDES"


# --------------------------------------------------------------------------- strategies


def strategy_settings(strategy: str) -> dict:
    """The dotted settings that turn ``strategy`` on: for Megatron FSDP the minimal enablement
    ``mfsdp.py enable`` applies, with the sharding strategy chosen."""
    if strategy in FSDP_STRATEGIES:
        from mfsdp_lib.enable import MINIMAL_OVERRIDES

        return {k: (strategy if k == SHARDING_KEY else v) for k, v in MINIMAL_OVERRIDES.items()}
    distopt = strategy == "distopt"
    return {
        "dist.use_megatron_fsdp": False,
        "ddp.use_megatron_fsdp": False,
        "ddp.use_distributed_optimizer": distopt,
        "optimizer.use_distributed_optimizer": distopt,
        # overlap_param_gather only exists for the distributed optimizer's all-gather.
        "ddp.overlap_param_gather": distopt,
        "optimizer.overlap_param_gather": distopt,
        "checkpoint.ckpt_format": "torch_dist",
    }


def strategy_source(strategy: str) -> str:
    """Where ``strategy_settings(strategy)`` comes from (recorded beside them)."""
    return FSDP_SETTINGS_SOURCE if strategy in FSDP_STRATEGIES else "plain Bridge settings"


def strategy_of(cfg) -> str:
    """The strategy a container already has (a YAML or recipe run without ``--strategy``)."""
    if get_dotted(cfg, "ddp.use_megatron_fsdp"):
        return get_dotted(cfg, SHARDING_KEY) or "optim_grads_params"
    return "distopt" if get_dotted(cfg, "ddp.use_distributed_optimizer") else "ddp"


# --------------------------------------------------------------------------- environment


def apex_fused_wgrad_available() -> bool:
    """Whether APEX's fused wgrad accumulation kernel imports (``gradient_accumulation_fusion``)."""
    try:
        import fused_weight_gradient_mlp_cuda  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return False
    return True


# What a rehearsal's PEFT model starts from (the report's ``peft_base_weights``).
PEFT_BASE_WEIGHTS = "random: the pretrained checkpoint is not read in a rehearsal"


def peft_hook_without_checkpoint():
    """A stand-in for Bridge's ``_create_peft_pre_wrap_hook``: the real hook loads the pretrained checkpoint,
    then adds the adapters. A rehearsal has no checkpoint: the adapters go onto randomly initialised base
    weights (same shapes and memory, other values). Used for the first build and for ``--save-load``'s
    fresh build, which then restores the saved adapters from the rehearsal's own checkpoint."""
    import megatron.bridge.training.setup as setup_mod

    def create(cfg, state):
        def hook(model):
            return setup_mod._apply_peft_transformation(cfg.peft, model)

        return hook

    return create


# megatron-core's flag that APEX's fused wgrad kernel imported (megatron/core/tensor_parallel/layers.py):
# ColumnParallelLinear's constructor raises when a config asks for the fusion and it is False.
MCORE_GAF_FLAG = ("megatron.core.tensor_parallel.layers", "_grad_accum_fusion_available")


def te_only_grad_accum_fusion_deviation() -> dict:
    """The deviation ``--te-grad-accum-fusion`` writes into the report."""
    return {
        "id": "grad-accum-fusion-te-only",
        "what": "model.gradient_accumulation_fusion stays true for Transformer Engine's layers and is off in "
        "megatron-core's own linear layers (the output layer)",
        "why": "APEX's fused_weight_gradient_mlp_cuda is not installed; Transformer Engine fuses the "
        "weight-gradient accumulation itself, megatron-core's linear layers need APEX for it",
        "memory_effect": "the output layer's weight gradient is formed apart before it is added to its main "
        "gradient (one transient tensor of that weight's size)",
        "time_effect": "the output layer's weight-gradient accumulation is a separate add, as without the fusion",
    }


def allow_grad_accum_fusion_without_apex():
    """Let megatron-core's linear layers be built with the fusion asked for while APEX is missing;
    returns the undo. Their fusion is turned off after the build (:func:`mcore_linears_without_fusion`)."""
    import importlib

    mod = importlib.import_module(MCORE_GAF_FLAG[0])
    before = getattr(mod, MCORE_GAF_FLAG[1])
    setattr(mod, MCORE_GAF_FLAG[1], True)
    return lambda: setattr(mod, MCORE_GAF_FLAG[1], before)


def mcore_linears_without_fusion(model_chunks) -> list[str]:
    """Turn the fusion off in every megatron-core ColumnParallelLinear/RowParallelLinear of the model
    (their forward reads the module's own ``gradient_accumulation_fusion``); returns their names.
    Transformer Engine's layers are other classes and keep it."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    names = []
    for chunk in model_chunks if isinstance(model_chunks, (list, tuple)) else [model_chunks]:
        for name, module in chunk.named_modules():
            if isinstance(module, (ColumnParallelLinear, RowParallelLinear)) and module.gradient_accumulation_fusion:
                module.gradient_accumulation_fusion = False
                names.append(name)
    return names


def unset_cuda_device_max_connections() -> None:
    """Megatron FSDP needs ``CUDA_DEVICE_MAX_CONNECTIONS`` unset or above 1."""
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)


# --------------------------------------------------------------------------- config containers


def model_provider(shape: dict, seq_length: int):
    """A Bridge model provider for a trunk shape (``kind`` "gpt", the default, or "hybrid"): bf16,
    TP = PP = CP = 1, RMSNorm, no biases, untied embeddings, no dropout, vocabulary from the tokenizer."""
    import torch

    shape = dict(shape)
    kind = shape.pop("kind", "gpt")
    common = dict(
        normalization="RMSNorm",
        add_bias_linear=False,
        share_embeddings_and_output_weights=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        init_method_std=0.01,
        layernorm_epsilon=1e-5,
        seq_length=seq_length,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        context_parallel_size=1,
        sequence_parallel=False,
        attention_softmax_in_fp32=True,
        make_vocab_size_divisible_by=128,
        vocab_size=None,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        # No APEX in plain PyTorch images: the fused wgrad accumulation kernel is missing
        # and ColumnParallelLinear raises at the first step if this stays True.
        gradient_accumulation_fusion=False,
    )
    if kind == "hybrid":
        from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider
        from megatron.core.activations import squared_relu
        from megatron.core.transformer.enums import AttnBackend

        # Nemotron-H: no position embedding, squared-ReLU MLP without a gate (the nemotronh recipes).
        # The hybrid provider defaults to attention_backend=flash (hybrid_provider.py:144), which lets
        # Transformer Engine use FlashAttention only (language_module.py:_set_attention_backend) and needs
        # the flash-attn package; auto (TransformerConfig's default, as the GPT presets have) lets it pick.
        return HybridModelProvider(
            position_embedding_type="none",
            activation_func=squared_relu,
            gated_linear_unit=False,
            attention_backend=AttnBackend.auto,
            **common,
            **shape,
        )
    import torch.nn.functional as F
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    # Llama 3 style: SwiGLU, RoPE (base 500 000), GQA.
    return GPTModelProvider(
        activation_func=F.silu,
        gated_linear_unit=True,
        position_embedding_type="rope",
        rotary_base=500_000,
        **common,
        **shape,
    )


def mock_dataset(seq_length: int):
    """Bridge's mock GPT data: nothing is read or downloaded."""
    from megatron.bridge.training.config import MockGPTDatasetConfig

    return MockGPTDatasetConfig(
        seq_length=seq_length,
        random_seed=1234,
        reset_attention_mask=False,
        reset_position_ids=False,
        eod_mask_loss=False,
        num_dataset_builder_threads=1,
        data_sharding=True,
        dataloader_type="single",
        num_workers=1,
    )


def wan_mock_dataset(fields: dict):
    """Bridge's own Wan mock data (``WanMockDataModuleConfig``), with the fields ``workload.wan_mock_fields``
    chose: nothing is read or downloaded; each micro-batch is one packed batch of random latents."""
    from megatron.bridge.diffusion.data.wan.wan_mock_datamodule import WanMockDataModuleConfig

    return WanMockDataModuleConfig(**fields)


def null_tokenizer(vocab_size: int = NULL_TOKENIZER_VOCAB):
    """NullTokenizer (no tokenizer files): it needs an explicit vocabulary size."""
    from megatron.bridge.training.config import TokenizerConfig

    return TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=vocab_size)


def config_container(
    model,
    *,
    iters: int,
    global_batch_size: int,
    micro_batch_size: int,
    warmup_iters: int,
    checkpoint: dict,
    train: dict | None = None,
):
    """A ConfigContainer around ``model``: ``iters`` steps of Adam (bf16, cosine decay to the last
    step, ``warmup_iters`` of warm-up), no evaluation, a log line per step, mock data, NullTokenizer,
    seed 1234. ``checkpoint`` and ``train`` are extra keyword arguments of CheckpointConfig and
    TrainingConfig (synchronous saves, fully parallel, always)."""
    from megatron.bridge.training.config import (
        CheckpointConfig,
        ConfigContainer,
        DistributedDataParallelConfig,
        DistributedInitConfig,
        LoggerConfig,
        OptimizerConfig,
        RNGConfig,
        SchedulerConfig,
        TrainingConfig,
        ValidationConfig,
    )

    return ConfigContainer(
        model=model,
        dist=DistributedInitConfig(),
        train=TrainingConfig(
            train_iters=iters, global_batch_size=global_batch_size, micro_batch_size=micro_batch_size, **(train or {})
        ),
        validation=ValidationConfig(eval_interval=iters + 1, eval_iters=0),
        optimizer=OptimizerConfig(
            optimizer="adam",
            bf16=True,
            fp16=False,
            adam_beta1=0.9,
            adam_beta2=0.95,
            adam_eps=1e-5,
            clip_grad=1.0,
            lr=3e-4,
            min_lr=3e-5,
            weight_decay=0.01,
        ),
        scheduler=SchedulerConfig(
            lr_decay_style="cosine",
            lr_warmup_iters=warmup_iters,
            lr_warmup_init=0.0,
            lr_decay_iters=iters,
            start_weight_decay=0.01,
            end_weight_decay=0.01,
            weight_decay_incr_style="constant",
            override_opt_param_scheduler=True,
        ),
        ddp=DistributedDataParallelConfig(
            check_for_nan_in_grad=True, grad_reduce_in_fp32=True, overlap_grad_reduce=True, average_in_collective=False
        ),
        dataset=mock_dataset(model.seq_length),
        logger=LoggerConfig(log_interval=1, log_memory_to_tensorboard=False),
        tokenizer=null_tokenizer(),
        checkpoint=CheckpointConfig(fully_parallel_save=True, async_save=False, **checkpoint),
        rng=RNGConfig(seed=1234),
    )


def preset_config(a):
    """A ConfigContainer for a model preset on mock data with NullTokenizer (one micro-batch per
    step until ``configure`` sets the batch); returns it with the preset's estimated parameters."""
    cfg = config_container(
        model_provider(PRESETS[a.model_preset], a.seq_length),
        iters=a.iters,
        global_batch_size=a.micro_batch_size,
        micro_batch_size=a.micro_batch_size,
        warmup_iters=1,
        checkpoint=dict(save=None, load=None),
    )
    if a.peft == "lora":
        from megatron.bridge.peft.lora import LoRA

        cfg.peft = LoRA(target_modules=["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], dim=32, alpha=32)
    return cfg, estimate_params(PRESETS[a.model_preset])


def load_config(a):
    """(ConfigContainer, estimated parameter count or None, source description)."""
    if a.model_preset:
        cfg, est = preset_config(a)
        return cfg, est, f"preset {a.model_preset}"
    if a.yaml:
        from megatron.bridge.training.config import ConfigContainer

        if not os.path.isfile(a.yaml):
            raise InputError(f"--yaml {a.yaml}: no such file")
        return ConfigContainer.from_yaml(a.yaml), None, f"yaml {a.yaml}"
    mod_name, _, fn_name = a.recipe.partition(":")
    if not mod_name or not fn_name:
        raise InputError(
            "--recipe must be MODULE:FUNCTION, e.g. megatron.bridge.recipes.llama.llama3:llama3_8b_pretrain_config"
        )
    import importlib

    fn = getattr(importlib.import_module(mod_name), fn_name)
    return fn(), None, f"recipe {a.recipe}"


# --------------------------------------------------------------------------- Bridge's validate and setup


def validate(cfg) -> dict:
    """Bridge's ``runtime_config_update`` (ending in ``ConfigContainer.validate()``) as a verdict."""
    from megatron.bridge.training.config import runtime_config_update

    try:
        runtime_config_update(cfg)
        return {"ok": True}
    except Exception as exc:
        return {"ok": False, "error_type": type(exc).__name__, "error": str(exc)[:2000]}


def callback_manager(meter=None):
    """A Bridge CallbackManager; with ``meter``, its ``start``/``end`` on each train step."""
    from megatron.bridge.training.callbacks import CallbackManager

    manager = CallbackManager()
    if meter is not None:
        manager.register("on_train_step_start", meter.start)
        manager.register("on_train_step_end", meter.end)
    return manager


def setup(cfg, manager=None):
    """Bridge's ``setup()`` of ``cfg`` (model, optimizer, data, any checkpoint load), with the
    callbacks of ``manager`` when given."""
    from megatron.bridge.data.utils import get_dataset_provider
    from megatron.bridge.training.setup import setup as bridge_setup
    from megatron.bridge.training.state import GlobalState

    reset_process_globals()
    state = GlobalState()
    state.cfg = cfg
    extra = {} if manager is None else {"callback_manager": manager}
    return bridge_setup(state, get_dataset_provider(cfg.dataset), **extra)


def reset_process_globals() -> None:
    """Forget the process-wide singletons a previous ``setup()`` in this process left behind.

    Bridge's ``initialize_megatron`` creates megatron-core's rerun state machine and micro-batch
    calculator and asserts that neither exists yet (rerun_state_machine.py :: _set_rerun_state_machine,
    "Rerun state machine is already initialized"; num_microbatches_calculator.py ::
    init_num_microbatches_calculator, "num microbatches calculator is already initialized."), so a
    second training run in one process (a checkpoint migration that trains, converts and resumes)
    fails there. Both modules ship a destroy function; calling them before a first setup does nothing.
    """
    from megatron.core import num_microbatches_calculator, rerun_state_machine

    rerun_state_machine.destroy_rerun_state_machine()
    num_microbatches_calculator.destroy_num_microbatches_calculator()


# --------------------------------------------------------------------------- dotted get/set


def set_dotted(obj, path: str, value):
    """Set ``a.b.c`` on a ConfigContainer; returns the old value. Unknown names raise."""
    parts = path.split(".")
    target = obj
    for p in parts[:-1]:
        if isinstance(target, dict):
            target = target.setdefault(p, {})
            continue
        if not hasattr(target, p):
            raise InputError(f"{path}: {type(target).__name__} has no attribute '{p}'")
        target = getattr(target, p)
        if target is None:
            raise InputError(f"{path}: '{p}' is not set in this config")
    last = parts[-1]
    if isinstance(target, dict):
        old = target.get(last)
        target[last] = value
        return old
    if not hasattr(target, last):
        raise InputError(f"{path}: {type(target).__name__} has no attribute '{last}'")
    old = getattr(target, last)
    setattr(target, last, _as_bridge_sets_it(path, old, value))
    return old


def _as_bridge_sets_it(path: str, old, value):
    """The value Bridge's override path would store (megatron/bridge/training/utils/omegaconf_utils.py ::
    _apply_overrides): ``{_target_: torch.X, _call_: false}`` becomes ``torch.X``; a string on a field that
    holds a dtype becomes that dtype (str_to_dtype). A string on a dtype field whose default is None stays a
    string, as in Bridge, and fails at the wrap: ``check`` says so first (MFSDP-DTYPE-STRING)."""
    import sys

    from .targets import TorchTarget

    if isinstance(value, TorchTarget):
        import torch

        obj = getattr(torch, value.name, None)
        if not isinstance(obj, torch.dtype):
            raise InputError(f"{path}: torch.{value.name} is not a torch dtype")
        return obj
    torch = sys.modules.get("torch")  # a field can hold a dtype only once torch is loaded
    if isinstance(value, str) and torch is not None and isinstance(old, torch.dtype):
        from megatron.bridge.utils.activation_map import str_to_dtype

        try:
            return str_to_dtype(value)
        except ValueError as exc:
            raise InputError(f"{path}: {exc}") from None
    return value


def get_dotted(obj, path: str, default=None):
    target = obj
    for p in path.split("."):
        if target is None:
            return default
        target = target.get(p, default) if isinstance(target, dict) else getattr(target, p, default)
    return target


class Settings:
    """Every setting this run changed, with its category and reason (reported)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.rows: list[dict] = []

    def apply(self, key: str, value, category: str, why: str, only_if_present: bool = False) -> None:
        if only_if_present and get_dotted(self.cfg, key, _MISSING) is _MISSING:
            return
        old = set_dotted(self.cfg, key, value)
        if _same(old, value):
            return
        self.rows.append({"key": key, "value": jsonable(value), "was": jsonable(old), "category": category, "why": why})


_MISSING = object()


def _same(a, b) -> bool:
    try:
        return type(a) is type(b) and a == b
    except Exception:
        return False


def checkpoint_only_container(provider, ddp, ckpt_kwargs: dict):
    """A ConfigContainer for loading or saving a checkpoint outside training (conversion): the model, its
    DDP config (None for a plain model), synchronous checkpointing with ``ckpt_kwargs``; no training parts."""
    from megatron.bridge.training.config import (
        CheckpointConfig,
        ConfigContainer,
        LoggerConfig,
        OptimizerConfig,
    )

    return ConfigContainer(
        model=provider,
        train=None,
        optimizer=OptimizerConfig(use_distributed_optimizer=bool(ddp is not None)),
        ddp=ddp,
        scheduler=None,
        dataset=None,
        logger=LoggerConfig(),
        tokenizer=None,
        checkpoint=CheckpointConfig(async_save=False, **ckpt_kwargs),
        dist=None,
    )
