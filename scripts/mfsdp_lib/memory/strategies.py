"""Model state per strategy: DDP, the distributed optimizer and each Megatron FSDP strategy.

Params, grads and optimizer state in bytes per parameter with ``N = DP * CP`` the sharding
degree, plus Megatron FSDP's buffers (the all-gather window, the reduce-scatter queue,
the double-buffer pools) and DDP's buckets, as the pinned code lays them out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

from .common import ADAM_STATES, FP32, ModelError
from .shapes import Counts, _group_elements, fsdp_chunk_factor
from .terms import Precision

STRATEGIES = ("ddp", "distopt", "no_shard", "optim", "optim_grads", "optim_grads_params")
FSDP_STRATEGIES = STRATEGIES[2:]


# Megatron FSDP (megatron_fsdp 0.6.1, megatron_fsdp.py): when
# ``suggested_communication_unit_size`` is unset it is
# ``max(1_000_000_000, 2 * elements per FSDP unit)`` for optim_grads_params, else
# ``max(1_000_000_000, bucket_size or 1e9)``; the all-gather prefetch limit is half of it.
FSDP_MIN_COMM_UNIT = 1_000_000_000
FSDP_DOUBLE_BUFFER_SLOTS = 2  # FixedPoolAllocator(size=UB_BUFFER_NUM=2)

# bucket_size when unset: max(40e6, 1e6 x DP x CP) (megatron/training/models/dist_utils.py,
# distributed/distributed_data_parallel.py), so buckets grow with DP.
DDP_MIN_BUCKET = 40_000_000
DDP_BUCKET_PER_DP_RANK = 1_000_000
# What a ``comm_overlap`` section writes into ddp.bucket_size at DP > 1 (Bridge's
# CommOverlapConfig._get_optimizer_overlap_cfgs: 128 * 1024 * 1024), replacing the user's value.
COMM_OVERLAP_BUCKET = 128 * 1024 * 1024

# How far ``smallest_dp`` searches (data-parallel sizes beyond this are not built today).
MAX_DP_SEARCH = 16384


def gathered_after_step(
    counts: Counts, p: Precision, *, n_dense: int, n_expert: int, dp: int, cp: int, peft: bool, limit: float
) -> tuple[int, float]:
    """(layers, elements) that Megatron FSDP all-gathers right after the optimizer step and holds
    until the next forward, with ``optim_grads_params``.

    ``start_param_sync`` gathers the bucket of the first parameter (the word embedding) with prefetch
    (megatron_fsdp.py:1277-1282), and ``all_gather_params`` then adds the next bucket group, in bucket
    order, while the buckets it has added so far hold fewer than ``limit`` elements
    (``suggested_AG_prefetch_size``, param_and_grad_buffer.py:4479-4508). Bucket order follows the
    parameter groups (:1786-1816): first the group of parameters outside the FSDP units (word and
    position embeddings, final norm, output layer), cut into buckets of ``bucket_size`` elements
    (:1849-1866; ``bucket_size`` is set by Bridge's wrapper when ``overlap_grad_reduce``, see
    ``Precision``), then each layer's groups (one bucket group per layer for its dense parameters,
    frozen and adapters together, one for its routed experts, :1935-1952). The non-unit buckets after
    the embedding's count toward the limit but stay allocated anyway; each layer's bucket is its
    padded size (``UnitGroup.bucket``). Only buckets that are sharded (group of more than one rank)
    are newly allocated. At least one layer is counted, the safe side of a layout this cannot read.
    Measured on H200 rehearsals (1.1 B Llama, with and without LoRA, at DP 8 and 64; 8 B and 70 B
    trunks; a 16-layer MoE), this gives the bytes gathered between steps exactly.
    """
    per_layer = counts.stage_unit_groups or (counts.unit_groups,) * counts.layers_on_gpu
    sizes = []  # (dense, expert) bucket-group elements per layer, in order
    for layer in per_layer:
        groups = [g for g in layer if peft or not g.lora]
        sizes.append(
            (
                sum(g.bucket(n_dense) for g in groups if not g.expert),
                sum(g.bucket(n_expert) for g in groups if g.expert),
            )
        )
    if not sizes:
        return 0, 0.0
    # the embedding's bucket is gathered; the later non-unit buckets are prefetched
    offset = sum(_nonunit_bucket_sizes(counts, p, n_dense=n_dense, dp=dp, cp=cp)[1:])
    prefetched, layers, gathered = offset, 0, 0.0
    for dense, expert in sizes:
        if prefetched >= limit:
            break
        for size, n in ((dense, n_dense), (expert, n_expert)):
            if size and prefetched < limit:
                prefetched += size
                gathered += size if n > 1 else 0.0
        layers += 1
    if layers == 0:
        dense, expert = max(sizes, key=sum)
        layers = 1
        gathered = dense * (n_dense > 1) + expert * (n_expert > 1)
    return layers, gathered


def fsdp_padding(counts: Counts, *, n_dense: int, n_expert: int, dp: int, cp: int, p: Precision, peft: bool,
                 trainable_only: bool) -> float:  # fmt: skip
    """Elements per rank that Megatron FSDP's sharded buffers hold beyond the parameters: each bucket is
    laid out in rows of its ``chunk_size_factor`` and padded to DP x chunk before it is split
    (param_and_grad_buffer.py:284-286, ``UnitGroup.bucket``), and every rank keeps an equal shard of it.
    Small for Llama layers (rows of ``ffn``); large when a layer's rows are of unlike widths (a Mamba
    layer's lcm(hidden, d_inner) rows: 376,320 elements for Nemotron 3 Nano 4B, 24 M at DP 64).
    ``trainable_only``: the groups that have gradients and optimizer state (with PEFT, the adapters)."""
    extra = 0.0
    for layer in counts.stage_unit_groups:
        for g in layer:
            if g.lora and not peft:
                continue
            if trainable_only and peft and not g.lora:
                continue
            n = n_expert if g.expert else n_dense
            if n > 1:
                extra += (g.bucket(n) - g.elements) / n
    if not (trainable_only and peft) and n_dense > 1:
        for b in _nonunit_buckets(counts, p, dp=dp, cp=cp):
            chunk = fsdp_chunk_factor(b)
            elems = _group_elements(b, chunk)
            step = n_dense * chunk
            extra += (math.ceil(elems / step) * step - sum(x[0] for x in b)) / n_dense
    return extra


def wrapper_bucket(p: Precision, *, dp: int, cp: int) -> int | None:
    """``ddp.bucket_size`` as Megatron-Core's wrapper hands it to Megatron FSDP (None: one bucket).

    First Bridge's ``comm_overlap`` section, when it applies (``Precision.comm_overlap_dp``): at DP > 1
    it writes 128 Mi and ``overlap_grad_reduce=True``, at DP 1 None and False, each replaced by the
    section's own non-null value. Then ``_ddp_wrap`` (megatron/training/models/dist_utils.py): an unset
    size becomes ``max(40e6, 1e6 x DP x CP)``, and without ``overlap_grad_reduce`` it is None again.
    """
    bucket, overlap = p.bucket_size, p.overlap_grad_reduce
    if p.comm_overlap_dp:
        bucket, overlap = (COMM_OVERLAP_BUCKET, True) if dp > 1 else (None, False)
        if p.comm_overlap_bucket_size is not None:
            bucket = p.comm_overlap_bucket_size
        if p.comm_overlap_grad_reduce is not None:
            overlap = p.comm_overlap_grad_reduce
    if bucket is None:
        bucket = max(DDP_MIN_BUCKET, DDP_BUCKET_PER_DP_RANK * dp * cp)
    return bucket if overlap else None


def _nonunit_buckets(counts: Counts, p: Precision, *, dp: int, cp: int) -> list[list[tuple[float, int]]]:
    """The group of parameters outside the FSDP units, cut into buckets of ``bucket_size`` elements
    (param_and_grad_buffer.py:1849-1866; ``wrapper_bucket`` says who sets it)."""
    bucket_size = wrapper_bucket(p, dp=dp, cp=cp)
    buckets: list[list[tuple[float, int]]] = [[]]
    for item in counts.nonunit_items:
        if not buckets[-1] or not bucket_size or sum(x[0] for x in buckets[-1]) < bucket_size:
            buckets[-1].append(item)
        else:
            buckets.append([item])
    return [b for b in buckets if b]


def _nonunit_bucket_sizes(counts: Counts, p: Precision, *, n_dense: int, dp: int, cp: int) -> list[float]:
    """Unsharded elements of each bucket of the non-unit group (``_nonunit_buckets``), in order: its
    items in rows of the bucket's ``chunk_size_factor``, padded to ``n_dense`` x chunk when sharded."""
    sizes: list[float] = []
    for b in _nonunit_buckets(counts, p, dp=dp, cp=cp):
        chunk = fsdp_chunk_factor(b)
        elems = _group_elements(b, chunk)
        step = n_dense * chunk if n_dense > 1 else 1
        sizes.append(float(math.ceil(elems / step) * step))
    return sizes


