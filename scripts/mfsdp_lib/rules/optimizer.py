"""Optimizer rules: which optimizers Megatron FSDP can drive.

Megatron FSDP hands the optimizer its own sharded parameter groups (``get_megatron_optimizer``'s
``if ddp_config.use_megatron_fsdp:`` branch). Adam and SGD go through it. The emerging optimizers
(Muon, distributed Muon, SOAP, Lion) return earlier through ``_get_megatron_emerging_optimizer``,
which has no Megatron FSDP branch and no guard: nothing in megatron-core 0.19.2 or Bridge 0.6.2
refuses them. For Muon and adaptive Muon the outcome is measured: that builder wraps them (bf16) in
``Float16OptimizerWithFloat16Params``, whose ``_copy_model_grads_to_main_grads`` reads each
parameter's ``main_grad``; Megatron FSDP's parameters are DTensors without one, so the first optimizer
step raises ``AttributeError: 'DTensor' object has no attribute 'main_grad'`` (a one-GPU rehearsal as
rank 0 of 8 on an H200; the same job under the distributed optimizer trains). The layer-wise
``dist_muon``, SOAP and Lion are not measured. Megatron-LM's own launcher refuses all of them
(``validate_args``); Bridge does not run that check.

One ``Rule`` per constraint; the fields are explained in ``rules/model.py``.
"""

from __future__ import annotations

from .context import SRC_MLM_ARGS, kv
from .model import Rule

# What Megatron-LM's argument check allows with Megatron FSDP.
FSDP_OPTIMIZERS = ("adam", "sgd")
# Wrapped in Float16OptimizerWithFloat16Params by _get_megatron_emerging_optimizer when not layer-wise:
# the first step fails on FSDP's DTensor parameters (measured for muon; adaptive_muon takes the same branch).
MAIN_GRAD_OPTIMIZERS = ("muon", "adaptive_muon")


def _optimizer_message(e) -> str:
    opt = e.get("optimizer.optimizer")
    head = (
        f"{kv(e, 'optimizer.optimizer')} with Megatron FSDP: only Adam and SGD go through its sharded parameter path. "
    )
    if opt in MAIN_GRAD_OPTIMIZERS:
        return head + (
            "The first optimizer step fails: megatron-core wraps Muon in Float16OptimizerWithFloat16Params, which "
            "reads each parameter's main_grad, and Megatron FSDP's DTensor parameters have none "
            "(AttributeError: 'DTensor' object has no attribute 'main_grad'; Bridge does not check it earlier)."
        )
    return head + (
        "Megatron-LM's launcher refuses other optimizers; Bridge does not check, and what this one does on "
        "sharded parameters is unverified (it may fail or update each shard on its own)."
    )


RULES: list[Rule] = [
    Rule(
        id="MFSDP-OPTIMIZER-UNSUPPORTED",
        severity="error",
        stage="runtime",
        topic="optimizer",
        paths=("optimizer.optimizer",),
        when=lambda e: e.fsdp and e.get("optimizer.optimizer") not in FSDP_OPTIMIZERS,
        message=_optimizer_message,
        fix="optimizer.optimizer=adam (or keep this optimizer with the distributed optimizer and no Megatron FSDP)",
        source=f'{SRC_MLM_ARGS}: validate_args: assert "Megatron-FSDP does not support the" '
        "optimizer (the Megatron-LM launcher check allows sgd and adam only; Bridge does not run it); "
        "megatron/core/optimizer/__init__.py: get_megatron_optimizer: "
        "'return _get_megatron_emerging_optimizer(' (before its 'if ddp_config.use_megatron_fsdp:' branch; "
        "no guard in _get_megatron_emerging_optimizer, which wraps Muon in "
        "'optimizer = Float16OptimizerWithFloat16Params('); megatron/core/optimizer/optimizer.py: "
        "Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads: 'model_param.grad = model_param.main_grad'",
    ),
]
