"""Counting a rank's communication per step from a recorded collective log."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES
from mfsdp_lib.perf import collectives as co

LOG = json.loads((FIXTURES / "perf" / "synthetic_distopt_n8.json").read_text())
P = 1_000_000  # parameters per model-parallel rank in the synthetic job (see the fixture README)
DP = 4


def test_bus_factors_are_nccl_tests_ring_factors():
    assert co.bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert co.bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert co.bus_factor("reduce_scatter", 64) == pytest.approx(63 / 64)
    assert co.bus_factor("all_to_all", 4) == pytest.approx(3 / 4)
    assert co.bus_factor("broadcast", 4) == 1.0
    assert co.bus_factor("send", 2) == 1.0
    assert co.bus_factor("all_reduce", 1) == 0.0  # a group of one moves nothing


def test_distopt_param_all_gather_is_bf16_param_bytes_times_n_minus_1_over_n():
    agg = co.aggregate(LOG)
    assert agg["steps"] == [3, 4]
    assert agg["bytes_per_step"]["all_gather"] == {"dp": round(2 * P * (DP - 1) / DP)}
    assert agg["bytes_per_step"]["reduce_scatter"] == {"dp": round(4 * P * (DP - 1) / DP)}
    assert agg["message_bytes_per_step"]["all_gather"] == {"dp": 2 * P}
    assert agg["calls_per_step"]["all_gather"] == {"dp": 2}


def test_groups_are_named_by_their_ranks_and_kinds_by_the_function():
    agg = co.aggregate(LOG)
    ar = agg["bytes_per_step"]["all_reduce"]
    # 16 TP all-reduces of 64 KiB (2(n-1)/n = 1 for n = 2) plus the 4-byte grad-norm all-reduce
    assert ar["tp"] == 16 * 65536 + 4
    assert ar["dp"] == round(8 * 2 * 3 / 4)
    assert ar["self"] == 0
    assert agg["groups"]["tp"] == [0, 1] and agg["groups"]["dp"] == [0, 2, 4, 6]
    assert agg["spread"]["min_bus_bytes"] == agg["spread"]["max_bus_bytes"]  # steady state
    assert agg["by_phase"]["forward"]["all_gather"]["dp"] == round(2 * P * 3 / 4)
    assert agg["by_phase"]["backward"]["reduce_scatter"]["dp"] == round(4 * P * 3 / 4)
    assert agg["by_phase"]["optimizer"]["all_reduce"] == {"self": 0, "tp": 4}


def test_classify_prefers_dp_for_equal_sets_and_says_world_or_other():
    groups = {"dp": [0, 1, 2, 3], "dp_cp": [0, 1, 2, 3], "tp": [0], "inter_dist_opt": [0, 4]}
    assert co.classify([3, 2, 1, 0], groups, 4) == "dp"
    assert co.classify([0, 4], groups, 8) == "dp_outer"
    assert co.classify(list(range(8)), groups, 8) == "world"
    assert co.classify([0, 5], groups, 8) == "other"
    assert co.classify([0], groups, 8) == "self"


def test_megatron_default_order_places_tp_fastest_then_cp_dp_pp():
    g = co.megatron_groups(16, 5, tp=2, cp=2, pp=2)
    # rank 5 = tp 1 + 2 * (cp 0 + 2 * (dp 1 + 2 * pp 0))
    assert g["tp"] == [4, 5]
    assert g["cp"] == [5, 7]
    assert g["dp"] == [1, 5]
    assert g["dp_cp"] == [1, 3, 5, 7]
    assert g["pp"] == [5, 13]
    with pytest.raises(ValueError):
        co.megatron_groups(12, 0, tp=8)


@pytest.mark.parametrize(
    ("event", "fragment"),
    [
        ({"op": "all_shuffle", "group": [0, 1], "size_bytes": 1}, "unknown collective"),
        ({"op": "all_reduce", "group": "g9", "size_bytes": 1}, "group table"),
        ({"op": "all_reduce", "group": [0, 1], "size_bytes": -1}, "non-negative"),
        ({"op": "all_reduce", "group": [0, 1], "size_bytes": 1, "phase": "lunch"}, "phase"),
        ({"op": "all_reduce", "group": [0, "x"], "size_bytes": 1}, "list of integers"),
    ],
)
def test_bad_events_are_refused_with_what_is_wrong(event, fragment):
    with pytest.raises(co.LogError, match=fragment):
        co.aggregate({"schema": co.LOG_SCHEMA, "events": [event]})


def test_a_different_schema_is_refused():
    with pytest.raises(co.LogError, match="schema"):
        co.aggregate({"schema": "something/9", "events": []})


def test_distinct_rank_sets_that_classify_alike_stay_apart():
    log = {
        "world_size": 8,
        "events": co.synthetic_events(
            [("all_reduce", 100, [0, 5], "other", 1), ("all_reduce", 100, [0, 6], "other", 1)]
        ),
    }
    agg = co.aggregate(log)
    assert set(agg["bytes_per_step"]["all_reduce"]) == {"other", "other#2"}


# Real logs recorded by ``rehearse --perf`` on an H200 (tests/fixtures/perf/recorded_*.json, exported by
# benchmarks/rehearse_perf_result.py --export-logs): counting them must give the per-step figures the
# result file reports, and the analytic volumes of their strategy within bucket padding.
RECORDED = sorted((FIXTURES / "perf").glob("recorded_*.json"))
RESULT = json.loads((FIXTURES.parent.parent / "benchmarks" / "results" / "rehearse_perf_1xh200.json").read_text())


def test_real_logs_are_present():
    assert len(RECORDED) >= 8, [p.name for p in RECORDED]


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_counting_a_real_log_gives_the_reported_bytes(path):
    log = json.loads(path.read_text())
    got = co.aggregate(log)["bytes_per_step"]
    name = path.stem.removeprefix("recorded_").removesuffix("_rank_0")
    row = next(r for r in RESULT["rows"] if r["row"] == name)
    for kind, groups in row["comm_bytes_per_step"].items():
        for group, value in groups.items():
            assert abs(got.get(kind, {}).get(group, 0) - value) <= max(1, 1e-9 * value), (kind, group)