# --------------------------------------------------------------------------- model state per strategy


@dataclass
class StrategyMemory:
    """Bytes on the most-loaded GPU for one strategy (floats: shards need not be whole)."""

    name: str
    params: float
    grads: float
    optimizer: float
    buffers_persistent: float = 0.0  # kept across iterations: preserved non-unit copies, double buffers
    buffers_at_peak: float = 0.0  # alive with the activation peak (start of backward)
    buffers_late: float = 0.0  # largest later in backward, when activations are mostly freed
    step_transient: float = 0.0  # fp32 gradient copy made for the optimizer step
    init_peak: float = 0.0  # while the model is built unsharded on the GPU, before wrapping
    gathered_after_step: float = 0.0  # layers all-gathered by start_param_sync right after the step
    notes: tuple[str, ...] = ()

    @property
    def model_state(self) -> float:
        return self.params + self.grads + self.optimizer + self.buffers_persistent

    def training_total(self, activations: float) -> float:
        """Peak of the training steps alone, without the model-construction peak."""
        return self.model_state + max(
            activations + self.buffers_at_peak, self.buffers_late, self.after_step - self.model_state
        )

    def total(self, activations: float) -> float:
        return max(self.training_total(activations), self.init_peak)

    @property
    def after_step(self) -> float:
        """What ``memory_allocated()`` reads between two training steps."""
        return self.model_state + self.step_transient + self.gathered_after_step

    def buffers(self, activations: float) -> float:
        """FSDP buffer bytes at the moment that decides the total."""
        peak = activations + self.buffers_at_peak
        moment = self.buffers_at_peak if peak >= self.buffers_late else self.buffers_late
        return self.buffers_persistent + moment


