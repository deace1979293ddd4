"""Per-GPU memory model for DDP, the distributed optimizer and each Megatron FSDP strategy.

Why this exists: "will it fit, and why did it OOM after I turned FSDP on?" is the
question behind most Megatron FSDP threads. Bridge's and Megatron-LM's theoretical
estimators know DDP and the distributed optimizer only; DeepSpeed's ZeRO
estimators do not know Megatron's buffers. This model reproduces, term by term,
what the pinned code allocates (Megatron-Bridge 0.6.2, Megatron-Core 0.19.2,
megatron_fsdp 0.6.1), so its numbers can be put beside a measured
``torch.cuda.max_memory_allocated``.

The mechanism, per GPU (the most-loaded model-parallel rank), in six parts:

1. **Parameter count** from the model shape, layer by layer (attention or MLA, MLP or MoE
   with shared experts and latent projections, Mamba mixers of a hybrid pattern, MTP depths,
   vision towers), read from the ``model`` section of a Bridge config, a Hugging Face
   ``config.json``, a built-in shape (``BUILTIN_SHAPES``) or ``--params``. Megatron pads the vocabulary to a
   multiple of ``make_vocab_size_divisible_by * TP`` only when
   ``should_pad_vocab`` is set (``GPTModelProvider.provide`` and
   ``megatron/training/vocab_utils.py``).
2. **Model state** (params, grads, optimizer) in bytes per parameter, per strategy,
   with ``N = DP * CP`` the sharding degree (Megatron FSDP shards over the
   ``dp_cp`` group, ``mcore_fsdp_adapter._init_dist_index``):

   =====================  ========  ===========  ==========================
   strategy               params    grads        optimizer (master, m, v)
   =====================  ========  ===========  ==========================
   ddp                    2         4 (fp32)     12
   distopt                2         4 (fp32)     12 / N
   no_shard (FSDP)        2         2 (bf16)     12       (not sharded)
   optim                  2         2            12 / N
   optim_grads            2         2 / N        12 / N
   optim_grads_params     2 / N     2 / N        12 / N
   =====================  ========  ===========  ==========================

   DDP and distopt are Megatron-LM's ``18`` and ``6 + 12/N``
   (``theoretical_memory_usage.py``, ``num_bytes_per_parameter``). Megatron FSDP
   lays its buffers out in ``param_and_grad_buffer.py``
   (``ParamAndGradBuffer._init_each_parameter_group_buffers``): the model-weight
   buffer is distributed only for ``optim_grads_params``, the fp32 main-weight
   buffer for every strategy but ``no_shard``, the grad buffer for ``optim_grads``
   and ``optim_grads_params``. Its grad dtype is ``ddp.megatron_fsdp_main_grads_dtype``
   (default None = the parameter dtype, bf16): ``ddp.grad_reduce_in_fp32`` is not
   read by Megatron FSDP. With ``N = 1`` nothing is distributed (``is_data_distributed``
   needs a group larger than one).
3. **Megatron FSDP buffers** (``optim_grads_params``/``optim_grads`` with N > 1):
   modules that are not FSDP units (embedding, output layer, final norm) stay
   all-gathered after first use (``AllGatherPipeline.reset(preserve_non_fsdp_units=True)``)
   - a persistent unsharded copy; the all-gather window is the current
   transformer layer plus prefetch until ``suggested_communication_unit_size // 2``
   elements (default ``max(1e9, 2 * layer)``, ``MegatronFSDP._init_fsdp_param_and_grad_buffer``);
   unsharded gradient buckets wait in the reduce-scatter queue until it holds more
   than ``suggested_communication_unit_size`` elements
   (``GradReducePipeline.wait_for_previous_grad_reduce``); ``fsdp_double_buffer``
   replaces both windows by two persistent layer-sized pools.
4. **Optimizer-step transient**: when the gradient dtype differs from the fp32 main
   weights, a fp32 copy of the (sharded) gradient is made for the step
   (``ParamAndGradBuffer.update_main_grads``, ``Float16OptimizerWithFloat16Params
   ._copy_model_grads_to_main_grads``, ``DistributedOptimizer`` ``.float()``); it is
   freed by ``zero_grad``. Activations are gone by then, so it competes with them
   for the peak instead of adding to it.
5. **Activations**: Korthikanti et al. 2022 (arXiv 2205.05198, Table 2) decompose a
   layer's saved tensors into norm inputs/outputs, Q/K/V/attention output, the MLP's wide
   tensors and dropout masks; ``activation_bytes`` sizes each term for the model (GQA,
   gated FFN, fused or unfused activation, dropout, the loss's fp32 softmax) and reduces
   to the paper's ``34 sbh`` where its assumptions hold. Pipeline in-flight microbatches,
   recomputation, CP and CPU offloading are applied on top. Megatron-LM's own formula
   (``megatron_activation_bytes``, exact) is reported beside it for comparison.
6. **Model construction**: without ``init_model_with_meta_device`` Bridge builds the
   whole model on the GPU before megatron_fsdp shards it: for ``optim_grads_params`` that
   can be the peak.

7. **Calibration** (``calibration``): what real runs allocate beyond the modelled terms
   (framework workspaces, MoE and MLA layer state, the measured excess of activation peaks), fitted on
   H200 rehearsals at data-parallel sizes 1 to 64 so that the predicted peak is never below a
   measured one; the model state itself is computed, never calibrated.

Totals: ``total = max(model_state + max(activations + buffers alive with them, the late
reduce-scatter queue, step transient) + calibration, construction peak)``: the calibrated margins
belong to the training steps, not to the model's construction. "Model state" =
params + grads + optimizer + persistent FSDP buffers; ``after_step`` (model state + step
transient + the layers gathered for the next step + framework workspaces) is what
``torch.cuda.memory_allocated()`` reads between training steps. Against the committed
rehearsal runs (BENCHMARK.md) the peak is 0 to 3.0 % above the measured one, never below.

Where each part lives: ``shapes`` (model shapes, parameter counting per family: GPT, MLA, MoE,
MTP, hybrid Mamba, vision towers), ``hf`` (a Hugging Face ``config.json`` as a model section),
``terms`` (precision, optimizer, activations), ``strategies`` (model state and buffers per
strategy), ``calibration`` (the measured margins), ``estimate`` (the totals, layout checks and
the report), ``common`` (units, dtype sizes, config access). This package re-exports the public
names, so ``memory.estimate(...)`` / ``memory.report(...)`` work from one import.

Standard library only: this runs inside the agent's own interpreter.
"""

