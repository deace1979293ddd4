"""One GPU as rank R of a world of N: PyTorch's fake process group and what it needs.

PyTorch's ``fake`` distributed backend (``torch.testing._internal.distributed.fake_pg``) returns
from every collective at once and moves no data, while every allocation of the process is real. A
process that is rank R of a fake world of N builds the same parallel groups, shards the same
tensors and allocates the same buffers as rank R of a real N-GPU job. Values are wrong on purpose
(gathered weights and reduced gradients are garbage), so losses mean nothing; memory per rank,
shapes, wrapping and the code paths taken are real. Bridge's ``setup()`` skips
``init_process_group`` when a process group exists, so the fake one is created first
(:func:`init_process_group`).

Also here: the settings the fake backend needs (``FAKE_BACKEND_SETTINGS``), the checkpoint planner
that lets one rank of a fake world save and load its own shards
(:func:`install_lowest_rank_checkpoint_planner`), and the process groups a rank belongs to
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
