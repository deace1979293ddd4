"""The measured what-works matrix: the row for the config at hand, printed by ``check``, ``enable`` and ``memory``.

``benchmarks/results/what_works_1xh200.json`` records Bridge's own recipes taken through this skill's route on one
GPU (``check``, ``enable``, ``memory``, ``rehearse --perf`` as rank 0 of the recipe's world): each row's verdict
per phase, the measured memory beside ``memory``'s prediction, the compute throughput, what ``enable`` changed,
and the first error. A user's config is matched to a row by what its ``model`` section says the model is (the
provider class and the shape fields in ``FINGERPRINT_FIELDS``, each compared as a value, never as text), and by
its mode (PEFT when a ``peft`` section is set, SFT when the dataset is a fine-tuning one, else pretrain). A
config of the same model in another mode gets that row, labelled as another mode.

Rows that were planned but not measured (every phase "not run") are never printed; without a results file
nothing is printed. ``MFSDP_WHAT_WORKS`` names another results file (a copy kept elsewhere; the tests' fixture).
Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import IO, Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "what_works_1xh200.json")
RESULTS_ENV = "MFSDP_WHAT_WORKS"
SCHEMA = "mfsdp-what-works/1"
PHASES = ("validate", "wrap", "optimizer", "first_steps", "save", "load")

# What identifies a model in a Bridge config: the provider class and its shape. Parallel sizes, batch and
# precision are left out on purpose: they are what a user changes while the model stays the same.
FINGERPRINT_FIELDS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "num_moe_experts",
    "moe_ffn_hidden_size",
    "moe_router_topk",
    "multi_latent_attention",
    "hybrid_layer_pattern",
    "hybrid_override_pattern",
)
# Dataset classes of Bridge's fine-tuning recipes (megatron/bridge/data/builders/, training/config.py).
SFT_DATASET_MARKERS = ("SFTDataset", "FinetuningDataset", "HFDataset")


def _model(cfg: Mapping) -> Mapping:
    model = cfg.get("model") if isinstance(cfg, Mapping) else None
    return model if isinstance(model, Mapping) else {}


def fingerprint(cfg: Mapping) -> tuple | None:
    """The model's identity: (provider class name, shape values), or None when the config does not name one."""
    model = _model(cfg)
    target = model.get("_target_")
    if not isinstance(target, str) or not model.get("num_layers") or not model.get("hidden_size"):
        return None
    return (target.rsplit(".", 1)[-1], *(model.get(k) for k in FINGERPRINT_FIELDS))


def mode_of_config(cfg: Mapping) -> str:
    """peft, sft or pretrain, from the config's own sections."""
    if isinstance(cfg, Mapping) and cfg.get("peft"):
        return "peft"
    dataset = cfg.get("dataset") if isinstance(cfg, Mapping) else None
    target = dataset.get("_target_") if isinstance(dataset, Mapping) else None
    if isinstance(target, str) and any(m in target.rsplit(".", 1)[-1] for m in SFT_DATASET_MARKERS):
        return "sft"
    return "pretrain"


def results_path() -> str:
    return os.environ.get(RESULTS_ENV) or RESULTS


def measured(row: Mapping) -> bool:
    """A row counts only once the GPU ran it: some phase passed or failed."""
    phases = row.get("phases")
    return isinstance(phases, Mapping) and any(v in ("passed", "failed") for v in phases.values())


def load(path: str | None = None) -> list[dict]:
    """The measured rows of the results file; [] when there is none or it is not a results file."""
    try:
        with open(path or results_path(), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("rows"), list):
        return []
    return [r for r in data["rows"] if isinstance(r, dict) and measured(r)]


def find(cfg: Mapping, rows: list[dict] | None = None) -> list[tuple[dict, bool]]:
    """(row, same mode) for each measured row of this config's model; same-mode rows first."""
    fp = fingerprint(cfg) if isinstance(cfg, Mapping) else None
    if fp is None:
        return []
    rows = load() if rows is None else rows
    mode = mode_of_config(cfg)
    hits = [(r, r.get("mode") == mode) for r in rows if _row_fingerprint(r) == fp]
    return sorted(hits, key=lambda h: not h[1])


