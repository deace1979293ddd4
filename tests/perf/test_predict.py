"""The link model and the step-time range."""

from __future__ import annotations

import pytest

from mfsdp_lib.perf import predict as pr


def test_groups_inside_a_node_use_nvlink_and_across_nodes_the_network():
    links = pr.Links()
    assert links.link_of(range(8)) == ("nvlink", 450.0)
    # 16 ranks over 2 nodes, 8 per node: the rings use all 8 ports of each node, capped by NVLink
    assert links.link_of(range(16)) == ("network", 400.0)
    # a rail group (one rank per node) has one port
    assert links.link_of([0, 8, 16, 24]) == ("network", 50.0)
    assert links.link_of([3]) == ("none", float("inf"))
    assert pr.Links(gpus_per_node=4).link_of(range(8)) == ("network", 200.0)


def test_defaults_are_the_dgx_h100_link_rates():
    d = pr.Links().describe()
    assert (d["intra_node_gbps"], d["inter_node_gbps"], d["gpus_per_node"]) == (450.0, 50.0, 8)
    assert "1e9 bytes" in d["unit"]


def test_range_low_is_max_of_compute_and_busiest_link_high_is_the_sum():
    groups = {"dp": list(range(16)), "tp": [0, 1]}
    bytes_per_step = {"all_gather": {"dp": 200e9}, "all_reduce": {"tp": 90e9}}
    links = pr.Links()
    p = pr.predict(1.0, bytes_per_step, groups, links, tokens_per_step_per_gpu=1000.0)
    assert p["communication"]["per_link_s"] == pytest.approx({"network": 0.5, "nvlink": 0.2})
    assert p["step_time_s"]["low"] == pytest.approx(1.0)
    assert p["step_time_s"]["high"] == pytest.approx(1.7)
    assert p["exposed_communication_s"]["low"] == pytest.approx(0.0)
    assert p["tokens_per_s_per_gpu"]["high"] == pytest.approx(1000.0)
    assert p["tokens_per_s_per_gpu"]["low"] == pytest.approx(1000.0 / 1.7)
    # when communication outlasts compute, the low bound is the busiest link and some is exposed
    q = pr.predict(0.2, bytes_per_step, groups, links)
    assert q["step_time_s"]["low"] == pytest.approx(0.5)
    assert q["exposed_communication_s"]["low"] == pytest.approx(0.3)
    assert q["busiest_link"] == "network"


def test_no_communication_means_a_range_of_width_zero():
    p = pr.predict(2.0, {"all_reduce": {"self": 100}}, {"self": [0]}, pr.Links())
    assert p["step_time_s"] == {"low": 2.0, "high": 2.0}


def test_bad_link_model_and_compute_are_refused():
    with pytest.raises(ValueError):
        pr.Links(intra_node_gbps=0)
    with pytest.raises(ValueError):
        pr.Links(gpus_per_node=0)
    with pytest.raises(ValueError):
        pr.predict(0.0, {}, {}, pr.Links())
