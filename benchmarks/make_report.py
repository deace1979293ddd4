#!/usr/bin/env python3
"""Generate BENCHMARK.md from the result files under benchmarks/results/.

Every figure in BENCHMARK.md comes from a JSON file that a command in this repository wrote, in the
project's one result shape::

    {"benchmark": id, "title", "date" (ISO), "machine" (words), "command" (the exact command line),
     "columns": [...], "rows": [[...], ...], "notes": [...], "raw": {...}}

so nobody types a number into BENCHMARK.md by hand, and each table carries the date, machine and
command that produced it. Each file becomes one section (title, date, machine, command, table, notes).

The measurements this skill is expected to have are listed in ``EXPECTED`` (with the command that
would make each). One that no result file provides appears under "Not measured yet", so a missing
2-GPU run or a missing real-model eval is stated plainly instead of silently absent. Eval results
from the scripted CI model server (``raw.scripted_model``) are shown, labelled by their own notes, but
never count as a real model's eval run.

The output is a pure function of the result files (no generation timestamp), so a test can check that
the committed BENCHMARK.md is current:

    python3 benchmarks/make_report.py            # rewrite BENCHMARK.md
    python3 benchmarks/make_report.py --check    # exit 1 when BENCHMARK.md is stale
    bash scripts/dev.sh benchmark-md             # the same, from the skill root

Standard library only; exit codes: 0 ok, 1 stale (--check), 2 unusable result file (named).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import raw_store  # beside this script: the raw results are kept as one archive

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OUTPUT = ROOT / "BENCHMARK.md"
REQUIRED = ("benchmark", "title", "date", "machine", "command", "columns", "rows")
REGENERATE = "bash scripts/dev.sh benchmark-md"
# The eval grader's first measurement on labelled items it had never seen (tests/fixtures/adversarial/batch2.json,
# written without reading the grader), taken before any grader change. It stays in the report next to the current
# rates, so a later fix cannot hide what the grader did on answers its authors had not foreseen.
FIRST_UNSEEN = "adversarial_batch2_unseen.json"  # its name in the raw results (benchmarks/raw_store.py)
FIRST_UNSEEN_SHOWN = f"{raw_store.LOGICAL}/{FIRST_UNSEEN}"


@dataclass(frozen=True)
class Expected:
    key: str
    title: str
    matches: Callable[[dict], bool]
    how: str  # the command (or issue) that would measure it


def _bid(r: dict) -> str:
    return str(r.get("benchmark", ""))


def _real_eval(agent: str) -> Callable[[dict], bool]:
    def match(r: dict) -> bool:
        raw = r.get("raw") or {}
        return _bid(r) == f"evals_{agent}" and raw.get("scripted_model") is False

    return match


# What the skill's claims rest on. Order = order of the report. Ids are those the measuring scripts write.
EXPECTED = (
    Expected(
        "check-speed",
        "Speed of `mfsdp.py check` on the embedded default, first and second call, against a bare `python3 -c pass`",
        lambda r: bool(re.match(r"(bench_)?check", _bid(r))),
        "`python3 benchmarks/bench_check.py --reps 100` on a quiet machine (target: the second call at most 5 "
        "times the bare interpreter start)",
    ),
    Expected(
        "suite-speed",
        "Speed of the whole test suite (`bash scripts/dev.sh test`, what CI runs), interleaved against the tree "
        "before it was made faster, with the coverage of both",
        lambda r: _bid(r) == "suite_speed",
        "`python3 benchmarks/bench_suite.py run --baseline REV --raw RAW`, then `... coverage --baseline REV --raw RAW` "
        "and `... summarize RAW` on a quiet 2-CPU machine (target: under 7 minutes)",
    ),
    Expected(
        "gpu-1",
        "DDP vs distributed optimizer vs Megatron FSDP on 1 GPU",
        lambda r: _bid(r).startswith("gpu_strategies_1x"),
        "`python3 benchmarks/bench_strategies.py --nproc-per-node 1 ...` on one H200",
    ),
    Expected(
        "gpu-2",
        "DDP vs distributed optimizer vs Megatron FSDP on 2 GPUs (data-parallel size 2, where "
        "Megatron FSDP actually shards)",
        lambda r: _bid(r).startswith("gpu_strategies_2x"),
        "`python3 benchmarks/bench_strategies.py --nproc-per-node 2 ...` on two H200s",
    ),
    Expected(
        "rehearse-1",
        "Rehearsal on one GPU as rank R of a world of N (fake process group), against the memory model",
        lambda r: _bid(r).startswith("rehearse_1x"),
        "`python3 benchmarks/bench_rehearse.py --group A|B|C --out RAW` on one H200, then "
        "`python3 benchmarks/bench_rehearse.py --summarize RAW --out benchmarks/results/rehearse_1xh200.json`",
    ),
    Expected(
        "rehearse-perf-1",
        "Step time, throughput and communication predicted on one GPU (`rehearse --perf`), against NVIDIA's "
        "published Llama 3 8B FSDP figure and a plain run",
        lambda r: _bid(r).startswith("rehearse_perf_1x"),
        "`python3 benchmarks/bench_rehearse_perf.py --out RAW` on one H200, then "
        "`python3 benchmarks/rehearse_perf_result.py RAW --out benchmarks/results/rehearse_perf_1xh200.json`",
    ),
    Expected(
        "moe-profile",
        "Megatron FSDP against the distributed optimizer on a MoE job, profiled: GPU kernel time by kind",
        lambda r: _bid(r).startswith("moe_profile_1x"),
        "`python3 benchmarks/bench_rehearse_perf.py --out RAW --only moe_prof_fsdp,moe_prof_distopt,"
        "moe_prof_fsdp_nomirror` on one GPU, then `python3 benchmarks/moe_profile_result.py RAW`",
    ),
    Expected(
        "evals-adversarial",
        "Eval grader's false-pass and false-fail rates on the adversarial regression set",
        lambda r: _bid(r) == "evals_adversarial",
        "`python3 -m evals adversarial --out benchmarks/results/evals_adversarial.json "
        "--report benchmarks/results/evals_adversarial_report.md`",
    ),
    Expected(
        "memory-vs-measured",
        "Memory per rank, `mfsdp.py memory` predicted vs measured, at data-parallel sizes up to 64 (dense, MoE "
        "with EP, hybrid, LoRA)",
        lambda r: _bid(r) == "memory_vs_measured",
        "`python3 benchmarks/bench_memory.py --raw-dir RUNS` on rehearsal runs (`scripts/rehearse_train.py`)",
    ),
    Expected(
        "ckpt-migration",
        "Checkpoint migration (torch_dist, fsdp_dtensor, Hugging Face) run and weights checked on one H200",
        lambda r: _bid(r) == "ckpt_migration_1xh200",
        "`python3 benchmarks/bench_ckpt_migration.py --out RAW` on one H200, then "
        "`python3 benchmarks/ckpt_migration_result.py RAW --out benchmarks/results/ckpt_migration_1xh200.json`",
    ),
    Expected(
        "what-works",
        "What works with Megatron FSDP: Bridge's recipes per family and mode through the skill's route, rehearsed "
        "as one rank of their real world on one H200",
        lambda r: _bid(r) == "what_works_1xh200",
        "`python3 benchmarks/bench_what_works.py --run --batch K --out RAW` on one H200 (one call per batch), then "
        "`python3 benchmarks/what_works_result.py RAW... --out benchmarks/results/what_works_1xh200.json`",
    ),
    Expected(
        "recommended-overrides",
        "Every override the skill recommends, rehearsed through wrap and two steps on the job it is meant for",
        lambda r: _bid(r) == "recommended_overrides_1xh200",
        "`python3 benchmarks/bench_recommended_overrides.py --run --batch K --out RAW` on one H200, then "
        "`--collect RAW... --out benchmarks/results/recommended_overrides_1xh200.json`",
    ),
    Expected(
        "evals-claude-code",
        "Skill evals with a real model in Claude Code (with and without the skill)",
        _real_eval("claude-code"),
        "`python3 -m evals run --agent claude-code` with a model API key, then `python3 -m evals report`",
    ),
    Expected(
        "evals-codex",
        "Skill evals with a real model in Codex (with and without the skill)",
        _real_eval("codex"),
        "`python3 -m evals run --agent codex` with a model API key, then `python3 -m evals report`",
    ),
)


class ReportError(Exception):
    """A result file cannot be used; the message names it."""


def load_results(results_dir: Path) -> list[tuple[str, dict]]:
    paths = sorted(results_dir.glob("*.json")) if results_dir.is_dir() else []
    return [(path.name, _load_one(path, path.name)) for path in paths]


def load_first_unseen(results_dir: Path) -> dict | None:
    """The grader's first measurement on unseen adversarial items (``FIRST_UNSEEN``), or None when absent."""
    path = raw_store.locate(FIRST_UNSEEN, results_dir)
    return _load_one(path, FIRST_UNSEEN_SHOWN) if path is not None and path.is_file() else None


