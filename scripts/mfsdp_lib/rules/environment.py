"""Rules over the job's environment variables (the config's env_vars applied with setdefault).

One ``Rule`` per constraint; the fields are explained in ``rules/model.py``.
"""

from __future__ import annotations

from .. import schema as S
from .context import (
    MAX_CONN,
    PRE_BLACKWELL_ARCHS,
    SRC_FSDP_CFG,
    comm_overlap_on,
    envfmt,
)
from .model import Rule

RULES: list[Rule] = [
    Rule(
        id="MFSDP-ENV-MAX-CONNECTIONS",
        severity="error",
        stage="validate",
        topic="environment",
        paths=("env." + MAX_CONN,),
        when=lambda e: (
            e.fsdp
            and e.env.get(MAX_CONN) == "1"
            and [
                (
                    f"env_vars.{MAX_CONN}",
                    f"{envfmt(e, MAX_CONN)}; Megatron FSDP needs it unset or > 1.",
                    f"env_vars.{MAX_CONN}=32",
                )
                if MAX_CONN in e.env_from_config
                else (
                    f"env.{MAX_CONN}",
                    f"{envfmt(e, MAX_CONN)}; Megatron FSDP needs it unset or > 1.",
                    f"unset {MAX_CONN} in the job's environment (or set it to 32)",
                )
            ]
        ),
        message=None,
        fix=None,
        source=f"{SRC_FSDP_CFG}: assert 'FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.'",
    ),
    Rule(
        id="MFSDP-FINE-GRAINED-OFFLOAD-ENV",
        severity="error",
        stage="validate",
        topic="environment",
        paths=("env.NVTE_CPU_OFFLOAD_V1", "model.fine_grained_activation_offloading"),
        when=lambda e: (
            bool(e.get("model.fine_grained_activation_offloading"))
            and e.get("model.transformer_impl") == "transformer_engine"
            and e.env.get("NVTE_CPU_OFFLOAD_V1", "0") != "1"
        ),
        message=lambda e: (
            f"fine-grained activation offloading with {envfmt(e, 'NVTE_CPU_OFFLOAD_V1')} "
            "(Transformer Engine >= 2.10 then offloads weights too)."
        ),
        fix="env_vars.NVTE_CPU_OFFLOAD_V1=1 (or export NVTE_CPU_OFFLOAD_V1=1)",
        source=f"{S.B_CFG}: _validate_fine_grained_activation_offloading: ValueError 'For fine-grained activation "
        "offloading with TE >= 2.10.0, NVTE_CPU_OFFLOAD_V1 environment variable should be set to 1'",
    ),
    Rule(
        id="MFSDP-ENV-MAX-CONN-TP-OVERLAP",
        severity="warning",
        stage="advice",
        topic="environment",
        paths=("env." + MAX_CONN, "model.tp_comm_overlap"),
        when=lambda e: (
            e.fsdp
            and e.gpu_arch in PRE_BLACKWELL_ARCHS
            and e.env.get(MAX_CONN) != "1"
            and (bool(e.get("model.tp_comm_overlap")) or comm_overlap_on(e, "tp_comm_overlap"))
        ),
        message=lambda e: (
            f"TP communication overlap on {e.gpu_arch} wants {MAX_CONN}=1, which Megatron FSDP forbids "
            f"({envfmt(e, MAX_CONN)}): overlap will be poor."
        ),
        fix="comm_overlap.tp_comm_overlap=false (or run on Blackwell, where the two do not conflict)",
        source=f"{SRC_FSDP_CFG}: assert 'FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.'; "
        "megatron/bridge/perf_recipes/deepseek/h100/deepseek_v3.py: env_vars '# CUDA stream scheduling for this "
        "model and parallel layout.' with CUDA_DEVICE_MAX_CONNECTIONS 1 on H100 (the B200/GB200 perf recipes use 32)",
    ),
    Rule(
        id="MFSDP-NCCL-UB-EXPANDABLE-SEGMENTS",
        severity="warning",
        stage="validate",
        topic="environment",
        paths=("env.PYTORCH_CUDA_ALLOC_CONF", "ddp.nccl_ub"),
        when=lambda e: (
            bool(e.get("ddp.nccl_ub"))
            and "expandable_segments:True" in e.env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",")
        ),
        message=lambda e: (
            f"ddp.nccl_ub=true with {envfmt(e, 'PYTORCH_CUDA_ALLOC_CONF')}: rejected with PyTorch older than 2.11."
        ),
        fix="remove expandable_segments:True from PYTORCH_CUDA_ALLOC_CONF / env_vars (or use PyTorch >= 2.11)",
        source=f"{S.MC_DDP}: DistributedDataParallelConfig.__post_init__: ValueError 'PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:True is currently not supported with nccl_ub'",
    ),
]
