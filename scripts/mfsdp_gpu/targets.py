"""Values an override names but cannot spell as a scalar: the floor both ``args`` (which parses them) and
``bridge`` (which sets them on the config, with torch loaded) import. Pure Python, no torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TorchTarget:
    """``{_target_: torch.NAME, _call_: false}``: the object ``torch.NAME`` itself, uncalled.

    The form Bridge's own YAML dumper writes for a dtype, which Bridge's override path instantiates into the
    dtype (megatron/bridge/training/utils/omegaconf_utils.py :: _apply_overrides, its ``_target_`` branch).
    A dtype field whose default is None needs it: given as a string (``fp32``), the value reaches Megatron
    FSDP's mixed-precision policy as text and the model wrap fails. Kept torch-free here; the engine
    resolves it when it sets the field (``bridge.set_dotted``)."""

    name: str
