"""``rehearse --perf`` on the GPU side: what goes into the report's ``perf`` record.

The parts live where they belong (the collective recorder with the other collective patching in
``collectives``, the CUDA-event timing with the step meter in ``steps``); this module puts their
results together with what the analysis needs (``mfsdp_lib.perf.report`` reads it, schema
``mfsdp-perf/1``):

* the step's shape: micro-batches per step, micro-batch size, sequence length, global batch,
  world, data-parallel, TP, CP, PP and EP sizes;
* the model FLOPs per step from Bridge's own formula, called on the job's config
  (``megatron/bridge/training/utils/flop_utils.py`` :: ``num_floating_point_operations(cfg,
  batch_size=global_batch_size)``, as ``megatron/bridge/training/train.py`` calls it each step);
* for a Wan (diffusion) job, no sequence length and the reason (``DIFFUSION_TOKENS_WHY``): its step trains on
  patchified latents, so the analysis reports no tokens/s; its FLOPs come from the same Bridge function, given
  the sequence sums of the mock data's step (``workload.wan_flops_stats``);
* the precision the GEMMs run in (``model.fp8`` set: FP8) and the GPU's name, for the peak;
* the parameter counts and the bytes per gathered parameter and reduced gradient, for the
  analytic volumes;
* the process groups this rank belongs to, by name (they name each collective's group), and the
  recorder's log.

Also :func:`gpu_lock`: several rehearsals on one GPU (a benchmark driver) can overlap their
imports while only one at a time builds a model and trains, so that timed steps never share the
GPU. The lock is a file named by ``MFSDP_GPU_LOCK``; without it nothing is locked.
"""

from __future__ import annotations

import math
import os

PERF_SCHEMA = "mfsdp-perf/1"
# Tokens per step are global batch x model.seq_length for a GPT job. A Wan model's seq_length is unused
# (wan_provider.py: "unused for images/videos"): a step trains on patchified latents, so no token rate is made up.
DIFFUSION_TOKENS_WHY = (
    "not reported for a diffusion model: a Wan step trains on patchified latents "
    "({tokens} latent tokens per micro-batch in the mock data), not on model.seq_length tokens"
)
GPU_LOCK_ENV = "MFSDP_GPU_LOCK"
FLOPS_SOURCE = "megatron/bridge/training/utils/flop_utils.py :: num_floating_point_operations(cfg, batch_size=GBS)"
_LOCK: list = []  # the lock's open descriptor, held until the process exits
# When the lock is taken, the previous holder may have exited without its GPU memory being returned yet (the
# driver frees it as the process is torn down, which can come after its descriptors are closed): wait until no
# more than this is held by others. Engines waiting for the lock hold a CUDA context each (about 0.5 GiB).
GPU_FREE_MARGIN_BYTES = 8 * 1024**3
# A driver that lets several untimed engines share the GPU (one lock per slot) sets this to "inf": the others'
# memory is then alive, not being freed, and waiting for it would only cost GPU_FREE_WAIT_S. A number is GiB.
GPU_FREE_MARGIN_ENV = "MFSDP_GPU_FREE_MARGIN_GIB"
GPU_FREE_WAIT_S = 120.0  # then go on, and say so: a rehearsal that meets a busy GPU reports an out-of-memory error
LOCK_STATE: dict = {"waited_for_memory_s": None, "others_held_bytes": None}


def gpu_lock(progress=None, mem_info=None) -> str | None:
    """Take the GPU lock named by ``MFSDP_GPU_LOCK`` (blocking); returns its path, or None when unset.

    The lock is a raw descriptor (no Python file object that interpreter shutdown would close early): the
    kernel closes it when the process ends. Once it is taken, :func:`wait_for_gpu_memory` waits for the
    previous holder's memory to come back. ``mem_info`` (for tests) returns ``(free, total)`` bytes."""
    path = os.environ.get(GPU_LOCK_ENV)
    if not path or _LOCK:
        return path or None
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if progress:
        progress(f"waiting for the GPU lock {path}")
    fcntl.flock(fd, fcntl.LOCK_EX)
    _LOCK.append(fd)
    if progress:
        progress("GPU lock taken")
    waited, others = wait_for_gpu_memory(mem_info or _cuda_mem_info, margin=free_margin(), progress=progress)
    LOCK_STATE.update(waited_for_memory_s=round(waited, 2), others_held_bytes=others)
    return path


