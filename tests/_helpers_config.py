"""Helpers for the config and rule tests: reading dataclass facts out of the real wheels with ``ast``.

Bridge and Megatron-Core cannot be imported here (CUDA, Transformer Engine), so the
tests parse their sources: a dataclass body's annotated assignments give the field
names, annotations and defaults; string constants give the assert messages that the
rule table quotes.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

FACTORY_LITERALS: dict[str, object] = {"dict": {}, "list": []}


def wheel_file(bridge_src: Path, mcore_src: Path, rel: str) -> Path:
    """Site-packages-relative path -> file in the unpacked wheel that ships it."""
    root = bridge_src if rel.startswith("megatron/bridge/") else mcore_src
    return root / rel


@cache
def parse(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"))


def find_class(path: Path, name: str) -> ast.ClassDef | None:
    for node in parse(str(path)).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


class NoDefault:
    """The field is declared without a default."""


class Unevaluable:
    def __init__(self, src: str):
        self.src = src

    def __repr__(self) -> str:
        return f"Unevaluable({self.src})"


def _default_of(value: ast.expr):
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
        for kw in value.keywords:
            if kw.arg == "default":
                return _literal(kw.value)
            if kw.arg == "default_factory":
                name = getattr(kw.value, "id", None)
                if name in FACTORY_LITERALS:
                    return FACTORY_LITERALS[name]
                return Unevaluable(ast.unparse(kw.value))
        return NoDefault()
    return _literal(value)


def _literal(node: ast.expr):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return Unevaluable(ast.unparse(node))


def class_fields(path: Path, name: str) -> dict:
    """{field: (annotation source, default)} of a dataclass body (NoDefault when none)."""
    cls = find_class(path, name)
    if cls is None:
        raise LookupError(f"class {name} not in {path}")
    out = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            ann = ast.unparse(stmt.annotation)
            if ann.startswith("ClassVar"):
                continue
            out[stmt.target.id] = (ann, NoDefault() if stmt.value is None else _default_of(stmt.value))
    return out


def literal_choices(annotation: str) -> tuple | None:
    m = re.search(r"Literal\[([^\]]*)\]", annotation)
    if not m:
        return None
    return tuple(ast.literal_eval("(" + m.group(1) + ",)"))


def field_docstring(path: Path, cls_name: str, field_name: str) -> str:
    """The string literal right after a field's declaration (its docstring), or ''."""
    cls = find_class(path, cls_name)
    assert cls is not None, f"{path}: no class {cls_name}"
    body = cls.body
    for stmt, after in zip(body, body[1:], strict=False):  # each statement with the one after it
        if (
            isinstance(stmt, ast.AnnAssign)
            and getattr(stmt.target, "id", None) == field_name
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
        ):
            return str(after.value.value)
    return ""


@cache
def string_constants(path: str) -> tuple[str, ...]:
    """Every string constant (implicit concatenation joined; f-strings with {expr})."""
    out = []
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                if isinstance(v, ast.Constant):
                    parts.append(str(v.value))
                elif isinstance(v, ast.FormattedValue):
                    parts.append("{" + ast.unparse(v.value) + "}")
            out.append("".join(parts))
    return tuple(out)


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def text_in_source(path: Path, quote: str) -> bool:
    """Is ``quote`` an assert/raise message (string constant) or a literal line of code in the file?"""
    q = squash(quote)
    if any(q in squash(s) for s in string_constants(str(path))):
        return True
    return q in squash(path.read_text(encoding="utf-8"))
