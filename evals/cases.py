"""The eval cases: ``evals/evals.json`` read once, in one place, for the grader, the runner and the CLI.

A missing or malformed file is ``UnreadableTranscript`` (one line, exit 2 at the CLI); a case whose fields
have the wrong types is refused when asked for, so grading never crashes on a file ``validate`` rejects.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from .transcripts import UnreadableTranscript, read_json_file

HERE = Path(__file__).resolve().parent
EVALS_JSON = HERE / "evals.json"
FIXTURES = HERE / "fixtures"

# The fields grading reads, with the JSON types evals.schema.json gives them (None = null allowed).
_CASE_TYPES: dict[str, tuple[type, ...]] = {
    "question": (str,),
    "expected_skill": (str, type(None)),
    "expected_script": (str, type(None)),
    "ground_truth": (str,),
    "expected_behavior": (list,),
}


def load_cases(path: str | os.PathLike | None = None) -> list:
    """The cases file as a list (the raw entries; ``validate`` reports what is wrong with them)."""
    return list(_load(str(Path(path or EVALS_JSON).resolve())))


@functools.lru_cache(maxsize=8)
def _load(path: str) -> tuple:
    data = read_json_file(path, "cases file")
    if not isinstance(data, list):
        raise UnreadableTranscript(f"{path}: expected a JSON array of cases")
    return tuple(data)


def by_id(path: str | os.PathLike | None = None) -> dict[str, dict]:
    return {c["id"]: c for c in load_cases(path) if isinstance(c, dict) and isinstance(c.get("id"), str)}


def get_case(case_id: str, path: str | os.PathLike | None = None) -> dict:
    """The case with this id; KeyError when absent, UnreadableTranscript when a field has the wrong type."""
    case = by_id(path).get(case_id)
    if case is None:
        raise KeyError(case_id)
    bad = [k for k, types in _CASE_TYPES.items() if not isinstance(case.get(k), types)]
    if not bad and not all(isinstance(b, str) for b in case["expected_behavior"]):
        bad = ["expected_behavior"]
    if bad:
        raise UnreadableTranscript(
            f"{path or EVALS_JSON}: case '{case_id}' has a missing or mistyped "
            f"{', '.join(bad)} (run: python3 -m evals validate --evals FILE)"
        )
    return case


def fixture_dir(case_id: str) -> Path | None:
    """The project tree the agent starts in for this case, when the case has one."""
    from .checks import CHECKS

    cc = CHECKS.get(case_id)
    if cc is None or not cc.fixture:
        return None
    return FIXTURES / cc.fixture
