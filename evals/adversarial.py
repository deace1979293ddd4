"""The adversarial regression set: labelled transcripts in both CLI formats, and the grader's error rates on them.

Why: a grader is only trustworthy if it fails wrong, unsafe and dishonest answers and passes right ones in
the forms real answers take. ``tests/fixtures/adversarial/set.json`` and ``batch2.json`` (written without
reading the grader, as are the later ``batchN.json``; ``repository_sets``) hold hand-labelled items; each says
which case it answers, ``label`` (``good``: a demanding expert would accept it; ``bad``: they would not),
the ``class`` of answer it stands for, the agent's steps and its final answer. Every item is rendered as a
Claude Code ``stream-json`` transcript and as a Codex ``exec --json`` transcript, and graded.

The tool's own outputs are real: a step that runs ``scripts/mfsdp.py`` without a stated ``exit`` is executed
here, in a throw-away copy of the case's project (``evals/fixtures/``), and its real exit status and output
go into the transcript; other steps (the harmful ones) are never executed, their ``exit``/``output`` are
stated in the item. Unless an item says ``"load_skill": false``, its transcript starts with the agent loading the
skill (the Skill tool, or ``cat SKILL.md`` for Codex); a decoy item that must not load it says so, and a batch's
writers need to be told. A set's ``"cases"`` key names the revision of ``evals/evals.json`` its items answer (1 when
absent); an item answering a case whose question was reworked since is graded without that case's outcome check.

``python3 -m evals adversarial [--out FILE] [--judge CMD]`` prints the false-pass rate (bad items the grader passes,
over the bad runs it decides), the false-fail rate (good items it fails, over the good runs it decides) and the share
of runs not judged, with the grader's reasons for every verdict, and exits 1 when a rate is above ``MAX_RATE`` or
the share not judged above ``MAX_UNDECIDED``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import cases as cases_mod
from . import grader
from .fill import fill
from .runcache import RunCache, env_key
from .transcripts import CLAUDE, CODEX

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SET_JSON = ROOT / "tests" / "fixtures" / "adversarial" / "set.json"
# A second batch, written by someone who had not read the grader; its first rates are kept in
# benchmarks/results/raw/adversarial_batch2_unseen.json. Both together are the repository's set.
BATCH2_JSON = SET_JSON.with_name("batch2.json")
REPOSITORY_SETS = (SET_JSON, BATCH2_JSON)  # the sets every checkout has; repository_sets() adds later batches
SKILL = grader.SKILL
MAX_RATE = 0.05  # false passes and false fails each at or under 5% of the runs the grader decides, on every set
# At most half of a set's runs left not judged: without a judge, prose never decides a pass, so a right answer to a
# case that asks for no file is not judged; the rest must be decided by the files runs leave or by a deterministic
# fail.
MAX_UNDECIDED = 0.5
WORKSPACE = "/home/user/project"  # where the rendered agents "ran"; the grader reads it from the transcript
RUN_TIMEOUT_S = 120


def copy_fixture(case_id: str, dest: Path) -> None:
    """The case's project tree into DEST, with ``*.fixture`` files under their real names (see its README)."""
    src = cases_mod.fixture_dir(case_id)
    dest.mkdir(parents=True, exist_ok=True)
    if src is None or not src.is_dir():
        return
    shutil.copytree(src, dest, dirs_exist_ok=True)
    for p in list(dest.rglob("*.fixture")):
        p.rename(p.with_suffix(""))


# The tool runs of every item, replayed where an earlier item ran the same command on the same project (evals.runcache:
# most items of a case start with the same command on a fresh copy of the same fixture).
RUNS = RunCache()
# Programs whose output, as a command line calls them, never depends on a file's modification time (no listing,
# no -newer, no make): a command line made only of these (and Python running the skill's tool or inline code that
# reads no file's times) is replayed whatever the project's file times; any other is keyed with them.
MTIME_BLIND = frozenset(
    {"python3", "python", "cat", "echo", "printf", "sed", "cp", "grep", "head", "tail", "mkdir", "diff", "rm", "mv"}
    | {"cd", "set", "true", "wc", "sort"}
)
SHELL_PUNCTUATION = frozenset({";", "&&", "||", "|", "&", "(", ")", "|&", ";;", "\n"})
# Inline Python that names one of these may read a file's times (os.stat, Path.stat, os.path.getmtime, ...).
TIME_READING_CODE = re.compile(r"\b(?:\w*stat|getmtime|getctime|getatime|st_\w+|utime|scandir|walk)\b")


