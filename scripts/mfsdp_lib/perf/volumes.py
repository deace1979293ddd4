"""Analytic per-step communication of each data-parallel strategy, with its source.

For one rank, per training step of ``m`` micro-batches, over a data-parallel group of ``N``
ranks (``f = (N-1)/N``), with ``P`` the parameters this rank's model-parallel partition
holds (all of them with TP = PP = 1), ``bp`` the bytes of a gathered parameter (2 for bf16;
1 when FP8 parameters are gathered) and ``bg`` the bytes of a reduced gradient element
(``gradient_comm_bytes``). Volumes are *bus* bytes (what crosses this rank's link,
nccl-tests' convention, see :mod:`.collectives`); bucket padding aside: the distributed
optimizer pads each bucket's end to a multiple of lcm(N, 128) elements
(``megatron/core/optimizer/param_layout.py`` :: ``pad_bucket_end``), Megatron FSDP
to a multiple of N x the bucket's row width (``param_and_grad_buffer.py`` ::
``build_data_parallel_buffer_index._pad_if_needed``, ``chunk_size_factor``: the widest row's
element count, or the lcm of unlike rows), up to N x row width elements per bucket: for
Llama 3 8B (rows of 4096 and 14336 elements, lcm 28672) at N = 64 up to 3.7 MB of bf16 per
bucket, 1.8 MB on average; ``COMPARE_TOLERANCE`` covers it.

Megatron-Core DDP and distributed optimizer (megatron-core 0.19.2):

* gradients are reduced once per step, on the last micro-batch: the schedule runs the
  first ``m-1`` micro-batches under ``no_sync`` (``megatron/core/pipeline_parallel/schedules.py``
  :: ``forward_backward_no_pipelining``, lines 787-788);
* DDP all-reduces them: ``all_reduce``, ``P bg 2f`` (``megatron/core/distributed/param_and_grad_buffer.py``
  :: ``_ParamAndGradBucketGroup.start_grad_sync``, lines 724 and 750);
* the distributed optimizer reduce-scatters them, ``P bg f`` (same function, line 712), and
  all-gathers the updated bf16 parameters once per step, ``P bp f`` (``start_param_sync``,
  lines 504-515; overlapped with the next forward when ``overlap_param_gather``).

Megatron FSDP (megatron-fsdp 0.6.1, ``megatron_fsdp/``):

* ``no_shard`` and ``optim`` delay the gradient reduction to the last micro-batch
  (``megatron_fsdp.py`` :: ``MegatronFSDP.__init__``, line 327, ``is_delay_grad_reduce``);
  ``no_shard`` all-reduces (``P bg 2f``), ``optim`` reduce-scatters (``P bg f``)
  (``param_and_grad_buffer.py`` :: ``GradReducePipeline``, lines 4076-4098);
* ``optim_grads`` and ``optim_grads_params`` shard the gradient buffer
  (``param_and_grad_buffer.py`` lines 2331-2339), so every micro-batch's gradients are
  reduce-scattered as backward produces them: ``m P bg f``;
* ``optim`` and ``optim_grads`` keep whole model weights: after the optimizer step
  megatron-core calls ``start_param_sync`` on each chunk (``megatron/core/optimizer/distrib_optimizer.py``
  :: ``DistributedOptimizer.step_with_ready_grads``, lines 3171-3175), which gathers every
  bucket at once when parameter gathering is not overlapped (``megatron_fsdp.py`` ::
  ``MegatronFSDP.start_param_sync``): ``P bp f`` per step;
* ``optim_grads_params`` shards the weights too and gathers each FSDP unit (a transformer
  layer) just in time, before its forward (pre-forward hook) and again before its backward
  (``megatron_fsdp.py`` :: ``_register_fsdp_hooks``, the pre-backward hook calls
  ``all_gather_and_wait_parameters_ready(..., bwd=True)``): ``2 m P_unit bp f``. Activation
  recomputation re-runs a layer's forward inside backward without a third gather (the
  post-forward hook releases lazily then, ``_post_forward``). Parameters outside FSDP units
  (embedding, output layer, final norm) are gathered once per step: they are never released
  within the step (``param_and_grad_buffer.py`` :: ``AllGatherPipeline.release_bucket``, its
  docstring), a gather of a bucket already ``READY_TO_USE`` returns at once
  (``AllGatherPipeline.async_bucket_gather``), and the step's end marks them ``PRESERVED`` for the
  next step's first gather to refresh (``megatron_fsdp.py`` :: ``MegatronFSDP.synchronize_param_gather``
  -> ``AllGatherPipeline.reset(preserve_non_fsdp_units=True)``): ``(P - P_unit) bp f``. The
  recorded H200 runs agree (the 16-micro-batch anchor gathers 197.30 GB against 197.27 GB for
  once per step and 254.27 GB for twice per micro-batch).

The recorded log (``rehearse --perf``) is the exact figure for a config; these formulas are
what it is checked against and what ``references/perf.md`` explains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CORE = "megatron/core/distributed/param_and_grad_buffer.py"
FSDP = "megatron_fsdp/param_and_grad_buffer.py"
FSDP_MAIN = "megatron_fsdp/megatron_fsdp.py"
SOURCES = {
    "grad_once": "megatron/core/pipeline_parallel/schedules.py :: forward_backward_no_pipelining (no_sync for m-1 "
    "micro-batches, lines 787-788)",
    "ddp_ar": f"{CORE} :: _ParamAndGradBucketGroup.start_grad_sync (all_reduce, lines 724, 750)",
    "distopt_rs": f"{CORE} :: _ParamAndGradBucketGroup.start_grad_sync (reduce-scatter, line 712)",
    "distopt_ag": f"{CORE} :: _ParamAndGradBucketGroup.start_param_sync (all-gather, lines 504-515)",
    "fsdp_delay": f"{FSDP_MAIN} :: MegatronFSDP.__init__ (is_delay_grad_reduce, line 327)",
    "fsdp_reduce": f"{FSDP} :: GradReducePipeline (all_reduce / reduce_scatter_tensor, lines 4076-4098)",
    "fsdp_buffers": f"{FSDP} :: ParamAndGradBuffer._init_each_parameter_group_buffers (lines 2323-2339)",
    "fsdp_step_ag": "megatron/core/optimizer/distrib_optimizer.py :: DistributedOptimizer.step_with_ready_grads "
    f"(lines 3171-3175) -> {FSDP_MAIN} :: MegatronFSDP.start_param_sync",
    "fsdp_unit_ag": f"{FSDP_MAIN} :: MegatronFSDP._register_fsdp_hooks (pre-forward and pre-backward all-gathers)",
    "fsdp_nonunit": f"{FSDP} :: AllGatherPipeline.release_bucket (non-unit modules stay gathered) and "
    f"AllGatherPipeline.reset(preserve_non_fsdp_units=True), from {FSDP_MAIN} :: "
    "MegatronFSDP.synchronize_param_gather (gathered once per step)",
}
STRATEGIES = ("ddp", "distopt", "no_shard", "optim", "optim_grads", "optim_grads_params")
FSDP_STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
SOURCES["fsdp_grad_dtype"] = (
    f"{FSDP} :: ParamAndGradBuffer._resolve_group_grad_dtype (gradients in the parameter dtype unless "
    "megatron_fsdp_main_grads_dtype is set; ddp.grad_reduce_in_fp32 is not passed to Megatron FSDP, "
    "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py :: FullyShardedDataParallel.__init__); "
    f"{FSDP} :: GradReducePipeline (the reduce-scatter input is fetched or copied in "
    "mp_policy.grad_comm_dtype when megatron_fsdp_grad_comm_dtype is set)"
)
# Relative margin ``compare`` allows on both sides of an analytic volume: bucket padding (module
# docstring). The recorded runs sit 0.02-0.8 % above the formula (Llama 3.2 1B at N = 64: 0.8 %).
COMPARE_TOLERANCE = 0.01
# Transformer Engine keeps FP8 copies of its linear layers' weights only; the embedding, the output layer
# and the norms stay bf16 and are gathered as such when ``fp8_param_gather`` is on (the H200 anchor
# run's distributed-optimizer all-gather is 6.98 B FP8 layer weights x 1 B + 1.05 B others x 2 B, x 7/8).
FP8_OTHER_PARAM_BYTES = 2


def gradient_comm_bytes(
    strategy: str,
    *,
    grad_reduce_in_fp32: bool,
    main_grads_bytes: int | None = None,
    grad_comm_bytes: int | None = None,
) -> int:
    """Bytes of one reduced gradient element (``bg``) under ``strategy``.

    DDP and the distributed optimizer reduce in fp32 with ``ddp.grad_reduce_in_fp32``, else in bf16.
    Megatron FSDP ignores that flag: it reduces in ``ddp.megatron_fsdp_grad_comm_dtype`` when set
    (``grad_comm_bytes``), else in ``ddp.megatron_fsdp_main_grads_dtype`` (``main_grads_bytes``), else in
    the parameter dtype, bf16 in mixed precision (``SOURCES['fsdp_grad_dtype']``). Bridge's Nemotron 3
    Nano recipe accumulates in fp32 and communicates in bf16: 2 bytes, not 4.
    """
    if strategy in FSDP_STRATEGIES:
        return grad_comm_bytes or main_grads_bytes or 2
    return 4 if grad_reduce_in_fp32 else 2


def gradient_comm_bytes_of(strategy: str, ddp: Mapping) -> int:
    """``gradient_comm_bytes`` read from a config's ``ddp`` section (a run_config.yaml's spelling of each
    dtype: ``null``, ``torch.bfloat16``, ``{_target_: torch.float32, _call_: false}``)."""
    from ..memory.common import dtype_bytes

    return gradient_comm_bytes(
        strategy,
        grad_reduce_in_fp32=bool(ddp.get("grad_reduce_in_fp32")),
        main_grads_bytes=dtype_bytes(ddp.get("megatron_fsdp_main_grads_dtype")),
        grad_comm_bytes=dtype_bytes(ddp.get("megatron_fsdp_grad_comm_dtype")),
    )


@dataclass(frozen=True)
class Job:
    """What the volumes depend on (see the module docstring for the symbols)."""

    params: int  # P: parameters of this rank's model-parallel partition
    dp: int  # N: data-parallel size
    micro_batches: int = 1  # m: micro-batches per step on this rank
    param_bytes: int = 2  # bp: bf16
    grad_bytes: int = 4  # bg: fp32 with ddp.grad_reduce_in_fp32
    unit_params: int | None = None  # P_unit: parameters inside FSDP units (None: all of P)
    # bytes of a gathered parameter outside the units (None: bp); FP8_OTHER_PARAM_BYTES under FP8 gathers
    other_param_bytes: int | None = None


def _row(kind, bus_low, bus_high, times, formula, source, phase):
    return {
        "kind": kind,
        "group": "dp",
        "bus_bytes": {"low": int(round(bus_low)), "high": int(round(bus_high))},
        "times": times,
        "phase": phase,
        "formula": formula,
        "source": SOURCES[source],
    }


def volumes(strategy: str, job: Job) -> list[dict]:
    """Per-step bus bytes of ``strategy`` for ``job``: one row per collective, each with its range.

    Every count is fixed by the source, so each row's range is a single value (``low == high``);
    the range form stays for ``compare`` and the report's readers.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
    if job.dp < 1 or job.micro_batches < 1 or job.params < 0:
        raise ValueError("dp and micro_batches must be at least 1, params non-negative")
    n, m, p = job.dp, job.micro_batches, job.params
    f = (n - 1) / n
    unit = p if job.unit_params is None else min(job.unit_params, p)
    rest = p - unit
    other = job.param_bytes if job.other_param_bytes is None else job.other_param_bytes
    gp, gg = unit * job.param_bytes + rest * other, p * job.grad_bytes
    if strategy in ("ddp", "no_shard"):
        src = "ddp_ar" if strategy == "ddp" else "fsdp_reduce"
        return [
            _row("all_reduce", 2 * f * gg, 2 * f * gg, "once per step", "P bg 2(N-1)/N", src, "backward"),
        ]
    if strategy in ("distopt", "optim"):
        rs_src = "distopt_rs" if strategy == "distopt" else "fsdp_reduce"
        ag_src = "distopt_ag" if strategy == "distopt" else "fsdp_step_ag"
        return [
            _row("reduce_scatter", f * gg, f * gg, "once per step", "P bg (N-1)/N", rs_src, "backward"),
            _row("all_gather", f * gp, f * gp, "once per step", "P bp (N-1)/N", ag_src, "optimizer"),
        ]
    if strategy == "optim_grads":
        return [
            _row(
                "reduce_scatter", m * f * gg, m * f * gg, "per micro-batch", "m P bg (N-1)/N", "fsdp_reduce", "backward"
            ),
            _row("all_gather", f * gp, f * gp, "once per step", "P bp (N-1)/N", "fsdp_step_ag", "optimizer"),
        ]
    ag_unit = 2 * m * unit * job.param_bytes * f
    ag_rest = rest * other * f
    return [
        _row("reduce_scatter", m * f * gg, m * f * gg, "per micro-batch", "m P bg (N-1)/N", "fsdp_reduce", "backward"),
        _row(
            "all_gather",
            ag_unit + ag_rest,
            ag_unit + ag_rest,
            "units: per micro-batch, forward and backward; the rest: once per step",
            "2 m P_unit bp (N-1)/N + (P - P_unit) bp (N-1)/N",
            "fsdp_unit_ag",
            "forward+backward",
        ),
    ]


def total(rows: list[dict]) -> dict:
    """{low, high} bus bytes per step over the rows."""
    return {
        "low": sum(r["bus_bytes"]["low"] for r in rows),
        "high": sum(r["bus_bytes"]["high"] for r in rows),
    }


def by_kind(rows: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in rows:
        d = out.setdefault(r["kind"], {"low": 0, "high": 0})
        d["low"] += r["bus_bytes"]["low"]
        d["high"] += r["bus_bytes"]["high"]
    return out


def compare(measured_by_kind: dict[str, float], rows: list[dict], tolerance: float = COMPARE_TOLERANCE) -> dict:
    """Does a recorded volume ({kind: bus bytes on the dp group}) fall in the analytic range?

    ``tolerance`` covers bucket padding (a relative margin on both sides). Returns per kind
    the measured value, the range and ``within``.
    """
    out = {}
    for kind, rng in by_kind(rows).items():
        got = float(measured_by_kind.get(kind, 0))
        lo, hi = rng["low"] * (1 - tolerance), rng["high"] * (1 + tolerance)
        out[kind] = {"measured": got, "low": rng["low"], "high": rng["high"], "within": lo <= got <= hi}
    return out