def _adam_bytes(p: Precision, *, fsdp: bool) -> tuple[int, int]:
    """(main-weight bytes, moment bytes) per parameter the optimizer holds."""
    if p.precision_aware:
        if fsdp:
            # FusedAdam receives Megatron FSDP's main weights and its own master weights are
            # switched off (megatron/core/optimizer/__init__.py, get_megatron_optimizer).
            master = p.fsdp_main_bytes
        elif p.store_param_remainders and p.param_bytes == 2 and p.master_bytes == FP32:
            master = 2  # only the 16 bits fp32 adds to the bf16 weight (OptimizerConfig docs)
        else:
            master = p.master_bytes
        return master, p.exp_avg_bytes + p.exp_avg_sq_bytes
    if fsdp:
        # Adam's states are zeros_like(the optimizer's parameter): the main weight, or the
        # model weight when megatron_fsdp_main_params_dtype is None.
        return p.fsdp_main_bytes, ADAM_STATES * (p.fsdp_main_bytes or p.param_bytes)
    master = FP32 if p.param_bytes < FP32 else 0  # fp32 training: the weights are the master
    return master, ADAM_STATES * FP32


def _optimizer_bytes(p: Precision, *, fsdp: bool) -> tuple[float, float]:
    """(bytes per 2-D weight, bytes per other parameter) of optimizer state, main weights included.

    Adam: main weights + exp_avg + exp_avg_sq for every parameter. Muon
    (optimizer/emerging_optimizers.py:160 TensorParallelMuon, an OrthogonalizedOptimizer):
    one momentum buffer per 2-D weight (adaptive Muon adds a second moment, :330); parameters
    that are not 2-D, and the embedding and output layer, go to ``muon_scalar_optimizer``
    (Adam: two moments; Lion: one) (:81-86, :128, optimizer/__init__.py:800-809). SGD: one
    momentum buffer when ``sgd_momentum`` > 0. Every state is zeros_like(the fp32 main weight).
    """
    master, adam_moments = _adam_bytes(p, fsdp=fsdp)
    state = (p.fsdp_main_bytes or p.param_bytes) if fsdp else FP32
    if p.optimizer in ("muon", "adaptive_muon"):
        matrix = master + state * (2 if p.optimizer == "adaptive_muon" else 1)
        scalar = master + (state if p.muon_scalar_optimizer == "lion" else adam_moments)
        return matrix, scalar
    if p.optimizer == "sgd":
        one = master + (state if p.sgd_momentum else 0)
        return one, one
    return master + adam_moments, master + adam_moments


