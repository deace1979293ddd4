"""Optimizer rules: which optimizers Megatron FSDP can drive.

Megatron FSDP hands the optimizer its own sharded parameter groups (``get_megatron_optimizer``'s
``if ddp_config.use_megatron_fsdp:`` branch). Adam and SGD go through it; the emerging optimizers
(Muon, distributed Muon, SOAP, Lion through ``_get_megatron_emerging_optimizer``) do not, and fail
at optimizer construction or at the first step.

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
            f"{kv(e, 'optimizer.optimizer')} with Megatron FSDP: only Adam and SGD run on its sharded "
            "parameters; Muon and distributed Muon fail at optimizer construction or at the first step."
        ),
        fix="optimizer.optimizer=adam (or keep this optimizer with the distributed optimizer and no Megatron FSDP)",
        source=f'{SRC_MLM_ARGS}: validate_args (line 1127): assert "Megatron-FSDP does not support the" '
        "optimizer (the Megatron-LM launcher check allows sgd and adam only); "
        "megatron/core/optimizer/__init__.py: get_megatron_optimizer (line 1039): "
        "'return _get_megatron_emerging_optimizer(' (no Megatron FSDP branch)",
    ),
]
