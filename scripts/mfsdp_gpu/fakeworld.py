"""One GPU as rank R of a world of N: PyTorch's fake process group and what it needs.

PyTorch's ``fake`` distributed backend (``torch.testing._internal.distributed.fake_pg``) returns
from every collective at once and moves no data, while every allocation of the process is real. A
process that is rank R of a fake world of N builds the same parallel groups, shards the same
tensors and allocates the same buffers as rank R of a real N-GPU job. Values are wrong on purpose
(gathered weights and reduced gradients are garbage), so losses mean nothing; memory per rank,
shapes, wrapping and the code paths taken are real. Bridge's ``setup()`` skips
``init_process_group`` when a process group exists, so the fake one is created first
(:func:`init_process_group`).

Also here: the settings the fake backend needs (``FAKE_BACKEND_SETTINGS``, and
``FAKE_BACKEND_NCCL_OPTIONS`` where a config sets them), the checkpoint planner
that lets one rank of a fake world save and load its own shards
(:func:`install_lowest_rank_checkpoint_planner`), the FP8 weight scales that an amax all-reduce would
have given (:func:`install_fp8_scale_keeper`), and the process groups a rank belongs to
(:func:`process_groups_of_rank`). The collectives themselves are patched in ``collectives``.
"""

from __future__ import annotations

import os
import socket

# The four settings PyTorch's fake backend needs, each with its reason.
FAKE_BACKEND_SETTINGS = {
    "ddp.check_for_nan_in_grad": (
        False,
        "reduced gradients are garbage under the fake backend, so the NaN check fires",
    ),
    "dist.use_gloo_process_groups": (False, "gloo process groups need a real rendezvous store"),
    "train.exit_signal_handler": (
        False,
        "its all-gather picks a device from the backend's name and knows only nccl and gloo",
    ),
    "rerun_state_machine.check_for_nan_in_loss": (False, "the loss is garbage under the fake backend"),
    "rerun_state_machine.check_for_spiky_loss": (False, "the loss is garbage under the fake backend"),
}


# Settings that give a process group NCCL options: megatron-core builds ProcessGroupNCCL.Options for the
# groups they name (parallel_state.get_nccl_options, from initialize_model_parallel) and hands them to
# torch.distributed.new_group, whose fake backend accepts only its own Options (a TypeError at Bridge's
# initialize, measured). Under the fake backend each is set to its default when the config sets it; they
# shape NCCL's streams and thread blocks, not what a rank allocates.
FAKE_BACKEND_NCCL_OPTIONS: dict[str, tuple[object, str]] = {
    "dist.high_priority_stream_groups": (
        [],
        "megatron-core gives the named groups NCCL options, which the fake backend's groups cannot take",
    ),
    "dist.nccl_communicator_config_path": (
        None,
        "megatron-core gives the groups in that file NCCL options, which the fake backend's groups cannot take",
    ),
}


def init_process_group(a, fake: bool) -> dict:
    """This process as rank ``a.rank`` of ``a.world_size`` on GPU 0: a fake world, a torchrun world,
    or a real NCCL world of 1; returns how the group was made (the report's ``process_group``)."""
    import torch
    import torch.distributed as dist

    os.environ["RANK"] = str(a.rank)
    os.environ["LOCAL_RANK"] = "0"
    os.environ["WORLD_SIZE"] = str(a.world_size)
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    torch.cuda.set_device(0)
    if dist.is_initialized():
        return {"backend": dist.get_backend(), "created_by": "caller"}
    if fake:
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

        dist.init_process_group("fake", rank=a.rank, world_size=a.world_size, store=FakeStore())
        return {"backend": "fake", "created_by": "rehearse_train.py"}
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return {"backend": "nccl", "created_by": "Bridge (torchrun environment)"}
    port = free_port()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    return {"backend": "nccl", "created_by": "rehearse_train.py", "world_size": 1}


