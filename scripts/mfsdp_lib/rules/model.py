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

SEVERITIES = ("error", "warning", "info")
STAGES = ("validate", "runtime", "rewrite", "input", "advice")


class Rule:
    """A typed, immutable rule record; every field is a keyword argument.

    A plain class with ``__slots__`` rather than a dataclass: ``dataclasses`` imports
    ``inspect`` and ``typing``, which would double the start-up cost of ``check``.
    """

    __slots__ = ("id", "severity", "stage", "topic", "paths", "when", "message", "fix", "source")

    id: str
    severity: str
    stage: str
    topic: str
    paths: tuple[str, ...]
    when: Callable[[Eff], object]
    message: Callable[[Eff], str] | None
    fix: str | Callable[[Eff], str] | None
    source: str

    def __init__(
        self,
        *,
        id: str,
        severity: str,
        stage: str,
        topic: str,
        paths: tuple[str, ...],
        when: Callable[[Eff], object],
        message: Callable[[Eff], str] | None,
        fix: str | Callable[[Eff], str] | None,
        source: str,
    ) -> None:
        if severity not in SEVERITIES:
            raise ValueError(f"{id}: severity {severity!r} not in {SEVERITIES}")
        if stage not in STAGES:
            raise ValueError(f"{id}: stage {stage!r} not in {STAGES}")
        if not paths:
            raise ValueError(f"{id}: a rule names at least one key")
        values = dict(
            id=id,
            severity=severity,
            stage=stage,
            topic=topic,
            paths=tuple(paths),
            when=when,
            message=message,
            fix=fix,
            source=source,
        )
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Rule {self.id} is immutable")

    def __repr__(self) -> str:
        return f"Rule(id={self.id!r}, severity={self.severity!r}, stage={self.stage!r}, topic={self.topic!r})"


TYPE_CHECKING = False
if TYPE_CHECKING:  # for the annotations only (mypy); nothing is imported at run time
    from .context import Eff
