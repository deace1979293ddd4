"""Count a rank's communication per step from its recorded collective log.

The engine (``rehearse --perf``) wraps every ``torch.distributed`` collective before
Megatron is imported and records, for each call during the recorded steps: the function
(``op``), its message size (``size_bytes``), the ranks of its process group, the phase it
ran in (forward, backward, optimizer, other) and the training step. Calls with the same
key are stored once with a ``count`` (the log stays small for a 64-layer model at 32
micro-batches); a plain event without ``count`` counts once.

Message size follows nccl-tests (``doc/PERFORMANCE.md``), so that one bandwidth figure
converts bytes into time for every kind:

* all-gather: the gathered output (N x the input); reduce-scatter: the input (N x the
  output); all-reduce, broadcast, reduce: the tensor; all-to-all: the input; send/recv:
  the tensor.

What crosses one rank's link is the *bus* volume: message size times the bus factor of
the ring algorithm (same source): all-gather, reduce-scatter, all-to-all (n-1)/n;
all-reduce 2(n-1)/n; broadcast, reduce, send, recv 1. So the distributed optimizer's
parameter all-gather of P bf16 parameters over N ranks is ``2P`` message bytes and
``2P (N-1)/N`` bus bytes per step: the figure a link of B bytes/s needs ``bytes / B``
seconds for. A group of one rank moves nothing (factor 0).

Groups are named by their ranks, never guessed from sizes: the engine records the rank
sets of this rank's parallel groups (Megatron's process-group collection: ``dp``,
``dp_cp``, ``tp``, ``cp``, ``ep``, ``pp``, ``expt_dp``, the hybrid-FSDP outer group...),
and a collective's group takes the first name in ``GROUP_ORDER`` whose rank set equals
its own. With TP = CP = 1 the data-parallel group is the whole world, and it is named
``dp``; a set that matches nothing is ``world`` (all ranks) or ``other``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

LOG_SCHEMA = "mfsdp-collectives/1"

# torch.distributed function -> kind. Coalesced and deprecated aliases count as their kind.
OP_KIND = {
    "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather",
    "all_gather": "all_gather",
    "all_gather_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_to_all_single": "all_to_all",
    "all_to_all": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "isend": "send",
    "recv": "recv",
    "irecv": "recv",
    "barrier": "barrier",
}
KINDS = tuple(dict.fromkeys(OP_KIND.values()))


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md) for a group of ``n`` ranks."""
    if n <= 1 or kind == "barrier":
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce, send, recv: the whole message crosses the link


# Megatron's group names (ProcessGroupCollection attributes) -> the name reported, in the
# order that settles equal rank sets (with CP = 1, dp and dp_cp are the same ranks: "dp").
GROUP_ORDER: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("dp", ("dp",)),
    ("dp_cp", ("dp_cp", "intra_dp_cp")),
    ("dp_outer", ("dp_outer", "inter_dist_opt", "hsdp_outer")),
    ("tp", ("tp",)),
    ("cp", ("cp",)),
    ("ep", ("ep",)),
    ("pp", ("pp",)),
    ("expert_dp", ("expt_dp", "intra_expt_dp")),
    ("expert_tp", ("expt_tp",)),
    ("tp_cp", ("tp_cp",)),
    ("mp", ("mp",)),
    ("embd", ("embd",)),
)
PHASES = ("forward", "backward", "optimizer", "other")


class LogError(ValueError):
    """A collective log this module cannot read (names what is wrong)."""


def _ranks(x) -> tuple[int, ...]:
    if not isinstance(x, (list, tuple)) or not all(isinstance(r, int) and not isinstance(r, bool) for r in x):
        raise LogError(f"group ranks must be a list of integers, got {x!r}")
    return tuple(sorted(x))


def classify(ranks: Sequence[int], parallel_groups: Mapping[str, Sequence[int]], world_size: int | None) -> str:
    """The reported name of a group with these ranks (see the module docstring)."""
    key = tuple(sorted(ranks))
    if len(key) <= 1:
        return "self"
    for name, aliases in GROUP_ORDER:
        for alias in aliases:
            got = parallel_groups.get(alias)
            if got is not None and tuple(sorted(got)) == key:
                return name
    if world_size and key == tuple(range(world_size)):
        return "world"
    return "other"


def megatron_groups(world: int, rank: int, tp: int = 1, cp: int = 1, pp: int = 1) -> dict[str, list[int]]:
    """A dense job's groups for one rank, in Megatron's default order ``tp-cp-ep-dp-pp``.

    ``megatron/core/parallel_state.py`` :: ``RankGenerator``: tensor parallel is the fastest
    varying index, then context, data, pipeline (expert parallel folds into data for dense
    layers). Used where no recorded groups exist (synthetic logs, the CPU tests); a real
    record carries the groups the job built.
    """
    if min(world, tp, cp, pp) < 1 or world % (tp * cp * pp):
        raise ValueError(f"world {world} is not a multiple of TP x CP x PP = {tp * cp * pp}")
    dp = world // (tp * cp * pp)
    t, rest = rank % tp, rank // tp
    c, rest = rest % cp, rest // cp
    d, p = rest % dp, rest // dp

    def at(ti, ci, di, pi):
        return ti + tp * (ci + cp * (di + dp * pi))

    return {
        "tp": [at(i, c, d, p) for i in range(tp)],
        "cp": [at(t, i, d, p) for i in range(cp)],
        "dp": [at(t, c, i, p) for i in range(dp)],
        "dp_cp": sorted(at(t, j, i, p) for i in range(dp) for j in range(cp)),
        "pp": [at(t, c, d, i) for i in range(pp)],
        "tp_cp": sorted(at(i, j, d, p) for i in range(tp) for j in range(cp)),
    }


