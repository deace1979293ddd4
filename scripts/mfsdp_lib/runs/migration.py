"""Which checkpoint conversions have been run and checked, and the ``convert`` command for them.

Why a table: advice to convert a checkpoint is only worth giving when the conversion was run and the weights
that came out were compared with the weights that went in. ``benchmarks/bench_ckpt_migration.py`` does that
on a GPU (resume losses against an uninterrupted run, logits against ``transformers``), and
``benchmarks/ckpt_migration_result.py`` writes its verdicts to ``benchmarks/results/ckpt_migration_1xh200.json``
and the small table this module reads, ``scripts/data/ckpt_migration_passing.json``. A path (FROM -> TO)
counts as passing only when every model that ran it (dense, MoE) passed; ``ckpt`` prints a command for passing
paths only and points to ``references/checkpoints.md`` for the rest.

Format names are the ones ``ckpt`` prints: ``torch_dist``, ``fsdp_dtensor``, ``hf``.
"""

from __future__ import annotations

import json
import os

FORMATS = ("torch_dist", "fsdp_dtensor", "hf")

# The table lives beside the other data the scripts ship (scripts/data/).
TABLE_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "ckpt_migration_passing.json"
)
TABLE_SCHEMA = "mfsdp-ckpt-migration-passing/1"
MAX_TABLE_BYTES = 1 << 16  # a handful of rows; anything larger is not ours

REFERENCE = "references/checkpoints.md#conversion-evidence"


def passing_from_rows(rows: list[dict]) -> list[dict]:
    """(from, to) paths where every row passed, with the models and the evidence that ran them."""
    by_path: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        key = (r.get("from"), r.get("to"))
        if key[0] in FORMATS and key[1] in FORMATS and r.get("via", "convert") == "convert":
            by_path.setdefault(key, []).append(r)  # type: ignore[arg-type]
    out = []
    for (src, dst), rs in sorted(by_path.items()):
        if rs and all(r.get("passed") is True for r in rs):
            out.append({"from": src, "to": dst, "models": sorted({str(r.get("model")) for r in rs})})
    return out


def load_table(path: str | None = None) -> dict:
    """The passing table; an absent table means nothing has been recorded as passing."""
    path = path or os.environ.get("MFSDP_MIGRATION_TABLE") or TABLE_PATH
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_TABLE_BYTES + 1)
    except OSError:
        return {"schema": TABLE_SCHEMA, "passing": [], "source": None}
    try:
        obj = json.loads(raw[:MAX_TABLE_BYTES].decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return {"schema": TABLE_SCHEMA, "passing": [], "source": None}
    if not isinstance(obj, dict) or not isinstance(obj.get("passing"), list):
        return {"schema": TABLE_SCHEMA, "passing": [], "source": None}
    return obj


def passing_paths(table: dict | None = None) -> set[tuple[str, str]]:
    table = load_table() if table is None else table
    out = set()
    for p in table.get("passing", []):
        if isinstance(p, dict) and p.get("from") in FORMATS and p.get("to") in FORMATS:
            out.add((p["from"], p["to"]))
    return out


def convert_command(src: str, to: str, hf_ref: str | None = None, dst: str = "<output_dir>") -> str:
    """The ``mfsdp.py convert`` command line for one conversion (what ``ckpt`` prints): this skill's script by its
    absolute path and every path quoted (``shell.mfsdp_command``), so it pastes as it is from the user's project."""
    from ..shell import mfsdp_command

    return mfsdp_command("convert", src, dst, "--to", to, *(("--hf-config", hf_ref) if hf_ref else ()))


def build_table(rows: list[dict], source: str) -> dict:
    return {"schema": TABLE_SCHEMA, "source": source, "passing": passing_from_rows(rows)}
