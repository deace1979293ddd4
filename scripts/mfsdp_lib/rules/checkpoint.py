"""Checkpoint rules: the format Megatron FSDP needs, async save, HF export, Gloo-free saving.

One ``Rule`` per constraint; the fields are explained in ``rules/model.py``.
"""

from __future__ import annotations

from .. import schema as S
from .context import DIST_CKPT_FORMATS, SRC_B_CKPT, SRC_FSDP_CFG, SRC_VALIDATE, fmt, raw_get
from .model import Rule

RULES: list[Rule] = [
    Rule(
        id="MFSDP-CKPT-FORMAT",
        severity="error",
        stage="validate",
        topic="checkpoint",
        paths=("checkpoint.ckpt_format", "checkpoint.save", "checkpoint.load"),
        when=lambda e: e.fsdp and e.ckpt_io and e.get("checkpoint.ckpt_format") != "fsdp_dtensor",
        message=lambda e: (
            f"Megatron FSDP with a checkpoint directory (save={fmt(e.get('checkpoint.save'))}, "
            f"load={fmt(e.get('checkpoint.load'))}) needs ckpt_format fsdp_dtensor, found "
            f"{fmt(e.get('checkpoint.ckpt_format'))}."
        ),
        fix="checkpoint.ckpt_format=fsdp_dtensor (or set both checkpoint.save and checkpoint.load to null)",
        source=f"{SRC_FSDP_CFG}: assert 'Megatron-FSDP requires the fsdp_dtensor checkpointing format!'",
    ),
    Rule(
        id="MFSDP-DTENSOR-NEEDS-MFSDP",
        severity="error",
        stage="validate",
        topic="checkpoint",
        paths=("checkpoint.ckpt_format", "ddp.use_megatron_fsdp"),
        when=lambda e: (
            e.ckpt_io
            and e.get("checkpoint.ckpt_format") == "fsdp_dtensor"
            and (not e.fsdp or bool(e.get("dist.use_torch_fsdp2")))
        ),
        message=lambda e: (
            "checkpoint.ckpt_format=fsdp_dtensor is only valid with Megatron FSDP, found "
            f"ddp.use_megatron_fsdp={fmt(e.get('ddp.use_megatron_fsdp'))}, "
            f"dist.use_megatron_fsdp={fmt(e.get('dist.use_megatron_fsdp'))}, "
            f"dist.use_torch_fsdp2={fmt(e.get('dist.use_torch_fsdp2'))}."
        ),
        fix="checkpoint.ckpt_format=torch_dist, or enable Megatron FSDP (mfsdp.py enable)",
        source=f"{SRC_VALIDATE}: assert 'fsdp_dtensor checkpoint format only supports Megatron FSDP'",
    ),
    Rule(
        id="MFSDP-ASYNC-FORMAT",
        severity="error",
        stage="validate",
        topic="checkpoint",
        paths=("checkpoint.async_save", "checkpoint.ckpt_format"),
        when=lambda e: (
            bool(e.get("checkpoint.async_save")) and e.get("checkpoint.ckpt_format") not in DIST_CKPT_FORMATS
        ),
        message=lambda e: f"checkpoint.async_save=true with ckpt_format {fmt(e.get('checkpoint.ckpt_format'))}.",
        fix="checkpoint.ckpt_format=fsdp_dtensor (with Megatron FSDP) or checkpoint.async_save=false",
        source=f"{SRC_VALIDATE}: assert \"async_save is only supported with ckpt_format='torch_dist','fsdp_dtensor'\"",
    ),
    Rule(
        id="MFSDP-ASYNC-NEEDS-SAVE",
        severity="error",
        stage="validate",
        topic="checkpoint",
        paths=("checkpoint.save", "checkpoint.async_save"),
        when=lambda e: bool(e.get("checkpoint.async_save")) and e.get("checkpoint.save") is None,
        message=lambda e: "checkpoint.async_save=true but checkpoint.save is null.",
        fix="checkpoint.save=/path/to/checkpoints (or checkpoint.async_save=false)",
        source=f"{S.B_CFG}: CheckpointConfig.finalize: assert 'async_save is enabled, but save is not set. "
        "Set save to a valid path.'",
    ),
    Rule(
        id="MFSDP-ASYNC-PERSISTENT-WORKER",
        severity="error",
        stage="validate",
        topic="checkpoint",
        paths=("checkpoint.use_persistent_ckpt_worker", "checkpoint.async_save"),
        when=lambda e: bool(e.get("checkpoint.async_save")) and not e.get("checkpoint.use_persistent_ckpt_worker"),
        message=lambda e: "checkpoint.async_save=true with checkpoint.use_persistent_ckpt_worker=false.",
        fix="checkpoint.use_persistent_ckpt_worker=true",
        source=f"{S.B_CFG}: CheckpointConfig.finalize: assert 'async_save requires use_persistent_ckpt_worker=True.'",
    ),
    Rule(
        id="MFSDP-ASYNC-DTENSOR-NVRX",
        severity="warning",
        stage="runtime",
        topic="checkpoint",
        paths=("checkpoint.async_save", "checkpoint.ckpt_format"),
        when=lambda e: (
            bool(e.get("checkpoint.async_save"))
            and e.get("checkpoint.ckpt_format") == "fsdp_dtensor"
            and e.get("checkpoint.save") is not None
        ),
        message=lambda e: (
            "async_save with fsdp_dtensor is asynchronous only when nvidia-resiliency-ext imports in the job; "
            "without it the shards are written synchronously and then the save fails on a bare assert, before "
            "train_state.pt and the tracker file are written (no resumable checkpoint)."
        ),
        fix="install nvidia-resiliency-ext in the job's image (NVIDIA's NeMo containers have it), "
        "or checkpoint.async_save=false",
        source=f"{SRC_B_CKPT}: save_checkpoint: 'if ckpt_cfg.async_save and HAVE_NVRX:' (else "
        "save_fsdp_dtensor_checkpoint, synchronous) then 'assert async_save_request is not None'",
    ),
    Rule(
        id="MFSDP-PRETRAINED-HF-AFTER-WRAP",
        severity="warning",
        stage="runtime",
        topic="checkpoint",
        paths=("checkpoint.pretrained_checkpoint",),
        # Without PEFT, Bridge loads checkpoint.pretrained_checkpoint after Megatron FSDP wrapped the model; for a
        # Hugging Face folder it then calls install_optimized_model_weights() on the wrapper's inner module, a
        # Float16Module, and fails (measured on an H200: benchmarks/results/raw/ckpt_migration_1xh200/
        # dense_upstream_pretrained_checkpoint_hf_into_fsdp.log). PEFT loads before the wrap (rules/peft.py).
        when=lambda e: e.fsdp and e.get("peft") is None and e.get("checkpoint.pretrained_checkpoint") is not None,
        message=lambda e: (
            f"checkpoint.pretrained_checkpoint={fmt(e.get('checkpoint.pretrained_checkpoint'))} with Megatron FSDP: "
            "if it is a Hugging Face folder, Bridge 0.6.2 fails to load it into the wrapped model "
            "(AttributeError: 'Float16Module' object has no attribute 'install_optimized_model_weights'); an "
            "fsdp_dtensor checkpoint loads. check cannot see the folder; 'mfsdp.py ckpt PATH' tells its format."
        ),
        fix="convert the Hugging Face folder first (python3 scripts/mfsdp.py convert HF_DIR DST --to fsdp_dtensor) "
        "and set checkpoint.pretrained_checkpoint=DST",
        source=f"{SRC_B_CKPT}: _load_hf_pretrained_checkpoint: 'bridge.load_hf_weights(model, hf_path=hf_dir)'; "
        "megatron/bridge/models/conversion/model_bridge.py: load_weights_hf_to_megatron: "
        "'m.module.install_optimized_model_weights()'",
    ),
    Rule(
        id="MFSDP-HF-EXPORT-DTENSOR",
        severity="error",
        stage="validate",
        topic="checkpoint",
        paths=("checkpoint.also_save_hf_checkpoint", "checkpoint.ckpt_format"),
        when=lambda e: (
            bool(e.get("checkpoint.also_save_hf_checkpoint")) and e.get("checkpoint.ckpt_format") == "fsdp_dtensor"
        ),
        message=lambda e: "checkpoint.also_save_hf_checkpoint=true cannot be combined with ckpt_format fsdp_dtensor.",
        fix="checkpoint.also_save_hf_checkpoint=false (convert to HF offline from the fsdp_dtensor checkpoint)",
        source=f'{S.B_CFG}: CheckpointConfig.finalize: ValueError "also_save_hf_checkpoint=True is not supported '
        "together with ckpt_format='fsdp_dtensor'.\"",
    ),
    Rule(
        id="MFSDP-HF-EXPORT-LOCAL",
        severity="error",
        stage="validate",
        topic="checkpoint",
        paths=("checkpoint.non_persistent_ckpt_type", "checkpoint.also_save_hf_checkpoint"),
        when=lambda e: (
            bool(e.get("checkpoint.also_save_hf_checkpoint"))
            and e.get("checkpoint.non_persistent_ckpt_type") == "local"
        ),
        message=lambda e: "checkpoint.also_save_hf_checkpoint=true with non_persistent_ckpt_type=local.",
        fix="checkpoint.non_persistent_ckpt_type=global (or null)",
        source=f"{S.B_CFG}: CheckpointConfig.finalize: ValueError 'also_save_hf_checkpoint=True is not compatible "
        "with local non-persistent checkpoints.'",
    ),
    Rule(
        id="MFSDP-HF-EXPORT-SOURCE",
        severity="error",
        stage="validate",
        topic="checkpoint",
        paths=("checkpoint.hf_source_path", "checkpoint.also_save_hf_checkpoint"),
        when=lambda e: (
            bool(e.get("checkpoint.also_save_hf_checkpoint"))
            and not e.get("checkpoint.hf_source_path")
            and not raw_get(e.cfg, "model.hf_model_id")
            and not raw_get(e.cfg, "tokenizer.tokenizer_model")
        ),
        message=lambda e: (
            "checkpoint.also_save_hf_checkpoint=true but no HF source: hf_source_path, model.hf_model_id "
            "and tokenizer.tokenizer_model are all unset."
        ),
        fix="checkpoint.hf_source_path=<HF model id or local HF folder>",
        source=f"{S.B_CFG}: ConfigContainer._validate_hf_checkpoint_export_source: ValueError "
        "'also_save_hf_checkpoint=True requires an HF source to template config/tokenizer files.'",
    ),
    Rule(
        id="MFSDP-CKPT-NO-GLOO",
        severity="error",
        stage="validate",
        topic="checkpoint",
        paths=("checkpoint.ckpt_format", "dist.use_gloo_process_groups"),
        when=lambda e: (
            not e.get("dist.use_gloo_process_groups")
            and e.dist_opt
            and e.get("checkpoint.ckpt_format") not in DIST_CKPT_FORMATS
        ),
        message=lambda e: (
            f"dist.use_gloo_process_groups=false with the distributed optimizer"
            f"{' (forced by Megatron FSDP)' if e.fsdp else ''} and ckpt_format "
            f"{fmt(e.get('checkpoint.ckpt_format'))}: legacy checkpointing needs Gloo."
        ),
        fix="checkpoint.ckpt_format=fsdp_dtensor (Megatron FSDP) or torch_dist",
        source=f"{SRC_VALIDATE}: assert \"Legacy checkpointing requires ckpt_format='torch_dist' or 'fsdp_dtensor'\"",
    ),
]