def free_margin() -> float:
    """Bytes others may hold when the lock is taken: ``MFSDP_GPU_FREE_MARGIN_GIB`` (GiB, or ``inf``), else the
    default; a value that is not a non-negative number is ignored."""
    raw = os.environ.get(GPU_FREE_MARGIN_ENV)
    try:
        gib = float(raw) if raw is not None else None
    except ValueError:
        gib = None
    return GPU_FREE_MARGIN_BYTES if gib is None or math.isnan(gib) or gib < 0 else gib * 1024**3


def _cuda_mem_info() -> tuple[int, int]:
    import torch

    free, total = torch.cuda.mem_get_info()
    return int(free), int(total)


def wait_for_gpu_memory(
    mem_info,
    margin: float = GPU_FREE_MARGIN_BYTES,
    timeout_s: float = GPU_FREE_WAIT_S,
    sleep=None,
    clock=None,
    progress=None,
) -> tuple[float, int | None]:
    """Wait until at most ``margin`` bytes of the GPU are held by others (``total - free``, this process's
    own memory included: it holds none yet when the lock is taken); returns (seconds waited, bytes others
    held at the end). Gives up after ``timeout_s`` (the run goes on and meets what it meets)."""
    import time

    sleep = sleep or time.sleep
    clock = clock or time.monotonic
    start = clock()
    others = None
    said = False
    while True:
        try:
            free, total = mem_info()
        except Exception:  # no CUDA to ask: nothing to wait for
            return 0.0, None
        others = total - free
        if others <= margin or clock() - start >= timeout_s:
            return clock() - start, others
        if progress and not said:
            progress(f"{others / 1024**3:.1f} GiB of the GPU still held by others: waiting for it to be freed")
            said = True
        sleep(0.5)


def _get(cfg, path: str, default=None):
    target = cfg
    for part in path.split("."):
        if target is None:
            return default
        target = getattr(target, part, default)
    return target


def _itemsize(dtype) -> int | None:
    """Bytes of one element of a torch dtype; None when the field is unset (or not a dtype)."""
    size = getattr(dtype, "itemsize", None)
    return size if isinstance(size, int) and size > 0 else None


def model_flops(cfg) -> tuple[float | None, str | None]:
    """(Bridge's model FLOPs per step for the whole job, None) or (None, why not). A Wan job's formula needs
    the step's sequence sums, which its mock data fixes (``workload.wan_flops_stats``)."""
    from . import workload

    try:
        from megatron.bridge.training.utils.flop_utils import num_floating_point_operations

        stats = {}
        if workload.choose(_get(cfg, "model")).kind == "wan":
            fields = {k: _get(cfg, f"dataset.{k}") for k in workload.WAN_MOCK_SHAPE_FIELDS}
            stats = workload.wan_flops_stats(fields, int(cfg.train.global_batch_size), int(cfg.train.micro_batch_size))
        return float(num_floating_point_operations(cfg, batch_size=int(cfg.train.global_batch_size), **stats)), None
    except Exception as exc:  # a measurement, never a reason to fail the run
        return None, f"{type(exc).__name__}: {str(exc)[:300]}"


def layer_params(model) -> int:
    """Parameters inside transformer layers (``...layers.N...``): Megatron FSDP's units."""
    total = 0
    seen = set()
    for chunk in model:
        for name, p in chunk.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            if ".layers." in f".{name}":
                total += p.numel()
    return total


def nonfinite(value) -> bool:
    """A recorded loss or gradient norm that is NaN or infinite (None, unknown, is not)."""
    return isinstance(value, (int, float)) and not math.isfinite(value)


