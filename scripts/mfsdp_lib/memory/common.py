"""Units, dtype sizes and forgiving config access shared by the memory model.

Standard library only: this runs inside the agent's own interpreter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, overload

GIB = 1024**3


# Bytes per element for every dtype spelling a Bridge config can carry
# (``torch.bfloat16``, ``{_target_: torch.float32}``, ``bf16``, ``fp32`` ...).
DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8": 1,
    "fp8": 1,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

FP32 = 4
ADAM_STATES = 2  # exp_avg and exp_avg_sq (optimizer 'adam', the Bridge default)


DEFAULT_MICRO_BATCH = 1


class ModelError(ValueError):
    """The model description cannot be used; the message says which field and why."""


# --------------------------------------------------------------------------- config access


def _get(cfg: Mapping | None, dotted: str, default=None):
    """``cfg['a']['b']`` for ``'a.b'``; ``default`` when any level is missing or None."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def _first(cfg, paths: Iterable[str], default=None):
    for p in paths:
        v = _get(cfg, p)
        if v is not None:
            return v
    return default


@overload
def dtype_bytes(value: Any, default: int) -> int: ...
@overload
def dtype_bytes(value: Any, default: None = None) -> int | None: ...
def dtype_bytes(value, default: int | None = None) -> int | None:
    """Bytes per element of a dtype as a Bridge config spells it; ``default`` for None.

    Accepts ``torch.bfloat16``, ``bfloat16``, ``bf16``, a ``{_target_: torch.float32}``
    mapping (how ``ConfigContainer.to_yaml`` writes dtypes) and the torch dtype's repr.
    """
    if value is None:
        return default
    if isinstance(value, Mapping):
        return dtype_bytes(value.get("_target_"), default)
    name = str(value).strip().lower()
    if name in ("none", "null", ""):
        return default
    name = name.rsplit(".", 1)[-1]
    if name not in DTYPE_BYTES:
        raise ModelError(f"unknown dtype {value!r} (expected one of bf16, fp16, fp32, fp8)")
    return DTYPE_BYTES[name]


def _positive(value, name: str, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ModelError(f"{name} must be {what}, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ModelError(f"{name} must be positive, got {value!r}")
    return number


def _bool(value, default: bool = False) -> bool:
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


@overload
def _int(value: Any, name: str, *, minimum: int = 1, default: int) -> int: ...
@overload
def _int(value: Any, name: str, *, minimum: int = 1, default: None = None) -> int | None: ...
def _int(value, name: str, *, minimum: int = 1, default: int | None = None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool):
        raise ModelError(f"{name} must be an integer, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ModelError(f"{name} must be an integer, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):
        raise ModelError(f"{name} must be an integer, got {value!r}")
    if int(number) < minimum:
        raise ModelError(f"{name} must be >= {minimum}, got {value!r}")
    return int(number)
