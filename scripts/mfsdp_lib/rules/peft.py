"""PEFT (LoRA, DoRA) rules: the pretrained checkpoint that PEFT loads, and how the base model is built.

Bridge's PEFT path builds the base model, then its pre-wrap hook loads the pretrained weights
(``checkpoint.pretrained_checkpoint``) *before* the model is wrapped by Megatron FSDP, using the
config's ``checkpoint.ckpt_format`` for a checkpoint root. That is why the format of that folder
and meta-device initialisation matter here.

One ``Rule`` per constraint; the fields are explained in ``rules/model.py``.
"""

from __future__ import annotations

from .. import schema as S
from .context import SRC_B_CKPT, SRC_B_PROVIDER, fmt
from .model import Rule


def _peft(e) -> bool:
    return e.get("peft") is not None


RULES: list[Rule] = [
    Rule(
        id="MFSDP-PEFT-NEEDS-PRETRAINED",
        severity="error",
        stage="validate",
        topic="peft",
        paths=("checkpoint.pretrained_checkpoint",),
        when=lambda e: _peft(e) and e.get("checkpoint.pretrained_checkpoint") is None,
        message=lambda e: (
            "a peft section (LoRA/DoRA) with checkpoint.pretrained_checkpoint=null: NVIDIA's PEFT recipes ship "
            "it unset, and validate() refuses them until it points at the base model."
        ),
        fix="checkpoint.pretrained_checkpoint=<Hugging Face model folder, or an fsdp_dtensor checkpoint>",
        source=f"{S.B_CFG}: ConfigContainer.validate (line 1488): assert 'PEFT requires a pretrained checkpoint path'",
    ),
    Rule(
        id="MFSDP-PEFT-META-DEVICE",
        severity="error",
        stage="runtime",
        topic="peft",
        paths=("model.init_model_with_meta_device",),
        when=lambda e: _peft(e) and bool(e.get("model.init_model_with_meta_device")),
        message=lambda e: (
            "model.init_model_with_meta_device=true with PEFT: the base model is built on the meta device and "
            "the PEFT pre-wrap hook loads the pretrained weights into it before Megatron FSDP materialises "
            "anything, so the load crashes."
        ),
        fix="model.init_model_with_meta_device=false",
        source=f"{SRC_B_PROVIDER}: get_model (line 649): builds the model under torch.device meta, then (line 660) runs the "
        "pre-wrap hooks '_model = hook(model)' before wrapping (megatron/bridge/training/setup.py, line 628: "
        "the PEFT hook calls '_load_checkpoint_from_path')",
    ),
    Rule(
        id="MFSDP-PEFT-PRETRAINED-FORMAT",
        severity="warning",
        stage="runtime",
        topic="peft",
        paths=("checkpoint.pretrained_checkpoint", "checkpoint.ckpt_format"),
        when=lambda e: (
            e.fsdp
            and _peft(e)
            and e.get("checkpoint.pretrained_checkpoint") is not None
            and e.get("checkpoint.ckpt_format") == "fsdp_dtensor"
        ),
        message=lambda e: (
            f"PEFT with Megatron FSDP loads checkpoint.pretrained_checkpoint="
            f"{fmt(e.get('checkpoint.pretrained_checkpoint'))} as ckpt_format fsdp_dtensor: a torch_dist "
            "checkpoint there (what Bridge's HF import writes) fails the format assert at load; a Hugging Face "
            "folder or an fsdp_dtensor checkpoint loads."
        ),
        fix="point checkpoint.pretrained_checkpoint at the Hugging Face model folder (or convert the base "
        "checkpoint to fsdp_dtensor); 'mfsdp.py ckpt PATH' tells which format a folder holds",
        source=f"{SRC_B_CKPT}: _load_base_checkpoint (line 3632): assert \"Checkpoint format '{{ckpt_format}}' from "
        f'config differs from inferred format"; {SRC_B_CKPT}: _load_checkpoint_from_path (line 2670): '
        "'if is_hf_checkpoint_dir(load_dir):' (Hugging Face folders take their own path)",
    ),
]