def _load_one(path: Path, rel: str) -> dict:
    """One result file in the project's shape; ReportError naming REL when it is not."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReportError(f"{rel}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ReportError(f"{rel}: the top level is not an object")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ReportError(f"{rel}: missing {', '.join(missing)} (shape: {', '.join(REQUIRED)}, notes, raw)")
    cols, rows = table(data)
    if not isinstance(cols, list) or not isinstance(rows, list):
        raise ReportError(f"{rel}: columns and rows must be lists")
    for i, row in enumerate(rows):
        if isinstance(row, dict):  # rows as records (the columns name the fields shown): render those fields
            absent = [c for c in cols if c not in row]
            if absent:
                raise ReportError(f"{rel}: row {i + 1} has no {', '.join(map(str, absent))}")
            rows[i] = row = [row[c] for c in cols]
        if not isinstance(row, list) or len(row) != len(cols):
            raise ReportError(
                f"{rel}: row {i + 1} has {len(row) if isinstance(row, list) else 'no'} cells, columns has {len(cols)}"
            )
    notes = data.get("notes", [])
    if not isinstance(notes, list):
        raise ReportError(f"{rel}: notes must be a list of strings")
    return data


def table(data: dict) -> tuple:
    """(columns, rows of cells) to print: ``rows`` itself, or ``table_rows`` when ``rows`` are keyed records
    (a result whose rows carry named fields, e.g. ranges and per-group bytes, and a display table beside them)."""
    rows = data["rows"]
    if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows) and "table_rows" in data:
        return data["columns"], data["table_rows"]
    return data["columns"], rows


def fmt(value) -> str:
    """One table cell: numbers shortened for reading, None as a dash, pipes escaped."""
    if value is None:
        text = "—"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            text = str(value)
        elif abs(value) >= 1000:
            text = f"{value:,.1f}".rstrip("0").rstrip(".")
        elif value == int(value):
            text = f"{value:.1f}"
        elif abs(value) < 1:
            text = f"{value:.3g}"  # three significant digits: small seconds and ratios never round to zero
        else:
            text = f"{value:.3f}".rstrip("0").rstrip(".")
    elif isinstance(value, int):
        text = f"{value:,}" if abs(value) >= 10000 else str(value)
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _order(item: tuple[str, dict]) -> tuple:
    rel, data = item
    for i, exp in enumerate(EXPECTED):
        if exp.matches(data):
            return (i, _bid(data), rel)
    return (len(EXPECTED), _bid(data), rel)


def _percent(value) -> str:
    return f"{value:.0%}" if isinstance(value, (int, float)) and not isinstance(value, bool) else fmt(value)


def render_first_unseen(data: dict) -> list[str]:
    """A short section: the grader's rates on unseen items at their first measurement, and the command."""
    raw = data.get("raw") or {}
    both = next((row for row in data["rows"] if row and row[0] == "both formats"), None)
    if both is None or "false_pass_rate" not in raw or "false_fail_rate" not in raw:
        raise ReportError(f"{FIRST_UNSEEN_SHOWN}: no 'both formats' row or no rates in raw")
    cols = data["columns"]
    fp, ff = both[cols.index("False passes")], both[cols.index("False fails")]
    sets = ", ".join(f"`{s}`" for s in raw.get("sets", [])) or "an adversarial set"
    return [
        "",
        "## Eval grader on adversarial items it had never seen: first measurement, before any grader change",
        "",
        *_provenance(data, f"- Raw result: `{FIRST_UNSEEN_SHOWN}`"),
        f"On {fmt(raw.get('items'))} labelled items ({sets}, written without reading the grader) rendered as "
        f"{fmt(raw.get('transcripts'))} transcripts, the grader as it then stood gave false passes {fmt(fp)} and "
        f"false fails {fmt(ff)} (limit {_percent(raw.get('max_rate'))}). The section above gives the current rates "
        "on the repository's whole adversarial set.",
    ]


