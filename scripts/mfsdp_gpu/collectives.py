"""Where ``torch.distributed``'s collectives are patched: the mirror that makes every peer look like this rank.

Under the fake backend a collective returns at once and moves no data, so what a rank receives is
memory nobody wrote. With the mirror, all-gathers copy the local input into every output slot,
all-to-alls deliver to every slot what this rank sends to itself, reduce-scatters keep this rank's
chunk (and gathers/scatters alike), and a point-to-point receive gets what this rank sends on the same
group (:class:`P2PPairs`). MoE token counts are then consistent and nothing extra is allocated.

Point-to-point matters for context parallelism: Transformer Engine's ring attention (``cp_comm_type``
p2p, its default) sends its K/V chunk to the next rank and receives the previous rank's into a buffer
made with ``torch.empty_like``. Unmirrored, that buffer is memory nobody wrote, and the first attention
step can read NaN (Wan 2.1 14B at CP 4 stopped at step 1 on "Loss exploded: nan"). Mirrored, every
peer's chunk is this rank's, as with the all-gathers.

Mechanism: :func:`wrap_collective` replaces one function of ``torch.distributed.distributed_c10d``
(and its re-export in ``torch.distributed``) by a wrapper that calls the original, then hands the
call's bound arguments to a hook. :func:`install_mirror_collectives` uses it with the hooks in
``MIRRORS``; anything else that needs to see every collective a rank issues patches the same way.
Patching must happen before megatron is imported: megatron.core binds some collectives at import
time (``dist_all_gather_func = torch.distributed.all_gather_into_tensor``).

The copy plans (:func:`all_gather_slots`, :func:`all_to_all_plan`) are pure Python.

``rehearse --perf`` also records every collective the rank issues (:class:`CollectiveRecorder`,
below): the same patching point, a cheaper wrapper (no signature binding). ``--perf`` keeps the
mirror on for dense models too: without it the gathered weights of the other ranks' shards are
memory nobody wrote, which can hold NaN, and a NaN step runs faster than a finite one (the
engine's ``perf`` record counts non-finite timed steps; the analysis leaves them out). The copy
writes what a real all-gather writes into its output, on the stream the caller issued it on.
"""

from __future__ import annotations

from collections.abc import Callable

# The collectives that carry data into an output another rank would have written (and the sends a
# receive is paired with); all_reduce and broadcast work in place, so their result already "looks like
# this rank".
MIRROR_NAMES = (
    "all_gather_into_tensor",
    "_all_gather_base",
    "all_gather",
    "all_to_all_single",
    "all_to_all",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "reduce_scatter",
    "gather",
    "scatter",
    "isend",
    "irecv",
    "send",
    "recv",
)
# The attribute that marks a wrapper installed here (a second install leaves it alone).
MARK = "_rehearse_mirror"
# Whether the installed mirror copies (a switch for a caller that must time a run without the copies).
MIRROR_STATE = {"copy": True}