def free_port() -> int:
    """A free TCP port on the loopback interface (a real world of 1 rendezvous there)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_groups_of_rank() -> dict:
    """Process groups this rank is a member of: what a real job would hold NCCL communicators for."""
    try:
        import torch.distributed.distributed_c10d as c10d

        sizes = [len(ranks) for ranks in c10d._world.pg_group_ranks.values()]
        hist: dict[int, int] = {}
        for s in sizes:
            hist[s] = hist.get(s, 0) + 1
        return {"count": len(sizes), "count_size_gt_1": sum(1 for s in sizes if s > 1), "by_size": hist}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def install_lowest_rank_checkpoint_planner() -> str:
    """Under the fake backend, make torch.distributed.checkpoint keep duplicated items on
    the lowest rank.

    With mirrored collectives every rank's save plan is a copy of this rank's, so the
    coordinator sees each of this rank's shards N times and, by default, spreads them
    over N writers: this rank would write 1/N of them and the load would look for files
    nobody wrote. ``dedup_save_to_lowest_rank=True`` keeps them all on the lowest rank,
    so this rank writes and reads back exactly its own shards (Bridge builds
    ``DefaultSavePlanner()`` for ``fsdp_dtensor``). Returns what was done.
    """
    import inspect

    import torch.distributed.checkpoint as dcp

    base = dcp.DefaultSavePlanner
    if getattr(base, "_rehearse", False):
        return "already installed"
    if "dedup_save_to_lowest_rank" not in inspect.signature(base.__init__).parameters:
        return "not available in this torch: DefaultSavePlanner has no dedup_save_to_lowest_rank"

    class LowestRankSavePlanner(base):  # type: ignore[valid-type,misc]
        _rehearse = True

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("dedup_save_to_lowest_rank", True)
            super().__init__(*args, **kwargs)

    dcp.DefaultSavePlanner = LowestRankSavePlanner
    try:
        import torch.distributed.checkpoint.state_dict_saver as saver

        if getattr(saver, "DefaultSavePlanner", None) is base:
            saver.DefaultSavePlanner = LowestRankSavePlanner
    except ImportError:
        pass
    waived = waive_global_plan_coverage_check()
    return "DefaultSavePlanner(dedup_save_to_lowest_rank=True)" + (f"; {waived}" if waived else "")


# What the coordinator's global-plan check said, one entry per save (read into the report).
GLOBAL_PLAN_CHECKS: list[dict] = []


def waive_global_plan_coverage_check() -> str:
    """Under the fake backend, let a save go on when only the global plan's coverage check fails.

    ``DefaultSavePlanner._create_global_plan`` (torch/distributed/checkpoint/default_planner.py)
    raises "Failed to validate global plan" when the module-level ``_validate_global_plan``
    returns False. That check wants the chunks of every tensor to cover it exactly once.
    Here every rank's plan is a copy of this rank's (mirrored collectives) and the copies are
    folded onto the lowest rank, so the global plan holds this rank's shards only: 1/N of
    each sharded tensor, by construction, and the check cannot pass. The original check
    still runs and its verdict is recorded (``GLOBAL_PLAN_CHECKS``); only its False no
    longer stops the save. Returns what was done ("" when torch has no such function).
    """
    import torch.distributed.checkpoint.default_planner as dp

    orig = getattr(dp, "_validate_global_plan", None)
    if orig is None or getattr(orig, "_rehearse", False):
        return ""

    def validate(global_plan, metadata):
        got = orig(global_plan, metadata)
        # torch releases differ: older ones return True when valid, newer ones a list of errors
        # (empty when valid). Answer "valid" in the caller's own terms.
        if isinstance(got, bool):
            ok, valid = got, True
        else:
            ok, valid = not got, type(got)()
        GLOBAL_PLAN_CHECKS.append(
            {
                "torch_verdict": ok,
                "waived": not ok,
                "errors": [str(e)[:200] for e in got][:5] if not isinstance(got, bool) else [],
            }
        )
        return valid

    validate._rehearse = True  # type: ignore[attr-defined]
    dp._validate_global_plan = validate
    return "global-plan coverage check waived (this process holds one rank's shards)"


# --------------------------------------------------------------------------- FP8 primary weights

# Where Transformer Engine re-quantizes FP8 (per-tensor current scaling) primary weights from the
# optimizer's master weights after each step; Megatron FSDP calls it through quantize_master_weights.
TE_CAST_MODULE = "transformer_engine.pytorch.tensor.utils"
TE_CAST_CURRENT_SCALING = "_cast_master_weights_to_fp8_current_scaling"
# What the rehearsal's report says the keeper did (filled by the wrapper at each optimizer step).
FP8_SCALE_KEEPER = {"installed": False, "calls": 0, "kept_last_call": 0, "weights_last_call": 0}


def unowned_positions(params) -> list[int]:
    """Positions in Transformer Engine's cast list whose master weight is None: weights of which this
    rank holds no shard (each entry is ``(model_weight, master_weight, start_offset, shard)``)."""
    return [i for i, entry in enumerate(params) if entry[1] is None]


def keep_unowned_scales(cast):
    """Wrap TE's current-scaling cast so that weights this rank holds no shard of keep their scale.

    Why: the cast computes each weight's amax from this rank's master shard (0 when it has none),
    all-reduces the amaxes with MAX over the data-parallel group, and sets every weight's
    ``_scale_inv`` from the result. Under the fake backend the all-reduce moves nothing, so a
    weight whose shard lives on other ranks gets its scale from an amax of 0, for which TE's
    ``compute_scale_from_amax`` (transformer_engine/common/recipe/recipe_common.cuh) returns 1: the
    bytes the all-gather puts in its place (the mirror's copy of this rank's shard, quantized at a
    scale near 448 / 0.1) are then read as values up to 448, and every step after the first is NaN
    (seen on the Llama 3 8B FP8 anchor under Megatron FSDP, mirror on or off). Keeping the scale the weight already had is
    what a real job comes close to: its all-reduce returns the owner's amax, which one step moves by
    a fraction of a percent. Weights with a local shard are cast exactly as TE casts them.
    """

    def wrapper(params, group, *args, **kwargs):
        kept = [(params[i][0]._scale_inv, params[i][0]._scale_inv.clone()) for i in unowned_positions(params)]
        out = cast(params, group, *args, **kwargs)
        for scale_inv, before in kept:
            scale_inv.copy_(before)
        FP8_SCALE_KEEPER["calls"] += 1
        FP8_SCALE_KEEPER["kept_last_call"] = len(kept)
        FP8_SCALE_KEEPER["weights_last_call"] = len(params)
        return out

    wrapper._rehearse = True
    wrapper.__wrapped__ = cast
    return wrapper


def install_fp8_scale_keeper() -> str:
    """Under the fake backend, patch TE's current-scaling cast with :func:`keep_unowned_scales`.

    Must run after Transformer Engine is imported and before the first optimizer step. TE's
    ``quantize_master_weights`` looks the cast up in its module at call time, so patching the
    module attribute reaches it. Delayed scaling needs nothing (the scale comes from the amax
    history, not from this step's all-reduce); blockwise and MXFP8 scales are per block and local.
    Returns what was done ("" when this Transformer Engine has no such function).
    """
    import importlib

    try:
        mod = importlib.import_module(TE_CAST_MODULE)
    except ImportError:
        return ""
    cast = getattr(mod, TE_CAST_CURRENT_SCALING, None)
    if cast is None:
        return ""
    if not getattr(cast, "_rehearse", False):
        setattr(mod, TE_CAST_CURRENT_SCALING, keep_unowned_scales(cast))
    FP8_SCALE_KEEPER["installed"] = True
    return (
        "FP8 current-scaling weights of which this rank holds no shard keep their scale at each re-quantization "
        "(the fake backend's amax all-reduce moves nothing, and an amax of 0 would reset it)"
    )


def fp8_scale_deviation(state: dict) -> dict:
    """The deviation the report lists once the keeper has kept scales (``state``: ``FP8_SCALE_KEEPER``)."""
    return {
        "id": "fp8-unowned-scales-kept",
        "what": f"{state['kept_last_call']} of {state['weights_last_call']} FP8 weights (current scaling) keep their "
        "scale at each re-quantization: this rank holds no shard of them",
        "why": "the fake backend's amax all-reduce moves nothing; an amax of 0 would reset their scale and the "
        "gathered weights would be read at the wrong scale (NaN from the second step)",
        "memory_effect": "none (one scalar per weight, for the length of the call)",
        "time_effect": "the amax all-reduce a real job makes here is not timed (one small collective per step); "
        "the scale copies take a few kernel launches per step",
    }


def tp_comm_overlap_deviation() -> dict:
    """The deviation a fake world's rehearsal lists when the config overlaps tensor-parallel communication
    with GEMMs: Bridge's ``_initialize_tp_communicators`` (training/initialize.py) calls Transformer Engine's
    ``initialize_ub``, whose userbuffers map the other tensor-parallel ranks' GPU memory (CUDA multicast, or
    IPC with UB_SKIPMC=1); one GPU playing a rank of a fake world has no such peers, and the set-up fails
    ("does not support comm+GEMM overlap with CUDA Multicast")."""
    return {
        "id": "tp-comm-overlap-off",
        "what": "comm_overlap.tp_comm_overlap: true -> false",
        "why": "Transformer Engine's userbuffers need the tensor-parallel group's GPUs (CUDA multicast or IPC); "
        "a rank of a fake world has none",
        "memory_effect": "too low by the userbuffers the real job allocates at start (initialize_ub: buffers of "
        "[sequence x micro-batch / CP, hidden] per overlapped GEMM kind, 16-bit or FP8)",
        "time_effect": "the overlapped GEMMs run as plain GEMMs; tensor-parallel communication is not timed in "
        "a fake world anyway (it is counted)",
    }