def render_first_vs_current(data: dict) -> list[str]:
    """Each adversarial batch's first measurement (before the grader was changed for it) beside its current rates."""
    per_set = (data.get("raw") or {}).get("per_set") or {}
    firsts = data.get("first_measurements") or []
    if not firsts:
        return []
    lines = [
        "",
        "Each batch's first measurement (the grader as it stood before any change for that batch) beside its current "
        "rates; a batch whose first measurement was not kept says why. False passes and false fails are over the runs "
        "the grader decided (first measurements recorded before the grader counted that way are over all runs of the "
        "label, as recorded); 'not judged' is over all runs:",
        "",
        "| Set | First: false passes | First: false fails | First: not judged | First measured by | "
        "Now: false passes | Now: false fails | Now: not judged |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in firsts:
        now = per_set.get(f.get("set"), {})
        bad, good = now.get("bad_decided", now.get("bad")), now.get("good_decided", now.get("good"))
        cur = [
            f"{now['false_passes']}/{bad} = {now['false_pass_rate']:.1%}" if now else None,
            f"{now['false_fails']}/{good} = {now['false_fail_rate']:.1%}" if now else None,
            f"{now['undecided']}/{now['runs']} = {now['undecided_rate']:.1%}" if now else None,
        ]
        if f.get("pending"):
            cur = ["pending: not in the repository set"] * 3
        if f.get("recorded"):
            first = [f.get("false_passes"), f.get("false_fails"), f.get("undecided")]
            how = f"{f.get('date')}, `{f.get('file')}`: {f.get('provenance')}"
        else:
            first, how = ["not recorded"] * 3, str(f.get("provenance"))
        lines.append("| " + " | ".join(fmt(c) for c in [f.get("set"), *first, how, *cur]) + " |")
    return lines


def _provenance(data: dict, where: str) -> list[str]:
    """Date, machine, ``where`` (the file the figures come from) and the command, as every section opens."""
    return [
        f"- Date: {fmt(data['date'])}",
        f"- Machine: {fmt(data['machine'])}",
        where,
        "- Command:",
        "",
        "```",
        str(data["command"]),
        "```",
        "",
    ]


def render(results: list[tuple[str, dict]], first_unseen: dict | None = None) -> str:
    results = sorted(results, key=_order)
    missing = [e for e in EXPECTED if not any(e.matches(d) for _, d in results)]
    lines = [
        "# Benchmarks: nemo-mbridge-perf-megatron-fsdp",
        "",
        "<!-- Generated by benchmarks/make_report.py from benchmarks/results/*.json; do not edit by hand. -->",
        f"<!-- Regenerate: {REGENERATE} -->",
        "",
        "Every table below was produced by the command shown with it, on the machine and date shown; the "
        "JSON it came from is in `benchmarks/results/`. Measurements that have not been made are listed at "
        "the end, as not measured.",
        "",
        "## Contents",
        "",
    ]
    for rel, data in results:
        lines.append(f"- {fmt(data['title'])} ({fmt(data['date'])}, `{rel}`)")
    if missing:
        lines.append(f"- Not measured yet: {len(missing)} item(s)")
    if not results:
        lines.append("- No result files yet.")
    for rel, data in results:
        lines += ["", f"## {fmt(data['title'])}", ""]
        lines += _provenance(data, f"- Result file: `benchmarks/results/{rel}` (benchmark `{fmt(data['benchmark'])}`)")
        cols, cells = table(data)
        if cells:
            lines.append("| " + " | ".join(fmt(c) for c in cols) + " |")
            lines.append("|" + "|".join("---" for _ in cols) + "|")
            for row in cells:
                lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
        else:
            lines.append("(the run produced no rows)")
        notes = [n for n in data.get("notes", []) if str(n).strip()]
        if notes:
            lines += ["", "Notes:", ""]
            lines += [f"- {str(n).strip()}" for n in notes]
        if _bid(data) == "evals_adversarial":
            lines += render_first_vs_current(data)
        if first_unseen is not None and _bid(data) == "evals_adversarial":
            lines += render_first_unseen(first_unseen)
            first_unseen = None
    if first_unseen is not None:
        lines += render_first_unseen(first_unseen)
    lines += ["", "## Not measured yet", ""]
    if missing:
        lines.append("No result file exists for these, so this report makes no claim about them:")
        lines.append("")
        for e in missing:
            lines.append(f"- **{e.title}**: not measured. Would be measured by {e.how}.")
    else:
        lines.append("Every expected measurement has a result file.")
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """The skill's one atomic writer (temp file, fsync, rename), as every result producer uses."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from mfsdp_lib import config_io

    config_io.write_atomic(str(path), text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="make_report.py", description=__doc__.split("\n\n")[0], epilog=f"Usually run as: {REGENERATE}"
    )
    p.add_argument("--results", type=Path, default=RESULTS, help="folder of result JSON files")
    p.add_argument("--output", type=Path, default=OUTPUT, help="file to write (default: BENCHMARK.md)")
    p.add_argument("--check", action="store_true", help="do not write; exit 1 when the output is stale")
    a = p.parse_args(argv)
    try:
        text = render(load_results(a.results), load_first_unseen(a.results))
    except ReportError as exc:
        sys.stderr.write(f"make_report.py: error: {exc}\n")
        return 2
    if a.check:
        current = a.output.read_text(encoding="utf-8") if a.output.is_file() else ""
        if current != text:
            sys.stderr.write(f"make_report.py: {a.output.name} is stale; regenerate with: {REGENERATE}\n")
            return 1
        print(f"{a.output.name} is current")
        return 0
    write_atomic(a.output, text)
    print(f"wrote {a.output} from {len(load_results(a.results))} result file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
