#!/usr/bin/env python3
"""Turn the raw folder of ``bench_ckpt_migration.py`` into ``benchmarks/results/ckpt_migration_1xh200.json``.

Reads ``RAW/<row>.json`` (one per row the driver finished; ``RAW/workers.json`` says which worker ended how,
``RAW/meta_<model>.json`` the machine and versions) and restates them without running anything:

* ``rows``: one object per row with at least ``model`` (dense | moe), ``from``, ``to`` (torch_dist,
  fsdp_dtensor, hf: the names ``ckpt`` prints), ``via`` (``convert`` = ``mfsdp.py convert``; ``upstream`` =
  a path the installed Bridge offers itself), ``command``, ``exit``, ``check`` (what was compared),
  ``difference`` (the number), ``tolerance`` and ``passed``; plus the row's evidence (losses, logits
  statistics, the optimizer-drop cost, the error of a failed row). A path the driver should have run but
  did not (a worker killed at the budget, a crash before the row) is a row with ``passed: false`` and
  ``exit: null`` saying so: missing evidence fails.
* ``columns`` and the rows' order are what ``benchmarks/make_report.py`` renders into BENCHMARK.md.
* the passing table ``scripts/data/ckpt_migration_passing.json`` (``--table``), which ``ckpt`` reads to
  decide which conversion commands it may print.

    python3 benchmarks/ckpt_migration_result.py RAW --out benchmarks/results/ckpt_migration_1xh200.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import raw_store  # noqa: E402  (beside this script: the raw results are read from their archive)

# The rows the driver runs (bench_ckpt_migration.WORKERS): dense (a)-(d), MoE (a)-(b).
EXPECTED_ROWS = {
    "dense_a_torch_dist_to_fsdp_dtensor": ("dense", "torch_dist", "fsdp_dtensor"),
    "dense_b_fsdp_dtensor_to_hf": ("dense", "fsdp_dtensor", "hf"),
    "dense_c_fsdp_dtensor_to_torch_dist": ("dense", "fsdp_dtensor", "torch_dist"),
    "dense_d_hf_to_fsdp_dtensor": ("dense", "hf", "fsdp_dtensor"),
    "moe_a_torch_dist_to_fsdp_dtensor": ("moe", "torch_dist", "fsdp_dtensor"),
    "moe_b_fsdp_dtensor_to_hf": ("moe", "fsdp_dtensor", "hf"),
}
COLUMNS = ["model", "from", "to", "via", "command", "exit", "check", "difference", "tolerance", "passed"]
REQUIRED_ROW_KEYS = ("model", "from", "to", "command", "exit", "check", "difference", "tolerance", "passed")


def _read(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def collect(raw: Path) -> tuple[list[dict], dict]:
    if not raw.is_dir():
        raise SystemExit(f"ckpt_migration_result: {raw}: not a folder")
    workers = (_read(raw / "workers.json") or {}).get("workers", {})
    meta = {p.stem[len("meta_") :]: _read(p) for p in sorted(raw.glob("meta_*.json"))}
    found = {}
    for p in sorted(raw.glob("*.json")):
        if p.name == "workers.json" or p.name.startswith("meta_"):
            continue
        obj = _read(p)
        if obj is not None and obj.get("role") != "reference":
            found[p.stem] = obj
    rows = []
    for name, (model, src, dst) in EXPECTED_ROWS.items():
        r = found.pop(name, None)
        if r is None:
            w = workers.get(model, {})
            why = "killed at the time budget" if w.get("killed_at_budget_s") else f"worker exit {w.get('exit')}"
            r = {
                "row": name,
                "model": model,
                "from": src,
                "to": dst,
                "via": "convert",
                "command": None,
                "exit": None,
                "check": "not run",
                "difference": None,
                "tolerance": None,
                "passed": False,
                "error": f"no {name}.json in the raw folder ({why}; see worker_{model}.log)",
            }
        rows.append(_normalise(r))
    rows += [_normalise(r) for _, r in sorted(found.items())]  # upstream rows and anything else recorded
    return rows, {"workers": workers, "meta": meta}


def _normalise(r: dict) -> dict:
    out = {k: r.get(k) for k in REQUIRED_ROW_KEYS}
    out["via"] = r.get("via", "convert")
    out["passed"] = r.get("passed") is True and (out["via"] != "convert" or r.get("exit") == 0)
    out.update({k: v for k, v in r.items() if k not in out})
    return out


def build(raw: Path, command: str) -> dict:
    from mfsdp_lib.runs import migration

    rows, extra = collect(raw)
    metas = [m for m in extra["meta"].values() if m]
    meta: dict = metas[0] if metas else {}
    versions = meta.get("versions") or {}
    machine = f"1x {meta.get('device') or 'NVIDIA H200'}; " + ", ".join(f"{k} {v}" for k, v in versions.items() if v)
    passing = migration.passing_from_rows(rows)
    moe = next((r for r in rows if r["model"] == "moe"), None)
    notes = [
        "World size 1 for real (a process group of one on one GPU): no data-parallel resharding is covered, and the "
        "MoE model runs with expert parallelism 1 (EP > 1 needs more ranks than one GPU can host).",
        "Resume rows compare the first resumed step's loss with the uninterrupted run's at the same step (same "
        "weights, same batch); tolerance 1.6e-2 x |loss| (bf16 rtol). The later steps' difference is what dropping "
        "the optimizer state costs (Adam restarts from zero moments): optimizer_drop_cost in the JSON.",
        "Logits rows compare max |difference| / max |logit| on fixed tokens (2 x 64) between transformers and the "
        "Megatron model at the same weights; tolerance 5e-2 (two implementations, bf16).",
        "Passing paths, which ckpt prints a convert command for: "
        + (", ".join(f"{p['from']} -> {p['to']} ({'/'.join(p['models'])})" for p in passing) or "none")
        + ".",
    ]
    if moe is None:
        notes.append("No MoE row was recorded.")
    return {
        "benchmark": "ckpt_migration_1xh200",
        "title": "Checkpoint migration run and weights checked: torch_dist, fsdp_dtensor, Hugging Face (1x H200)",
        "date": meta.get("date") or _mtime_date(raw),
        "machine": machine,
        "command": command,
        "columns": COLUMNS,
        "rows": rows,
        "notes": notes,
        "raw": {
            "dir": raw_store.logical(raw) or (os.path.relpath(raw, ROOT) if raw.is_absolute() else str(raw)),
            "workers": extra["workers"],
        },
    }


def _mtime_date(raw: Path) -> str:
    import datetime

    newest = max((p.stat().st_mtime for p in raw.glob("*.json")), default=0.0)
    return datetime.datetime.fromtimestamp(newest, tz=datetime.timezone.utc).isoformat(timespec="seconds")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", help="the folder bench_ckpt_migration.py --out wrote")
    ap.add_argument("--out", required=True, help="result JSON to write")
    ap.add_argument(
        "--table",
        default=str(ROOT / "scripts" / "data" / "ckpt_migration_passing.json"),
        help="passing table that ckpt reads (default scripts/data/ckpt_migration_passing.json)",
    )
    ap.add_argument(
        "--command",
        default="python3 benchmarks/bench_ckpt_migration.py --out RAW  # on one H200 prepared by "
        "tests/gpu/setup_device.sh; then python3 benchmarks/ckpt_migration_result.py RAW "
        "--out benchmarks/results/ckpt_migration_1xh200.json",
        help="the command line recorded in the result",
    )
    a = ap.parse_args(argv)
    from mfsdp_lib import config_io
    from mfsdp_lib.runs import migration

    doc = build(raw_store.resolve(a.raw).resolve(), a.command)
    config_io.write_atomic(a.out, json.dumps(doc, indent=1, ensure_ascii=False, default=str) + "\n")
    table = migration.build_table(doc["rows"], source=f"benchmarks/results/{Path(a.out).name}")
    config_io.write_atomic(a.table, json.dumps(table, indent=1) + "\n")
    print(f"wrote {a.out} ({len(doc['rows'])} rows) and {a.table} ({len(table['passing'])} passing paths)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
