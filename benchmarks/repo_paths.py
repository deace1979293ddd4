"""Commands and paths in result files, written as a reader runs them from the repository root.

GPU benchmarks run on another machine, in a copy of this repository, and write to an output
folder there; their raw files are then copied into ``benchmarks/results/raw/<name>/``. A result
file (and so BENCHMARK.md) states every command as it runs from this repository's root: the
copy's path is dropped (``scripts/smoke_train.py``), the interpreter is ``python3``, and each
output folder is the raw folder in this repository that holds its files. The numbers are not
touched.
"""

from __future__ import annotations

import re

# A repository copy on the GPU machine: any path that ends in .../code/ under a staging folder.
_COPY_PREFIX = re.compile(r"(?<![\w./-])/\S*?/\.gpuwork/code/")
# An absolute interpreter path (a virtual environment's python3) -> python3.
_PYTHON = re.compile(r"(?<![\w./-])/\S*/bin/python3?(?![\w.])")


def repo_relative(value, folders: dict[str, str]):
    """``value`` (a string, or lists and dicts of them) with machine paths made repository-relative.

    ``folders`` maps an output folder on the GPU machine to the repository folder holding its
    files, e.g. ``{"/scratch/res": "benchmarks/results/raw/gpu_smoke_1xh200"}``; the longest
    matching folder wins.
    """
    if isinstance(value, str):
        text = _PYTHON.sub("python3", _COPY_PREFIX.sub("", value))
        for old in sorted(folders, key=len, reverse=True):
            text = re.sub(rf"(?<![\w./-]){re.escape(old.rstrip('/'))}(?=/|\b|$)", folders[old], text)
        return text
    if isinstance(value, list):
        return [repo_relative(v, folders) for v in value]
    if isinstance(value, dict):
        return {k: repo_relative(v, folders) for k, v in value.items()}
    return value


def option_value(command: str, option: str) -> str | None:
    """The value of ``--option VALUE`` in a recorded command line, or None."""
    m = re.search(rf"(?:^|\s){re.escape(option)}[ =](\S+)", command or "")
    return m.group(1) if m else None