def read_log(log: Mapping) -> tuple[list[dict], dict[str, tuple[int, ...]], dict[str, list[int]]]:
    """(events with resolved group ranks, group table, parallel groups) from a log mapping."""
    if not isinstance(log, Mapping):
        raise LogError("a collective log is a JSON object")
    if log.get("schema") not in (None, LOG_SCHEMA):
        raise LogError(f"collective log schema {log.get('schema')!r}, expected {LOG_SCHEMA!r}")
    table = {str(k): _ranks(v) for k, v in (log.get("groups") or {}).items()}
    parallel = {str(k): list(_ranks(v)) for k, v in (log.get("parallel_groups") or {}).items()}
    events = []
    for i, ev in enumerate(log.get("events") or []):
        if not isinstance(ev, Mapping):
            raise LogError(f"event {i} is not an object")
        op = ev.get("op")
        kind = ev.get("kind") or OP_KIND.get(str(op))
        if kind not in KINDS:
            raise LogError(f"event {i}: unknown collective {op!r}")
        g = ev.get("group")
        if isinstance(g, (list, tuple)):
            ranks = _ranks(g)
        elif str(g) in table:
            ranks = table[str(g)]
        else:
            raise LogError(f"event {i}: group {g!r} is not in the log's group table")
        size = ev.get("size_bytes")
        count = ev.get("count", 1)
        if not isinstance(size, int) or size < 0 or not isinstance(count, int) or count < 1:
            raise LogError(f"event {i}: size_bytes and count must be non-negative integers")
        phase = ev.get("phase") or "other"
        if phase not in PHASES:
            raise LogError(f"event {i}: phase {phase!r} is not one of {', '.join(PHASES)}")
        events.append(
            {"op": op, "kind": kind, "ranks": ranks, "phase": phase, "step": ev.get("step"), "size": size, "n": count}
        )
    return events, table, parallel


def _add(d: dict, kind: str, group: str, value: float) -> None:
    d.setdefault(kind, {})
    d[kind][group] = d[kind].get(group, 0) + value


def aggregate(log: Mapping, world_size: int | None = None) -> dict:
    """Per-step communication of one rank, from its log (see the module docstring).

    Returns ``bytes_per_step`` ({kind: {group: bus bytes}}, the mean over the recorded
    steps), ``message_bytes_per_step`` and ``calls_per_step`` in the same shape,
    ``by_phase`` ({phase: {kind: {group: bus bytes}}}), ``groups`` ({name: ranks}),
    ``steps`` and the per-step totals' ``spread`` (steady-state steps carry equal volumes).
    """
    events, _table, parallel = read_log(log)
    world = world_size or log.get("world_size")
    steps = log.get("steps")
    if not steps:
        steps = sorted({e["step"] for e in events if e["step"] is not None})
    nsteps = max(len(steps), 1)
    bus: dict = {}
    msg: dict = {}
    calls: dict = {}
    phase: dict = {}
    per_step_total: dict = {s: 0.0 for s in steps}
    groups: dict[str, list[int]] = {}
    seen_sets: dict[tuple[int, ...], str] = {}
    for e in events:
        name = seen_sets.get(e["ranks"])
        if name is None:
            name = classify(e["ranks"], parallel, world)
            if name in groups and tuple(groups[name]) != e["ranks"]:
                k = 2
                while f"{name}#{k}" in groups:
                    k += 1
                name = f"{name}#{k}"
            seen_sets[e["ranks"]] = name
            groups[name] = list(e["ranks"])
        b = e["size"] * e["n"] * bus_factor(e["kind"], len(e["ranks"]))
        _add(bus, e["kind"], name, b / nsteps)
        _add(msg, e["kind"], name, e["size"] * e["n"] / nsteps)
        _add(calls, e["kind"], name, e["n"] / nsteps)
        _add(phase.setdefault(e["phase"], {}), e["kind"], name, b / nsteps)
        if e["step"] in per_step_total:
            per_step_total[e["step"]] += b
    totals = list(per_step_total.values())
    return {
        "steps": list(steps),
        "bytes_per_step": _rounded(bus),
        "message_bytes_per_step": _rounded(msg),
        "calls_per_step": {k: {g: round(v, 3) for g, v in d.items()} for k, d in calls.items()},
        "by_phase": {p: _rounded(d) for p, d in phase.items()},
        "groups": groups,
        "spread": {"min_bus_bytes": min(totals), "max_bus_bytes": max(totals)} if totals else None,
        "total_bytes_per_step": int(round(sum(v for d in bus.values() for v in d.values()))),
    }


def _rounded(d: Mapping) -> dict:
    return {k: {g: int(round(v)) for g, v in sorted(inner.items())} for k, inner in sorted(d.items())}


def by_group(bytes_per_step: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """{group: bus bytes per step} summed over kinds."""
    out: dict[str, float] = {}
    for inner in bytes_per_step.values():
        for g, v in inner.items():
            out[g] = out.get(g, 0) + v
    return out


def synthetic_events(items: Iterable[tuple]) -> list[dict]:
    """Events from ``(op, size_bytes, group, phase, step[, count])`` tuples (tests, examples)."""
    out = []
    for it in items:
        op, size, group, ph, step = it[:5]
        ev = {"op": op, "size_bytes": size, "group": group, "phase": ph, "step": step}
        if len(it) > 5:
            ev["count"] = it[5]
        out.append(ev)
    return out