def timed_numerics(steps: list[dict], timed_iterations: list, tp: int = 1) -> dict:
    """The timed steps' losses and gradient norms, and how many of those steps had a non-finite one.

    Under the fake backend a weight nobody wrote can hold NaN, and a NaN step runs faster than a
    finite one: such a step's time is not the job's. The analysis (``mfsdp_lib.perf.report``)
    leaves these steps out of every figure and says so first.

    One exception, recorded apart (``loss_inf_tp_steps``): with tensor parallelism, a loss of +inf
    under a finite gradient norm is the fake backend's reduction, not the computation. Transformer
    Engine's vocabulary-parallel cross-entropy all-gathers each rank's (max, sum, target logit) and
    reads the target's logit from the rank that owns it; a rank that does not own the target
    writes -inf there, and the mirror gives every slot this rank's values, so the reported loss of
    every row whose target lies in another rank's vocabulary shard is +inf. The gradient uses only
    local statistics and stays finite: the step computed on finite values, and it counts."""
    by_iter = {s.get("iteration"): s for s in steps}
    losses = [by_iter.get(i, {}).get("loss") for i in timed_iterations]
    norms = [by_iter.get(i, {}).get("grad_norm") for i in timed_iterations]
    exempt = [
        i
        for i, x, g in zip(timed_iterations, losses, norms, strict=True)
        if tp > 1 and isinstance(x, (int, float)) and x == math.inf and g is not None and not nonfinite(g)
    ]
    bad = [
        i
        for i, x, g in zip(timed_iterations, losses, norms, strict=True)
        if (nonfinite(x) and i not in exempt) or nonfinite(g)
    ]
    return {
        "timed_losses": losses,
        "timed_grad_norms": norms,
        "nonfinite_timed_steps": len(bad),
        "nonfinite_steps": bad,
        "loss_inf_tp_steps": exempt,
    }


def scaled_flops(flops: float | None, scaling: dict | None) -> float | None:
    """Bridge's FLOPs per step are linear in the global batch: those of K micro-batches x M/K."""
    if flops is None or not scaling or not scaling.get("micro_batches_run"):
        return flops
    return flops * scaling["micro_batches_full"] / scaling["micro_batches_run"]


