"""Helpers for the skill-text tests (SKILL.md, references/, card.yaml, skill-card.md).

* Markdown helpers: frontmatter, relative links, headings, ``scripts/mfsdp.py`` commands.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

# Token estimate: about 4 characters per token for English prose and code (the rule
# of thumb OpenAI and Anthropic both document); a limit checked this way has slack
# because dense code and paths tokenize at 3-3.5 characters.
CHARS_PER_TOKEN = 4

LINK_RE = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE_RE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE_RE = re.compile(r"`[^`\n]*`")
# A command as written in the skill: inline code or a line of a fenced block.
MFSDP_CMD_RE = re.compile(r"(?:python3?\s+)?scripts/mfsdp\.py((?:\s+[^`\n#]*)?)")
PLACEHOLDER_RE = re.compile(r"^(?:[A-Z][A-Z_]*|<[^>]+>)$")


def read(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


def frontmatter(text: str) -> tuple[dict, str]:
    assert text.startswith("---\n"), "SKILL.md must start with a YAML frontmatter block"
    end = text.index("\n---\n", 4)
    return yaml.safe_load(text[4:end]), text[end + 5 :]


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def strip_code(text: str) -> str:
    """Prose only: links inside code are examples, not links."""
    return INLINE_CODE_RE.sub("", FENCE_RE.sub("", text))


def relative_links(text: str) -> list[str]:
    out = []
    for target in LINK_RE.findall(strip_code(text)):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        out.append(target)
    return out


def slug(heading: str) -> str:
    """GitHub's heading anchor: lower-case, punctuation dropped, spaces to hyphens."""
    h = heading.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def headings(text: str) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", FENCE_RE.sub("", text), re.M)}


def mfsdp_commands(text: str) -> list[list[str]]:
    """Every ``scripts/mfsdp.py NAME ...`` invocation written in the text, as argv lists."""
    found = []
    chunks = [m.group(0).strip("`") for m in INLINE_CODE_RE.finditer(text)]
    for block in FENCE_RE.findall(text):
        chunks.extend(block.splitlines())
    for chunk in chunks:
        for m in MFSDP_CMD_RE.finditer(chunk):
            args = m.group(1).split(" #")[0].strip().rstrip("\\").strip()
            if not args:
                continue
            argv = shlex.split(args)
            if PLACEHOLDER_RE.match(argv[0]):
                continue  # "scripts/mfsdp.py COMMAND": prose, not an invocation
            found.append(argv)
    return found
