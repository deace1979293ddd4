"""``python3 -m evals validate|grade|run|report``: the skill's eval harness.

* ``validate`` checks ``evals/evals.json`` against ``evals/evals.schema.json``
  (jsonschema, imported only here), unique ids, that every ``expected_script``
  file exists and its subcommand is one of ``scripts/mfsdp.py``'s ``COMMANDS``
  (read from the file's source, not imported), that ``evals/checks.py`` has
  checks for exactly these cases, that ``budgets.json`` names only known cases,
  and the coverage the project promises (>= 20 cases, >= 5 decoys, >= 6 cases
  that run a script).
* ``grade --case ID TRANSCRIPT`` scores one transcript (see ``evals.grader``):
  exit 0 pass, 1 fail, 2 unreadable transcript or unknown case.
* ``run`` is the end-to-end runner (``evals/runner.py``), imported
  only when asked for, so the rest works without it.
* ``report RESULTS.json`` turns a ``run`` results file into the BENCHMARK tables
  under ``benchmarks/results/`` (see ``evals.report``).

Bad input is one line on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from pathlib import Path, PurePosixPath

from . import checks as checks_mod
from .transcripts import AGENTS, UnreadableTranscript, read_json_file

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCHEMA_JSON = HERE / "evals.schema.json"
EVALS_JSON = HERE / "evals.json"
BUDGETS_JSON = HERE / "budgets.json"
DISPATCHER = ROOT / "scripts" / "mfsdp.py"

# What the case set promises: enough cases, decoys, cases that run a script, traps, and users' projects.
MIN_CASES, MIN_NEGATIVE, MIN_SCRIPT = 40, 5, 6
MIN_NEGATIVE_OR_TRAP = 10  # decoys (expected_skill null) plus trap-* cases
MIN_FIXTURE_SHARE = 0.5  # at least half the cases start in a project of the user's
# At least half the positive cases leave a file that decides correctness (evals/outcomes.py): prose alone cannot.
MIN_OUTCOME_SHARE = 0.5

PROG = "python3 -m evals"
EPILOG = f"""\
examples:
  {PROG} validate
  {PROG} grade --case mfsdp-ckpt-format-assertion run/claude.jsonl --format json
  {PROG} grade --case mfsdp-vs-fsdp2 run/claude.jsonl --judge "claude -p"      # a judge decides prose cases
  {PROG} run --agent claude-code --cases decoy-torchtitan-fsdp2 --attempts 1   # scripted model without an API key
  {PROG} report results/claude-code.json

