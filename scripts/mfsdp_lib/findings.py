"""Findings: the one shape every checking command reports in.

``check``, ``ckpt`` and ``log`` all report a list of findings, each with a stable
rule id, a severity, the dotted config ``path`` to change (or the file it is
about), a message that names the value found, and a concrete ``fix``. Keeping a
single record and a single renderer means the JSON contract
``{"ok": bool, "findings": [{"rule", "severity", "path", "message", "fix"}]}``
is the same everywhere, and tests can assert on it once.

Exit codes are shared too (``EXIT_*``): 0 no error-severity finding, 1 at least
one, 2 unusable input (raised as ``InputError`` and printed as one line).

``fix`` is prose for a person; the JSON adds ``fix_overrides`` beside it, the
``section.key=value`` overrides of the fix's first option as a list an agent can
apply (``fix_overrides``: how they are read and what is left out).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_INPUT = 2

SEVERITIES = ("error", "warning", "info")  # most to least severe; the text report keeps this order


class InputError(Exception):
    """The user's input cannot be used (missing file, bad YAML, unknown key...).

    The message must be one line that says what is wrong and, where possible,
    how to fix it; the CLI prints it on stderr and exits 2.
    """


def oserror_to_input(path: str, exc: OSError, doing: str = "") -> InputError:
    """One line for a file-system error on the user's PATH (shared by every command that reads files).

    ``doing`` says what was attempted ("cannot list the folder"); the message names the cause in words a
    user acts on (missing, broken link, loop, permission) rather than an errno.
    """
    import errno
    import os

    if isinstance(exc, FileNotFoundError):
        if os.path.islink(path):
            return InputError(f"{path}: broken symbolic link")
        return InputError(f"{path}: no such file or folder")
    if isinstance(exc, PermissionError):
        return InputError(f"{path}: permission denied" + (f" ({doing})" if doing else ""))
    if exc.errno == errno.ELOOP:
        return InputError(f"{path}: symbolic link loop")
    what = exc.strerror or str(exc)
    return InputError(f"{path}: {doing} ({what})" if doing else f"{path}: {what}")


class Finding:
    """One problem found, with its fix.

    A plain class rather than a dataclass: ``dataclasses`` imports ``inspect``, which alone
    costs about half an interpreter start-up, and ``check`` must start fast.
    """

    __slots__ = ("rule", "severity", "path", "message", "fix", "extra")

    def __init__(self, rule: str, severity: str, path: str, message: str, fix: str, extra: dict | None = None):
        if severity not in SEVERITIES:
            raise ValueError(f"bad severity {severity!r}")
        self.rule = rule  # stable id, e.g. "MFSDP-CKPT-FORMAT"; never reused for another meaning
        self.severity = severity  # one of SEVERITIES
        # dotted config key (``checkpoint.ckpt_format``), env var (``env.CUDA_DEVICE_MAX_CONNECTIONS``) or file
        self.path = path
        self.message = message  # names the value found
        self.fix = fix  # a concrete change, ideally a ``key=value`` the user can paste
        self.extra: dict = {} if extra is None else extra  # machine-readable details (source anchor, values)

    def _key(self) -> tuple:
        return (self.rule, self.severity, self.path, self.message, self.fix, self.extra)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Finding) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return "Finding(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"

    def to_dict(self) -> dict:
        import copy

        d: dict[str, object] = {
            "rule": self.rule,
            "severity": self.severity,
            "path": self.path,
            "message": self.message,
            "fix": self.fix,
        }
        d["fix_overrides"] = fix_overrides(self.fix)
        d.update({k: copy.deepcopy(v) for k, v in self.extra.items() if k not in d})
        return d


# Where a fix's first option ends: "A (or B)", "A, or B", "A or B", "A; B", "A. B", "A (else B)", "A, then B".
_ALTERNATIVE_RE = re.compile(r"\s*\((?:or|else)\b|,\s*or\s|\s+or\s+|;\s|\.\s+(?=[A-Z])")
_CHOOSE_ONE = "choose one:"
# One override word: section.key[.sub...]=VALUE, or a whole section given a preset (mixed_precision=bf16_mixed).
_OVERRIDE_RE = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)=(\S+)$")
# Values that stand for something the user chooses: <HF model id>, /path/to/checkpoints, DST, N.
_PLACEHOLDER_RE = re.compile(r"<|^/path/to/|^[A-Z][A-Z0-9_]*$")
_WRAPPERS = "`'\"(["
_TRAILERS = "`'\"),;:."


def fix_overrides(fix: str | None) -> list[str]:
    """The overrides a fix's first option sets, as ``section.key=value`` strings an agent can apply.

    Field-scoped: a word counts only when it is a whole ``key=value`` word whose first part is a section of
    Bridge's ConfigContainer (``schema.CONTAINER_KEYS``); alternatives after the first ("(or ...)", ", or ...",
    "; ...") and placeholder values (``<...>``, ``/path/to/...``, ``DST``, ``N``) are left out, so ``[]`` means
    the fix is not a set of overrides (a command to run, a file to restore): read ``fix``.
    """
    if not fix:
        return []
    from .schema import CONTAINER_KEYS

    text = fix.strip()
    if text.lower().startswith(_CHOOSE_ONE):
        text = text[len(_CHOOSE_ONE) :]
    first = _ALTERNATIVE_RE.split(text, maxsplit=1)[0]
    out: list[str] = []
    for word in first.split():
        word = word.lstrip(_WRAPPERS)
        if word.endswith("]") and "[" in word:  # a list value keeps its brackets: model.offload_modules=[a,b]
            word = word.rstrip(_TRAILERS.replace(")", ""))
        else:
            word = word.rstrip(_TRAILERS)
        m = _OVERRIDE_RE.match(word)
        if not m or m.group(1).split(".")[0] not in CONTAINER_KEYS or _PLACEHOLDER_RE.search(m.group(2)):
            continue
        if word not in out:
            out.append(word)
    return out


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


def exit_code(findings: Iterable[Finding]) -> int:
    return EXIT_FINDINGS if has_errors(findings) else EXIT_OK


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: (order[f.severity], f.path, f.rule))


def render_text(findings: list[Finding], header: str = "", out=None) -> None:
    """Human report: a header line, then one block per finding, most severe first."""
    out = out or sys.stdout
    if header:
        out.write(header.rstrip() + "\n")
    if not findings:
        out.write("no findings\n")
        return
    for f in sort_findings(findings):
        out.write(f"{f.severity.upper():7} {f.rule}  {f.path}\n")
        out.write(f"        {f.message}\n")
        if f.fix:
            out.write(f"        fix: {f.fix}\n")
    counts = {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}
    out.write(", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts.items()) + "\n")


def render_json(findings: list[Finding], out=None, **extra) -> None:
    """Exactly one JSON object on stdout: {"ok", "findings", **extra}."""
    out = out or sys.stdout
    obj = {"ok": not has_errors(findings), "findings": [f.to_dict() for f in sort_findings(findings)]}
    obj.update(extra)
    import json  # only for --format json: text output (the common case) starts without it

    out.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")
