"""Mixture-of-Experts rules: expert-parallel overlap and grouped expert weights under Megatron FSDP.

Expert parallelism itself works with Megatron FSDP at pipeline size 1: the FSDP adapter builds a
separate expert mesh (``_get_dp_tp_mesh(expt_dp_group, expt_tp_group, ep_size=...)``). What does
not work are the features below, each refused by Megatron-Core or Megatron-LM's own checks.

One ``Rule`` per constraint; the fields are explained in ``rules/model.py``.
"""

from __future__ import annotations

from .. import schema as S
from .context import SRC_MCORE_FSDP, SRC_MLM_ARGS, kv, moe_ep_overlap
from .model import Rule

RULES: list[Rule] = [
    Rule(
        id="MFSDP-MOE-OVERLAP-DOUBLE-BUFFER",
        severity="error",
        stage="runtime",
        topic="moe",
        paths=(
            "ddp.fsdp_double_buffer",
            "ddp.megatron_fsdp_max_pool_double_buffer",
            "comm_overlap.overlap_moe_expert_parallel_comm",
        ),
        when=lambda e: (
            e.fsdp
            and moe_ep_overlap(e)
            and (bool(e.get("ddp.fsdp_double_buffer")) or bool(e.get("ddp.megatron_fsdp_max_pool_double_buffer")))
        ),
        message=lambda e: (
            f"expert-parallel A2A overlap (overlap_moe_expert_parallel_comm) with {kv(e, 'ddp.fsdp_double_buffer')}, "
            f"{kv(e, 'ddp.megatron_fsdp_max_pool_double_buffer')} (the max-pool buffer turns double buffering on): "
            "the Megatron FSDP wrapper asserts when the model is wrapped."
        ),
        fix="ddp.fsdp_double_buffer=false and ddp.megatron_fsdp_max_pool_double_buffer=false "
        "(or turn the expert-parallel overlap off)",
        source=f"{SRC_MCORE_FSDP}: FullyShardedDataParallel.__init__ (line 169): assert '1F1B overlap with FSDP does not "
        f"support double buffer.'; {S.MC_DDP}: DistributedDataParallelConfig.__post_init__ (line 273) "
        "(megatron_fsdp_max_pool_double_buffer sets 'self.fsdp_double_buffer = True')",
    ),
    Rule(
        id="MFSDP-MOE-SINGLE-GROUPED-WEIGHT",
        severity="error",
        stage="runtime",
        topic="moe",
        paths=("model.moe_single_grouped_weight", "model.moe_single_grouped_bias"),
        when=lambda e: (
            e.fsdp and (bool(e.get("model.moe_single_grouped_weight")) or bool(e.get("model.moe_single_grouped_bias")))
        ),
        message=lambda e: (
            f"{kv(e, 'model.moe_single_grouped_weight')}, {kv(e, 'model.moe_single_grouped_bias')} with Megatron "
            "FSDP: its parameter buffers cannot hold Transformer Engine GroupedTensor parameters."
        ),
        fix="model.moe_single_grouped_weight=false and model.moe_single_grouped_bias=false",
        source=f"{SRC_MLM_ARGS}: validate_args (line 1121): ValueError 'Megatron-FSDP does not currently support "
        "moe_single_grouped_weight or moe_single_grouped_bias.' (the Megatron-LM launcher check; Bridge has none, "
        "the job fails when the parameters are remapped)",
    ),
]