exit codes: 0 ok / passed, 1 invalid cases / failed, 2 unusable input, 4 not judged (grade: no file the run
left and no judge decided correctness, and nothing failed it; prose alone is never a pass).
"""


def _fail(msg: str) -> int:
    sys.stderr.write(f"{PROG}: {msg}\n")
    return 2


def dispatcher_commands(path: Path = DISPATCHER) -> set[str]:
    """The keys of COMMANDS in scripts/mfsdp.py, read from its source (no import)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        names = [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else []
        if "COMMANDS" in names and isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return set()


def validate_cases(cases, schema: dict, root: Path = ROOT, budgets: dict | None = None) -> list[str]:
    """Every problem with the case set, as lines (empty: valid)."""
    try:
        import jsonschema  # type: ignore[import-untyped,unused-ignore]  # no stubs shipped
    except ImportError:  # pragma: no cover - depends on the environment
        raise UnreadableTranscript("validate needs the jsonschema package (pip install 'jsonschema>=4.17')") from None
    problems = []
    validator = jsonschema.Draft202012Validator(schema)
    for err in sorted(validator.iter_errors(cases), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in err.absolute_path) or "(root)"
        problems.append(f"schema: {where}: {err.message}")
    if not isinstance(cases, list):
        return problems
    objs = [c for c in cases if isinstance(c, dict)]
    ids = [c.get("id") for c in objs]
    for dup in sorted({i for i in ids if ids.count(i) > 1 and isinstance(i, str)}):
        problems.append(f"duplicate id: {dup}")
    commands_cache: dict[Path, set[str]] = {}
    for c in objs:
        spec = c.get("expected_script")
        if not isinstance(spec, str):
            continue
        parts = spec.split()
        script = root / parts[0]
        if not script.is_file():
            problems.append(f"{c.get('id')}: expected_script file {parts[0]} does not exist")
            continue
        if len(parts) > 1:
            if script.resolve() not in commands_cache:
                try:
                    commands_cache[script.resolve()] = dispatcher_commands(script)
                except (OSError, SyntaxError, ValueError):
                    commands_cache[script.resolve()] = set()
            known = commands_cache[script.resolve()]
            if parts[1] not in known:
                problems.append(
                    f"{c.get('id')}: '{parts[1]}' is not a command of {parts[0]} "
                    f"(known: {', '.join(sorted(known)) or 'none'})"
                )
    known_ids = {i for i in ids if isinstance(i, str)}
    for cid in sorted(known_ids - set(checks_mod.CHECKS)):
        problems.append(f"{cid}: no answer checks in evals/checks.py")
    for cid in sorted(set(checks_mod.CHECKS) - known_ids):
        problems.append(f"evals/checks.py has checks for unknown case {cid}")
    if budgets is not None:
        for cid in sorted(set(budgets.get("cases", {})) - known_ids):
            problems.append(f"budgets.json names unknown case {cid}")
    neg = sum(1 for c in objs if c.get("expected_skill") is None)
    scr = sum(1 for c in objs if isinstance(c.get("expected_script"), str))
    if len(objs) < MIN_CASES:
        problems.append(f"coverage: {len(objs)} cases, at least {MIN_CASES} wanted")
    if neg < MIN_NEGATIVE:
        problems.append(f"coverage: {neg} negative/decoy cases, at least {MIN_NEGATIVE} wanted")
    if scr < MIN_SCRIPT:
        problems.append(f"coverage: {scr} cases with an expected_script, at least {MIN_SCRIPT} wanted")
    traps = sum(1 for c in objs if c.get("expected_skill") is None or str(c.get("id", "")).startswith("trap-"))
    if traps < MIN_NEGATIVE_OR_TRAP:
        problems.append(f"coverage: {traps} negative or trap cases, at least {MIN_NEGATIVE_OR_TRAP} wanted")
    with_fixture = [i for i in known_ids if i in checks_mod.CHECKS and checks_mod.CHECKS[i].fixture]
    if objs and len(with_fixture) < MIN_FIXTURE_SHARE * len(objs):
        problems.append(f"coverage: {len(with_fixture)} cases start in a user's project, at least half wanted")
    for cid in sorted(with_fixture):
        fixture = HERE / "fixtures" / str(checks_mod.CHECKS[cid].fixture)
        if not fixture.is_dir():
            problems.append(f"{cid}: fixture folder {fixture.relative_to(ROOT)} does not exist")
    positive = [c.get("id") for c in objs if c.get("expected_skill") is not None]
    checked = [i for i in positive if i in checks_mod.CHECKS and checks_mod.CHECKS[i].outcome is not None]
    if positive and len(checked) < MIN_OUTCOME_SHARE * len(positive):
        problems.append(
            f"coverage: {len(checked)} of {len(positive)} positive cases are outcome-checked, at least half wanted"
        )
    question = {c.get("id"): str(c.get("question", "")) for c in objs}
    for cid in sorted(checked):
        outcome = checks_mod.CHECKS[cid].outcome
        for path in outcome.paths if outcome is not None else ():
            names = (path, PurePosixPath(path).name, PurePosixPath(path).parts[0])
            if not any(n in question[cid] for n in names):
                problems.append(f"{cid}: the question never names the file its outcome check reads ({path})")
    return problems


def cmd_validate(args) -> int:
    cases = read_json_file(Path(args.evals), "cases file")
    schema = read_json_file(Path(args.schema), "schema")
    budgets = read_json_file(BUDGETS_JSON, "budgets") if BUDGETS_JSON.is_file() else None
    problems = validate_cases(cases, schema, budgets=budgets)
    objs = [c for c in cases if isinstance(c, dict)] if isinstance(cases, list) else []
    summary = {
        "ok": not problems,
        "cases": len(objs),
        "negative": sum(1 for c in objs if c.get("expected_skill") is None),
        "with_script": sum(1 for c in objs if isinstance(c.get("expected_script"), str)),
        "outcome_checked": sum(
            1 for c in objs if c.get("id") in checks_mod.CHECKS and checks_mod.CHECKS[c["id"]].outcome is not None
        ),
        "problems": problems,
    }
    if args.format == "json":
        print(json.dumps(summary, indent=2))
    else:
        for p in problems:
            print(f"error: {p}")
        print(
            f"{args.evals}: {summary['cases']} cases ({summary['negative']} negative, "
            f"{summary['with_script']} run a script, {summary['outcome_checked']} outcome-checked): "
            f"{'valid' if not problems else f'{len(problems)} problem(s)'}"
        )
    return 0 if not problems else 1


def cmd_grade(args) -> int:
    from . import grader

    try:
        case = grader.get_case(args.case, args.evals)
    except KeyError:
        return _fail(f"unknown case '{args.case}' in {args.evals or EVALS_JSON}")
    meta = None
    if args.meta:
        from .transcripts import load_meta

        meta = load_meta(args.meta, args.meta_sha256)
    elif args.meta_sha256:
        return _fail("--meta-sha256 needs --meta")
    if args.workspace and not Path(args.workspace).is_dir():
        return _fail(f"--workspace {args.workspace}: not a folder")
    result = grader.grade(
        case, args.transcript, agent=args.agent, judge=args.judge, meta=meta, workspace=args.workspace
    )
    if args.format == "json":
        print(json.dumps(result, indent=2))
    else:
        sys.stdout.write(grader.render_text(result))
    return {True: 0, False: 1}.get(result["passed"], 4)


def cmd_report(args) -> int:
    from . import report

    return report.main_args(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Eval harness of the Megatron FSDP skill: validate the cases, "
        "grade transcripts, run agents end to end, report.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="{validate,grade,run,adversarial,report}")
    v = sub.add_parser("validate", help="check evals.json against its schema and the scripts it names")
    v.add_argument("--evals", default=str(EVALS_JSON), help="cases file (default: evals/evals.json)")
    v.add_argument("--schema", default=str(SCHEMA_JSON), help="JSON Schema (default: evals/evals.schema.json)")
    v.add_argument("--format", choices=("text", "json"), default="text")
    g = sub.add_parser(
        "grade",
        help="score one transcript on the five dimensions",
        description="Score TRANSCRIPT (Claude Code stream-json or Codex exec --json; a "
        "file beside it is never read: pass the runner's invocation record with --meta and the digest the runner "
        "recorded with --meta-sha256) against case ID.",
        epilog=f"example: {PROG} grade --case decoy-cuda-graphs out/codex.jsonl --agent codex\n"
        f"         {PROG} grade --case mfsdp-sharding-strategy-typo run/transcript.jsonl --workspace run/project\n\n"
        "Correctness is right, wrong (only on decisive evidence: a wrong file, a forbidden setting with a required\n"
        "point missing, a claim the tool's own output contradicts) or undecided. Prose alone never passes: a case\n"
        "whose question asks for a file is decided by that file in --workspace (the project as the run left it),\n"
        "checked with the skill's own tools; any other run that fails nothing is 'not judged' (JSON: \"passed\":\n"
        'null, "decided_by": null) unless the judge (--judge CMD) decides it.\n\n'
        "exit codes: 0 passed, 1 failed, 4 not judged, 2 unusable input.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument("--case", required=True, help="case id from evals.json")
    g.add_argument("transcript", help="transcript file (JSON Lines)")
    g.add_argument("--agent", choices=AGENTS, help="which CLI wrote it (default: detected)")
    g.add_argument("--format", choices=("text", "json"), default="text")
    g.add_argument(
        "--judge",
        metavar="CMD",
        default="off",
        help="the judge: a command that reads the prompt (the case's ground truth, expected behaviour and the "
        'transcript) on stdin and prints a verdict, e.g. "claude -p"; its verdict decides the runs the evidence '
        "leaves open (verdict, judge and reason are recorded). 'api': the Anthropic API with ANTHROPIC_API_KEY. "
        "Default off: such runs are 'not judged' (exit 4)",
    )
    g.add_argument("--meta", help="the runner's invocation record for this transcript (e.g. TRANSCRIPT.meta.json)")
    g.add_argument("--meta-sha256", help="the SHA-256 the runner recorded for --meta (results.json: meta_sha256)")
    g.add_argument(
        "--workspace",
        help="the project folder as the run left it (the runner's attempt-N/project): the file a case asks for "
        "is checked there; without it such a case is graded on the prose alone",
    )
    g.add_argument("--evals", default=None, help="cases file (default: evals/evals.json)")
    sub.add_parser("run", help="run the agent CLIs end to end (evals/runner.py)", add_help=False)
    sub.add_parser("adversarial", help="the grader's false-pass / false-fail rates on the labelled set", add_help=False)
    r = sub.add_parser("report", help="turn a run results file into benchmarks/results/evals_<agent>.json")
    from . import report as report_mod

    report_mod.configure(r)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "adversarial":
        from . import adversarial

        return adversarial.main(argv[1:])
    if argv and argv[0] == "run":
        if not (HERE / "runner.py").is_file():
            return _fail("'run' needs evals/runner.py (the end-to-end runner), which is not in this copy")
        try:
            from . import runner
        except ImportError as exc:
            return _fail(f"'run' could not load evals/runner.py: {exc}")
        return int(runner.main(argv[1:]) or 0)
    parser = build_parser()
    if not argv:
        parser.print_help()
        return 2
    args = parser.parse_args(argv)
    handlers = {"validate": cmd_validate, "grade": cmd_grade, "report": cmd_report}
    try:
        return handlers[args.command](args)
    except UnreadableTranscript as exc:
        return _fail(str(exc))
    except BrokenPipeError:  # output piped into head: not an error of ours
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        sys.stderr.write("python3 -m evals: interrupted\n")
        return 130
    except Exception as exc:  # a bug in the harness: one line, like scripts/mfsdp.py (exit 3)
        if os.environ.get("MFSDP_DEBUG") == "1":
            raise
        sys.stderr.write(
            f"python3 -m evals {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(a bug in the eval harness; rerun with MFSDP_DEBUG=1 for the traceback)\n"
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
