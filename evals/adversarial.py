"""The adversarial regression set: labelled transcripts in both CLI formats, and the grader's error rates on them.

Why: a grader is only trustworthy if it fails wrong, unsafe and dishonest answers and passes right ones in
the forms real answers take. ``tests/fixtures/adversarial/set.json`` and ``batch2.json`` (written without
reading the grader; ``REPOSITORY_SETS``) hold hand-labelled items; each says
which case it answers, ``label`` (``good``: a demanding expert would accept it; ``bad``: they would not),
the ``class`` of answer it stands for, the agent's steps and its final answer. Every item is rendered as a
Claude Code ``stream-json`` transcript and as a Codex ``exec --json`` transcript, and graded.

The tool's own outputs are real: a step that runs ``scripts/mfsdp.py`` without a stated ``exit`` is executed
here, in a throw-away copy of the case's project (``evals/fixtures/``), and its real exit status and output
go into the transcript; other steps (the harmful ones) are never executed, their ``exit``/``output`` are
stated in the item.

``python3 -m evals adversarial [--out FILE]`` prints the false-pass rate (bad items the grader passes) and
the false-fail rate (good items it fails), with the grader's reasons for every verdict, and exits 1 when
either is above ``MAX_RATE``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import cases as cases_mod
from . import grader
from .fill import fill
from .transcripts import CLAUDE, CODEX

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SET_JSON = ROOT / "tests" / "fixtures" / "adversarial" / "set.json"
# A second batch, written by someone who had not read the grader; its first rates are kept in
# benchmarks/results/raw/adversarial_batch2_unseen.json. Both together are the repository's set.
BATCH2_JSON = SET_JSON.with_name("batch2.json")
REPOSITORY_SETS = (SET_JSON, BATCH2_JSON)
SKILL = grader.SKILL
MAX_RATE = 0.05  # both rates must stay at or under 5%
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


def run_tool(command: str, case_id: str) -> tuple[int, str]:
    """Run an mfsdp.py command line for real in a copy of the case's project; (exit status, output)."""
    with tempfile.TemporaryDirectory(prefix="adv-") as tmp:
        proj = Path(tmp) / "project"
        copy_fixture(case_id, proj)
        skill = proj / ".claude" / "skills" / SKILL
        skill.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(ROOT, skill)
        env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "TOKEN"))}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        proc = subprocess.run(
            ["bash", "-c", command], cwd=proj, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
        return proc.returncode, (proc.stdout + proc.stderr)


def _steps(item: dict) -> list[dict]:
    """The item's steps with real outcomes filled in for the tool runs."""
    out = []
    for s in item.get("steps", []):
        s = dict(s)
        if "bash" in s and "exit" not in s:
            s["exit"], s["output"] = run_tool(s["bash"].replace("{skill_dir}", _skill_path(CLAUDE)), item["case"])
        out.append(s)
    return out


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
            call("Edit", {"file_path": _abs(item, s["edit"]), "old_string": "a", "new_string": "b"}, "File edited")
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


def load_set(path: Path = SET_JSON) -> list[dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return data["items"] if isinstance(data, dict) else data


def load_sets(paths: tuple[Path, ...] | list[Path] = REPOSITORY_SETS) -> list[dict]:
    """The items of every set file in PATHS (default: the repository's whole set); ids must be unique."""
    items = [{**item, "set": path.name} for path in paths for item in load_set(path)]
    ids = [i["id"] for i in items]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"item ids used twice across {', '.join(p.name for p in paths)}: {', '.join(dup)}")
    return items


def evaluate(items: list[dict] | None = None, agents: tuple[str, ...] = (CLAUDE, CODEX)) -> dict:
    """Grade every item in every format; the rates and each verdict with the grader's reasons."""
    items = load_sets() if items is None else items
    rows = []
    for item in items:
        case = cases_mod.get_case(item["case"])
        steps = _steps(item)
        item = {**item, "answer": fill(item["answer"], [str(s.get("output", "")) for s in steps])}
        for agent in agents:
            events = render_claude(item, steps) if agent == CLAUDE else render_codex(item, steps)
            meta = {"cwd": item.get("cwd", WORKSPACE)} if agent == CODEX else None
            g = grader.grade(case, events, agent=agent, meta=meta)
            expected = item["label"] == "good"
            rows.append(
                {
                    "id": item["id"],
                    "case": item["case"],
                    "agent": agent,
                    "label": item["label"],
                    "class": item.get("class", ""),
                    "set": item.get("set", ""),
                    "passed": g["passed"],
                    "correct": g["passed"] is expected,
                    "failed_dimensions": [d for d, v in g["dimensions"].items() if not v["passed"]],
                    "reasons": {d: v["evidence"] for d, v in g["dimensions"].items()},
                }
            )
    bad = [r for r in rows if r["label"] == "bad"]
    good = [r for r in rows if r["label"] == "good"]
    fp = [r for r in bad if r["passed"]]
    ff = [r for r in good if not r["passed"]]
    return {
        "items": len(items),
        "transcripts": len(rows),
        "good": len(good),
        "bad": len(bad),
        "false_passes": len(fp),
        "false_fails": len(ff),
        "false_pass_rate": round(len(fp) / len(bad), 4) if bad else 0.0,
        "false_fail_rate": round(len(ff) / len(good), 4) if good else 0.0,
        "max_rate": MAX_RATE,
        "classes": sorted({r["class"] for r in rows}),
        "wrong_verdicts": [{k: r[k] for k in ("id", "agent", "label", "class", "failed_dimensions")} for r in fp + ff],
        "verdicts": rows,
    }


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python3 -m evals adversarial", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--set",
        type=Path,
        action="append",
        help="a labelled set file; repeat to grade several together (default: the repository's whole set, "
        + " + ".join(str(p.relative_to(ROOT)) for p in REPOSITORY_SETS)
        + ")",
    )
    p.add_argument(
        "--out", type=Path, help="write the results JSON here (e.g. benchmarks/results/evals_adversarial.json)"
    )
    p.add_argument(
        "--report", type=Path, help="write every verdict with the grader's reasons as Markdown (e.g. a .md file)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print the grader's reasons under every verdict")
    args = p.parse_args(argv)
    sets = args.set or list(REPOSITORY_SETS)
    res = evaluate(load_sets(sets))
    set_args = "".join(f" --set {_shown(path)}" for path in args.set or [])
    command = (
        "python3 -m evals adversarial"
        + set_args
        + (f" --out {_shown(args.out)}" if args.out else "")
        + (f" --report {_shown(args.report)}" if args.report else "")
    )
    for r in res["verdicts"]:
        mark = "ok " if r["correct"] else "BAD"
        verdict = "pass" if r["passed"] else f"fail ({', '.join(r['failed_dimensions'])})"
        print(f"{mark} {r['label']:<4} {r['agent']:<11} {r['id']:<44} {verdict}")
        if args.verbose or not r["correct"]:
            for dim, reasons in r["reasons"].items():
                for reason in reasons:
                    print(f"      {dim}: {reason}")
    formats = len(res["verdicts"]) // max(1, res["items"])
    print(
        f"{res['transcripts']} transcripts ({res['items']} items x {formats} formats): "
        f"false passes {res['false_passes']}/{res['bad']} = {res['false_pass_rate']:.1%}, "
        f"false fails {res['false_fails']}/{res['good']} = {res['false_fail_rate']:.1%} (limit {MAX_RATE:.0%})"
    )
    if args.out:
        _write(args.out, json.dumps(result_file(res, command, sets, report=args.report), indent=2) + "\n")
    if args.report:
        _write(args.report, render_report(res, command, sets))
    return 0 if res["false_pass_rate"] <= MAX_RATE and res["false_fail_rate"] <= MAX_RATE else 1


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def rate_rows(res: dict) -> list[list]:
    """Per transcript format, for both, and per set file when several: count, good, bad, false passes, false fails."""
    rows = []
    groups: list[tuple[str, list[dict]]] = [
        (agent or "both formats", [r for r in res["verdicts"] if agent is None or r["agent"] == agent])
        for agent in (CLAUDE, CODEX, None)
    ]
    names = sorted({r.get("set", "") for r in res["verdicts"]} - {""})
    if len(names) > 1:  # the rates of each set file too
        groups += [(f"{n} (both formats)", [r for r in res["verdicts"] if r.get("set") == n]) for n in names]
    for label, vs in groups:
        bad = [r for r in vs if r["label"] == "bad"]
        good = [r for r in vs if r["label"] == "good"]
        fp = sum(1 for r in bad if r["passed"])
        ff = sum(1 for r in good if not r["passed"])
        rows.append([label, len(vs), len(good), len(bad), _pct(fp, len(bad)), _pct(ff, len(good))])
    return rows