def record(
    cfg,
    so,
    clock,
    recorder,
    world_size: int,
    rank: int,
    params: dict,
    device: str | None,
    steps: list[dict] | None = None,
    scaling: dict | None = None,
) -> dict:
    """The ``perf`` record of one rehearsal (see the module docstring). ``steps``: the step meter's
    records (losses); ``scaling``: ``--perf-micro-batches``' facts (the step's M, the K run)."""
    from . import workload
    from .collectives import parallel_groups_of

    gbs = int(_get(cfg, "train.global_batch_size") or 0)
    mbs = int(_get(cfg, "train.micro_batch_size") or 1)
    tp = int(_get(cfg, "model.tensor_model_parallel_size") or 1)
    cp = int(_get(cfg, "model.context_parallel_size") or 1)
    pp = int(_get(cfg, "model.pipeline_model_parallel_size") or 1)
    ep = int(_get(cfg, "model.expert_model_parallel_size") or 1)
    dp = max(world_size // (tp * cp * pp), 1)
    flops, flops_error = model_flops(cfg)  # of what ran: K micro-batches under --perf-micro-batches
    fp8 = _get(cfg, "model.fp8")
    timed = [r for r in clock.records if r.get("step_s")]
    groups = {}
    try:
        groups = parallel_groups_of(so.pg_collection)
    except Exception as exc:  # the log still names groups "world" / "other" by their ranks
        recorder.errors.append(f"parallel groups: {type(exc).__name__}: {exc}")
    steps_done = [r["iteration"] for r in timed]
    try:
        in_layers = layer_params(so.model)
    except Exception:
        in_layers = None
    fsdp = bool(_get(cfg, "ddp.use_megatron_fsdp"))
    ran = max(gbs // (dp * mbs), 1) if gbs else 1
    out_scaling = None
    if scaling and scaling.get("micro_batches_run") and scaling["micro_batches_run"] < scaling["micro_batches_full"]:
        out_scaling = {
            "micro_batches_run": ran,
            "micro_batches_full": int(scaling["micro_batches_full"]),
            "global_batch_size_full": int(scaling["global_batch_size_full"]),
            "rule": "step = optimizer + (step - optimizer) x M/K: the forward/backward of K micro-batches "
            "scaled to the step's M, the optimizer step once",
            "flops": "Bridge's FLOPs of the K micro-batches run x M/K (linear in the batch)",
            "communication": "counted over the K micro-batches run, not scaled",
        }
    diffusion = {}
    if workload.choose(_get(cfg, "model")).kind == "wan":
        tokens = workload.wan_latent_tokens({k: _get(cfg, f"dataset.{k}") for k in workload.WAN_MOCK_SHAPE_FIELDS})
        diffusion = {"seq_length": None, "tokens_why": DIFFUSION_TOKENS_WHY.format(tokens=tokens)}
        if flops is not None:
            diffusion["flops_source"] = FLOPS_SOURCE + ", with the mock step's sequence sums (Wan)"
    return {
        "schema": PERF_SCHEMA,
        **timed_numerics(steps or [], steps_done, tp),
        "scaling": out_scaling,
        "warmup_steps": clock.warmup,
        "timed_steps": steps_done,
        "step_times_s": [r["step_s"] for r in timed],
        "fwd_bwd_times_s": [r["fwd_bwd_s"] for r in timed if r.get("fwd_bwd_s") is not None],
        "optimizer_times_s": [r["optimizer_s"] for r in timed if r.get("optimizer_s") is not None],
        "micro_batches": out_scaling["micro_batches_full"] if out_scaling else ran,
        "micro_batch_size": mbs,
        "seq_length": int(_get(cfg, "model.seq_length") or 0) or None,
        "global_batch_size": (out_scaling["global_batch_size_full"] if out_scaling else gbs) or None,
        "world_size": world_size,
        "rank": rank,
        "data_parallel_size": dp,
        "tp": tp,
        "cp": cp,
        "pp": pp,
        "ep": ep,
        "model_flops_per_step": scaled_flops(flops, out_scaling),
        "flops_source": FLOPS_SOURCE if flops is not None else None,
        "flops_error": flops_error,
        "precision": "fp8" if fp8 not in (None, False, "") else "bf16",
        "model_fp8": None if fp8 is None else str(fp8),
        "device": device,
        # the model's total (TP and EP partitions counted whole), and this rank's model-parallel partition
        # (what data parallelism shards or replicates: the analytic volumes' P); they differ under TP and EP
        "params": params.get("model_total_numel") or params.get("global_numel"),
        "params_scope": params.get("model_total_scope") if params.get("model_total_numel") else "this rank's partition",
        "local_params": params.get("global_numel"),
        "local_params_dp_shard": params.get("local_numel") if fsdp else None,
        "params_in_layers": in_layers,
        "param_gather_bytes": 1 if _get(cfg, "ddp.fp8_param_gather") or _get(cfg, "model.fp8_param") else 2,
        # what the flag asks; the result applies volumes.gradient_comm_bytes (Megatron FSDP ignores it)
        "grad_reduce_bytes": 4 if _get(cfg, "ddp.grad_reduce_in_fp32") else 2,
        # what Megatron FSDP reduces in instead: its grad-comm dtype, else its main-grads dtype (None: unset)
        "fsdp_main_grads_bytes": _itemsize(_get(cfg, "ddp.megatron_fsdp_main_grads_dtype")),
        "fsdp_grad_comm_bytes": _itemsize(_get(cfg, "ddp.megatron_fsdp_grad_comm_dtype")),
        "recorder": {
            "mode": "on the timed steps only",
            "patched": list(recorder.patched),
            "schedule_hooks": list(getattr(recorder, "schedule_hooks", [])),
            "calls": recorder.calls,
            "overhead_s_per_step": recorder.overhead_s / len(steps_done) if steps_done else None,
            "errors": list(recorder.errors),
        },
        "collectives": recorder.log(rank, world_size, steps_done, groups),
        **diffusion,  # a Wan job: no token rate (DIFFUSION_TOKENS_WHY)
    }
