"""Step time from measured compute and counted communication: a link model and its bounds.

Inputs: the compute time of one step measured on the rehearsed rank (the fake backend
moves no data, so that time holds no communication), and the rank's bus bytes per step
per group (:mod:`.collectives`). Each group's traffic is priced on the link it crosses:

* a group whose ranks all sit in one node uses NVLink: ``intra_node_gbps``;
* a group that spans nodes rides the InfiniBand fabric. NCCL splits a collective over
  several rings (channels) and each GPU of a DGX-class node has its own network port, so
  a group with ``r`` ranks in every node it touches can push ``r`` ports' worth across the
  node boundary: the group's bus bandwidth is ``min(intra_node_gbps, r x inter_node_gbps)``.
  A "rail" group (one rank per node, e.g. data parallel across nodes with TP = 8) gets one
  port: ``inter_node_gbps``.

Units: GB/s = 10^9 bytes per second, per GPU, in one direction, as the bus bandwidth
nccl-tests reports (``busbw``): a link of B GB/s moves a collective of ``x`` bus bytes in
``x / (B 10^9)`` seconds. Not Gb/s (bits): a 400 Gb/s InfiniBand port is 50 GB/s.

Defaults: a DGX H100-class node (NVIDIA DGX H100 datasheet and user guide):

* 8 GPUs per node (``DGX_GPUS_PER_NODE``);
* NVLink: 18 fourth-generation links per GPU, 900 GB/s of bidirectional GPU-to-GPU
  bandwidth through the NVSwitches, so 450 GB/s in one direction (``DGX_NVLINK_GBPS``);
* compute fabric: 8 single-port ConnectX-7 adapters at 400 Gb/s InfiniBand, one per GPU,
  so 50 GB/s per GPU in one direction (``DGX_IB_GBPS``).

These are link rates; what NCCL achieves is lower (protocol overhead, small messages,
latency per call), so the communication times here are optimistic for a given link. Give
the bus bandwidth your cluster measured (nccl-tests ``all_gather_perf``,
``reduce_scatter_perf`` at the job's message sizes) to tighten them.

The step time is a range, never one number:

* ``low`` = max(compute, the busiest link's communication): every byte hidden under
  compute, links (NVLink and InfiniBand) working in parallel;
* ``high`` = compute + all communication: nothing overlapped;
* ``exposed_communication_s`` = the communication the low bound leaves visible,
  ``low - compute`` (zero when compute hides everything), and at most all of it.

Megatron overlaps most data-parallel traffic with compute (``overlap_grad_reduce``,
``overlap_param_gather``, FSDP's prefetching), so real steps sit toward ``low`` when the
compute per layer outlasts the layer's transfers, and toward ``high`` when they do not.
"""

from __future__ import annotations

from collections.abc import Mapping

DGX_GPUS_PER_NODE = 8  # DGX H100 datasheet: 8x NVIDIA H100 Tensor Core GPUs per system
DGX_NVLINK_GBPS = 450.0  # DGX H100 datasheet: 900 GB/s bidirectional NVLink per GPU -> 450 GB/s one way
DGX_IB_GBPS = 50.0  # DGX H100 datasheet: 8x ConnectX-7 400 Gb/s InfiniBand (one per GPU) -> 50 GB/s one way
GB = 1e9


class Links:
    """The link model (see the module docstring for the units and defaults)."""

    def __init__(
        self,
        intra_node_gbps: float = DGX_NVLINK_GBPS,
        inter_node_gbps: float = DGX_IB_GBPS,
        gpus_per_node: int = DGX_GPUS_PER_NODE,
    ):
        if not intra_node_gbps > 0 or not inter_node_gbps > 0:
            raise ValueError("link bandwidths must be positive (GB/s)")
        if gpus_per_node < 1:
            raise ValueError("gpus per node must be at least 1")
        self.intra = float(intra_node_gbps)
        self.inter = float(inter_node_gbps)
        self.gpus_per_node = int(gpus_per_node)

    def describe(self) -> dict:
        return {
            "intra_node_gbps": self.intra,
            "inter_node_gbps": self.inter,
            "gpus_per_node": self.gpus_per_node,
            "unit": "GB/s (1e9 bytes/s) per GPU, one direction, nccl-tests bus bandwidth",
        }

    def link_of(self, ranks) -> tuple[str, float]:
        """('none' | 'nvlink' | 'network', bus GB/s) for a group with these ranks."""
        ranks = sorted(set(ranks))
        if len(ranks) <= 1:
            return "none", float("inf")
        per_node: dict[int, int] = {}
        for r in ranks:
            per_node[r // self.gpus_per_node] = per_node.get(r // self.gpus_per_node, 0) + 1
        if len(per_node) == 1:
            return "nvlink", self.intra
        r_min = min(per_node.values())
        return "network", min(self.intra, r_min * self.inter)


def communication(bytes_per_step: Mapping[str, Mapping[str, float]], groups: Mapping[str, list], links: Links) -> dict:
    """Seconds per step for each group and each link, from bus bytes per kind and group."""
    rows = []
    per_link: dict[str, float] = {}
    for kind, inner in bytes_per_step.items():
        for g, b in inner.items():
            ranks = groups.get(g) or []
            link, gbps = links.link_of(ranks)
            secs = 0.0 if link == "none" or not b else b / (gbps * GB)
            rows.append(
                {
                    "kind": kind,
                    "group": g,
                    "group_size": len(ranks),
                    "bus_bytes": int(b),
                    "link": link,
                    "bus_gbps": None if link == "none" else gbps,
                    "seconds": secs,
                }
            )
            if link != "none":
                per_link[link] = per_link.get(link, 0.0) + secs
    return {"rows": rows, "per_link_s": per_link, "total_s": sum(per_link.values())}


def step_range(compute_s: float, comm: Mapping) -> dict:
    """{low, high} step seconds and the exposed communication (module docstring)."""
    if compute_s is None or not compute_s > 0:
        raise ValueError("compute time must be a positive number of seconds")
    busiest = max(comm["per_link_s"].values(), default=0.0)
    low = max(compute_s, busiest)
    high = compute_s + comm["total_s"]
    return {
        "step_time_s": {"low": low, "high": high},
        "exposed_communication_s": {"low": low - compute_s, "high": comm["total_s"]},
        "busiest_link": max(comm["per_link_s"], key=comm["per_link_s"].get) if comm["per_link_s"] else None,
        "busiest_link_s": busiest,
        "communication_s": comm["total_s"],
        "compute_s": compute_s,
    }


def predict(
    compute_s: float,
    bytes_per_step: Mapping[str, Mapping[str, float]],
    groups: Mapping[str, list],
    links: Links,
    tokens_per_step_per_gpu: float | None = None,
    flops_per_step_per_gpu: float | None = None,
) -> dict:
    """The whole prediction: per-group times, the step range, and throughput ranges from it.

    Throughput ranges invert the step range: ``high`` throughput from the ``low`` step time.
    """
    comm = communication(bytes_per_step, groups, links)
    rng = step_range(compute_s, comm)
    lo, hi = rng["step_time_s"]["low"], rng["step_time_s"]["high"]
    out = {"links": links.describe(), "communication": comm, **rng}
    if tokens_per_step_per_gpu:
        out["tokens_per_s_per_gpu"] = {"low": tokens_per_step_per_gpu / hi, "high": tokens_per_step_per_gpu / lo}
    if flops_per_step_per_gpu:
        out["model_tflops_per_gpu"] = {
            "low": flops_per_step_per_gpu / hi / 1e12,
            "high": flops_per_step_per_gpu / lo / 1e12,
        }
    return out