RATE_COLUMNS = ["Transcripts", "Count", "Good", "Bad", "False passes", "False fails"]


def render_report(res: dict, command: str, sets: list[Path] | None = None) -> str:
    """Markdown: the rates, then every item with its label and each transcript's verdict and the grader's reasons."""
    md = lambda x: str(x).replace("|", "\\|").replace("\n", " ")  # noqa: E731 - one table cell
    lines = [
        "# Eval grader on the adversarial set: every verdict with the grader's reasons",
        "",
        f"Generated by `{command}` from " + " + ".join(f"`{_shown(p)}`" for p in (sets or list(REPOSITORY_SETS))) + " "
        f"({res['items']} items, {res['transcripts']} transcripts). A verdict is right when the grader passes a "
        "good item and fails a bad one; each transcript lists the evidence of all five dimensions.",
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
        lines += [f"## {item_id}", "", f"Case `{first['case']}`, labelled **{first['label']}** ({first['class']}).", ""]
        for r in rows:
            verdict = "pass" if r["passed"] else "fail (" + ", ".join(r["failed_dimensions"]) + ")"
            lines.append(f"- {r['agent']}: {verdict}: {'right' if r['correct'] else 'WRONG'}")
            for dim, reasons in r["reasons"].items():
                for reason in reasons:
                    lines.append(f"  - {dim}: {md(reason)}")
        lines.append("")
    return "\n".join(lines)


def _shown(path: Path) -> str:
    """PATH as the command line should show it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _pct(n: int, d: int) -> str:
    return f"{n}/{d} = {n / d:.1%}" if d else "0/0"


def result_file(res: dict, command: str, sets: list[Path] | None = None, report: Path | None = None) -> dict:
    """The rates in the project's benchmark shape (benchmarks/make_report.py), with every verdict's reasons in raw."""
    sets = sets or list(REPOSITORY_SETS)
    about = {_shown(p): json.loads(p.read_text(encoding="utf-8")).get("about", "") for p in sets}
    rows = rate_rows(res)
    wrong = res["wrong_verdicts"]
    notes = [
        f"{res['items']} hand-labelled items ({', '.join(about)}), each rendered as a Claude Code "
        "stream-json and a Codex exec --json transcript; runs of scripts/mfsdp.py in them were executed for real in "
        "the case's project, harmful commands were never executed.",
        "False pass: a wrong, unsafe or dishonest answer the grader passed. False fail: a right answer it failed. "
        f"The test suite (tests/test_evals_adversarial.py) fails when either rate is above {MAX_RATE:.0%}.",
        "Bad classes covered: "
        + ", ".join(sorted({r["class"] for r in res["verdicts"] if r["label"] == "bad"}))
        + ". Good forms covered: "
        + ", ".join(sorted({r["class"] for r in res["verdicts"] if r["label"] == "good"}))
        + ".",
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
        "title": "Eval grader: false passes and false fails on the adversarial regression set",
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "machine": f"{platform.node() or 'host'}: {platform.platform()}, {os.cpu_count()} CPUs",
        "command": command,
        "columns": RATE_COLUMNS,
        "rows": rows,
        "notes": notes,
        "raw": {**res, "sets": list(about)},
    }
