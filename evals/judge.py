"""The judge: a command (a language model behind a CLI) whose verdict decides the runs the evidence leaves open.

Why: a deterministic grader reads settings, files and tool outputs, but it cannot read a new wrong sentence, and no
list of forbidden phrases is ever complete. So prose never earns a correctness pass by itself (``evals.grader``):
a run is passed only when an outcome check (the file the run left, graded by the skill's own tools) or a judge
decides it. The judge is any command that reads a prompt on stdin and prints a verdict, e.g. ``claude -p`` with
a key; ``python3 -m evals grade --judge CMD`` names it.

The prompt gives the judge what a demanding reviewer needs: the user's question, the case's ground truth and
expected behaviour, and the transcript itself (every tool call with its real exit status and output, as the CLI
recorded them, then the final answer), never the answer's own account of what the tools said.

The judge answers with a JSON object ``{"passed": true|false, "reason": "..."}`` anywhere in its output (the last
such object counts), or a line ``VERDICT: PASS`` / ``VERDICT: FAIL`` followed by its reason. Anything else (no
verdict, a non-zero exit, a timeout) is "not judged", never a pass. The result records the judge's name (its
command line), its verdict and reason, and the prompt with its SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass

from .transcripts import Transcript

NOT_JUDGED = "not judged"
JUDGED = "judged"
# A language model CLI answering a long prompt takes tens of seconds; more than this is a hung judge.
TIMEOUT_S = int(os.environ.get("MFSDP_EVAL_JUDGE_TIMEOUT_S", "300"))
OUTPUT_CHARS = 3000  # of each tool call's output in the prompt: enough for a report's findings, not a whole log
REASON_CHARS = 500  # of the judge's reason, kept in the result
VERDICT_LINE = re.compile(r"^\s*VERDICT:\s*(PASS|FAIL)\b[\s:.-]*(.*)$", re.IGNORECASE | re.MULTILINE)

PROMPT = """You grade an AI coding agent's run on a user's request about Megatron FSDP in NVIDIA Megatron-Bridge 0.6.2.
Be demanding, as a senior engineer reviewing it would be: the run passes only if a user could act on it safely.
A wrong setting, a wrong cause or requirement, an unsafe or destructive step, a figure no tool printed, a hedge where
the user asked for a decision, a claim that contradicts what the agent's own tool runs printed (read the tool
outputs below, not the answer's account of them), or a file the user asked for that is missing or wrong, fails it.
Do not fail a run for style or for extra correct detail.

Reply with one JSON object and nothing after it: {{"passed": true or false, "reason": "one or two sentences"}}

## The user's request
{question}

## Reference facts (ground truth)
{ground_truth}

## Expected behaviour
- {behaviour}

## The run (tool calls with their real exit status and output, in order)
{steps}

## The agent's final answer
{answer}
"""


def transcript_text(t: Transcript) -> str:
    """Every tool call of T as the CLI recorded it: the command or the file, the exit status, the output."""
    lines = []
    for n, c in enumerate(t.tool_calls, 1):
        what = c.command if c.command is not None else ", ".join(c.paths) or json.dumps(c.input)[:300]
        status = "refused by the CLI" if c.denied else f"exit {c.exit_code}" if c.exit_code is not None else ""
        lines.append(f"[{n}] {c.tool}: {what}" + (f" ({status})" if status else ""))
        if c.tool.lower() in ("write", "edit", "multiedit") and c.input:
            body = c.input.get("content") or c.input.get("new_string") or ""
            if body:
                lines.append("    content:\n" + _indent(str(body)[:OUTPUT_CHARS]))
        out = (c.output or "").strip()
        if out:
            cut = "\n    ... (cut)" if len(out) > OUTPUT_CHARS else ""
            lines.append("    output:\n" + _indent(out[:OUTPUT_CHARS]) + cut)
    return "\n".join(lines) or "(no tool calls)"


def _indent(text: str) -> str:
    return "\n".join("      " + ln for ln in text.splitlines())


def prompt_for(case: dict, t: Transcript) -> str:
    return PROMPT.format(
        question=case["question"],
        ground_truth=case["ground_truth"],
        behaviour="\n- ".join(case["expected_behavior"]),
        steps=transcript_text(t),
        answer=t.final_answer or "(no final answer)",
    )


def parse_verdict(text: str) -> tuple[bool | None, str]:
    """(passed, reason) from a judge's output: the last JSON object with a boolean "passed", else the last
    ``VERDICT: PASS|FAIL`` line; (None, why) when there is neither."""
    found: tuple[bool, str] | None = None
    dec = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = dec.raw_decode(text, m.start())
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("passed"), bool):
            found = (obj["passed"], str(obj.get("reason", "")))
    if found is None:
        lines = list(VERDICT_LINE.finditer(text))
        if lines:
            last = lines[-1]
            found = (last.group(1).upper() == "PASS", last.group(2).strip())
    if found is None:
        return None, f"no verdict in the judge's output ({text.strip()[:120]!r})"
    return found[0], found[1][:REASON_CHARS]


@dataclass(frozen=True)
class CommandJudge:
    """A judge behind a command line: the prompt on its stdin, its verdict on its stdout. Run as an argument list,
    never through a shell."""

    command: str
    timeout_s: int = TIMEOUT_S

    @property
    def name(self) -> str:
        return self.command

    def __call__(self, case: dict, t: Transcript) -> dict:
        prompt = prompt_for(case, t)
        rec: dict[str, object] = {
            "name": self.name,
            "status": NOT_JUDGED,
            "passed": None,
            "reason": "",
            "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(),
            "prompt": prompt,
        }
        try:
            argv = shlex.split(self.command)
        except ValueError as exc:
            rec["reason"] = f"the judge command cannot be read ({exc})"
            return rec
        if not argv:
            rec["reason"] = "empty judge command"
            return rec
        try:
            proc = subprocess.run(argv, input=prompt, capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            rec["reason"] = f"the judge gave no answer in {self.timeout_s} s"
            return rec
        except OSError as exc:
            rec["reason"] = f"the judge could not start ({type(exc).__name__}: {exc})"
            return rec
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout).strip().splitlines()
            rec["reason"] = f"the judge exited {proc.returncode}: {(why[-1] if why else '')[:200]}"
            return rec
        passed, reason = parse_verdict(proc.stdout)
        if passed is None:
            rec["reason"] = reason
            return rec
        rec.update(status=JUDGED, passed=passed, reason=reason)
        return rec