def _row_fingerprint(row: Mapping) -> tuple | None:
    fp = row.get("fingerprint")
    return tuple(fp) if isinstance(fp, list) else None


def verdict(row: Mapping) -> str:
    """passed / failed at PHASE / not run, from the row's phases."""
    phases = row.get("phases") or {}
    for name in PHASES:
        if phases.get(name) == "failed":
            return f"failed at {name}"
    if any(phases.get(n) == "passed" for n in PHASES):
        return "passed"
    return "not run"


def _layout(layout: Any) -> str:
    if not isinstance(layout, Mapping):
        return "?"
    return " ".join(f"{k.upper()}{layout.get(k)}" for k in ("tp", "pp", "cp", "ep", "dp") if layout.get(k) is not None)


def _gib(x: Any) -> str:
    return f"{x:.1f} GiB" if isinstance(x, (int, float)) else "n/a"


def lines(cfg: Mapping, rows: list[dict] | None = None) -> list[str]:
    """What to print for this config: one block per matching measured row (nothing when none matches)."""
    out: list[str] = []
    for row, same_mode in find(cfg, rows):
        mem = row.get("memory_gib") or {}
        label = "" if same_mode else f" (same model, mode {row.get('mode')})"
        out.append(
            f"what-works: {row.get('recipe')}{label}: {verdict(row)} as rank 0 of {row.get('world_size')} GPUs, "
            f"{_layout(row.get('layout_before'))} -> {_layout(row.get('layout_after'))} "
            f"({(row.get('measured') or {}).get('device') or 'one GPU'})"
        )
        out.append(
            f"  memory per GPU: between steps {_gib(mem.get('measured_state'))} (memory predicted "
            f"{_gib(mem.get('predicted_state'))}), peak {_gib(mem.get('measured_peak'))} (predicted "
            f"{_gib(mem.get('predicted_peak'))})"
            + (
                f"; as run with {', '.join(mem['as_run'])}: predicted {_gib(mem.get('predicted_state_as_run'))} "
                f"and {_gib(mem.get('predicted_peak_as_run'))}"
                if mem.get("as_run")
                else ""
            )
        )
        tps = row.get("tokens_per_s_per_gpu")
        if isinstance(tps, (int, float)):
            out.append(f"  compute: {tps:,.0f} tokens/s/GPU (no communication; rehearse --perf predicts the step)")
        changes = row.get("changes") or {}
        if changes:
            out.append("  enable changed: " + ", ".join(f"{k}={_value(v)}" for k, v in changes.items()))
        fallbacks = row.get("fallbacks") or []
        if fallbacks:
            out.append("  ran with: " + ", ".join(fallbacks))
        cut = row.get("cut")
        if isinstance(cut, Mapping):
            out.append(f"  {cut.get('phase')}: not run to its end (the GPU call's time limit cut it after the steps)")
        err = row.get("first_error")
        if isinstance(err, Mapping) and err.get("message"):
            rule = err.get("rule") or "no rule"
            out.append(f"  first error ({rule}): {str(err['message']).splitlines()[0][:200]}")
            if err.get("category") == "not-fsdp":
                out.append("  not a verdict on Megatron FSDP: the cause is outside it (the page's note says what)")
    if out:
        out.append("  the whole matrix: references/what-works.md")
    return out


def _value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def show(cfg: Mapping | None, fmt: str = "text", out: IO[str] | None = None) -> None:
    """Print this config's rows, if any: to ``out`` (default stdout) for text, to stderr beside JSON output
    (stdout then holds the command's JSON alone)."""
    if not isinstance(cfg, Mapping):
        return
    found = lines(cfg)
    if not found:
        return
    stream = sys.stderr if fmt == "json" else (out or sys.stdout)
    stream.write("\n".join(found) + "\n")
