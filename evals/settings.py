"""The settings an answer recommends, read from every form answers write them in, with negation understood.

Why: an answer that says ``DistributedDataParallelConfig(use_megatron_fsdp=True)`` or gives a markdown table
recommends the same setting as one that writes ``ddp.use_megatron_fsdp=true``; and "do not set
checkpoint.load=None" recommends the opposite of what a keyword search finds in it. So correctness is judged
on ``Setting`` records, not on substrings:

* ``key=value`` / Hydra overrides (``+x=y``, ``++x=y``) / shell ``export NAME=value`` / Python attribute
  assignments (``cfg.ddp.x = True``; ``cfg.``/``config.``/``recipe.`` prefixes dropped);
* YAML, nested by indentation (``ddp:`` then ``  use_megatron_fsdp: true``), in or out of code fences;
* Python constructors of Bridge's config classes (``CheckpointConfig(ckpt_format="fsdp_dtensor")`` is
  ``checkpoint.ckpt_format``) and ``dict(...)``;
* markdown tables whose row names a setting in one cell and its value in the next;
* prose: "set X to Y", "X should be Y", "enable X" (true), "disable / turn off X" (false), "unset /
  remove X" (unset), and "X Y" when Y is one of X's closed set of values ("with ckpt_format fsdp_dtensor").

A setting is *negated* when its clause says not to do it: a cue (``don't``, ``never``, ``avoid``,
``instead of``, ``rather than``, ``not``, ``wrong``, ``❌``, what the user's files have now: "your launcher's"
...) between the start of its clause and it, with no
other setting in between; or a verdict right after it ("X=Y is wrong / will fail / is not supported"); or a
removed line of a ``diff`` block; or a comment line that says so. Keys compare case-insensitively; values are
normalised (``True/1/yes/on`` -> ``true``, ``None/null/~`` -> ``none``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Bridge 0.6.2 config classes (megatron/bridge/training/config.py) and the ConfigContainer field each fills.
CLASS_SECTIONS = {
    "distributeddataparallelconfig": "ddp",
    "distributedinitconfig": "dist",
    "checkpointconfig": "checkpoint",
    "optimizerconfig": "optimizer",
    "trainingconfig": "train",
    "loggerconfig": "logger",
    "mixedprecisionconfig": "mixed_precision",
    "schedulerconfig": "scheduler",
    "rngconfig": "rng",
    "profilingconfig": "profiling",
    "loraconfig": "peft",
    "lora": "peft",
    "gptmodelprovider": "model",
    "llamamodelprovider": "model",
    "transformerconfig": "model",
}
DROP_PREFIXES = ("cfg.", "config.", "recipe.", "self.", "c.", "conf.", "container.", "run_config.", "overrides.")
TRUE = {"true", "1", "yes", "on"}
FALSE = {"false", "0", "no", "off"}
NONE = {"none", "null", "~", "nil"}
UNSET = "<unset>"

# Words that make the setting after them a thing not to do (within its clause).
NEG_CUES = re.compile(
    r"(?:\bdo\s+not\b|\bdon'?t\b|\bdoes\s+not\b|\bdoesn'?t\b|\bnever\b|\bavoid\b|\binstead\s+of\b|\brather\s+than\b"
    r"|\bnot\b|\bno\s+longer\b|\bshould\s*n'?o?t\b|\bshouldn'?t\b|\bmust\s*n'?o?t\b|\bmustn'?t\b|\bwon'?t\b"
    r"|\bcan'?t\b|\bcannot\b|\bwouldn'?t\b|\bcouldn'?t\b|\bisn'?t\b|\baren'?t\b|\bhardly\b|\bwrong\b|\bincorrect\b|\bbad\b|\bbroken\b|\bfails?\b|\bnot\s+recommended\b"
    r"|\bstop\s+using\b|\bremove\b|\bdrop\b|\bdelete\b|\bunset\b|\bwithout\b|\bold\b"
    r"|❌|✗|✘|\bwas\b|\bwere\b|\bcurrently\b|\bhad\b|\byou\s+have\b|\byour\s+(?:config|launcher|yaml|job|script|recipe|run)\s+(?:has|sets|exports|uses|saves|loads|writes|holds|contains|specifies|still)\b"
    r"|\b(?:config|yaml|file|launcher|recipe)\s+(?:sets|has|exports|uses)\b|\brejects?\b|\brefuses?\b"
    r"|\b(?:the|your|their|its)\s+(?:config|yaml|file|launcher|recipe|job|script|environment)'s\b)",
    re.IGNORECASE,
)
# Verdicts right after a setting that reject it ("X=Y is wrong", "X=Y will fail").
NEG_AFTER = re.compile(
    r"^\s*[`'\"]?\s*(?:\)|,)?\s*(?:which|that)?\s*(?:is|are|was|would\s+be|will\s+be)?\s*(?:wrong|incorrect|invalid|not\s+supported|"
    r"unsupported|the\s+(?:problem|culprit|cause|bug)|what\s+(?:breaks|fails)|breaks|fails|will\s+fail|won'?t\s+work|"
    r"is\s+what\s+(?:breaks|fails)|causes|triggers|is\s+rejected|gets\s+rejected)\b",
    re.IGNORECASE,
)
# A denial right before a prose verb ("don't clear X", "never unset X", "you should not remove X").
DENIED_VERB = re.compile(
    r"(?:\bdo\s+not|\bdon'?t|\bnever|\bshould\s*n'?t|\bshould\s+not|\bmust\s*n'?t|\bmust\s+not|\bno\s+need\s+to"
    r"|\bavoid|\bwon'?t|\bwill\s+not)\s+(?:\w+\s+)?$",
    re.IGNORECASE,
)
# Verbs that recommend what follows; one after a cue (but not governed by it) cancels the cue.
RECOMMEND = r"\b(?:set|setting|use|using|add|adding|pass|passing|apply|applying|change|switch|keep|enable|put|write)\b"
CLAUSE_SPLIT = re.compile(r"(?:[.!?](?=\s|$)|\n|;|(?<=\w):(?=\s)|\bbut\b|\bthen\b|\bhowever\b|—|\s-\s)", re.IGNORECASE)
KEY = r"[+]{0,2}[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
VALUE = r"(?:\"[^\"\n]*\"|'[^'\n]*'|\[[^\]\n]*\]|[^\s,;`'\")\]|]+)"
KV_RE = re.compile(rf"(?<![\w.$-])[`'\"]?(?P<key>{KEY})[`'\"]?\s*(?P<op>==|=|:=)\s*[`'\"]?(?P<val>{VALUE})")
KV_COLON_RE = re.compile(
    rf"(?<![\w.$-])[`'\"]?(?P<key>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)[`'\"]?:[ \t]+[`'\"]?(?P<val>{VALUE})"
)
PROSE_SET = re.compile(
    rf"\b(?:set|change|switch|flip|make|put|configure)\s+(?:the\s+)?[`'\"]?(?P<key>{KEY})[`'\"]?\s+"
    rf"(?:to|=|as|back\s+to)\s+(?:be\s+)?[`'\"]?(?P<val>{VALUE})",
    re.IGNORECASE,
)
PROSE_BE = re.compile(
    rf"[`'\"]?(?P<key>{KEY})[`'\"]?\s+(?:should|must|needs?\s+to|has\s+to|ought\s+to)\s+(?:be\s+|stay\s+|remain\s+)"
    rf"(?:set\s+to\s+|kept\s+(?:at|as)\s+)?[`'\"]?(?P<val>{VALUE})",
    re.IGNORECASE,
)
PROSE_TO = re.compile(
    rf"(?:[`'\"](?P<key>{KEY})[`'\"]|(?<![\w.])(?P<key2>[a-z_]+\.[a-z_][\w.]*))\s+(?:to|→|->)\s+[`'\"]?(?P<val>{VALUE})",
    re.IGNORECASE,
)
PROSE_ON = re.compile(
    rf"\b(?P<verb>enable|turn\s+on|switch\s+on|activate|disable|turn\s+off|switch\s+off|deactivate|unset|remove|drop|"
    rf"clear)\s+(?:the\s+)?[`'\"]?(?P<key>{KEY})[`'\"]?",
    re.IGNORECASE,
)
# Settings whose values form a closed set can be written as "KEY VALUE" ("with ckpt_format fsdp_dtensor"): a
# value of the key's own set right after it is a setting, any other word is not.
ENUM_VALUES = {
    "ckpt_format": ("torch_dist", "fsdp_dtensor", "torch", "zarr"),
    "data_parallel_sharding_strategy": ("no_shard", "optim", "optim_grads", "optim_grads_params"),
}
PROSE_ENUM = re.compile(
    "|".join(
        rf"(?<![\w.])[`'\"]?(?P<key{i}>(?:[A-Za-z_]\w*\.)*{k})[`'\"]?[ \t]+[`'\"]?(?P<val{i}>{'|'.join(v)})(?![\w.])"
        for i, (k, v) in enumerate(ENUM_VALUES.items())
    ),
    re.IGNORECASE,
)
CTOR_RE = re.compile(r"\b(?P<cls>[A-Z][A-Za-z0-9_]*|dict)\s*\(")
YAML_LINE = re.compile(
    r"^(?P<indent>[ \t]*)(?:-\s+)?[`'\"]?(?P<key>[A-Za-z_][\w.]*)[`'\"]?\s*:(?:\s+(?P<val>.*?))?\s*$"
)
TABLE_ROW = re.compile(r"^\s*\|(.+)\|\s*$")


@dataclass(frozen=True)
class Setting:
    key: str  # dotted, lower-case, prefixes like cfg. dropped
    value: str  # normalised: true/false/none/<unset>/text
    negated: bool
    form: str  # kv, yaml, constructor, table, prose
    evidence: str  # the text it was read from

    def describe(self) -> str:
        return f"{'NOT ' if self.negated else ''}{self.key}={self.value} ({self.form}: {self.evidence[:80]!r})"


def norm_key(key: str) -> str:
    k = key.strip().strip("`'\"").lstrip("+").lower()
    changed = True
    while changed:
        changed = False
        for p in DROP_PREFIXES:
            if k.startswith(p) and k.count(".") >= 1 and len(k) > len(p):
                k = k[len(p) :]
                changed = True
    return k


def norm_value(value: str) -> str:
    v = value.strip().strip("`").strip()
    v = v.rstrip(".,;:")
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        v = v[1:-1]
    low = v.lower()
    if low in TRUE:
        return "true"
    if low in FALSE:
        return "false"
    if low in NONE or low in ("''", '""'):
        return "none"
    return low


def key_matches(found: str, wanted: str) -> bool:
    """``ddp.use_megatron_fsdp`` matches itself and ``x.ddp.use_megatron_fsdp``; a bare wanted key matches any
    section; a bare found key does not satisfy a sectioned wanted key (dist vs ddp would be ambiguous)."""
    f, w = found.lower(), wanted.lower()
    return f == w or f.endswith("." + w)


# --------------------------------------------------------------------------- negation


def _clause_start(text: str, pos: int) -> int:
    start = 0
    for m in CLAUSE_SPLIT.finditer(text, 0, pos):
        # a dot inside a dotted key is not a sentence end
        if m.group(0) == "." and pos > m.end() and not text[m.end() : m.end() + 1].isspace():
            continue
        start = m.end()
    return start


# The narrower cue set for statements (facts): only words that deny what follows.
FACT_NEG_CUES = re.compile(
    r"(?:\bdo\s+not\b|\bdon'?t\b|\bdoes\s+not\b|\bdoesn'?t\b|\bnever\b|\bnot\b|\bno\s+longer\b|\bisn'?t\b|\baren'?t\b"
    r"|\bwouldn'?t\b|\bwon'?t\b|\bcan'?t\b|\bcannot\b|\bshouldn'?t\b|\bhardly\b|\bfalse\s+that\b|\bwrong\s+that\b)",
    re.IGNORECASE,
)


def negated_at(text: str, start: int, end: int, prev_end: int = 0, statement: bool = False) -> bool:
    """Whether the mention at TEXT[start:end] is said not to be done (see the module docstring)."""
    line_start = text.rfind("\n", 0, start) + 1
    line = text[line_start : text.find("\n", start) if text.find("\n", start) >= 0 else len(text)]
    stripped = line.lstrip()
    if stripped.startswith("-") and _in_diff_block(text, start):
        return True
    lo = max(_clause_start(text, start), prev_end, start - 80)
    window = text[lo:start]
    window = re.sub(r"`[^`]*`", " ", window)  # code in between is a value, not a cue
    cues = list((FACT_NEG_CUES if statement else NEG_CUES).finditer(window))
    if cues:
        rest = window[cues[-1].end() :]
        if re.match(rf"^[^\w,]*(?:\w+[^\w,]+){{0,2}}?{RECOMMEND}", rest, re.IGNORECASE):
            return True  # "don't set X", "never use X", "avoid setting X"
        return not re.search(RECOMMEND, rest, re.IGNORECASE)  # "to avoid this, set X": the verb wins
    if stripped.startswith("#") and NEG_CUES.search(stripped):
        return True
    return not statement and bool(NEG_AFTER.match(text[end : end + 60]))


def _in_diff_block(text: str, pos: int) -> bool:
    fences = [m for m in re.finditer(r"^\s*```(\w*)", text[:pos], re.M)]
    return bool(fences) and len(fences) % 2 == 1 and fences[-1].group(1).lower() in ("diff", "patch")


# --------------------------------------------------------------------------- extraction


def extract(text: str) -> list[Setting]:
    """Every setting TEXT recommends or rejects, in order of appearance (duplicates kept)."""
    found: list[tuple[int, int, str, str, str]] = []  # start, end, key, value, form
    spans: list[tuple[int, int]] = []

    def add(start: int, end: int, key: str, val: str, form: str) -> None:
        if any(s <= start < e for s, e in spans):
            return
        spans.append((start, end))
        found.append((start, end, key, val, form))

    for m in CTOR_RE.finditer(text):
        open_at = m.end()
        close = _balanced(text, open_at)
        body = text[open_at : close - 1]
        cls = m.group("cls").lower()
        section = CLASS_SECTIONS.get(cls)
        if section is None and not cls.endswith(("config", "provider")) and cls != "dict":
            continue
        for km in re.finditer(rf"(?<![\w.])(?P<key>[A-Za-z_]\w*)\s*=\s*(?P<val>{VALUE})", body):
            key = f"{section}.{km.group('key')}" if section else km.group("key")
            add(open_at + km.start(), open_at + km.end(), key, km.group("val"), "constructor")
    _yaml(text, add)
    for m in re.finditer(r"`([A-Za-z_][\w.]*)\s*:\s*([^`\s][^`]*)`", text):  # inline `key: value`
        if "." in m.group(1) or "_" in m.group(1):
            add(m.start(), m.end(), m.group(1), m.group(2).split()[0], "yaml")
    _tables(text, add)
    for rx, form in ((PROSE_SET, "prose"), (PROSE_BE, "prose"), (PROSE_TO, "prose")):
        for m in rx.finditer(text):
            key = m.groupdict().get("key") or m.groupdict().get("key2") or ""
            add(m.start(), m.end(), key, m.group("val"), form)
    for m in PROSE_ENUM.finditer(text):
        i = next(n for n in range(len(ENUM_VALUES)) if m.group(f"key{n}"))
        add(m.start(), m.end(), m.group(f"key{i}"), m.group(f"val{i}"), "prose")
    for m in PROSE_ON.finditer(text):
        verb = m.group("verb").lower()
        val = "true" if verb in ("enable", "activate") or verb.endswith(" on") else UNSET
        if verb in ("disable", "deactivate") or verb.endswith(" off"):
            val = "false"
        add(m.start(), m.end(), m.group("key"), val, "prose")
    for m in KV_COLON_RE.finditer(text):  # "checkpoint.load: null" in prose: a dotted key makes it a setting
        add(m.start(), m.end(), m.group("key"), m.group("val"), "kv")
    for m in KV_RE.finditer(text):
        key = m.group("key")
        if key.lower() in ("export", "set") or "." not in key and not ("_" in key or key.isupper()):
            continue
        add(m.start(), m.end(), key, m.group("val"), "kv")
    found.sort()
    out: list[Setting] = []
    prev_end = 0
    for start, end, key, val, form in found:
        nkey = norm_key(key)
        if not nkey or nkey[0].isdigit():
            continue
        neg = negated_at(text, start, end, prev_end)
        if form == "prose" and val == UNSET:
            # "unset / remove / clear X" carries its own polarity (the verb's cue words are not a denial of it);
            # only a denial that governs the verb itself negates it: "don't clear checkpoint.load".
            neg = bool(DENIED_VERB.search(text[max(0, start - 40) : start]))
        if val == UNSET:
            nval = UNSET
        elif key.isupper():  # an environment variable: its value is a number or a word, not a boolean
            nval = val.strip("`'\"").rstrip(".,;:").lower()
        else:
            nval = norm_value(val)
        out.append(Setting(nkey, nval, neg, form, text[start:end]))
        prev_end = end
    return out


def _balanced(text: str, i: int) -> int:
    depth = 1
    while i < len(text) and depth:
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c in "\"'":
            j = text.find(c, i + 1)
            i = j if j > 0 else i
        i += 1
    return i


def _yaml(text: str, add) -> None:
    stack: list[tuple[int, str]] = []
    pos = 0
    for line in _undiff(text).split("\n"):
        m = YAML_LINE.match(line)
        line_start = pos
        pos += len(line) + 1
        if not line.strip():
            continue
        if not m or " " in m.group("key").strip():
            if not line.startswith((" ", "\t")):
                stack = []
            continue
        indent = len(m.group("indent").expandtabs(2))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key, val = m.group("key"), (m.group("val") or "").strip()
        if val.startswith("#"):
            val = ""
        if val:
            val = re.sub(r"\s+#.*$", "", val)
            # prose after a colon ("Note: this ...") is not a value
            if not re.match(rf"^{VALUE}$", val) and not val.startswith(("'", '"')) and len(val.split()) > 2:
                continue
            parents = ".".join(k for _, k in stack)
            full = f"{parents}.{key}" if parents else key
            if "." not in full and "_" not in full:
                continue
            add(line_start + len(m.group("indent")), line_start + len(line), full, val.split()[0], "yaml")
        else:
            stack.append((indent, key))


def _undiff(text: str) -> str:
    """TEXT with the +/- markers of ```diff blocks blanked (same length, so positions stay valid); a removed
    line is still known as removed by ``negated_at``, which reads the original text."""
    out, in_diff = [], False
    for line in text.split("\n"):
        fence = re.match(r"^\s*```(\w*)", line)
        if fence:
            in_diff = not in_diff and fence.group(1).lower() in ("diff", "patch")
        elif in_diff and line[:1] in ("+", "-") and not line.startswith(("+++", "---")):
            line = " " + line[1:]
        out.append(line)
    return "\n".join(out)


def _tables(text: str, add) -> None:
    pos = 0
    for line in text.split("\n"):
        start = pos
        pos += len(line) + 1
        m = TABLE_ROW.match(line)
        if not m:
            continue
        cells = [c.strip() for c in m.group(1).split("|")]
        if all(re.fullmatch(r":?-{2,}:?", c) for c in cells if c):
            continue
        for i, cell in enumerate(cells[:-1]):
            key = cell.strip("`*_ ").strip()
            if (
                re.fullmatch(KEY, key)
                and ("." in key or "_" in key)
                and not re.fullmatch(r"[A-Z_]+", key)
                or (re.fullmatch(r"[A-Z][A-Z0-9_]{3,}", key))
            ):
                val = cells[i + 1].strip("`*_ ").strip()
                val = val.split()[0] if val else ""
                if val:
                    add(start + line.find(cell), start + len(line), key, val, "table")
                break


def recommended(settings: list[Setting], key: str) -> list[Setting]:
    return [s for s in settings if key_matches(s.key, key) and not s.negated]


def rejected(settings: list[Setting], key: str) -> list[Setting]:
    return [s for s in settings if key_matches(s.key, key) and s.negated]
