"""Turn ``run`` results into BENCHMARK tables: pass rates per dimension, with and without the skill.

Input: one or more results files written by ``python3 -m evals run``, all for
the same agent::

    {
      "agent": "claude-code" | "codex",
      "scripted_model": true,            # replies came from the scripted CI model server
      "model": "claude-sonnet-4-5",      # optional
      "cli_version": "2.1.332",          # optional
      "date": "2026-12-02T18:00:00Z",    # optional (ISO); default: now
      "machine": "words",                # optional; default: this host
      "command": "python3 -m evals run --agent claude-code ...",
      "runs": [
        {"case": "mfsdp-enable-llama3-recipe", "attempt": 1, "with_skill": true,
         "transcript": "path/to/transcript.jsonl", "grade": {<evals.grader.grade() result>}},
        ...
      ]
    }

``with_skill`` and ``scripted_model`` may also come from ``grade.transcript``
(the invocation record). A run whose grade is missing (the CLI crashed, the
transcript was unreadable) counts as failed on every dimension: dropping it
would flatter the numbers.

Output, in the project's benchmark shape (``{"benchmark", "title", "date",
"machine", "command", "columns", "rows", "notes", "raw"}``):

* ``benchmarks/results/evals_<agent>.json``: one row per dimension plus "All
  five": runs with the skill, how many of them were not judged, the pass rate
  over the decided runs with it and without it, and the uplift in percentage
  points (NVIDIA reports the same five dimensions); its notes and raw give the
  verdicts: passes decided by the outcome (the file the run left, checked with
  the skill's own tools), passes decided by the judge, not judged, fails;
* ``benchmarks/results/evals_<agent>_cases.json``: one row per case.

Runs against the scripted model prove the plumbing (real CLI, real skill
install, real tool calls, real grading), not a model's ability; their title
and notes say "scripted model (CI plumbing test), not a model's performance",
so BENCHMARK.md can never present them as one.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import tempfile
from pathlib import Path

from .transcripts import UnreadableTranscript, read_json_file

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results"
DIMENSIONS = ("security", "correctness", "discoverability", "effectiveness", "efficiency")
SCRIPTED_LABEL = "scripted model (CI plumbing test), not a model's performance"
AGENT_NAMES = {"claude-code": "Claude Code", "codex": "Codex"}


def configure(parser) -> None:
    parser.description = (
        "Turn results files of 'python3 -m evals run' into benchmarks/results/evals_<agent>.json "
        "(pass rate per dimension with and without the skill, and the uplift) and "
        "evals_<agent>_cases.json (per case)."
    )
    parser.epilog = (
        "example: python3 -m evals report out/claude-with.json out/claude-without.json\n"
        "Scripted-model runs are labelled '" + SCRIPTED_LABEL + "'."
    )
    parser.add_argument("results", nargs="+", help="results JSON file(s) written by 'run' (one agent)")
    parser.add_argument("--out-dir", default=str(DEFAULT_OUT), help="where to write (default: benchmarks/results)")
    parser.add_argument("--format", choices=("text", "json"), default="text")


def _load(path: str) -> dict:
    data = read_json_file(path, "results")
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise UnreadableTranscript(f"results {path}: expected an object with a 'runs' list")
    return data


def _with_skill(run: dict) -> bool | None:
    if isinstance(run.get("with_skill"), bool):
        return run["with_skill"]
    t = (run.get("grade") or {}).get("transcript") or {}
    return t.get("with_skill") if isinstance(t.get("with_skill"), bool) else None


def _passed(run: dict, dim: str | None) -> bool | None:
    """True, False, or None where the run (or its dimension) was not judged: no file the run left and no judge
    decided its correctness. A run without a grade failed."""
    g = run.get("grade")
    if not isinstance(g, dict):
        return False
    if dim is None:
        p = g.get("passed")
    else:
        d = (g.get("dimensions") or {}).get(dim)
        p = d.get("passed") if isinstance(d, dict) else False
    return None if p is None else bool(p)


def _rate(runs: list[dict], dim: str | None) -> float | None:
    """The pass rate over the runs that were decided (not judged runs are left out, and counted beside it)."""
    decided = [p for p in (_passed(r, dim) for r in runs) if p is not None]
    return None if not decided else sum(decided) / len(decided)


def _not_judged(runs: list[dict], dim: str | None) -> int:
    return sum(1 for r in runs if _passed(r, dim) is None)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{round(100 * x)}%"


def _uplift(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "n/a"
    pp = round(100 * (a - b))
    return f"{pp:+d} pp"


# How a run's verdict was reached (evals.grader: "decided_by"); a failed run is a fail whatever decided it.


def verdicts(runs: list[dict]) -> dict[str, int]:
    """Outcome-decided passes, judge-decided passes, runs not judged, fails."""
    out = {"outcome": 0, "judge": 0, "not_judged": 0, "failed": 0}
    for r in runs:
        p = _passed(r, None)
        if p is None:
            out["not_judged"] += 1
        elif p is False:
            out["failed"] += 1
        elif (r.get("grade") or {}).get("decided_by") == "judge":
            out["judge"] += 1
        else:
            out["outcome"] += 1  # a pass is decided by the file the run left or by the judge, never by prose
    return out


def build(results: list[dict], report_command: str | None = None) -> tuple[dict, dict]:
    """The two benchmark objects (summary, per case) for the merged RESULTS."""
    agents = {r.get("agent") for r in results}
    if len(agents) != 1 or None in agents:
        raise UnreadableTranscript(f"results must all name one agent, got {sorted(map(str, agents))}")
    agent = agents.pop()
    runs = [run for r in results for run in r["runs"] if isinstance(run, dict)]
    scripted = any(bool(r.get("scripted_model")) for r in results) or any(
        bool(((run.get("grade") or {}).get("transcript") or {}).get("scripted_model")) for run in runs
    )
    with_runs = [r for r in runs if _with_skill(r) is True]
    without_runs = [r for r in runs if _with_skill(r) is False]
    first = results[0]
    date = first.get("date") or _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    machine = first.get("machine") or f"{platform.node() or 'host'}: {platform.platform()}, {os.cpu_count()} CPUs"
    command = " ; ".join(dict.fromkeys(str(r["command"]) for r in results if r.get("command"))) or (
        report_command or "python3 -m evals report"
    )
    who = AGENT_NAMES.get(str(agent), str(agent))
    model = first.get("model")
    label = f"{who} CLI" + (f" {first['cli_version']}" if first.get("cli_version") else "")
    if scripted:
        title = f"Skill evals, {label}: {SCRIPTED_LABEL}"
    else:
        title = f"Skill evals, {label}" + (f" with {model}" if model else "") + ": pass rate with and without the skill"
    notes = []
    if scripted:
        notes.append(
            f"{SCRIPTED_LABEL}: every reply came from the scripted model server on 127.0.0.1; the CLI, the "
            "skill install, the tool calls and the grading are real, the answers and token counts are not."
        )
    vw, vo = verdicts(with_runs), verdicts(without_runs)
    judge_names = sorted(
        {str(((r.get("grade") or {}).get("judge") or {}).get("name")) for r in runs if _judge_answered(r)}
    )
    notes += [
        f"{len(with_runs)} run(s) with the skill installed, {len(without_runs)} without; "
        f"{len({r.get('case') for r in runs})} case(s).",
        f"With the skill: {vw['outcome']} passed as decided by the file the run left (checked by the skill's own "
        f"tools), {vw['judge']} passed as decided by the judge, {vw['not_judged']} not judged, {vw['failed']} failed. "
        f"Without: {vo['outcome']}, {vo['judge']}, {vo['not_judged']} not judged, {vo['failed']} failed.",
        "Prose alone never passes: a run whose answer trips no deterministic fail but whose case asks for no file is "
        "not judged unless a judge decides it ("
        + (f"judge: {', '.join(judge_names)}" if judge_names else "no judge gave a verdict in these runs")
        + ").",
        "Rates and uplift count only decided runs: a dimension's rate is the share of its decided runs that passed "
        "it, 'All five' the share of decided runs that passed every dimension; the 'Not judged' columns say how many "
        "runs each rate leaves out. Uplift = with skill minus without, in percentage points.",
        "Graded by evals/grader.py from the transcript's structure: the file the case asks for checked with the "
        "skill's own tools in the project the run left, the answer's claims held to its own tool runs' real output, "
        "deterministic fails (forbidden claims, destructive commands, made-up figures), skill load, the expected "
        "script run on the case's input with a visible exit status, budgets in evals/budgets.json.",
    ]
    if not without_runs:
        notes.append("No run without the skill: uplift not measured.")
    if report_command:
        notes.append(f"Tables written by: {report_command}")

    rows, raw_dims = [], {}
    for dim in list(DIMENSIONS) + [None]:
        a, b = _rate(with_runs, dim), _rate(without_runs, dim)
        nw, nwo = _not_judged(with_runs, dim), _not_judged(without_runs, dim)
        name = dim.capitalize() if dim else "All five (case passes)"
        rows.append([name, len(with_runs), nw, _pct(a), nwo, _pct(b), _uplift(a, b)])
        raw_dims[dim or "all"] = {
            "with_skill": a,
            "without_skill": b,
            "not_judged_with_skill": nw,
            "not_judged_without_skill": nwo,
        }
    summary = {
        "benchmark": f"evals_{agent}",
        "title": title,
        "date": date,
        "machine": machine,
        "command": command,
        "columns": [
            "Dimension",
            "Runs with skill",
            "Not judged with skill",
            "With skill (of decided)",
            "Not judged without",
            "Without skill (of decided)",
            "Uplift (decided runs)",
        ],
        "rows": rows,
        "notes": notes,
        "raw": {
            "agent": agent,
            "scripted_model": scripted,
            "model": model,
            "cli_version": first.get("cli_version"),
            "rates": raw_dims,
            "verdicts": {"with_skill": vw, "without_skill": vo},
            "runs": [_raw_run(r) for r in runs],
        },
    }

    case_rows = []
    for cid in dict.fromkeys(r.get("case") for r in runs):
        w = [r for r in with_runs if r.get("case") == cid]
        wo = [r for r in without_runs if r.get("case") == cid]
        a, b = _rate(w, None), _rate(wo, None)
        failing = sorted({d for r in w for d in DIMENSIONS if _passed(r, d) is False})
        how = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in verdicts(w).items() if n)
        case_rows.append([cid, len(w), how or "-", _pct(a), len(wo), _pct(b), _uplift(a, b), ", ".join(failing) or "-"])
    cases = {
        "benchmark": f"evals_{agent}_cases",
        "title": title.replace("Skill evals", "Skill evals per case", 1),
        "date": date,
        "machine": machine,
        "command": command,
        "columns": [
            "Case",
            "Runs with skill",
            "Verdicts with skill",
            "Pass with skill (of decided)",
            "Runs without",
            "Pass without skill",
            "Uplift",
            "Dimensions failed with skill",
        ],
        "rows": case_rows,
        "notes": notes[:1] if scripted else [],
        "raw": {"agent": agent, "scripted_model": scripted},
    }
    return summary, cases


def _raw_run(run: dict) -> dict:
    grade = run.get("grade")
    g: dict = grade if isinstance(grade, dict) else {}
    judge = g.get("judge") if isinstance(g.get("judge"), dict) else {}
    return {
        "case": run.get("case"),
        "attempt": run.get("attempt"),
        "with_skill": _with_skill(run),
        "transcript": run.get("transcript"),
        "passed": _passed(run, None),
        "status": g.get("status") or ("pass" if g.get("passed") else "fail"),
        "decided_by": g.get("decided_by"),
        "judge": {k: judge.get(k) for k in ("name", "status", "passed", "reason")} if judge else None,
        "scores": {d: (g.get("dimensions") or {}).get(d, {}).get("score") for d in DIMENSIONS},
        "usage": g.get("transcript"),
    }


def _judge_answered(run: dict) -> bool:
    j = (run.get("grade") or {}).get("judge")
    return isinstance(j, dict) and j.get("status") == "judged"


def write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main_args(args) -> int:
    results = [_load(p) for p in args.results]
    report_command = "python3 -m evals report " + " ".join(shlex.quote(p) for p in args.results)
    summary, cases = build(results, report_command)
    out = Path(args.out_dir)
    written = []
    for obj in (summary, cases):
        path = out / f"{obj['benchmark']}.json"
        write_atomic(path, obj)
        written.append(str(path))
    if args.format == "json":
        print(json.dumps({"written": written, "rows": summary["rows"]}, indent=2))
    else:
        print(summary["title"])
        w = [max(len(str(x)) for x in col) for col in zip(summary["columns"], *summary["rows"], strict=True)]
        for row in [summary["columns"]] + summary["rows"]:
            print("  " + "  ".join(str(x).ljust(n) for x, n in zip(row, w, strict=True)))
        for p in written:
            print(f"wrote {p}")
    return 0
