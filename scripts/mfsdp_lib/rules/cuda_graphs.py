"""CUDA graph rules: features that cannot run under CUDA graph capture.

One ``Rule`` per constraint; the fields are explained in ``rules/model.py``.
"""

from __future__ import annotations

from .. import schema as S
from .context import kv
from .model import Rule

RULES: list[Rule] = [
    Rule(
        id="MFSDP-CPU-OFFLOAD-CUDA-GRAPH",
        severity="error",
        stage="validate",
        topic="cuda_graphs",
        paths=("model.cuda_graph_impl", "model.cpu_offloading"),
        when=lambda e: (
            bool(e.get("model.cpu_offloading")) and e.get("model.cuda_graph_impl") not in ("none", "full_iteration")
        ),
        message=lambda e: f"model.cpu_offloading=true with {kv(e, 'model.cuda_graph_impl')}.",
        fix="model.cuda_graph_impl=none (or model.cpu_offloading=false)",
        source=f"{S.MC_TC}: TransformerConfig.__post_init__: ValueError 'CUDA graphs not supported with CPU offloading.'",
    ),
]