def all_gather_slots(out_numel: int, in_numel: int) -> list[int]:
    """Element offsets of the output slots an all-gather fills with the local input."""
    if in_numel <= 0 or out_numel < in_numel:
        return []
    return [i * in_numel for i in range(out_numel // in_numel)]


def all_to_all_plan(in_rows: int, out_rows: int, in_splits, out_splits, me: int, world: int):
    """Row copies for an all-to-all in which every peer sends what rank ``me`` sends to itself.

    Returns ``(copies, fills)``: ``copies`` are ``(src_row, dst_row, rows)``, ``fills``
    are ``(dst_row, rows)`` to zero (an output slot larger than what is delivered).
    Without split sizes the rows are split evenly over ``world``. With every rank
    looking like ``me``, the slot sizes agree and nothing is zeroed; when ``me`` is not
    a valid position, the input is copied to the output as far as it fits.
    """
    if world <= 0:
        return [], [(0, out_rows)] if out_rows else []
    # split sizes arrive as lists, numpy arrays or tensors: compare lengths, never truth values
    ins = [int(x) for x in in_splits] if in_splits is not None and len(in_splits) else [in_rows // world] * world
    outs = [int(x) for x in out_splits] if out_splits is not None and len(out_splits) else [out_rows // world] * world
    copies, fills = [], []
    if not 0 <= me < len(ins):
        n = min(in_rows, out_rows)
        if n:
            copies.append((0, 0, n))
        if out_rows > n:
            fills.append((n, out_rows - n))
        return copies, fills
    src = sum(ins[:me])
    src_len = ins[me]
    dst = 0
    for size in outs:
        n = min(size, src_len)
        if n:
            copies.append((src, dst, n))
        if size > n:
            fills.append((dst + n, size - n))
        dst += size
    return copies, fills


class P2PPairs:
    """Pairs this rank's point-to-point sends with its receives on the same group, in either order.

    A ring exchange issues, per step, one send and one receive of the same size on one group: even
    ranks send first, odd ranks receive first (Transformer Engine's ``flash_attn_p2p_communicate``).
    :meth:`offer` keeps the first of the two and, when its partner arrives with the same layout,
    returns ``(receive buffer, sent tensor)`` to copy; one pending operation per kind and group, so a
    partner that never comes holds one tensor until the next exchange on that group replaces it.
    """

    def __init__(self) -> None:
        self.pending: dict[tuple[str, object], object] = {}

    def offer(self, kind: str, group_key, tensor, fits: Callable[[object, object], bool]):
        other = "recv" if kind == "send" else "send"
        waiting = self.pending.get((other, group_key))
        if waiting is not None and fits(waiting, tensor):
            del self.pending[(other, group_key)]
            return (waiting, tensor) if kind == "send" else (tensor, waiting)
        self.pending[(kind, group_key)] = tensor
        return None


P2P = P2PPairs()


def _same_layout(a, b) -> bool:
    return a.numel() == b.numel() and a.dtype == b.dtype


def _p2p_hook(kind: str) -> Callable[[dict], None]:
    def hook(a: dict) -> None:
        group = a.get("group")
        pair = P2P.offer(kind, id(group) if group is not None else None, a["tensor"], _same_layout)
        if pair is not None:
            _flat_copy(*pair)

    return hook


# --------------------------------------------------------------------------- mirror hooks (torch side)


def group_rank(group) -> int:
    """This process's rank in ``group`` (the world when None); -1 when it is not a member."""
    import torch.distributed as dist

    try:
        return dist.get_rank(group) if group is not None else dist.get_rank()
    except Exception:
        return -1


def group_size(group) -> int:
    """The size of ``group`` (the world when None); 0 when unknown."""
    import torch.distributed as dist

    try:
        return dist.get_world_size(group) if group is not None else dist.get_world_size()
    except Exception:
        return 0


def _flat_copy(dst, src) -> None:
    n = min(dst.numel(), src.numel())
    if n and dst.is_contiguous() and src.is_contiguous():
        dst.view(-1)[:n].copy_(src.reshape(-1)[:n])


def mirror_all_gather_into_tensor(a: dict) -> None:
    out, inp = a["output_tensor"], a["input_tensor"]
    if not out.is_contiguous():
        return
    flat_out, flat_in = out.view(-1), inp.reshape(-1)
    for off in all_gather_slots(flat_out.numel(), flat_in.numel()):
        flat_out[off : off + flat_in.numel()].copy_(flat_in)


def mirror_all_gather(a: dict) -> None:
    for t in a["tensor_list"]:
        if t.shape == a["tensor"].shape:
            t.copy_(a["tensor"])
        else:
            _flat_copy(t, a["tensor"])


def mirror_all_to_all_single(a: dict) -> None:
    out, inp = a["output"], a["input"]
    if out.dim() == 0 or inp.dim() == 0:
        return
    copies, fills = all_to_all_plan(
        inp.shape[0],
        out.shape[0],
        a.get("input_split_sizes"),
        a.get("output_split_sizes"),
        group_rank(a.get("group")),
        group_size(a.get("group")),
    )
    for s, d, n in copies:
        if out.shape[1:] == inp.shape[1:]:
            out.narrow(0, d, n).copy_(inp.narrow(0, s, n))
    for d, n in fills:
        out.narrow(0, d, n).zero_()


def mirror_all_to_all(a: dict) -> None:
    outs, ins = a["output_tensor_list"], a["input_tensor_list"]
    me = group_rank(a.get("group"))
    src = ins[me] if 0 <= me < len(ins) else None
    for j, o in enumerate(outs):
        s = src if src is not None else (ins[j] if j < len(ins) else None)
        if s is None:
            continue
        if o.shape == s.shape:
            o.copy_(s)
        else:
            _flat_copy(o, s)


def mirror_reduce_scatter_tensor(a: dict) -> None:
    out, inp = a["output"], a["input"]
    me = max(group_rank(a.get("group")), 0)
    n = out.numel()
    if out.is_contiguous() and inp.is_contiguous() and inp.numel() >= (me + 1) * n:
        out.view(-1).copy_(inp.view(-1)[me * n : (me + 1) * n])


def mirror_reduce_scatter(a: dict) -> None:
    me = max(group_rank(a.get("group")), 0)
    lst = a["input_list"]
    if me < len(lst) and lst[me].shape == a["output"].shape:
        a["output"].copy_(lst[me])


def mirror_gather(a: dict) -> None:
    for t in a.get("gather_list") or []:
        if t.shape == a["tensor"].shape:
            t.copy_(a["tensor"])


def mirror_scatter(a: dict) -> None:
    lst = a.get("scatter_list") or []
    me = max(group_rank(a.get("group")), 0)
    if me < len(lst) and lst[me].shape == a["tensor"].shape:
        a["tensor"].copy_(lst[me])


# One hook per name in MIRROR_NAMES: it gets the call's bound arguments (defaults applied).
MIRRORS: dict[str, Callable[[dict], None]] = {
    "all_gather_into_tensor": mirror_all_gather_into_tensor,
    "_all_gather_base": mirror_all_gather_into_tensor,
    "all_gather": mirror_all_gather,
    "all_to_all_single": mirror_all_to_all_single,
    "all_to_all": mirror_all_to_all,
    "reduce_scatter_tensor": mirror_reduce_scatter_tensor,
    "_reduce_scatter_base": mirror_reduce_scatter_tensor,
    "reduce_scatter": mirror_reduce_scatter,
    "gather": mirror_gather,
    "scatter": mirror_scatter,
    "isend": _p2p_hook("send"),
    "irecv": _p2p_hook("recv"),
    "send": _p2p_hook("send"),
    "recv": _p2p_hook("recv"),
}


# --------------------------------------------------------------------------- patching


def wrap_collective(
    name: str, after: Callable[[dict], None], mark: str = MARK, enabled: Callable[[], bool] | None = None
) -> bool:
    """Replace ``torch.distributed`` collective ``name`` by a wrapper that runs the original, then
    ``after(bound arguments)`` under ``torch.no_grad()``; returns whether it was patched.

    The original call's result (its Work object under ``async_op``) is returned unchanged; a hook
    that raises leaves the result as the original left it. Not patched when torch has no such
    function or a wrapper carrying ``mark`` is already there. With ``enabled``, the hook (and the
    argument binding) runs only while ``enabled()`` is true.
    """
    import inspect

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    orig = getattr(c10d, name, None)
    if orig is None or getattr(orig, mark, False):
        return False
    sig = inspect.signature(orig)

    def wrapper(*args, __orig=orig, __sig=sig, __after=after, **kwargs):
        work = __orig(*args, **kwargs)
        if enabled is not None and not enabled():
            return work
        try:
            bound = __sig.bind(*args, **kwargs)
            bound.apply_defaults()
            with torch.no_grad():
                __after(bound.arguments)
        except Exception:  # a hook that cannot apply leaves the result as it was
            pass
        return work

    setattr(wrapper, mark, True)
    wrapper.__name__ = name
    wrapper.__doc__ = orig.__doc__
    setattr(c10d, name, wrapper)
    if getattr(dist, name, None) is orig:
        setattr(dist, name, wrapper)
    return True


def install_mirror_collectives() -> list[str]:
    """Patch torch.distributed so every peer looks like this rank; returns the names patched.

    Must run before megatron is imported (see the module docstring). The original call still
    runs (its Work object is returned for ``async_op``); the copy is done at once on the current
    stream.
    """
    return [name for name in MIRROR_NAMES if wrap_collective(name, MIRRORS[name], enabled=lambda: MIRROR_STATE["copy"])]


# --------------------------------------------------------------------------- recording (rehearse --perf)

# Where each recorded function keeps its tensors and its group: (tensor arguments, how to size them,
# position of ``group``). ``out``: the output tensor's bytes (all-gathers: N x the input, nccl-tests'
# message size); ``in``: the input's; ``list``: the sum over a tensor list; ``lists``: over lists of lists.
# Positions follow torch.distributed's signatures (torch 2.4 to 2.11).
RECORD_SPECS = {
    "all_gather_into_tensor": (("output_tensor", 0, "one"), 2),
    "_all_gather_base": (("output_tensor", 0, "one"), 2),
    "all_gather": (("tensor_list", 0, "list"), 2),
    "all_gather_coalesced": (("output_tensor_lists", 0, "lists"), 2),
    "reduce_scatter_tensor": (("input", 1, "one"), 3),
    "_reduce_scatter_base": (("input", 1, "one"), 3),
    "reduce_scatter": (("input_list", 1, "list"), 3),
    "all_reduce": (("tensor", 0, "one"), 2),
    "all_reduce_coalesced": (("tensors", 0, "list"), 2),
    "all_to_all_single": (("input", 1, "one"), 4),
    "all_to_all": (("input_tensor_list", 1, "list"), 2),
    "broadcast": (("tensor", 0, "one"), 2),
    "reduce": (("tensor", 0, "one"), 3),
    "send": (("tensor", 0, "one"), 2),
    "isend": (("tensor", 0, "one"), 2),
    "recv": (("tensor", 0, "one"), 2),
    "irecv": (("tensor", 0, "one"), 2),
    "gather": (("gather_list", 1, "list"), 3),
    "scatter": (("scatter_list", 1, "list"), 3),
}
RECORD_MARK = "_rehearse_recorder"
MAX_ERRORS = 20  # a recorder that cannot read a call says so, a few times, and never stops the run


def _nbytes(t) -> int:
    return int(t.numel()) * int(t.element_size())


def _sized(value, how: str) -> int:
    if value is None:
        return 0
    if how == "one":
        return _nbytes(value)
    if how == "list":
        return sum(_nbytes(t) for t in value)
    return sum(_nbytes(t) for lst in value for t in lst)


class CollectiveRecorder:
    """Every ``torch.distributed`` collective this rank issues while ``active``, from the caller's side.

    Installed before megatron is imported (megatron-core binds ``all_gather_into_tensor`` and
    ``reduce_scatter_tensor`` into module globals at import, megatron-fsdp and Bridge call
    ``torch.distributed.X`` at call time; both then reach the wrapper), it patches the functions of
    ``torch.distributed.distributed_c10d`` and their re-exports in ``torch.distributed`` (and
    ``batch_isend_irecv``, whose point-to-point operations it records one by one). Calls made
    inside a recorded call (``_all_gather_base`` calls ``all_gather_into_tensor``) are not counted
    twice: a per-thread depth counter records the outermost call only.

    Each call is stored once per key ``(step, op, group, phase, bytes)`` with a count, so the log
    of a 64-layer model at 32 micro-batches stays small. The cost per call is a dictionary update
    and a tensor size (no signature binding); ``overhead_s`` adds up the time spent recording so
    that its effect on the timed steps is stated, not guessed.

    Phase: the step meter says whether the rank is in forward/backward or in the optimizer step;
    within forward/backward, megatron-core's schedule functions ``forward_step`` and
    ``backward_step`` are wrapped (:meth:`track_schedule`), and autograd's current node
    (``torch._C._current_autograd_node()``, set while backward runs a node and its hooks) is the
    fallback. Between the schedule functions (after the last micro-batch's backward, megatron-core's
    ``finalize_model_grads`` finishes the gradient reduction) the phase is the last one that ran.
    """

    def __init__(self):
        import threading

        self.active = False
        self.step = None
        self.region = "other"  # set by the step meter: "fwd_bwd", "optimizer", "other"
        self.sched = None  # "forward" / "backward" while megatron's schedule functions run
        self.last_sched = None  # the last of them that ran in this step (gradient finalisation follows backward)
        self.counts: dict[tuple, int] = {}
        self.groups: dict[int, tuple] = {}  # id(group) -> (gid, ranks, group)
        self.overhead_s = 0.0
        self.calls = 0
        self.errors: list[str] = []
        self.patched: list[str] = []
        self.schedule_hooks: list[str] = []
        self._tls = threading.local()

    # ------------------------------------------------------------------ installing

    def install(self) -> list[str]:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for name, (tensor_spec, group_pos) in RECORD_SPECS.items():
            orig = getattr(c10d, name, None)
            if orig is None or getattr(orig, RECORD_MARK, False):
                continue
            wrapper = self._wrapper(name, orig, tensor_spec, group_pos)
            setattr(c10d, name, wrapper)
            if getattr(dist, name, None) is orig:
                setattr(dist, name, wrapper)
            self.patched.append(name)
        orig_batch = getattr(c10d, "batch_isend_irecv", None)
        if orig_batch is not None and not getattr(orig_batch, RECORD_MARK, False):
            batch = self._batch_wrapper(orig_batch)
            c10d.batch_isend_irecv = batch
            if getattr(dist, "batch_isend_irecv", None) is orig_batch:
                dist.batch_isend_irecv = batch
            self.patched.append("batch_isend_irecv")
        return list(self.patched)

    def _wrapper(self, name, orig, tensor_spec, group_pos):
        import time

        key_name, pos, how = tensor_spec
        rec = self

        def wrapper(*args, **kwargs):
            tls = rec._tls
            depth = getattr(tls, "depth", 0)
            if rec.active and depth == 0:
                t0 = time.perf_counter()
                try:
                    value = kwargs[key_name] if key_name in kwargs else (args[pos] if len(args) > pos else None)
                    group = (
                        kwargs["group"] if "group" in kwargs else (args[group_pos] if len(args) > group_pos else None)
                    )
                    rec._count(name, _sized(value, how), group)
                except Exception as exc:  # never let counting break the job
                    rec._error(name, exc)
                rec.overhead_s += time.perf_counter() - t0
            tls.depth = depth + 1
            try:
                return orig(*args, **kwargs)
            finally:
                tls.depth = depth

        setattr(wrapper, RECORD_MARK, True)
        wrapper.__name__ = name
        wrapper.__doc__ = orig.__doc__
        wrapper.__wrapped__ = orig
        return wrapper

    def _batch_wrapper(self, orig):
        import time

        rec = self

        def batch_isend_irecv(p2p_op_list, *args, **kwargs):
            tls = rec._tls
            depth = getattr(tls, "depth", 0)
            if rec.active and depth == 0:
                t0 = time.perf_counter()
                for op in p2p_op_list or []:
                    try:
                        fn = getattr(getattr(op, "op", None), "__name__", "")
                        rec._count("isend" if "send" in fn else "irecv", _nbytes(op.tensor), getattr(op, "group", None))
                    except Exception as exc:
                        rec._error("batch_isend_irecv", exc)
                rec.overhead_s += time.perf_counter() - t0
            tls.depth = depth + 1
            try:
                return orig(p2p_op_list, *args, **kwargs)
            finally:
                tls.depth = depth

        setattr(batch_isend_irecv, RECORD_MARK, True)
        batch_isend_irecv.__wrapped__ = orig
        return batch_isend_irecv

    def track_schedule(self) -> list[str]:
        """Wrap megatron-core's ``forward_step`` / ``backward_step`` (module globals the schedules call)."""
        import megatron.core.pipeline_parallel.schedules as sched

        done = []
        for name, label in (("forward_step", "forward"), ("backward_step", "backward")):
            orig = getattr(sched, name, None)
            if orig is None or getattr(orig, RECORD_MARK, False):
                continue

            def wrapped(*args, __orig=orig, __label=label, **kwargs):
                prev = self.sched
                self.sched = self.last_sched = __label
                try:
                    return __orig(*args, **kwargs)
                finally:
                    self.sched = prev

            setattr(wrapped, RECORD_MARK, True)
            wrapped.__name__ = name
            setattr(sched, name, wrapped)
            done.append(f"megatron.core.pipeline_parallel.schedules.{name}")
        return done

    # ------------------------------------------------------------------ counting

    def phase(self) -> str:
        if self.region == "optimizer":
            return "optimizer"
        if self.region != "fwd_bwd":
            return "other"
        if self.sched is not None:
            return self.sched
        if self.last_sched == "backward":  # after the last micro-batch's backward: finalize_model_grads
            return "backward"
        try:
            import torch

            return "backward" if torch._C._current_autograd_node() is not None else "forward"
        except Exception:
            return "forward"

    def _gid(self, group) -> str:
        ent = self.groups.get(id(group))
        if ent is not None and ent[2] is group:
            return ent[0]
        import torch.distributed as dist

        g = group if group is not None else dist.group.WORLD
        ranks = tuple(int(r) for r in dist.get_process_group_ranks(g))
        for gid, rk, _g in self.groups.values():  # the same ranks under another group object: one id
            if rk == ranks:
                self.groups[id(group)] = (gid, ranks, group)
                return gid
        gid = f"g{len({v[0] for v in self.groups.values()})}"
        self.groups[id(group)] = (gid, ranks, group)  # keeps the group alive: ids are never reused
        return gid

    def _count(self, op: str, size: int, group) -> None:
        key = (self.step, op, self._gid(group), self.phase(), size)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.calls += 1

    def _error(self, op: str, exc: BaseException) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(f"{op}: {type(exc).__name__}: {str(exc)[:200]}")

    # ------------------------------------------------------------------ the log

    def log(self, rank: int, world_size: int, steps: list, parallel_groups: dict) -> dict:
        """The ``mfsdp-collectives/1`` log that ``mfsdp_lib.perf.collectives`` reads."""
        table = {}
        for gid, ranks, _g in self.groups.values():
            table[gid] = list(ranks)
        events = [
            {"step": step, "op": op, "group": gid, "phase": phase, "size_bytes": size, "count": n}
            for (step, op, gid, phase, size), n in sorted(self.counts.items(), key=lambda kv: str(kv[0]))
        ]
        return {
            "schema": "mfsdp-collectives/1",
            "rank": rank,
            "world_size": world_size,
            "steps": list(steps),
            "parallel_groups": parallel_groups,
            "groups": table,
            "events": events,
        }


def parallel_groups_of(pg_collection) -> dict:
    """{name: ranks} of the process groups in Megatron's ProcessGroupCollection (what names a group)."""
    import torch.distributed as dist

    out = {}
    names = list(getattr(pg_collection, "__dict__", {}) or {})
    if not names:
        names = [n for n in dir(pg_collection) if not n.startswith("_")]
    for name in names:
        try:
            g = getattr(pg_collection, name, None)
        except Exception:  # a property that asserts (an unset group) is not a group of this job
            continue
        if isinstance(g, dist.ProcessGroup):
            try:
                out[name] = [int(r) for r in dist.get_process_group_ranks(g)]
            except Exception:
                continue
    return out
