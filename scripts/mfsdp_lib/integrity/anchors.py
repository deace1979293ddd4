"""Code anchors: how SKILL.md and references/ cite Megatron code, and checking them.

Why: advice that says "see config.py line 1533" rots with the next release (that
is exactly how NVIDIA's own version of this skill went stale). An anchor here
names *what* is cited - a function, class, dataclass field or the text of an
assertion - so it can be found again in any version, and checked mechanically.

Citation syntax (the only one this module reads; write anchors exactly so):

    `megatron/bridge/training/config.py` :: `ConfigContainer.validate`
    `megatron/bridge/training/config.py` :: "Megatron-FSDP requires the fsdp_dtensor checkpointing format!"

* the file is the path inside the installed distribution, in backticks, starting
  with ``megatron/bridge/`` (megatron-bridge) or ``megatron/core/`` or
  ``megatron/training/`` (megatron-core; see ``sources.PACKAGE_PREFIXES``);
* then `` :: `` (spaces and one line break around it are fine, so a citation
  may wrap in the markdown source);
* then either a *symbol* in backticks - a dotted path through module-level and
  class-level definitions: ``function``, ``Class``, ``Class.method``,
  ``Class.field`` (an annotated or plain assignment in the class body) or a
  module-level ``CONSTANT`` - found with ``ast``;
* or a *message* in double quotes: the text of a string literal in that file
  (whitespace-normalised; implicitly concatenated literals count as one; in an
  f-string each ``{expression}`` is written as in the source, e.g.
  ``"... differs from inferred format '{inferred_ckpt_format}' ..."``). A message
  ending in ``...`` matches any literal that starts with the text before it, for
  long messages. Messages cannot contain a double quote.

Bare line numbers are never cited; ``anchors`` reports the current line range.

Checking: each anchor is looked up in its file. Found -> status ``found`` with
the line range of the definition or literal. Not found -> ``drifted``, with the
nearest match: the same symbol/message in another file of the same
distribution (it moved), else the closest name or literal in the cited file
(``difflib``, it was renamed or reworded), else the closest file path (the file
moved or was renamed).
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..integrity import sources as _sources

ANCHOR_RE = re.compile(
    r"`(?P<file>megatron/[A-Za-z0-9_./-]+\.py)`\s*::\s*"
    r"(?:`(?P<symbol>[A-Za-z_][A-Za-z0-9_.]*)`|\"(?P<message>[^\"\n]+)\")"
)
# A citation of a Megatron file by line number (``config.py:1533``), which this
# skill never uses; tests fail on it so none creeps back in.
BARE_LINE_RE = re.compile(r"megatron/[A-Za-z0-9_./-]+\.py:\d+")
PREFIX_MARK = "..."
# difflib cut-offs: below these, a "nearest match" is noise and is not shown.
NAME_CUTOFF = 0.6
MESSAGE_CUTOFF = 0.6
PATH_CUTOFF = 0.5


@dataclass
class Anchor:
    file: str
    symbol: str  # the symbol, or the message text for kind == "message"
    kind: str  # "symbol" or "message"
    cited_in: list[str] = field(default_factory=list)  # "SKILL.md:42", ...
    status: str = "unchecked"  # "found", "drifted", "unchecked"
    lines: list[int] | None = None
    source: str | None = None  # "bridge" or "mcore"
    nearest: dict | None = None
    note: str = ""

    def key(self):
        return (self.file, self.kind, self.symbol)

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "symbol": self.symbol,
            "kind": self.kind,
            "status": self.status,
            "lines": self.lines,
            "source": self.source,
            "cited_in": self.cited_in,
            "nearest": self.nearest,
            "note": self.note,
        }


def _norm(text: str) -> str:
    return " ".join(text.split())


def extract(text: str, where: str = "") -> list[Anchor]:
    """Every anchor cited in one markdown text, in order (duplicates kept)."""
    out = []
    for m in ANCHOR_RE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        if m.group("symbol") is not None:
            a = Anchor(m.group("file"), m.group("symbol"), "symbol")
        else:
            a = Anchor(m.group("file"), _norm(m.group("message")), "message")
        a.cited_in.append(f"{where}:{line}" if where else str(line))
        out.append(a)
    return out


def doc_files(skill_dir: str | Path) -> list[Path]:
    """The documents whose anchors are checked: SKILL.md and references/*.md."""
    skill_dir = Path(skill_dir)
    docs = [skill_dir / "SKILL.md"] if (skill_dir / "SKILL.md").is_file() else []
    ref = skill_dir / "references"
    if ref.is_dir():
        docs.extend(sorted(p for p in ref.glob("*.md") if p.is_file()))
    return docs


def collect(skill_dir: str | Path) -> list[Anchor]:
    """All distinct anchors of the skill, each with every place it is cited."""
    skill_dir = Path(skill_dir)
    merged: dict = {}
    for doc in doc_files(skill_dir):
        rel = doc.relative_to(skill_dir).as_posix()
        for a in extract(doc.read_text(encoding="utf-8", errors="replace"), rel):
            if a.key() in merged:
                merged[a.key()].cited_in.extend(a.cited_in)
            else:
                merged[a.key()] = a
    return list(merged.values())


# ---------------------------------------------------------------- source index


class FileIndex:
    """What one Python file defines (qualified names) and says (string literals)."""

    def __init__(self, text: str):
        self.symbols: dict[str, tuple[int, int]] = {}
        self.literals: list[tuple[str, int, int]] = []
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return
        self._walk(tree.body, "")
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                self.literals.append((_norm(node.value), node.lineno, node.end_lineno or node.lineno))
            elif isinstance(node, ast.JoinedStr):
                self.literals.append((_norm(_render_fstring(node)), node.lineno, node.end_lineno or node.lineno))

    def _walk(self, body, prefix: str) -> None:
        for node in body:
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            for name in names:
                self.symbols.setdefault(prefix + name, (node.lineno, node.end_lineno or node.lineno))
            if isinstance(node, ast.ClassDef):
                self._walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.If, ast.Try)):  # definitions under `if HAVE_X:` / `try:`
                self._walk(node.body, prefix)
                self._walk(getattr(node, "orelse", []), prefix)

    def find_symbol(self, symbol: str):
        return self.symbols.get(symbol)

    def find_message(self, message: str):
        prefix = message.endswith(PREFIX_MARK)
        want = message[: -len(PREFIX_MARK)].rstrip() if prefix else message
        for text, start, end in self.literals:
            if text.startswith(want) if prefix else text == want:
                return (start, end)
        return None


def _render_fstring(node: ast.JoinedStr) -> str:
    parts = []
    for v in node.values:
        if isinstance(v, ast.Constant):
            parts.append(str(v.value))
        elif isinstance(v, ast.FormattedValue):
            parts.append("{" + ast.unparse(v.value) + "}")
    return "".join(parts)


def _longest_token(message: str) -> str:
    words = re.findall(r"[A-Za-z0-9_]{4,}", message.replace(PREFIX_MARK, ""))
    return max(words, key=len) if words else ""


class Checker:
    """Checks anchors against located sources, parsing each file at most once."""

    def __init__(self, srcs: dict):
        self.srcs = srcs  # 'bridge'/'mcore' -> sources.Source
        self._index: dict = {}

    def index(self, src, path: str) -> FileIndex | None:
        key = (src.which, path)
        if key not in self._index:
            text = src.read_text(path)
            self._index[key] = FileIndex(text) if text is not None else None
        return self._index[key]

    def check(self, a: Anchor) -> Anchor:
        which = _sources.owner_of(a.file)
        a.source = which
        if which is None:
            a.status, a.note = "drifted", "no Megatron distribution ships this path"
            return a
        src = self.srcs.get(which)
        if src is None:
            a.status, a.note = "unchecked", f"{_sources.DISTRIBUTIONS[which]} source not located"
            return a
        idx = self.index(src, a.file)
        hit = None
        if idx is not None:
            hit = idx.find_symbol(a.symbol) if a.kind == "symbol" else idx.find_message(a.symbol)
        if hit:
            a.status, a.lines = "found", [hit[0], hit[1]]
            return a
        a.status = "drifted"
        moved = self._search_elsewhere(src, a)
        if moved:
            a.nearest, a.note = moved, "moved to another file"
        elif idx is not None:
            a.nearest = self._closest_in_file(idx, a)
            a.note = "not in this file" + ("; closest shown" if a.nearest else "")
        else:
            close = difflib.get_close_matches(a.file, src.python_files(), n=1, cutoff=PATH_CUTOFF)
            a.nearest = {"file": close[0], "symbol": None, "lines": None} if close else None
            a.note = "file not found" + ("; closest path shown" if close else "")
        return a

    def _search_elsewhere(self, src, a: Anchor) -> dict | None:
        if a.kind == "symbol":
            last = a.symbol.rsplit(".", 1)[-1]
            probe = re.compile(rf"(\bdef|\bclass)\s+{re.escape(last)}\b|^\s*{re.escape(last)}\s*[:=]", re.M)
        else:
            token = _longest_token(a.symbol)
            if not token:
                return None
            probe = re.compile(re.escape(token))
        for path in src.python_files():
            if path == a.file:
                continue
            text = src.read_text(path)
            if not text or not probe.search(text):
                continue
            idx = self.index(src, path)
            if idx is None:
                continue
            hit = idx.find_symbol(a.symbol) if a.kind == "symbol" else idx.find_message(a.symbol)
            if hit:
                return {"file": path, "symbol": a.symbol, "lines": [hit[0], hit[1]]}
        return None

    @staticmethod
    def _closest_in_file(idx: FileIndex, a: Anchor) -> dict | None:
        if a.kind == "symbol":
            close = difflib.get_close_matches(a.symbol, list(idx.symbols), n=1, cutoff=NAME_CUTOFF)
            if close:
                s, e = idx.symbols[close[0]]
                return {"file": a.file, "symbol": close[0], "lines": [s, e]}
            return None
        want = a.symbol[: -len(PREFIX_MARK)] if a.symbol.endswith(PREFIX_MARK) else a.symbol
        texts: dict[str, tuple[str, int, int]] = {}
        for text, s, e in idx.literals:
            # Compare like with like: a prefix citation against literal prefixes.
            texts.setdefault(text[: len(want)] if a.symbol.endswith(PREFIX_MARK) else text, (text, s, e))
        close = difflib.get_close_matches(want, list(texts), n=1, cutoff=MESSAGE_CUTOFF)
        if close:
            text, s, e = texts[close[0]]
            return {"file": a.file, "symbol": text, "lines": [s, e]}
        return None


def check_all(anchors: list[Anchor], srcs: dict) -> list[Anchor]:
    checker = Checker(srcs)
    return [checker.check(a) for a in anchors]
