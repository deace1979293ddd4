"""Optimizer rules: which optimizers Megatron FSDP can drive.

Megatron FSDP hands the optimizer its own sharded parameter groups (``get_megatron_optimizer``'s
``if ddp_config.use_megatron_fsdp:`` branch). Adam and SGD go through it. The emerging optimizers
(Muon, distributed Muon, SOAP, Lion) return earlier through ``_get_megatron_emerging_optimizer``,
which has no Megatron FSDP branch and no guard: nothing in megatron-core 0.19.2 or Bridge 0.6.2
refuses them, and what they do with FSDP's sharded parameters is not decided by the source
(unverified: an error, or Muon orthogonalising each rank's shard instead of the whole matrix).
Megatron-LM's own launcher refuses them (``validate_args``), Bridge does not run that check. The
rule stays an error: an unsupported combination must be proved before a long run, not found in one.

One ``Rule`` per constraint; the fields are explained in ``rules/model.py``.
"""

from __future__ import annotations

from .context import SRC_MLM_ARGS, kv
from .model import Rule

# What Megatron-LM's argument check allows with Megatron FSDP.
FSDP_OPTIMIZERS = ("adam", "sgd")

RULES: list[Rule] = [
    Rule(
        id="MFSDP-OPTIMIZER-UNSUPPORTED",
        severity="error",
        stage="runtime",
        topic="optimizer",
        paths=("optimizer.optimizer",),
        when=lambda e: e.fsdp and e.get("optimizer.optimizer") not in FSDP_OPTIMIZERS,
        message=lambda e: (
            f"{kv(e, 'optimizer.optimizer')} with Megatron FSDP: only Adam and SGD go through its sharded "
            "parameter path. Megatron-LM's launcher refuses other optimizers; Bridge does not check, and what "
            "Muon does on sharded parameters is unverified (it may fail or update each shard on its own)."
        ),
        fix="optimizer.optimizer=adam (or keep this optimizer with the distributed optimizer and no Megatron FSDP)",
        source=f'{SRC_MLM_ARGS}: validate_args: assert "Megatron-FSDP does not support the" '
        "optimizer (the Megatron-LM launcher check allows sgd and adam only; Bridge does not run it); "
        "megatron/core/optimizer/__init__.py: get_megatron_optimizer: "
        "'return _get_megatron_emerging_optimizer(' (before its 'if ddp_config.use_megatron_fsdp:' branch; "
        "no guard in _get_megatron_emerging_optimizer)",
    ),
]
