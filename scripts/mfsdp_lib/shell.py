"""Commands the tools print for a user to paste: this skill's script by its absolute path, every path quoted.

Why: a printed ``python3 scripts/mfsdp.py convert /data/my ckpts ...`` works only from the skill folder and
splits a path with a space into two words. The user runs it from their own project, where the skill sits in an
install folder (``.claude/skills/<name>/`` or wherever it was copied), so the command names the script by the
absolute path of the ``mfsdp.py`` that is running now (beside this library), and quotes every word with
``shlex.quote``. Placeholders the user must fill in (``<output_dir>``) are left as they are, visibly unfilled.
"""

from __future__ import annotations

import os
import re
import shlex

# The entry point beside the library (scripts/mfsdp.py for scripts/mfsdp_lib/), as the running copy sees it.
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mfsdp.py")
PYTHON = "python3"  # what README and SKILL.md run the script with
_PLACEHOLDER_RE = re.compile(r"^<[^<>]*>$")  # "<output_dir>": a word for the user to replace, never quoted


def quote(word: str) -> str:
    """``word`` as one shell word (a placeholder stays visible as it is)."""
    return word if _PLACEHOLDER_RE.match(word) else shlex.quote(word)


def mfsdp_command(*args: str) -> str:
    """``python3 /abs/path/to/scripts/mfsdp.py ARGS...``, every word quoted for a POSIX shell."""
    return " ".join([PYTHON, quote(SCRIPT), *(quote(a) for a in args)])
