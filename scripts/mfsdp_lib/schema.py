"""The Megatron-Bridge 0.6.x config fields that the Megatron FSDP rules read.

Every rule in ``rules/`` reads a value such as ``ddp.data_parallel_sharding_strategy``.
When a config file does not set that value, Bridge uses the dataclass default, so we
must know it; when a file sets it, we must know its type (to coerce ``"True"`` or
``"4"`` the way OmegaConf would) and, for enums, the allowed values (a misspelt
``optim_grad_params`` is accepted silently by Bridge and only fails deep inside
Megatron FSDP at runtime, so catching it here is the most valuable check we do).

Each entry names the class that defines the default, as ``file: Class`` relative to
``site-packages``, so a newcomer can open the source in one step. The table is
checked against the real wheels by ``tests/test_schema.py`` (it parses the dataclass
bodies with ``ast``), so when Bridge changes a default, a test fails.

Why a hand-written table rather than importing Bridge: Bridge needs CUDA and
Transformer Engine to import, and ``check`` must run on a laptop in a few
interpreter start-ups. Plain tuples and dicts keep the import cost near zero.
"""

from __future__ import annotations

# Source files, relative to site-packages (the wheel root). One name per file, so a
# rule or field cites "B_CFG: CheckpointConfig" and the reader knows where to look.
B_CFG = "megatron/bridge/training/config.py"
B_GPT = "megatron/bridge/models/gpt_provider.py"
B_MP = "megatron/bridge/training/mixed_precision.py"
B_CO = "megatron/bridge/training/comm_overlap.py"
MT_COMMON = "megatron/training/config/common_config.py"
MT_TRAIN = "megatron/training/config/training_config.py"
MC_DDP = "megatron/core/distributed/distributed_data_parallel_config.py"
MC_OPT = "megatron/core/optimizer/optimizer_config.py"
MC_MP = "megatron/core/model_parallel_config.py"
MC_TC = "megatron/core/transformer/transformer_config.py"
MT_RESIL = "megatron/training/config/resilience_config.py"

# For each section: the classes a field can be defined in, most derived first (the
# Python MRO, flattened). The first class that defines a field gives its default.
SECTION_CLASSES = {
    "dist": ((B_CFG, "DistributedInitConfig"), (MT_COMMON, "DistributedInitConfig")),
    "ddp": ((B_CFG, "DistributedDataParallelConfig"), (MC_DDP, "DistributedDataParallelConfig")),
    "optimizer": ((B_CFG, "OptimizerConfig"), (MC_OPT, "OptimizerConfig")),
    "checkpoint": ((B_CFG, "CheckpointConfig"), (MT_TRAIN, "CheckpointConfig")),
    "train": ((B_CFG, "TrainingConfig"), (MT_TRAIN, "TrainingConfig")),
    "model": (
        (B_GPT, "GPTModelProvider"),
        ("megatron/bridge/models/transformer_config.py", "TransformerConfig"),
        (MC_TC, "TransformerConfig"),
        (MC_MP, "ModelParallelConfig"),
    ),
    "mixed_precision": ((B_MP, "MixedPrecisionConfig"),),
    "comm_overlap": ((B_CO, "CommOverlapConfig"),),
    "rerun_state_machine": ((B_CFG, "RerunStateMachineConfig"), (MT_RESIL, "RerunStateMachineConfig")),
}

# Sentinel for a default computed at construction time (``default_factory`` calling a
# probe, e.g. GPTModelProvider.gradient_accumulation_fusion asks whether the fused
# kernel is installed). The rules treat it as "unknown"; the schema test skips it.
FACTORY = "<computed at construction>"

# Field record: (type, default, choices, nullable). ``type`` is one of
# bool / int / float / str / dict / list / any. ``choices`` is a tuple for enums (Literal in
# the source, or a docstring-listed set that the code compares against), else None.
# ``nullable`` says whether None (YAML null) is a legal value.
BOOL, INT, FLOAT, STR, DICT, LIST, ANY = "bool", "int", "float", "str", "dict", "list", "any"

