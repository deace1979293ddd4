"""The mirrored collectives' copy plans (``mfsdp_gpu.collectives``)."""

from __future__ import annotations

from mfsdp_gpu import collectives


def test_all_gather_fills_every_slot_with_the_local_input():
    assert collectives.all_gather_slots(32, 4) == [0, 4, 8, 12, 16, 20, 24, 28]
    assert collectives.all_gather_slots(4, 4) == [0]
    assert collectives.all_gather_slots(3, 4) == [] and collectives.all_gather_slots(8, 0) == []


def _apply(plan, inp, out_rows):
    copies, fills = plan
    out = [None] * out_rows
    for s, d, n in copies:
        out[d : d + n] = inp[s : s + n]
    for d, n in fills:
        out[d : d + n] = [0] * n
    return out


def test_all_to_all_delivers_what_this_rank_sends_itself_to_every_slot():
    # rank 0 of 4 sends 2 rows to itself and 1, 3, 0 rows to the others; with every peer
    # looking like rank 0 each peer sends it 2 rows: the token-count exchange says so.
    inp = ["a0", "a1", "b0", "c0", "c1", "c2"]
    plan = collectives.all_to_all_plan(6, 8, [2, 1, 3, 0], [2, 2, 2, 2], me=0, world=4)
    assert _apply(plan, inp, 8) == ["a0", "a1"] * 4
    assert plan[1] == []


def test_all_to_all_even_split_and_other_positions():
    inp = list(range(8))
    assert _apply(collectives.all_to_all_plan(8, 8, None, None, me=1, world=4), inp, 8) == [2, 3] * 4
    # an output slot larger than what is delivered is zeroed, never left unwritten
    assert _apply(collectives.all_to_all_plan(8, 6, [2, 2, 2, 2], [3, 1, 1, 1], me=0, world=4), inp, 6) == [
        0,
        1,
        0,
        0,
        0,
        0,
    ]


def test_all_to_all_outside_the_group_copies_what_fits():
    assert _apply(collectives.all_to_all_plan(3, 5, None, None, me=-1, world=4), ["x", "y", "z"], 5) == [
        "x",
        "y",
        "z",
        0,
        0,
    ]


def test_mirror_wraps_every_collective_that_carries_data():
    names = set(collectives.MIRROR_NAMES)
    assert {"all_gather_into_tensor", "all_to_all_single", "all_gather", "reduce_scatter_tensor"} <= names
    assert "all_reduce" not in names and "broadcast" not in names  # in place: already "like this rank"


class _T:
    """A stand-in tensor for the pairing logic: its size, dtype and a name."""

    def __init__(self, name, n=4, dtype="bf16"):
        self.name, self.n, self.dtype = name, n, dtype

    def numel(self):
        return self.n


def _fits(a, b):
    return a.numel() == b.numel() and a.dtype == b.dtype


def test_a_ring_receive_gets_what_this_rank_sends_in_either_order():
    """Context parallelism's ring: even ranks send then receive, odd ranks receive then send; either way the
    receive buffer is paired with the send of the same layout on the same group (copy: receive <- send)."""
    p = collectives.P2PPairs()
    kv, buf = _T("kv"), _T("buf")
    assert p.offer("send", "cp", kv, _fits) is None
    assert p.offer("recv", "cp", buf, _fits) == (buf, kv)
    assert p.pending == {}
    assert p.offer("recv", "cp", buf, _fits) is None  # odd rank: the receive comes first
    assert p.offer("send", "cp", kv, _fits) == (buf, kv)
    # another group, or another size or dtype, is not a partner
    assert p.offer("send", "cp", kv, _fits) is None
    assert p.offer("recv", "tp", buf, _fits) is None
    assert p.offer("recv", "cp", _T("small", n=2), _fits) is None
    assert p.offer("recv", "cp", _T("fp32", dtype="fp32"), _fits) is None
    assert set(p.pending) == {("send", "cp"), ("recv", "tp"), ("recv", "cp")}


def test_the_mirror_covers_point_to_point():
    assert {"isend", "irecv", "send", "recv"} <= set(collectives.MIRROR_NAMES)
    assert set(collectives.MIRROR_NAMES) == set(collectives.MIRRORS)
