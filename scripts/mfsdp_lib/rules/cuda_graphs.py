"""CUDA graph rules: features that cannot run under CUDA graph capture.

One ``Rule`` per constraint; the fields are explained in ``rules/model.py``.
"""

from __future__ import annotations

from .. import schema as S
from .context import SRC_MCORE_FSDP, SRC_MLM_TRAINING, kv, moe_ep_overlap
from .model import Rule

# cuda_graph_impl values that capture per layer (not the whole iteration).
PER_LAYER_GRAPHS = ("local", "transformer_engine")
SRC_MFSDP_MAIN = "megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py"


def _gpt_provider(e) -> bool:
    """A GPT-family model provider (Bridge's GPTModelProvider and its subclasses). Hybrid (Mamba) providers
    derive from HybridModelProvider (models/hybrid/hybrid_provider.py), which has no such assert; they carry a
    layer pattern, GPT providers have neither field."""
    return e.get("model.hybrid_layer_pattern") is None and e.get("model.hybrid_override_pattern") is None


def cuda_graph_needs_te_rng(e) -> bool:
    """CUDA graphs on a GPT-family model without Transformer Engine's RNG tracker: the build asserts."""
    return (
        e.get("model.cuda_graph_impl") not in (None, "none")
        and not e.get("model.use_te_rng_tracker")
        and _gpt_provider(e)
    )


def _full_iteration_unsafe(e) -> bool:
    return not e.get("ddp.megatron_fsdp_cuda_graph_mode") or bool(e.get("ddp.fsdp_all_gather_in_start_param_sync"))


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
    Rule(
        id="MFSDP-CUDA-GRAPH-TE-RNG",
        severity="error",
        stage="runtime",
        topic="cuda_graphs",
        paths=("model.use_te_rng_tracker", "model.cuda_graph_impl"),
        when=cuda_graph_needs_te_rng,
        message=lambda e: (
            f"{kv(e, 'model.cuda_graph_impl')} with model.use_te_rng_tracker=false: the model build asserts that "
            "CUDA graphs run with Transformer Engine's RNG tracker (validate() does not check it)."
        ),
        fix="model.use_te_rng_tracker=true",
        source=f"{S.B_GPT}: GPTModelProvider.provide (line 233): assert 'Transformer engine's RNG tracker is required "
        "for cudagraphs'",
    ),
    Rule(
        id="MFSDP-FULL-ITER-NAN-CHECK",
        severity="error",
        stage="validate",
        topic="cuda_graphs",
        paths=("rerun_state_machine.check_for_nan_in_loss", "model.cuda_graph_impl"),
        when=lambda e: (
            e.get("model.cuda_graph_impl") == "full_iteration"
            and bool(e.get("rerun_state_machine.check_for_nan_in_loss"))
        ),
        message=lambda e: (
            "model.cuda_graph_impl=full_iteration with rerun_state_machine.check_for_nan_in_loss=true: the NaN "
            "check cannot run inside a captured iteration."
        ),
        fix="rerun_state_machine.check_for_nan_in_loss=false",
        source=f"{S.B_CFG}: ConfigContainer.validate (line 1371): assert 'check_for_nan_in_loss must be disabled when "
        "using full_iteration CUDA graph. '",
    ),
    Rule(
        id="MFSDP-MOE-OVERLAP-CUDA-GRAPH",
        severity="error",
        stage="runtime",
        topic="cuda_graphs",
        paths=("model.cuda_graph_impl", "comm_overlap.overlap_moe_expert_parallel_comm"),
        when=lambda e: e.fsdp and moe_ep_overlap(e) and e.get("model.cuda_graph_impl") in PER_LAYER_GRAPHS,
        message=lambda e: (
            f"{kv(e, 'model.cuda_graph_impl')} (per-layer CUDA graphs) with the expert-parallel A2A overlap "
            "(overlap_moe_expert_parallel_comm) under Megatron FSDP: the wrapper asserts when the model is wrapped."
        ),
        # full_iteration alone is no fix: validate() then asserts on the NaN check (MFSDP-FULL-ITER-NAN-CHECK), the
        # captured iteration needs two ddp settings (MFSDP-FULL-ITER-CUDA-GRAPH) and the build the TE RNG tracker
        # (MFSDP-CUDA-GRAPH-TE-RNG); it is offered with all four.
        fix="model.cuda_graph_impl=none, or model.cuda_graph_impl=full_iteration with "
        "rerun_state_machine.check_for_nan_in_loss=false, ddp.megatron_fsdp_cuda_graph_mode=true, "
        "ddp.fsdp_all_gather_in_start_param_sync=false and model.use_te_rng_tracker=true, or turn the "
        "expert-parallel overlap off",
        source=f"{SRC_MCORE_FSDP}: FullyShardedDataParallel.__init__ (line 173): assert '1F1B overlap with FSDP does not "
        "support per-layer CUDA graphs'",
    ),
    Rule(
        id="MFSDP-FULL-ITER-CUDA-GRAPH",
        severity="error",
        stage="runtime",
        topic="cuda_graphs",
        paths=("ddp.megatron_fsdp_cuda_graph_mode", "ddp.fsdp_all_gather_in_start_param_sync", "model.cuda_graph_impl"),
        when=lambda e: e.fsdp and e.get("model.cuda_graph_impl") == "full_iteration" and _full_iteration_unsafe(e),
        message=lambda e: (
            f"model.cuda_graph_impl=full_iteration with {kv(e, 'ddp.megatron_fsdp_cuda_graph_mode')}, "
            f"{kv(e, 'ddp.fsdp_all_gather_in_start_param_sync')}: Bridge does not set these for you (Megatron-LM "
            "does); the captured iteration then waits on an all-gather launched outside the graph."
        ),
        fix="ddp.megatron_fsdp_cuda_graph_mode=true and ddp.fsdp_all_gather_in_start_param_sync=false",
        source=f"{SRC_MLM_TRAINING}: get_megatron_ddp_config (line 2008): 'When using full-iteration CUDA graphs, "
        "Megatron-FSDP should not AG parameters' then 'kwargs[\"fsdp_all_gather_in_start_param_sync\"] = False'; "
        f"{SRC_MFSDP_MAIN}: start_param_sync (line 1278): 'if self.ddp_config.fsdp_all_gather_in_start_param_sync:'",
    ),
    Rule(
        id="MFSDP-CUDA-GRAPH-SAFE-MODE",
        severity="warning",
        stage="advice",
        topic="cuda_graphs",
        paths=("ddp.megatron_fsdp_cuda_graph_mode", "model.cuda_graph_impl"),
        when=lambda e: (
            e.fsdp
            and e.get("model.cuda_graph_impl") in PER_LAYER_GRAPHS
            and not e.get("ddp.megatron_fsdp_cuda_graph_mode")
        ),
        message=lambda e: (
            f"{kv(e, 'model.cuda_graph_impl')} with Megatron FSDP and ddp.megatron_fsdp_cuda_graph_mode=false: "
            "Megatron FSDP then drops gradient references after each step that graph replay relies on."
        ),
        fix="ddp.megatron_fsdp_cuda_graph_mode=true",
        source=f"{SRC_MLM_TRAINING}: get_megatron_ddp_config (line 2004): 'Run Megatron-FSDP in CUDA graph-safe mode.' "
        "(Megatron-LM sets it whenever cuda_graph_impl is not none; Bridge leaves it to the config); "
        "megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py (line 3198) "
        "'if not self.ddp_config.megatron_fsdp_cuda_graph_mode:'",
    ),
]