SHARDING_STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")  # MC_DDP docstring; megatron_fsdp
OUTER_SHARDING_STRATEGIES = ("no_shard", "optim")  # MC_DDP outer_dp_sharding_strategy docstring
CKPT_FORMATS = ("torch", "torch_dist", "torch_dcp", "fsdp_dtensor")  # MT_TRAIN Literal
NON_PERSISTENT_TYPES = ("global", "local", "in_memory")  # MT_TRAIN Literal
ASYNC_STRATEGIES = ("nvrx", "mcore")  # MT_TRAIN Literal; asserted in CheckpointConfig.__post_init__
RECOMPUTE_GRANULARITIES = ("full", "selective")  # MC_TC Literal
RECOMPUTE_METHODS = ("uniform", "block")  # MC_TC Literal
TRANSFORMER_IMPLS = ("local", "transformer_engine", "inference_optimized")  # MC_TC Literal
FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")  # MC_TC fp8_recipe Literal
DIST_BACKENDS = ("nccl", "gloo")  # MT_COMMON Literal
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")  # MC_TC Literal

# path -> (type, default, choices, nullable, defining class "file: Class")
FIELDS: dict[str, tuple] = {
    # --- dist: DistributedInitConfig (Megatron-Training base, Bridge subclass) ---
    "dist.use_megatron_fsdp": (BOOL, False, None, False, f"{MT_COMMON}: DistributedInitConfig"),
    "dist.use_torch_fsdp2": (BOOL, False, None, False, f"{MT_COMMON}: DistributedInitConfig"),
    "dist.use_tp_pp_dp_mapping": (BOOL, False, None, False, f"{MT_COMMON}: DistributedInitConfig"),
    "dist.use_gloo_process_groups": (BOOL, True, None, False, f"{MT_COMMON}: DistributedInitConfig"),
    "dist.lazy_mpu_init": (BOOL, False, None, False, f"{MT_COMMON}: DistributedInitConfig"),
    "dist.use_sharp": (BOOL, False, None, False, f"{MT_COMMON}: DistributedInitConfig"),
    "dist.distributed_backend": (STR, "nccl", DIST_BACKENDS, False, f"{MT_COMMON}: DistributedInitConfig"),
    "dist.use_decentralized_pg": (BOOL, False, None, False, f"{B_CFG}: DistributedInitConfig"),
    # --- ddp: Megatron-Core DistributedDataParallelConfig (Bridge defers __post_init__) ---
    "ddp.use_megatron_fsdp": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.use_custom_fsdp": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.data_parallel_sharding_strategy": (
        STR,
        "no_shard",
        SHARDING_STRATEGIES,
        False,
        f"{MC_DDP}: DistributedDataParallelConfig",
    ),
    "ddp.outer_dp_sharding_strategy": (
        STR,
        "no_shard",
        OUTER_SHARDING_STRATEGIES,
        False,
        f"{MC_DDP}: DistributedDataParallelConfig",
    ),
    "ddp.average_in_collective": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.use_distributed_optimizer": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.num_distributed_optimizer_instances": (INT, 1, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.disable_symmetric_registration": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.reuse_grad_buf_for_mxfp8_param_ag": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.fp8_param_gather": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.grad_reduce_in_fp32": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.nccl_ub": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.fsdp_manual_registration": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.fsdp_double_buffer": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.megatron_fsdp_max_pool_double_buffer": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.keep_fp8_transpose_cache": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.megatron_fsdp_use_decoupled_grad": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.overlap_grad_reduce": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.overlap_param_gather": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.num_buckets": (INT, None, None, True, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.megatron_fsdp_cuda_graph_mode": (BOOL, False, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.fsdp_all_gather_in_start_param_sync": (BOOL, True, None, False, f"{MC_DDP}: DistributedDataParallelConfig"),
    "ddp.bucket_size": (INT, None, None, True, f"{MC_DDP}: DistributedDataParallelConfig"),
    # --- optimizer: Megatron-Core OptimizerConfig ---
    "optimizer.use_distributed_optimizer": (BOOL, False, None, False, f"{MC_OPT}: OptimizerConfig"),
    "optimizer.optimizer": (STR, "adam", None, False, f"{MC_OPT}: OptimizerConfig"),
    "optimizer.use_precision_aware_optimizer": (BOOL, False, None, False, f"{MC_OPT}: OptimizerConfig"),
    "optimizer.reuse_grad_buf_for_mxfp8_param_ag": (BOOL, False, None, False, f"{MC_OPT}: OptimizerConfig"),
    "optimizer.overlap_param_gather": (BOOL, False, None, False, f"{MC_OPT}: OptimizerConfig"),
    "optimizer.bf16": (BOOL, False, None, False, f"{MC_OPT}: OptimizerConfig"),
    "optimizer.fp16": (BOOL, False, None, False, f"{MC_OPT}: OptimizerConfig"),
    # --- checkpoint: Bridge CheckpointConfig over Megatron-Training CheckpointConfig ---
    "checkpoint.save": (STR, None, None, True, f"{MT_TRAIN}: CheckpointConfig"),
    "checkpoint.load": (STR, None, None, True, f"{MT_TRAIN}: CheckpointConfig"),
    "checkpoint.ckpt_format": (STR, "torch_dist", CKPT_FORMATS, False, f"{MT_TRAIN}: CheckpointConfig"),
    "checkpoint.async_save": (BOOL, False, None, False, f"{MT_TRAIN}: CheckpointConfig"),
    "checkpoint.async_strategy": (STR, "nvrx", ASYNC_STRATEGIES, False, f"{B_CFG}: CheckpointConfig"),
    "checkpoint.use_persistent_ckpt_worker": (BOOL, True, None, False, f"{B_CFG}: CheckpointConfig"),
    "checkpoint.also_save_hf_checkpoint": (BOOL, False, None, False, f"{B_CFG}: CheckpointConfig"),
    "checkpoint.hf_source_path": (STR, None, None, True, f"{B_CFG}: CheckpointConfig"),
    "checkpoint.strict_fsdp_dtensor_load": (BOOL, False, None, False, f"{B_CFG}: CheckpointConfig"),
    "checkpoint.non_persistent_ckpt_type": (STR, None, NON_PERSISTENT_TYPES, True, f"{MT_TRAIN}: CheckpointConfig"),
    "checkpoint.ckpt_step": (INT, None, None, True, f"{MT_TRAIN}: CheckpointConfig"),
    "checkpoint.load_optim": (BOOL, True, None, False, f"{MT_TRAIN}: CheckpointConfig"),
    "checkpoint.load_main_params_from_ckpt": (BOOL, False, None, False, f"{MT_TRAIN}: CheckpointConfig"),
    "checkpoint.pretrained_checkpoint": (STR, None, None, True, f"{B_CFG}: CheckpointConfig"),
    # --- train: TrainingConfig ---
    "train.check_weight_hash_across_dp_replicas_interval": (INT, None, None, True, f"{MT_TRAIN}: TrainingConfig"),
    "train.micro_batch_size": (INT, None, None, True, f"{MT_TRAIN}: TrainingConfig"),
    "train.global_batch_size": (INT, None, None, True, f"{MT_TRAIN}: TrainingConfig"),
    # --- rerun_state_machine: Bridge RerunStateMachineConfig over Megatron-Training's ---
    "rerun_state_machine.check_for_nan_in_loss": (BOOL, True, None, False, f"{MT_RESIL}: RerunStateMachineConfig"),
    # --- model: GPTModelProvider -> Bridge TransformerConfig -> MCore TransformerConfig -> ModelParallelConfig ---
    "model.tensor_model_parallel_size": (INT, 1, None, False, f"{MC_MP}: ModelParallelConfig"),
    "model.pipeline_model_parallel_size": (INT, 1, None, False, f"{MC_MP}: ModelParallelConfig"),
    "model.context_parallel_size": (INT, 1, None, False, f"{MC_MP}: ModelParallelConfig"),
    "model.virtual_pipeline_model_parallel_size": (INT, None, None, True, f"{B_GPT}: GPTModelProvider"),
    "model.expert_model_parallel_size": (INT, 1, None, False, f"{MC_MP}: ModelParallelConfig"),
    "model.expert_tensor_parallel_size": (INT, None, None, True, f"{MC_MP}: ModelParallelConfig"),
    "model.overlap_moe_expert_parallel_comm": (BOOL, False, None, False, f"{MC_MP}: ModelParallelConfig"),
    "model.num_moe_experts": (INT, None, None, True, f"{B_GPT}: GPTModelProvider"),
    "model.moe_single_grouped_weight": (BOOL, False, None, False, f"{MC_TC}: TransformerConfig"),
    "model.moe_single_grouped_bias": (BOOL, False, None, False, f"{MC_TC}: TransformerConfig"),
    "model.sequence_parallel": (BOOL, False, None, False, f"{MC_MP}: ModelParallelConfig"),
    "model.cpu_offloading": (BOOL, False, None, False, f"{MC_MP}: ModelParallelConfig"),
    "model.cpu_offloading_num_layers": (INT, 0, None, False, f"{MC_MP}: ModelParallelConfig"),
    "model.tp_comm_overlap": (BOOL, False, None, False, f"{MC_MP}: ModelParallelConfig"),
    "model.bf16": (BOOL, False, None, False, f"{MC_MP}: ModelParallelConfig"),
    "model.fp16": (BOOL, False, None, False, f"{MC_MP}: ModelParallelConfig"),
    "model.gradient_accumulation_fusion": (BOOL, FACTORY, None, False, f"{B_GPT}: GPTModelProvider"),
    "model.init_model_with_meta_device": (BOOL, False, None, False, f"{B_GPT}: GPTModelProvider"),
    "model.num_layers": (INT, 0, None, False, f"{MC_TC}: TransformerConfig"),
    "model.recompute_granularity": (STR, None, RECOMPUTE_GRANULARITIES, True, f"{MC_TC}: TransformerConfig"),
    "model.recompute_method": (STR, None, RECOMPUTE_METHODS, True, f"{MC_TC}: TransformerConfig"),
    "model.recompute_num_layers": (INT, None, None, True, f"{MC_TC}: TransformerConfig"),
    "model.fine_grained_activation_offloading": (BOOL, False, None, False, f"{MC_TC}: TransformerConfig"),
    "model.offload_modules": (LIST, [], None, True, f"{MC_TC}: TransformerConfig"),
    "model.cuda_graph_impl": (STR, "none", CUDA_GRAPH_IMPLS, False, f"{MC_TC}: TransformerConfig"),
    "model.transformer_impl": (STR, "transformer_engine", TRANSFORMER_IMPLS, False, f"{MC_TC}: TransformerConfig"),
    "model.seq_length": (INT, 1024, None, False, f"{B_GPT}: GPTModelProvider"),
    # --- top-level ConfigContainer fields ---
    "mixed_precision": (ANY, None, None, True, f"{B_CFG}: ConfigContainer"),
    "comm_overlap": (ANY, None, None, True, f"{B_CFG}: ConfigContainer"),
    "peft": (ANY, None, None, True, f"{B_CFG}: ConfigContainer"),
    "env_vars": (DICT, {}, None, False, f"{B_CFG}: ConfigContainer"),
    # --- comm_overlap: CommOverlapConfig (only read when the section is a mapping) ---
    "comm_overlap.tp_comm_overlap": (BOOL, None, None, True, f"{B_CO}: CommOverlapConfig"),
    "comm_overlap.defer_embedding_wgrad_compute": (BOOL, None, None, True, f"{B_CO}: CommOverlapConfig"),
    "comm_overlap.overlap_moe_expert_parallel_comm": (BOOL, None, None, True, f"{B_CO}: CommOverlapConfig"),
    # --- mixed_precision: MixedPrecisionConfig (when given as a mapping instead of a preset name) ---
    "mixed_precision.bf16": (BOOL, False, None, False, f"{B_MP}: MixedPrecisionConfig"),
    "mixed_precision.fp16": (BOOL, False, None, False, f"{B_MP}: MixedPrecisionConfig"),
    "mixed_precision.grad_reduce_in_fp32": (BOOL, True, None, False, f"{B_MP}: MixedPrecisionConfig"),
    "mixed_precision.fp8": (STR, None, None, True, f"{B_MP}: MixedPrecisionConfig"),
    "mixed_precision.fp8_recipe": (STR, "tensorwise", FP8_RECIPES, False, f"{B_MP}: MixedPrecisionConfig"),
    "mixed_precision.fp8_param_gather": (BOOL, False, None, False, f"{B_MP}: MixedPrecisionConfig"),
    "mixed_precision.fp4": (STR, None, None, True, f"{B_MP}: MixedPrecisionConfig"),
    "mixed_precision.fp4_param_gather": (BOOL, False, None, False, f"{B_MP}: MixedPrecisionConfig"),
    "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag": (BOOL, False, None, False, f"{B_MP}: MixedPrecisionConfig"),
}

# Keys people copy from newer documentation that this release does not have: a plain
# did-you-mean would point at an unrelated key, so say what is going on instead.
# (Checked by test_schema.py: the name appears nowhere in the pinned Megatron-Core / Bridge.)
NOT_IN_THIS_RELEASE = {
    "ddp.megatron_fsdp_version": (
        "Megatron-FSDP v2 is not selectable in Megatron-Core 0.19.2 / Bridge 0.6.2 (DistributedDataParallelConfig "
        "has no megatron_fsdp_version, and neither imports the megatron_fsdp.experimental package); "
        "remove the key"
    ),
}

# Sections that exist in a ConfigContainer (top-level keys of run_config.yaml). A key
# outside this set is an unknown section. Source: B_CFG ConfigContainer fields.
CONTAINER_KEYS = (
    "env_vars",
    "rng",
    "rerun_state_machine",
    "train",
    "model",
    "optimizer",
    "optimizer_config_override_provider",
    "ddp",
    "validation",
    "scheduler",
    "dataset",
    "logger",
    "tokenizer",
    "checkpoint",
    "dist",
    "ft",
    "straggler",
    "nvrx_straggler",
    "profiling",
    "peft",
    "comm_overlap",
    "mixed_precision",
    "tensor_inspect",
    "inprocess_restart",
)

# Fields without any default in the source (the dataclass requires them); the table
# holds None for them, meaning "absent". CommOverlapConfig(tp_comm_overlap=...) is required.
REQUIRED = ("comm_overlap.tp_comm_overlap",)

# Fields whose base class forbids null but a recipe family's provider allows it, so that family's dumps hold
# null: path -> (file, provider class) that declares it Optional. Bridge's hybrid (Mamba) provider derives
# num_layers from hybrid_layer_pattern and declares ``num_layers: int | None = None``.
FAMILY_NULLABLE = {
    "model.num_layers": ("megatron/bridge/models/hybrid/hybrid_provider.py", "HybridModelProvider"),
}

# Every field of the two top-level sections that are null in a recipe dump but may be
# given as mappings (so an unknown key there can still get a did-you-mean).
MIXED_PRECISION_KEYS = (
    "fp32",
    "fp16",
    "bf16",
    "params_dtype",
    "pipeline_dtype",
    "autocast_dtype",
    "autocast_enabled",
    "grad_reduce_in_fp32",
    "fp8",
    "fp8_recipe",
    "first_last_layers_bf16",
    "fp8_margin",
    "fp8_amax_history_len",
    "fp8_amax_compute_algo",
    "fp8_wgrad",
    "fp8_dot_product_attention",
    "fp8_multi_head_attention",
    "fp8_param",
    "fp8_param_gather",
    "fp4",
    "fp4_recipe",
    "fp4_param",
    "fp4_param_gather",
    "loss_scale",
    "initial_loss_scale",
    "min_loss_scale",
    "loss_scale_window",
    "hysteresis",
    "num_layers_at_start_in_bf16",
    "num_layers_at_end_in_bf16",
    "reuse_grad_buf_for_mxfp8_param_ag",
)  # B_MP: MixedPrecisionConfig
COMM_OVERLAP_KEYS = (
    "tp_comm_overlap",
    "tp_comm_overlap_cfg",
    "tp_comm_bootstrap_backend",
    "overlap_p2p_comm",
    "batch_p2p_comm",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "overlap_param_gather_with_optimizer_step",
    "align_param_gather",
    "bucket_size",
    "defer_embedding_wgrad_compute",
    "wgrad_deferral_limit",
    "data_parallel_size",
    "overlap_moe_expert_parallel_comm",
    "delay_wgrad_compute",
)  # B_CO: CommOverlapConfig

# Mixed-precision presets (``mixed_precision: bf16_mixed`` in YAML): the fields of the
# preset that overlap the rules' fields. Bridge's ``MixedPrecisionConfig.setup()``
# copies EVERY field of the preset onto the model, optimizer and ddp configs that have
# a field of that name (``update_config_with_precision_overrides``), so e.g. a
# ``ddp.reuse_grad_buf_for_mxfp8_param_ag: true`` is overwritten by the preset's False.
# Values transcribed from B_MP (the @register functions); checked by test_schema.py.
_MP_BASE = {
    "bf16": False,
    "fp16": False,
    "grad_reduce_in_fp32": True,
    "fp8": None,
    "fp8_recipe": "tensorwise",
    "fp8_param_gather": False,
    "fp4": None,
    "fp4_param_gather": False,
    "reuse_grad_buf_for_mxfp8_param_ag": False,
}
_BF16 = {**_MP_BASE, "bf16": True, "grad_reduce_in_fp32": True}
_FP16 = {**_MP_BASE, "fp16": True, "grad_reduce_in_fp32": False}
MIXED_PRECISION_PRESETS: dict[str, dict] = {
    "bf16_mixed": _BF16,
    "fp16_mixed": _FP16,
    "bf16_with_fp8_delayed_scaling_mixed": {
        **_BF16,
        "fp8": "hybrid",
        "fp8_recipe": "delayed",
        "fp8_param_gather": True,
    },
    "fp16_with_fp8_delayed_scaling_mixed": {
        **_FP16,
        "fp8": "hybrid",
        "fp8_recipe": "delayed",
        "fp8_param_gather": True,
    },
    "bf16_with_mxfp8_mixed": {
        **_BF16,
        "fp8": "e4m3",
        "fp8_recipe": "mxfp8",
        "fp8_param_gather": True,
        "reuse_grad_buf_for_mxfp8_param_ag": True,
    },
    "fp16_with_mxfp8_mixed": {
        **_FP16,
        "fp8": "e4m3",
        "fp8_recipe": "mxfp8",
        "fp8_param_gather": True,
        "reuse_grad_buf_for_mxfp8_param_ag": True,
    },
    "bf16_with_fp8_current_scaling_mixed": {
        **_BF16,
        "fp8": "hybrid",
        "fp8_recipe": "tensorwise",
        "fp8_param_gather": True,
    },
    "nemotron_h_bf16_with_fp8_current_scaling_mixed": {
        **_BF16,
        "fp8": "hybrid",
        "fp8_recipe": "tensorwise",
        "fp8_param_gather": True,
    },
    "nanov2_bf16_with_fp8_current_scaling_mixed": {
        **_BF16,
        "fp8": "hybrid",
        "fp8_recipe": "blockwise",
        "fp8_param_gather": True,
    },
    "fp16_with_fp8_current_scaling_mixed": {
        **_FP16,
        "fp8": "hybrid",
        "fp8_recipe": "tensorwise",
        "fp8_param_gather": True,
    },
    "bf16_with_fp8_subchannel_scaling_mixed": {
        **_BF16,
        "fp8": "hybrid",
        "fp8_recipe": "blockwise",
        "fp8_param_gather": False,
    },
    "fp16_with_fp8_subchannel_scaling_mixed": {
        **_FP16,
        "fp8": "hybrid",
        "fp8_recipe": "blockwise",
        "fp8_param_gather": False,
    },
    "bf16_with_nvfp4_mixed": {**_BF16, "fp8": None, "fp4": "e2m1", "fp8_param_gather": False, "fp4_param_gather": True},
    "nemotron_3_super_bf16_with_nvfp4_mixed": {
        **_BF16,
        "fp8": None,
        "fp4": "e2m1",
        "fp8_param_gather": False,
        "fp4_param_gather": True,
    },
    "nemotron_3_ultra_bf16_with_nvfp4_mixed": {
        **_BF16,
        "fp8": None,
        "fp4": "e2m1",
        "fp8_param_gather": False,
        "fp4_param_gather": True,
    },
}
# Bridge's ``register`` also files every preset under its hyphenated name (bf16-mixed).
MIXED_PRECISION_PRESETS.update({k.replace("_", "-"): v for k, v in list(MIXED_PRECISION_PRESETS.items())})

# Which sections receive which mixed-precision fields in ``MixedPrecisionConfig.setup``
# (only fields the rules read; a field is copied when the target class has it).
MP_TARGETS = {
    "ddp": ("grad_reduce_in_fp32", "fp8_param_gather", "reuse_grad_buf_for_mxfp8_param_ag"),
    "optimizer": ("bf16", "fp16", "reuse_grad_buf_for_mxfp8_param_ag"),
    "model": ("bf16", "fp16"),
}


def field(path: str):
    """The (type, default, choices, nullable, source) record of a dotted path, or None."""
    return FIELDS.get(path)


def default(path: str):
    rec = FIELDS.get(path)
    return None if rec is None else rec[1]


def section_defaults() -> dict:
    """``{section: {key: default}}`` for every field in the table (top-level ones as plain keys)."""
    out: dict = {}
    for path, rec in FIELDS.items():
        if "." not in path:
            continue
        sec, key = path.split(".", 1)
        if sec in ("mixed_precision", "comm_overlap"):
            continue  # only meaningful when the user gives the section as a mapping
        out.setdefault(sec, {})[key] = rec[1]
    for top in ("mixed_precision", "comm_overlap", "env_vars"):
        d = FIELDS[top][1]
        out[top] = dict(d) if isinstance(d, dict) else d
    return out
