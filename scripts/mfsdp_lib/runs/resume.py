"""What ``check`` says about the checkpoint a config resumes from, read as ``mfsdp.py ckpt`` reads it.

Why: the format a job loads is decided by the folder, not the config. Bridge 0.6.2 reads the
checkpoint it resumes from (``checkpoint.load``; ``checkpoint.pretrained_checkpoint`` when ``load``
holds none) and asserts that ``checkpoint.ckpt_format`` is the format it finds there
(``megatron/bridge/training/checkpointing.py``: ``_load_base_checkpoint``: "Checkpoint format '...'
from config differs from inferred format '...'"). A config that is right by every rule still fails
there, after the job has queued and started, when the folder was saved in another format: the
commonest case is a ``torch_dist`` checkpoint resumed after Megatron FSDP was switched on.

Only a folder that exists on this machine is read, with ``checkpoints.inspect`` (metadata files
only, nothing unpickled); a path that is not here (a cluster's file system) is not judged. A
folder with no checkpoint yet (a fresh save directory) is what Bridge starts from scratch on, and is
not judged either. Imported by ``check`` only when such a folder exists, so ``check`` stays light.
"""

from __future__ import annotations

from ..findings import Finding, InputError
from . import checkpoints

RULE = "MFSDP-CKPT-LOAD-FORMAT"
# Where Bridge compares the two formats, and its words (quoted in the finding so a user can match the log).
BRIDGE_ASSERT = (
    "megatron/bridge/training/checkpointing.py: _load_base_checkpoint: "
    "\"Checkpoint format '{cfg}' from config differs from inferred format '{found}'\""
)
# An iteration folder named directly skips that comparison, but the state dict is still built for the configured
# format and the loader is chosen by what is on disk (_load_checkpoint_from_path, _load_base_checkpoint).
DIRECT_LOAD = (
    "an iteration folder named directly skips Bridge's format comparison, but the state dict is built for the "
    "configured format and read with the loader of the one on disk (checkpointing.py: _load_checkpoint_from_path): "
    "the load fails"
)
# checkpoint.load refuses a Hugging Face folder (checkpointing.py: _load_checkpoint_from_path).
HF_LOAD_ERROR = "checkpoint.load does not support HuggingFace-format directories"


def findings(folders: list[tuple[str, str]], ckpt_format: str | None) -> list[Finding]:
    """A finding per folder whose checkpoint Bridge would refuse to load with ``ckpt_format``."""
    out: list[Finding] = []
    resumes = False
    for key, path in folders:
        if key == "checkpoint.pretrained_checkpoint" and resumes:
            continue  # Bridge reads pretrained_checkpoint only when load holds no checkpoint (load_checkpoint)
        try:
            report = checkpoints.inspect(path, expect=ckpt_format)
        except InputError:
            continue  # not a checkpoint (yet): Bridge starts from scratch there, or from pretrained_checkpoint
        resumes = resumes or key == "checkpoint.load"
        found = report.format
        if found is None or report.inspected is None:
            continue
        where = report.inspected.path
        if found == "hf":
            if key == "checkpoint.load":
                out.append(
                    Finding(
                        RULE,
                        "error",
                        key,
                        f"{key}={path} holds Hugging Face weights ({where}); Bridge raises "
                        f"'{HF_LOAD_ERROR}' (checkpointing.py: _load_checkpoint_from_path)",
                        f"checkpoint.pretrained_checkpoint={path} (and checkpoint.load=null, or a folder of native "
                        "checkpoints) to start from these weights",
                        {"folder": where, "found": found, "config": ckpt_format},
                    )
                )
            continue  # pretrained_checkpoint loads Hugging Face weights in any format
        if found == ckpt_format:
            continue
        how = next((f.fix for f in report.findings if f.rule == "MFSDP-CKPT-EXPECT"), "")
        out.append(
            Finding(
                RULE,
                "error",
                key,
                f"{key}={path} holds a {found} checkpoint ({where}, read as 'mfsdp.py ckpt' reads it) but "
                f"checkpoint.ckpt_format={ckpt_format}: "
                + (
                    "the load stops at " + BRIDGE_ASSERT.format(cfg=ckpt_format, found=found)
                    if report.kind == "root"
                    else DIRECT_LOAD
                ),
                f"{how}; or start from a fresh checkpoint directory (checkpoint.load=<an empty folder>)"
                if how
                else "convert it (mfsdp.py ckpt FOLDER says how), or start from a fresh checkpoint directory",
                {"folder": where, "found": found, "config": ckpt_format},
            )
        )
    return out
