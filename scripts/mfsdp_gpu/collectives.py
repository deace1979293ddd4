"""Where ``torch.distributed``'s collectives are patched: the mirror that makes every peer look like this rank.

Under the fake backend a collective returns at once and moves no data, so what a rank receives is
memory nobody wrote. With the mirror, all-gathers copy the local input into every output slot,
all-to-alls deliver to every slot what this rank sends to itself, reduce-scatters keep this rank's
chunk (and gathers/scatters alike). MoE token counts are then consistent and nothing extra is
allocated.

Mechanism: :func:`wrap_collective` replaces one function of ``torch.distributed.distributed_c10d``
(and its re-export in ``torch.distributed``) by a wrapper that calls the original, then hands the
call's bound arguments to a hook. :func:`install_mirror_collectives` uses it with the hooks in
``MIRRORS``; anything else that needs to see every collective a rank issues patches the same way.
Patching must happen before megatron is imported: megatron.core binds some collectives at import
time (``dist_all_gather_func = torch.distributed.all_gather_into_tensor``).

The copy plans (:func:`all_gather_slots`, :func:`all_to_all_plan`) are pure Python.
"""

from __future__ import annotations

from collections.abc import Callable

# The collectives that carry data into an output another rank would have written; all_reduce and
# broadcast work in place, so their result already "looks like this rank".
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
)
# The attribute that marks a wrapper installed here (a second install leaves it alone).
MARK = "_rehearse_mirror"


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
}


# --------------------------------------------------------------------------- patching


def wrap_collective(name: str, after: Callable[[dict], None], mark: str = MARK) -> bool:
    """Replace ``torch.distributed`` collective ``name`` by a wrapper that runs the original, then
    ``after(bound arguments)`` under ``torch.no_grad()``; returns whether it was patched.

    The original call's result (its Work object under ``async_op``) is returned unchanged; a hook
    that raises leaves the result as the original left it. Not patched when torch has no such
    function or a wrapper carrying ``mark`` is already there.
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
    return [name for name in MIRROR_NAMES if wrap_collective(name, MIRRORS[name])]