# Newton-Schulz orthogonalisation works on one gradient matrix at a time in fp32 (the
# momentum's update, X, X X^T and the polynomial's terms): about four fp32 copies of the
# largest 2-D weight live during Muon's step (emerging_optimizers.py:269 ``orthogonalize``).
MUON_NS_COPIES = 4


def _rs_queue_peak(buckets: list[float], capacity: float) -> float:
    """Largest sum of unsharded gradient buckets alive, by GradReducePipeline's rule.

    A bucket's unsharded storage lives while its gradients accumulate and then in the
    reduce-scatter queue; before a bucket is queued, the oldest are freed while the
    queue holds more than ``capacity`` elements (``wait_for_previous_grad_reduce``).
    """
    queue: deque[float] = deque()
    queued = peak = 0.0
    for size in buckets:
        peak = max(peak, queued + size)  # this bucket accumulating, older ones queued
        while queue and queued > capacity:
            queued -= queue.popleft()
        queue.append(size)
        queued += size
        peak = max(peak, queued)
    return peak


def _buckets(total: float, bucket: int, capacity: float) -> list[float]:
    """``total`` elements cut into gradient buckets of ``bucket`` elements.

    A run of equal buckets reaches the queue's steady state after ``capacity / bucket + 1``
    of them, so longer runs are cut short: the peak is the same, and it stays cheap.
    """
    if total <= 0:
        return []
    n = int(total // bucket)
    rest = total - n * bucket
    n = min(n, int(capacity // bucket) + 3)
    return [float(bucket)] * n + ([rest] if rest > 0 else [])


def strategy_memory(
    strategy: str,
    counts: Counts,
    p: Precision,
    *,
    dp: int = 1,
    cp: int = 1,
    tp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    peft: bool = False,
    loss_headroom: float = 0.0,
) -> StrategyMemory:
    """Model-state and buffer bytes for one strategy on the most-loaded GPU.

    ``loss_headroom``: bytes by which the loss forward exceeds the start of backward
    (``terms.loss_forward_headroom``); the unsharded gradient buffers alive at the start of backward
    fit in it, since they do not exist yet at the loss forward.

    ``peft``: only the LoRA adapters in ``counts`` train; the base weights are frozen and
    keep no gradient, main weight or optimizer state (Megatron FSDP creates grad and main
    buffers only for parameters that require grad, megatron_fsdp/param_and_grad_buffer.py:2012
    and :2640; Megatron-Core DDP likewise, distributed_data_parallel.py ``if param.requires_grad``).
    """
    if strategy not in STRATEGIES:
        raise ModelError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
    etp = etp or tp
    n_dense = dp * cp
    n_expert = max(1, (dp * cp * tp) // (ep * etp))  # expert data-parallel group
    w_dense = counts.gpu_dense + (counts.gpu_lora - counts.gpu_lora_experts if peft else 0.0)
    w_exp = counts.gpu_experts + (counts.gpu_lora_experts if peft else 0.0)
    full = w_dense + w_exp
    shard = w_dense / n_dense + w_exp / n_expert
    if peft:
        t_dense, t_exp = counts.gpu_lora - counts.gpu_lora_experts, counts.gpu_lora_experts
    else:
        # Parameters a VLM's freeze flags set requires_grad=False on (Counts.gpu_frozen_*) hold only their
        # weights, like PEFT's frozen base: Megatron FSDP builds the main weight and main grad buffers of a
        # parameter group only when it requires grad (param_and_grad_buffer.py:2637-2642, the default
        # only_create_grad_buffer_and_main_weight_buffer_for_param_requires_grad=True at :2012, which neither
        # megatron-core nor Bridge overrides), and the optimizer gets only parameters that require grad.
        t_dense = w_dense - counts.gpu_frozen_dense
        t_exp = w_exp - counts.gpu_frozen_experts
    t_full = t_dense + t_exp
    t_shard = t_dense / n_dense + t_exp / n_expert
    t_frac = t_full / full if full else 1.0
    # Share of trainable parameters that are 2-D weights (Muon's); all LoRA adapters are.
    matrix_frac = 1.0 if peft else (counts.gpu_matrix / full if full and counts.gpu_matrix else 1.0)
    pbytes = float(p.param_bytes)
    if p.fp8_params:
        # FP8 weights (1 byte) for the linear layers; norms, embeddings and the output layer stay 16-bit.
        weight_matrix = counts.gpu_matrix / full if full and counts.gpu_matrix else 0.0
        pbytes = weight_matrix * 1 + (1 - weight_matrix) * p.param_bytes
    keep = 1.0 - p.optimizer_offload_fraction  # share of optimizer state left on the GPU
    notes: list[str] = []
    muon = p.optimizer in ("muon", "adaptive_muon")
    if muon and strategy in FSDP_STRATEGIES:
        notes.append("Muon with Megatron FSDP fails at optimizer construction or the first step (see `check`)")

    def opt_state(held_all: float, held_sharded: float, fsdp: bool) -> float:
        """Optimizer bytes: 2-D weights (Muon's part sharded only layer-wise or by FSDP) + the rest."""
        mat_b, sca_b = _optimizer_bytes(p, fsdp=fsdp)
        if muon and not fsdp and not p.layer_wise:
            matrix_held = held_all  # plain Muon keeps whole state on every data-parallel rank
        else:
            matrix_held = held_sharded
        return (mat_b * matrix_frac * matrix_held + sca_b * (1 - matrix_frac) * held_sharded) * keep

    muon_step = MUON_NS_COPIES * FP32 * counts.gpu_largest_matrix if muon else 0.0

    if strategy in ("ddp", "distopt"):
        precision_aware = p.precision_aware and strategy == "distopt"
        if p.precision_aware and strategy == "ddp":
            notes.append("use_precision_aware_optimizer needs the distributed optimizer; not applied to ddp")
        q = replace(p, precision_aware=precision_aware)
        held_sharded = t_full if strategy == "ddp" else t_shard
        mat_b, sca_b = _optimizer_bytes(q, fsdp=False)
        if muon and not p.layer_wise:
            # Plain Muon is not distributed, and neither is its scalar optimizer: get_megatron_optimizer's emerging
            # path builds the non-Muon groups with fallback_config.use_distributed_optimizer = False unless
            # layer-wise (optimizer/__init__.py :: _get_megatron_emerging_optimizer). Measured on an H200: the
            # llama 1.1 B preset's Muon + Adam state is 1.235 G fp32 numbers on rank 0 of 8, none of it sharded.
            matrix_held = scalar_held = t_full
        else:
            matrix_held = scalar_held = held_sharded
        optimizer = (mat_b * matrix_frac * matrix_held + sca_b * (1 - matrix_frac) * scalar_held) * keep
        step = muon_step
        if p.ddp_grad_bytes != FP32 and p.param_bytes < FP32 and not precision_aware:
            step += FP32 * held_sharded  # main_param.grad = main_grad.float(): a copy unless already fp32
        return StrategyMemory(
            strategy,
            pbytes * full,
            p.ddp_grad_bytes * t_full,
            optimizer,
            step_transient=step,
            notes=tuple(notes),
        )

    # Megatron FSDP: a buffer is distributed only when the strategy says so and its group has > 1 rank.
    sharded = n_dense > 1 or n_expert > 1
    w_sharded = strategy == "optim_grads_params" and sharded
    g_sharded = strategy in ("optim_grads", "optim_grads_params") and sharded
    if sharded:  # the sharded buffers are padded (fsdp_padding); each rank holds an equal shard
        for trainable in (False, True):
            pad = fsdp_padding(
                counts, n_dense=n_dense, n_expert=n_expert, dp=dp, cp=cp, p=p, peft=peft, trainable_only=trainable
            )
            if trainable:
                t_shard += pad
            else:
                shard += pad
    held = t_full if strategy == "no_shard" else t_shard  # no_shard keeps whole optimizer state
    mem = StrategyMemory(
        strategy,
        pbytes * (shard if w_sharded else full),
        p.fsdp_grad_bytes * (t_shard if g_sharded else t_full),
        opt_state(held, held, True),
    )
    if p.fsdp_main_bytes and not p.precision_aware and p.fsdp_grad_bytes != p.fsdp_main_bytes:
        mem.step_transient = p.fsdp_main_bytes * held  # update_main_grads: grad.to(main dtype)
    mem.step_transient += muon_step
    if p.built_on_gpu and w_sharded:
        # megatron_fsdp copies each parameter into its buffer and frees the original as it goes:
        # the peak is the unsharded model plus the current group's unsharded bucket (ParamAndGradBuffer
        # init). The first group is the one outside the FSDP units (embedding first in module order),
        # whole while nothing is freed yet: its bucket, when larger than a layer, sets the peak.
        nonunit_bucket = max(_nonunit_bucket_sizes(counts, p, n_dense=n_dense, dp=dp, cp=cp), default=0.0)
        mem.init_peak = pbytes * full + max(pbytes * counts.gpu_unit, p.param_bytes * nonunit_bucket)
    g = p.fsdp_comm_grad_bytes * t_frac  # frozen weights send no gradients
    # optim_grads gradient buckets: a comm_overlap section's size when Bridge applies one (128 Mi at DP > 1),
    # else ddp.bucket_size; unset (or one bucket) is sized like _ddp_wrap's default.
    configured = wrapper_bucket(p, dp=dp, cp=cp) if p.comm_overlap_dp else p.bucket_size
    bucket = configured or max(DDP_MIN_BUCKET, DDP_BUCKET_PER_DP_RANK * dp * cp)
    if w_sharded and counts.gpu_unit > 0:
        unit, layers = counts.gpu_unit, counts.layers_on_gpu
        capacity = p.suggested_communication_unit_size or max(FSDP_MIN_COMM_UNIT, int(2 * unit))
        first = counts.gpu_first_grads  # output layer: the first gradients of the backward pass
        rest = counts.gpu_non_unit - first  # embedding (+ final norm): the last ones
        # A gathered layer allocates only the groups that are sharded: with EP and an expert-data-
        # parallel group of one, the experts are whole already and only the dense part is gathered.
        gathered = (unit - counts.gpu_unit_experts) * (n_dense > 1) + counts.gpu_unit_experts * (n_expert > 1)
        mem.buffers_persistent = p.param_bytes * counts.gpu_non_unit
        notes.append("non-FSDP-unit modules (embedding, output layer) stay all-gathered after first use")
        if p.fsdp_double_buffer:
            mem.buffers_persistent += FSDP_DOUBLE_BUFFER_SLOTS * unit * (pbytes + g)
            mem.buffers_at_peak = g * first - min(g * first, loss_headroom)
            mem.buffers_late = g * max(first, rest)
            notes.append("fsdp_double_buffer: two persistent layer-sized pools, for weights and for grads")
        else:
            # Prefetch adds layers while the prefetched size stays within
            # suggested_communication_unit_size // 2 (param_and_grad_buffer.py:4479-4505). Measured on
            # H200 rehearsals of 1.1 B, 8 B and 70 B Llama trunks and a 16-layer MoE: floor(limit /
            # layer) layers (at least one) are gathered right after the optimizer step
            # (start_param_sync); at the activation peak (start of backward) the window is the
            # current layer plus half of that prefetch.
            # In the passes, prefetch starts from a layer's bucket: about limit / layer layers.
            prefetched = min(layers, max(1, int((capacity // 2) // unit)))
            at_peak = min(layers, 1 + math.ceil(prefetched / 2))
            # After the step it starts from the embedding's bucket (gathered_after_step).
            after_layers, gathered_elems = gathered_after_step(
                counts, p, n_dense=n_dense, n_expert=n_expert, dp=dp, cp=cp, peft=peft, limit=capacity // 2
            )
            if p.gather_after_step:
                mem.gathered_after_step = pbytes * gathered_elems
            rs = _rs_queue_peak([first] + [unit] * min(layers, int(capacity // unit) + 3) + [rest], capacity)
            grads_at_peak = g * (first + unit)
            mem.buffers_at_peak = pbytes * at_peak * gathered + grads_at_peak - min(grads_at_peak, loss_headroom)
            mem.buffers_late = pbytes * at_peak * gathered + g * rs
            notes.append(
                f"all-gather window: {at_peak} layer(s) at the activation peak, {after_layers} gathered between "
                f"steps; reduce-scatter queue: up to {rs / 1e6:.0f}M unsharded gradient elements"
            )
    elif w_sharded:
        notes.append("no model shape: FSDP all-gather/reduce-scatter buffers not estimated")
    elif g_sharded:
        capacity = p.suggested_communication_unit_size or max(FSDP_MIN_COMM_UNIT, bucket)
        # A parameter larger than a bucket gets one of its own: output layer first, embedding last.
        first, rest = counts.gpu_first_grads, counts.gpu_non_unit - counts.gpu_first_grads
        grads_in_backward = [first] + _buckets(full - first - rest, bucket, capacity) + [rest]
        rs = _rs_queue_peak([x for x in grads_in_backward if x > 0], capacity)
        first = max(first, grads_in_backward[1] if len(grads_in_backward) > 2 else 0.0)
        mem.buffers_at_peak = g * first - min(g * first, loss_headroom)
        mem.buffers_late = g * rs
        notes.append(f"reduce-scatter queue: up to {rs / 1e6:.0f}M unsharded gradient elements")
    mem.notes = tuple(notes)
    return mem