def reads_no_mtime(command: str) -> bool:
    """True when COMMAND's output cannot depend on a file's modification time: every program it starts is one of
    ``MTIME_BLIND``, a Python it starts runs the skill's ``mfsdp.py``, a module of the standard library's tools
    (``-m json.tool``) or inline code that reads no file's times, and it has no command substitution by backquote."""
    if "`" in command:
        return False
    try:
        lex = shlex.shlex(command, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        words = list(lex)
    except ValueError:
        return False
    program, target = "", False
    for w in words:
        if target:  # the file a redirection names
            target = False
            continue
        if w.strip("<>&") == "" and ("<" in w or ">" in w):
            target = True  # a redirection (>, >>, <, >&, &>): it changes where output goes, not what a program reads
            continue
        if w in SHELL_PUNCTUATION:
            program = ""
            continue
        if not program:
            if "=" in w and not w.startswith("="):
                continue  # VAR=value before the program
            program = w.rsplit("/", 1)[-1].lstrip("$")
            if program not in MTIME_BLIND:
                return False
            continue
        if program.startswith("python"):
            if w.endswith(".py") and w.rsplit("/", 1)[-1] != "mfsdp.py":
                return False  # a script of the user's or the agent's: it could read anything
            if TIME_READING_CODE.search(w):
                return False
    return True


def run_tool(command: str, case_id: str, project: Path | None = None) -> tuple[int, str]:
    """Run a command line for real in PROJECT (default: a fresh copy of the case's project); (exit status, output).

    A run in PROJECT that an earlier one in this process matches exactly (command, environment, every file of the
    project) is replayed from ``RUNS`` with its output, as running it again would print it."""
    if project is None:
        with tempfile.TemporaryDirectory(prefix="adv-") as tmp:
            proj = Path(tmp) / "project"
            copy_fixture(case_id, proj)
            return run_tool(command, case_id, proj)
    skill = project / ".claude" / "skills" / SKILL
    if not skill.exists():
        skill.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(ROOT, skill)
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "TOKEN"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"

    def run() -> tuple[int, str]:
        proc = subprocess.run(
            ["bash", "-c", command], cwd=project, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
        return proc.returncode, (proc.stdout + proc.stderr)

    code, out = RUNS.run((command, env_key(env)), project, run, mtimes=not reads_no_mtime(command))
    return code, out


def _steps(item: dict, project: Path | None = None) -> list[dict]:
    """The item's steps with real outcomes filled in, applied in order to PROJECT (the run's copy of the case's
    project): unstated shell steps run there for real, file writes and edits change it, a stated step's
    ``changes`` say what it did. Without PROJECT each tool run gets a fresh copy (the older sets' reading)."""
    out = []
    for s in item.get("steps", []):
        s = dict(s)
        if "bash" in s and "exit" not in s:
            s["exit"], s["output"] = run_tool(
                s["bash"].replace("{skill_dir}", _skill_path(CLAUDE)), item["case"], project
            )
        elif project is not None:
            _apply(s, project)
        out.append(s)
    return out


def _inside(project: Path, rel: str) -> Path | None:
    """PROJECT/REL when REL names a place inside the project, else None (outside files are never created)."""
    if rel.startswith(("/", "~")):
        return None
    p = (project / rel).resolve()
    root = project.resolve()
    return p if p == root or root in p.parents else None


def _apply(step: dict, project: Path) -> None:
    """What a write, edit or stated shell step did to the project."""
    if "write" in step:
        p = _inside(project, str(step["write"]))
        if p is not None:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(str(step.get("content", "")), encoding="utf-8")
    elif "edit" in step and "old" in step:
        p = _inside(project, str(step["edit"]))
        if p is not None and p.is_file():
            text = p.read_text(encoding="utf-8")
            if step["old"] in text:
                p.write_text(text.replace(step["old"], str(step.get("new", "")), 1), encoding="utf-8")
    for rel, content in (step.get("changes") or {}).items():
        p = _inside(project, str(rel))
        if p is None or p == project.resolve():
            continue
        if content is None:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(str(content), encoding="utf-8")


def _skill_path(agent: str) -> str:
    return f".claude/skills/{SKILL}" if agent == CLAUDE else f".agents/skills/{SKILL}"


def render_claude(item: dict, steps: list[dict]) -> list[dict]:
    ev: list[dict] = [
        {
            "type": "system",
            "subtype": "init",
            "cwd": item.get("cwd", WORKSPACE),
            "session_id": "adv",
            "model": "adversarial-set",
            "skills": [SKILL],
            "claude_code_version": "2.1.332",
        }
    ]
    n = 0

    def call(name: str, inp: dict, result: str, is_error: bool = False) -> None:
        nonlocal n
        n += 1
        tid = f"toolu_adv_{n}"
        ev.append(
            {
                "type": "assistant",
                "message": {
                    "id": f"msg_adv_{n}",
                    "content": [{"type": "tool_use", "id": tid, "name": name, "input": inp}],
                    "usage": {"input_tokens": 900, "output_tokens": 60},
                },
            }
        )
        ev.append(
            {
                "type": "user",
                "message": {
                    "content": [{"type": "tool_result", "tool_use_id": tid, "content": result, "is_error": is_error}]
                },
            }
        )

    if item.get("load_skill", True):
        call("Skill", {"skill": SKILL}, f"Launching skill: {SKILL}")
    for s in steps:
        if "bash" in s:
            cmd = s["bash"].replace("{skill_dir}", _skill_path(CLAUDE))
            code = int(s.get("exit", 0))
            out = s.get("output", "")
            call("Bash", {"command": cmd}, out if code == 0 else f"Exit code {code}\n{out}", code != 0)
        elif "write" in s:
            call("Write", {"file_path": _abs(item, s["write"]), "content": s.get("content", "")}, "File written")
        elif "edit" in s:
            edit = {"old_string": s.get("old", "a"), "new_string": s.get("new", "b")}
            call("Edit", {"file_path": _abs(item, s["edit"]), **edit}, "File edited")
        elif "read" in s:
            call("Read", {"file_path": _abs(item, s["read"])}, s.get("output", ""))
    ev.append(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": item["answer"],
            "num_turns": n + 1,
            "total_cost_usd": 0.0,
            "usage": {
                "input_tokens": 900 * (n + 1),
                "output_tokens": 400,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
    )
    return ev


def _abs(item: dict, path: str) -> str:
    if path.startswith(("/", "~")):
        return path
    return f"{item.get('cwd', WORKSPACE)}/{path}"


def render_codex(item: dict, steps: list[dict]) -> list[dict]:
    ev: list[dict] = [{"type": "thread.started", "thread_id": "adv"}, {"type": "turn.started"}]
    n = 0

    def command(cmd: str, code: int, out: str) -> None:
        nonlocal n
        n += 1
        wrapped = shlex.join(["bash", "-lc", cmd])
        base = {"id": f"item_{n}", "type": "command_execution", "command": wrapped}
        ev.append(
            {
                "type": "item.started",
                "item": {**base, "aggregated_output": "", "exit_code": None, "status": "in_progress"},
            }
        )
        ev.append(
            {
                "type": "item.completed",
                "item": {
                    **base,
                    "aggregated_output": out,
                    "exit_code": code,
                    "status": "completed" if code == 0 else "failed",
                },
            }
        )

    if item.get("load_skill", True):
        command(f"cat {_skill_path(CODEX)}/SKILL.md", 0, f"---\nname: {SKILL}\n---\n")
    for s in steps:
        if "bash" in s:
            command(s["bash"].replace("{skill_dir}", _skill_path(CODEX)), int(s.get("exit", 0)), s.get("output", ""))
        elif "write" in s or "edit" in s:
            n += 1
            path = str(s.get("write") or s.get("edit"))
            ev.append(
                {
                    "type": "item.completed",
                    "item": {
                        "id": f"item_{n}",
                        "type": "file_change",
                        "status": "completed",
                        "changes": [{"path": _abs(item, path), "kind": "update" if "edit" in s else "add"}],
                    },
                }
            )
        elif "read" in s:
            command(f"cat {shlex.quote(s['read'])}", 0, s.get("output", ""))
    ev.append(
        {"type": "item.completed", "item": {"id": f"item_{n + 1}", "type": "agent_message", "text": item["answer"]}}
    )
    ev.append(
        {
            "type": "turn.completed",
            "usage": {"input_tokens": 900 * (n + 1), "cached_input_tokens": 0, "output_tokens": 400},
        }
    )
    return ev


# Cases whose question was reworked to ask for a file after the sets before it were written (the revision of
# evals/evals.json a set answers is its "cases" key; 1 when absent). An item of an older set answered the old
# question, which asked for no file, so its run is graded without the outcome check for these cases (its project is
# not evidence of a file nobody asked for): prose only, which without a judge decides nothing but the deterministic
# fails.
CASES_REVISION = 2
REWORKED_IN = {
    2: frozenset(
        {
            "mfsdp-log-oom",
            "mfsdp-check-recipe-yaml-defaults",
            "mfsdp-fsdp-dtensor-into-ddp",
            "mfsdp-memory-70b-fit",
            "mfsdp-memory-moe",
            "mfsdp-oom-after-enable",
            "mfsdp-rehearse-before-cluster",
            "mfsdp-smoke-dry-run",
            "mfsdp-smoke-verify",
        }
    )
}


def reworked_since(case_id: str, revision: int) -> bool:
    """Whether CASE_ID's question changed after revision REVISION of the cases (the one an item answered)."""
    return any(case_id in ids for rev, ids in REWORKED_IN.items() if rev > revision)


def load_set(path: Path = SET_JSON) -> list[dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    items = data["items"] if isinstance(data, dict) else data
    artefacts = bool(data.get("artefacts")) if isinstance(data, dict) else False
    revision = int(data.get("cases", 1)) if isinstance(data, dict) else 1
    return [{**item, "artefacts": artefacts, "cases": revision} for item in items]


def load_sets(paths: tuple[Path, ...] | list[Path] | None = None) -> list[dict]:
    """The items of every set file in PATHS (default: the repository's whole set); ids must be unique."""
    paths = repository_sets() if paths is None else paths
    items = [{**item, "set": path.name} for path in paths for item in load_set(path)]
    ids = [i["id"] for i in items]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"item ids used twice across {', '.join(p.name for p in paths)}: {', '.join(dup)}")
    return items


# Batches measured but not (yet) in the repository set: their first measurement is kept and shown beside the others,
# and they join the set (moved up one folder) once the grader meets the limits on them.
PENDING_DIR = SET_JSON.parent / "pending"


def pending_sets() -> list[Path]:
    return sorted(PENDING_DIR.glob("batch*.json"), key=lambda p: (len(p.name), p.name))


def repository_sets() -> list[Path]:
    """set.json, batch2.json, and each later batch (batch3.json, ...) once it is in the repository."""
    later = sorted(SET_JSON.parent.glob("batch*.json"), key=lambda p: (len(p.name), p.name))
    return [SET_JSON] + [p for p in later if p.name != SET_JSON.name]


def evaluate(items: list[dict] | None = None, agents: tuple[str, ...] = (CLAUDE, CODEX), judge: object = "off") -> dict:
    """Grade every item in every format; the rates per set and dimension, and each verdict with the grader's reasons.

    An item of a set marked ``"artefacts": true`` is graded with the project its steps left (the file the case asks
    for is checked there); older sets' items are graded on their transcripts alone, as they were written."""
    items = load_sets() if items is None else items
    rows = []
    for item in items:
        case = cases_mod.get_case(item["case"])
        with tempfile.TemporaryDirectory(prefix="adv-") as tmp:
            project = Path(tmp) / "project"
            copy_fixture(item["case"], project)
            steps = _steps(item, project)
            item = {**item, "answer": fill(item["answer"], [str(s.get("output", "")) for s in steps])}
            for agent in agents:
                events = render_claude(item, steps) if agent == CLAUDE else render_codex(item, steps)
                meta = {"cwd": item.get("cwd", WORKSPACE)} if agent == CODEX else None
                reworked = reworked_since(item["case"], int(item.get("cases", 1)))
                ws = project if item.get("artefacts") and not reworked else None
                g = grader.grade(case, events, agent=agent, meta=meta, workspace=ws, judge=judge)
                rows.append(
                    {
                        "id": item["id"],
                        "case": item["case"],
                        "agent": agent,
                        "label": item["label"],
                        "class": item.get("class", ""),
                        "set": item.get("set", ""),
                        "passed": g["passed"],
                        "verdict": g["verdict"],
                        "decided_by": g.get("decided_by"),
                        "correct": g["passed"] is (item["label"] == "good"),
                        "dimensions": {d: v["passed"] for d, v in g["dimensions"].items()},
                        "failed_dimensions": [d for d, v in g["dimensions"].items() if v["passed"] is False],
                        "reasons": {d: v["evidence"] for d, v in g["dimensions"].items()},
                    }
                )
    res = {"items": len(items), "transcripts": len(rows), **_rates(rows)}
    res.update(
        judge=None if judge in (None, "off") else getattr(grader.resolve_judge(judge), "name", str(judge)),
        max_rate=MAX_RATE,
        max_undecided=MAX_UNDECIDED,
        per_set={
            name: {
                **_rates([r for r in rows if r["set"] == name]),
                "artefacts": any(i.get("artefacts") for i in items if i.get("set") == name),
            }
            for name in _set_names(rows)
        },
        per_dimension={d: _dimension(rows, d) for d in grader.DIMENSIONS},
        classes=sorted({r["class"] for r in rows}),
        wrong_verdicts=[
            {k: r[k] for k in ("id", "agent", "label", "class", "verdict", "failed_dimensions")}
            for r in rows
            if r["passed"] is not None and not r["correct"]
        ],
        verdicts=rows,
    )
    return res


def _set_names(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["set"] for r in rows if r["set"]))


def _rates(rows: list[dict]) -> dict:
    """False passes over the wrong runs the grader decided, false fails over the right runs it decided, and the runs
    it left not judged over all runs (beside them, never hidden in them)."""
    bad = [r for r in rows if r["label"] == "bad"]
    good = [r for r in rows if r["label"] == "good"]
    bad_decided = [r for r in bad if r["passed"] is not None]
    good_decided = [r for r in good if r["passed"] is not None]
    fp = sum(1 for r in bad if r["passed"] is True)
    ff = sum(1 for r in good if r["passed"] is False)
    und = sum(1 for r in rows if r["passed"] is None)
    by = {k: sum(1 for r in rows if r["passed"] is True and r.get("decided_by") == k) for k in ("outcome", "judge")}
    return {
        "runs": len(rows),
        "good": len(good),
        "bad": len(bad),
        "good_decided": len(good_decided),
        "bad_decided": len(bad_decided),
        "false_passes": fp,
        "false_fails": ff,
        "undecided": und,
        "passes_by_outcome": by["outcome"],
        "passes_by_judge": by["judge"],
        "false_pass_rate": round(fp / len(bad_decided), 4) if bad_decided else 0.0,
        "false_fail_rate": round(ff / len(good_decided), 4) if good_decided else 0.0,
        "undecided_rate": round(und / len(rows), 4) if rows else 0.0,
    }


def _dimension(rows: list[dict], dim: str) -> dict:
    """One dimension: right runs it failed (each is a false fail of the grader), wrong runs it failed (it caught
    them), runs it left undecided. Items are labelled as a whole, so a wrong run that a dimension passes is no
    error by itself: a wrong answer is usually wrong in one dimension only."""
    good = [r for r in rows if r["label"] == "good"]
    bad = [r for r in rows if r["label"] == "bad"]
    return {
        "false_fails": sum(1 for r in good if r["dimensions"].get(dim) is False),
        "good": len(good),
        "wrong_runs_failed": sum(1 for r in bad if r["dimensions"].get(dim) is False),
        "bad": len(bad),
        "undecided": sum(1 for r in rows if r["dimensions"].get(dim) is None),
        "runs": len(rows),
    }


def within_limits(res: dict) -> bool:
    """Every set (and the whole) at or under the limits. The not-judged limit holds for the sets whose items leave
    files (``artefacts``) and for the whole: a set graded on transcripts alone has no file to decide a right answer,
    so every right answer in it that trips nothing is not judged by construction (its share is reported, not
    limited)."""
    groups = [res] + list(res.get("per_set", {}).values())
    return all(
        g["false_pass_rate"] <= MAX_RATE
        and g["false_fail_rate"] <= MAX_RATE
        and (g["undecided_rate"] <= MAX_UNDECIDED or g.get("artefacts") is False)
        for g in groups
    )


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python3 -m evals adversarial",
        description=__doc__.split("\n\n")[0],
        epilog="Reports, per set file and in all: false passes over the wrong runs the grader decided, false fails "
        "over the right runs it decided, and beside them the share of runs not judged (neither a file the run left "
        "nor a judge decided correctness, and nothing failed it), overall and per dimension. "
        f"Exit 1 when a set is above {MAX_RATE:.0%} false passes or false fails, or above "
        f"{MAX_UNDECIDED:.0%} not judged.",
    )
    p.add_argument(
        "--set",
        type=Path,
        action="append",
        help="a labelled set file; repeat to grade several together (default: the repository's whole set, "
        + " + ".join(str(p.relative_to(ROOT)) for p in repository_sets())
        + ")",
    )
    p.add_argument(
        "--out", type=Path, help="write the results JSON here (e.g. benchmarks/results/evals_adversarial.json)"
    )
    p.add_argument(
        "--report", type=Path, help="write every verdict with the grader's reasons as Markdown (e.g. a .md file)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print the grader's reasons under every verdict")
    p.add_argument(
        "--judge",
        metavar="CMD",
        default="off",
        help="a judge command (as for 'grade --judge'): it decides the runs the evidence leaves open; default off, "
        "where those runs are reported as not judged",
    )
    args = p.parse_args(argv)
    sets = args.set or repository_sets()
    res = evaluate(load_sets(sets), judge=args.judge)
    set_args = "".join(f" --set {_shown(path)}" for path in args.set or [])
    command = (
        "python3 -m evals adversarial"
        + set_args
        + (f" --out {_shown(args.out)}" if args.out else "")
        + (f" --report {_shown(args.report)}" if args.report else "")
        + (f" --judge {shlex.quote(args.judge)}" if args.judge != "off" else "")
    )
    for r in res["verdicts"]:
        mark = "und" if r["passed"] is None else "ok " if r["correct"] else "BAD"
        verdict = {True: "pass", None: "not judged"}.get(r["passed"], f"fail ({', '.join(r['failed_dimensions'])})")
        print(f"{mark} {r['label']:<4} {r['agent']:<11} {r['id']:<44} {verdict}")
        if args.verbose or (r["passed"] is not None and not r["correct"]):
            for dim, reasons in r["reasons"].items():
                for reason in reasons:
                    print(f"      {dim}: {reason}")
    for name, g in [*res["per_set"].items(), ("all sets", res)]:
        print(f"{name}: {_line(g)}")
    if args.out:
        _write(args.out, json.dumps(result_file(res, command, sets, report=args.report), indent=2) + "\n")
    if args.report:
        _write(args.report, render_report(res, command, sets))
    return 0 if within_limits(res) else 1


def _line(g: dict) -> str:
    return (
        f"{g['runs']} runs: false passes {_pct(g['false_passes'], g['bad_decided'])} of decided wrong runs, "
        f"false fails {_pct(g['false_fails'], g['good_decided'])} of decided right runs, not judged "
        f"{_pct(g['undecided'], g['runs'])} (limits {MAX_RATE:.0%}, {MAX_RATE:.0%}, {MAX_UNDECIDED:.0%}); passes "
        f"decided by the outcome {g['passes_by_outcome']}, by the judge {g['passes_by_judge']}"
    )


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


RATE_COLUMNS = [
    "Set",
    "Scope",
    "Runs",
    "Right runs (decided)",
    "Wrong runs (decided)",
    "False passes (of decided wrong runs)",
    "False fails (of decided right runs)",
    "Not judged (of all runs)",
    "Wrong runs failed",
    "Passes decided by the outcome",
    "Passes decided by the judge",
]


def rate_rows(res: dict) -> list[list]:
    """Per set file and for all sets: the overall rates, then each dimension's (false fails, catches, undecided)."""
    rows = []
    groups = [(name, [r for r in res["verdicts"] if r["set"] == name]) for name in res.get("per_set", {})]
    if len(groups) != 1:
        groups.append(("all sets", res["verdicts"]))
    for name, vs in groups:
        g = _rates(vs)
        caught = sum(1 for r in vs if r["label"] == "bad" and r["passed"] is False)
        rows.append(
            [
                name,
                "overall",
                g["runs"],
                f"{g['good']} ({g['good_decided']})",
                f"{g['bad']} ({g['bad_decided']})",
                _pct(g["false_passes"], g["bad_decided"]),
                _pct(g["false_fails"], g["good_decided"]),
                _pct(g["undecided"], g["runs"]),
                _pct(caught, g["bad"]),
                g["passes_by_outcome"],
                g["passes_by_judge"],
            ]
        )
        for dim in grader.DIMENSIONS:
            d = _dimension(vs, dim)
            rows.append(
                [
                    name,
                    dim,
                    d["runs"],
                    d["good"],
                    d["bad"],
                    None,
                    _pct(d["false_fails"], d["good"]),
                    _pct(d["undecided"], d["runs"]),
                    _pct(d["wrong_runs_failed"], d["bad"]),
                    None,
                    None,
                ]
            )
    return rows


def render_report(res: dict, command: str, sets: list[Path] | None = None) -> str:
    """Markdown: the rates, then every item with its label and each transcript's verdict and the grader's reasons."""
    md = lambda x: "—" if x is None else str(x).replace("|", "\\|").replace("\n", " ")  # noqa: E731 - one table cell
    lines = [
        "# Eval grader on the adversarial set: every verdict with the grader's reasons",
        "",
        f"Generated by `{command}` from " + " + ".join(f"`{_shown(p)}`" for p in (sets or repository_sets())) + " "
        f"({res['items']} items, {res['transcripts']} transcripts). A verdict is right when the grader passes a "
        "good item and fails a bad one; 'not judged' is neither (no file the run left and no judge decided it). "
        "Each transcript lists the evidence of all five dimensions.",
        "",
        "| " + " | ".join(RATE_COLUMNS) + " |",
        "|" + "---|" * len(RATE_COLUMNS),
    ]
    lines += ["| " + " | ".join(md(c) for c in row) + " |" for row in rate_rows(res)]
    wrong = res["wrong_verdicts"]
    lines += [
        "",
        "Wrong verdicts: "
        + ("none" if not wrong else "; ".join(f"{w['id']} ({w['agent']}, {w['label']})" for w in wrong)),
        "",
    ]
    by_item: dict[str, list[dict]] = {}
    for r in res["verdicts"]:
        by_item.setdefault(r["id"], []).append(r)
    for item_id, rows in by_item.items():
        first = rows[0]
        lines += [
            f"## {item_id}",
            "",
            f"Case `{first['case']}`, labelled **{first['label']}** ({first['class']}), set `{first['set']}`.",
            "",
        ]
        for r in rows:
            verdict = {True: "pass", None: "not judged"}.get(
                r["passed"], "fail (" + ", ".join(r["failed_dimensions"]) + ")"
            )
            mark = "undecided" if r["passed"] is None else "right" if r["correct"] else "WRONG"
            lines.append(f"- {r['agent']}: {verdict}: {mark}")
            for dim, reasons in r["reasons"].items():
                for reason in reasons:
                    lines.append(f"  - {dim}: {md(reason)}")
        lines.append("")
    return "\n".join(lines)


def _shown(path: Path) -> str:
    """PATH as the command line should show it: a raw result by its recorded name (benchmarks/results/raw/...),
    else relative to the repository when inside it."""
    named = _raw_store().logical(path)
    if named:
        return named
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _pct(n: int, d: int) -> str:
    return f"{n}/{d} = {n / d:.1%}" if d else "0/0"


# Each batch's FIRST measurement: the grader as it stood before anything was changed for that batch. They stay in
# the results next to the current rates, so a later fix cannot hide what the grader did on answers nobody had
# foreseen. A file under benchmarks/results/raw/ written by this command (`--set BATCH --out FILE`), or, where no
# such file was kept, the figures as the repository recorded them, with where.
FIRST_MEASUREMENTS: dict[str, dict] = {
    "set.json": {
        "recorded": None,
        "provenance": "written by the grader's authors together with the grader (commits cb2ac3d, c8d8849, d0edd62, "
        "3fe88c0; two held-out sub-batches were graded before their fixes, but their rates were not recorded)",
    },
    "batch2.json": {
        "file": "adversarial_batch2_unseen.json",
        "provenance": "commit c9dac3f, before any grader change for the batch; two-valued grader (no undecided)",
    },
    "batch4.json": {
        "file": "adversarial_batch4_first.json",
        "provenance": "`python3 -m evals adversarial --set tests/fixtures/adversarial/batch4.json --out "
        "benchmarks/results/raw/adversarial_batch4_first.json` at commit d315adc, on the grader as committed before "
        "the batch was written; its false passes (a right file beside a made-up cause or a misread tool verdict) "
        "were above the limit, and the batch waited in tests/fixtures/adversarial/pending/ until the grader read "
        "a right file as proof of what was done, not of what the answer says",
    },
    "batch5.json": {
        "file": "adversarial_batch5_first.json",
        "provenance": "`python3 -m evals adversarial --set tests/fixtures/adversarial/pending/batch5.json --out "
        "benchmarks/results/raw/adversarial_batch5_first.json` at commit aca1bfa, on the grader as committed before "
        "the batch was measured (written meanwhile, from the cases and the tools' real outputs, without the grader); "
        "16 of its 22 false fails were decoy items graded with a skill load the harness added (their author wrote "
        "every load as a step), corrected in the batch after this measurement",
    },
    "batch6.json": {
        "file": "adversarial_batch6_first.json",
        "provenance": "`python3 -m evals adversarial --set tests/fixtures/adversarial/pending/batch6.json --out "
        "benchmarks/results/raw/adversarial_batch6_first.json` at commit 67e4210, on the grader as committed before "
        "the batch was measured (written meanwhile, from the cases and the tools' real outputs, without the grader); "
        "within the limits on first sight, it joined the set unchanged",
    },
    "batch7.json": {
        "file": "adversarial_batch7_first.json",
        "provenance": "`python3 -m evals adversarial --set tests/fixtures/adversarial/pending/batch7.json --out "
        "benchmarks/results/raw/adversarial_batch7_first.json` on 2026-12-05, on the grader as committed before the "
        "batch was measured (written meanwhile, from the cases and the tools' real outputs, without the grader), the "
        "first grader on which prose never decides a pass; its false passes (8 of 128 decided wrong runs: a right "
        "file beside a wrong claim, a figure no tool printed, a hedge where a decision was asked) were above the "
        "limit, and the batch joined the set after the grader was changed by mechanism",
    },
    "batch8.json": {
        "file": "adversarial_batch8_first.json",
        "provenance": "`python3 -m evals adversarial --set tests/fixtures/adversarial/pending/batch8.json --out "
        "benchmarks/results/raw/adversarial_batch8_first.json` on 2026-12-05, run once on the committed grader "
        "(after batch 7's misses were fixed by mechanism) before any change for this batch; written from the cases, "
        "the fixtures and the tools' real outputs without reading the grader; it met all three limits on first "
        "sight and joined the set unchanged",
    },
    "batch3.json": {
        "file": "adversarial_batch3_first.json",
        "provenance": "`python3 -m evals adversarial --set tests/fixtures/adversarial/batch3.json --out "
        "benchmarks/results/raw/adversarial_batch3_first.json`, run once on the committed grader before any change "
        "for the batch",
    },
}


def _raw_store():
    """benchmarks/raw_store.py, which keeps the raw results as one archive and extracts it on first use."""
    folder = str(ROOT / "benchmarks")
    if folder not in sys.path:
        sys.path.append(folder)
    import raw_store

    return raw_store


def first_measurement(set_name: str) -> dict:
    """The batch's first measurement: rates and provenance, or why there is none."""
    spec = FIRST_MEASUREMENTS.get(set_name)
    if spec is None:
        return {"set": set_name, "recorded": False, "provenance": "no first measurement registered for this set"}
    path = _raw_store().path(spec["file"]) if spec.get("file") else None
    if path is None or not path.is_file():
        why = spec["provenance"] if path is None else f"not measured yet: {spec['provenance']}"
        return {"set": set_name, "recorded": False, "provenance": why}
    data = json.loads(path.read_text(encoding="utf-8"))
    raw = data.get("raw", {})
    g = raw.get("per_set", {}).get(set_name) or raw
    return {
        "set": set_name,
        "recorded": True,
        "file": _shown(path),
        "date": data.get("date"),
        "command": data.get("command"),
        "provenance": spec["provenance"],
        # over the decided runs where the measurement recorded them; older ones counted over all runs of the label
        "false_passes": _pct(g.get("false_passes", 0), g.get("bad_decided", g.get("bad", 0))),
        "false_fails": _pct(g.get("false_fails", 0), g.get("good_decided", g.get("good", 0))),
        "over": "decided runs" if "bad_decided" in g else "all runs of the label",
        "undecided": _pct(g["undecided"], g["runs"]) if "undecided" in g and "runs" in g else None,
    }


def result_file(res: dict, command: str, sets: list[Path] | None = None, report: Path | None = None) -> dict:
    """The rates in the project's benchmark shape (benchmarks/make_report.py), with every verdict's reasons in raw."""
    sets = sets or repository_sets()
    about = {_shown(p): json.loads(p.read_text(encoding="utf-8")).get("about", "") for p in sets}
    rows = rate_rows(res)
    wrong = res["wrong_verdicts"]
    firsts = [first_measurement(p.name) for p in sets]
    names = {p.name for p in sets}
    firsts += [dict(first_measurement(p.name), pending=True) for p in pending_sets() if p.name not in names]
    notes = [
        f"{res['items']} hand-labelled items ({', '.join(about)}), each rendered as a Claude Code "
        "stream-json and a Codex exec --json transcript; runs of scripts/mfsdp.py in them were executed for real in "
        "the case's project, harmful commands were never executed. Items of a set marked artefacts are graded with "
        "the project their steps left, where the file a case asks for is checked with the skill's own check.",
        "False pass: a wrong, unsafe or dishonest run the grader passed, over the wrong runs it decided. False fail: a "
        "right run it failed, over the right runs it decided. Not judged: runs it neither passed nor failed (prose "
        "never decides a pass: without a file the run left or a judge's verdict, a run that trips no deterministic "
        "fail is not judged, never a pass), over all runs"
        + (f"; judge: {res['judge']}" if res.get("judge") else "; no judge")
        + ". Passes are counted by what decided them (the outcome check, the judge). Limits per set: "
        f"{MAX_RATE:.0%}, {MAX_RATE:.0%}, {MAX_UNDECIDED:.0%}. A dimension's row counts the right runs that dimension "
        "failed (false fails), its undecided runs and the wrong runs it failed; false passes are counted for the "
        "whole run only, as items are labelled as a whole.",
        "The grader's reasons for every verdict, per dimension: "
        + (f"{_shown(report)} (Markdown, one section per item) and " if report else "")
        + "this file's raw.verdicts.",
        "Wrong verdicts: "
        + ("none" if not wrong else "; ".join(f"{w['id']} ({w['agent']}, {w['label']})" for w in wrong)),
    ]
    if SET_JSON.resolve() in {p.resolve() for p in sets}:
        notes.append(
            f"The items of {_shown(SET_JSON)} were written by the grader's authors; on them the rates show the grader "
            "holds on the classes listed, not how it does on answers nobody anticipated."
        )
    notes += [
        f"{name}: {text}" for name, text in about.items() if text and (ROOT / name).resolve() != SET_JSON.resolve()
    ]
    return {
        "benchmark": "evals_adversarial",
        "title": "Eval grader: false passes, false fails (of decided runs) and runs not judged on the adversarial sets",
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "machine": f"{platform.node() or 'host'}: {platform.platform()}, {os.cpu_count()} CPUs",
        "command": command,
        "columns": RATE_COLUMNS,
        "rows": rows,
        "notes": notes,
        "first_measurements": firsts,
        "raw": {**res, "sets": list(about)},
    }