from __future__ import annotations

from .common import (
    ADAM_STATES,
    DEFAULT_MICRO_BATCH,
    DTYPE_BYTES,
    FP32,
    GIB,
    ModelError,
    dtype_bytes,
)
from .devices import GPU_PRESETS, TIGHT_FRACTION, parse_gpu_mem
from .estimate import (
    Estimate,
    Parallel,
    assumptions,
    check_layout,
    configured_strategy,
    dp_step,
    estimate,
    lora_from_config,
    model_state,
    parallel_from,
    report,
    smallest_dp,
)
from .hf import load_hf_config, model_section_from_hf
from .shapes import (
    BUILTIN_SHAPES,
    Counts,
    Lora,
    Shape,
    builtin_names,
    builtin_shape,
    count_parameters,
    pipeline_stages,
    shape_from_config,
)
from .strategies import (
    DDP_BUCKET_PER_DP_RANK,
    DDP_MIN_BUCKET,
    FSDP_DOUBLE_BUFFER_SLOTS,
    FSDP_MIN_COMM_UNIT,
    FSDP_STRATEGIES,
    STRATEGIES,
    StrategyMemory,
    strategy_memory,
)
from .terms import (
    ActivationSettings,
    Precision,
    activation_bytes,
    activation_settings,
    layer_activation_bytes,
    megatron_activation_bytes,
    precision_from_config,
)

__all__ = [
    "GPU_PRESETS",
    "TIGHT_FRACTION",
    "parse_gpu_mem",
    "Lora",
    "check_layout",
    "dp_step",
    "layer_activation_bytes",
    "load_hf_config",
    "lora_from_config",
    "model_section_from_hf",
    "pipeline_stages",
    "ADAM_STATES",
    "ActivationSettings",
    "BUILTIN_SHAPES",
    "Counts",
    "DDP_BUCKET_PER_DP_RANK",
    "DDP_MIN_BUCKET",
    "DEFAULT_MICRO_BATCH",
    "DTYPE_BYTES",
    "Estimate",
    "FP32",
    "FSDP_DOUBLE_BUFFER_SLOTS",
    "FSDP_MIN_COMM_UNIT",
    "FSDP_STRATEGIES",
    "GIB",
    "ModelError",
    "Parallel",
    "Precision",
    "STRATEGIES",
    "Shape",
    "StrategyMemory",
    "activation_bytes",
    "activation_settings",
    "assumptions",
    "builtin_names",
    "builtin_shape",
    "configured_strategy",
    "count_parameters",
    "dtype_bytes",
    "estimate",
    "megatron_activation_bytes",
    "model_state",
    "parallel_from",
    "precision_from_config",
    "report",
    "shape_from_config",
    "smallest_dp",
    "strategy_memory",
]
