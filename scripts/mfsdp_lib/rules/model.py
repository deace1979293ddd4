"""The rule record: one Megatron FSDP constraint, with keyword fields.

A rule is data plus two small functions over an ``Eff`` view (``context.Eff``):

* ``id``        stable, never reused for another meaning (``MFSDP-CKPT-FORMAT``);
* ``severity``  error / warning / info (see ``findings.SEVERITIES``);
* ``stage``     where the real stack acts on it:
                ``validate`` - Bridge's ``runtime_config_update()`` raises (the differential
                test holds us to Bridge's verdict on these);
                ``runtime``  - Bridge accepts the config, the job fails later (model wrap,
                first step); documented exceptions in the differential test;
                a rule is ``runtime`` only when the failing assert is on the path every
                such job takes (read the code before and after it: Megatron FSDP, for one,
                forces ``fsdp_double_buffer`` itself before its NCCL-UB assert);
                ``rewrite``  - Bridge silently changes the value; we say so;
                ``input``    - a value Bridge accepts silently but is wrong (misspelt enum);
                ``advice``   - a performance / robustness recommendation;
* ``topic``     the module of ``mfsdp_lib.rules`` that holds it (core, checkpoint, ...);
* ``paths``     the dotted keys involved; the first one is what the user should change;
* ``when``      predicate over an ``Eff`` view; truthy means the rule fires. It may return
                a list of ``(path, message, fix)`` instead, one finding each (rules over
                many keys, such as MFSDP-ENUM);
* ``message``   callable giving one sentence that names the value found;
* ``fix``       a concrete change, a ``key=value`` where possible (a string, or a callable
                over ``Eff`` when the fix depends on the values found);
* ``source``    ``file: symbol: 'assert message'`` in the real wheels (site-packages relative).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SEVERITIES = ("error", "warning", "info")
STAGES = ("validate", "runtime", "rewrite", "input", "advice")


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    stage: str
    topic: str
    paths: tuple[str, ...]
    when: Callable[[Any], Any]
    message: Callable[[Any], str] | None
    fix: str | Callable[[Any], str] | None
    source: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.id}: severity {self.severity!r} not in {SEVERITIES}")
        if self.stage not in STAGES:
            raise ValueError(f"{self.id}: stage {self.stage!r} not in {STAGES}")
        if not self.paths:
            raise ValueError(f"{self.id}: a rule names at least one key")
