"""Read an agent CLI transcript into one neutral shape the grader can score.

Two CLIs, three event dialects, one ``Transcript``:

* **Claude Code** ``claude -p --output-format stream-json --verbose``: one JSON
  object per line. ``system/init`` lists the installed ``skills`` and the ``cwd``;
  ``assistant`` lines hold one content block each (``text``, ``thinking``,
  ``tool_use``) and *repeat* the message's ``usage`` on every block, so usage is
  de-duplicated by ``message.id``; ``user`` lines carry ``tool_result`` blocks
  (``is_error``) and, after a ``Skill`` call, a synthetic text block
  ``Base directory for this skill: .../skills/NAME``; the final ``result`` line
  carries ``usage``, ``total_cost_usd``, ``num_turns`` and ``is_error``. An API
  error still says ``subtype: "success"``, so failure is read from ``is_error``
  only. A skill load is a ``tool_use`` named ``Skill`` with input
  ``{"skill": NAME}`` whose result is not an error, or a ``Read`` of
  ``.../skills/NAME/SKILL.md``.
* **Codex** ``codex exec --json``, 0.44+ ("thread" generation):
  ``thread.started``, ``turn.started``, ``item.started``/``item.completed`` with
  ``item.type`` ``command_execution`` (``command``, ``aggregated_output``,
  ``exit_code``, ``status``), ``agent_message`` (``text``), ``reasoning``,
  ``file_change``, ``web_search``, ``mcp_tool_call``, ``error``; ``turn.completed``
  carries the turn's ``usage``; ``turn.failed`` and top-level ``error`` mark a
  failed run. The final answer is the last ``agent_message``.
* **Codex**, older ("msg" generation, before 0.44): a config line
  (``{"model": ..., "sandbox": ...}``), a ``{"prompt": ...}`` line, then
  ``{"id": N, "msg": {"type": ...}}`` with ``exec_command_begin`` /
  ``exec_command_end`` (``command`` is an argv list, ``exit_code``, ``stdout``,
  ``stderr``, ``aggregated_output``), ``agent_message`` (``message``),
  ``agent_reasoning``, ``token_count`` (flat per-turn usage, or ``info`` with a
  running ``total_token_usage``), ``task_complete`` (``last_agent_message``),
  ``error`` / ``stream_error``.

Codex wraps every command as ``bash -lc '...'`` (or ``/bin/bash -lc``); the
reader unwraps it with ``shlex`` so that the grader sees the words the agent
meant (``python3 scripts/mfsdp.py check x.yaml``), then splits compound
command lines on ``&&``, ``||``, ``;`` and ``|`` into simple commands. Matching
downstream is done on those parsed words, never on the raw line.

Unknown event types and unknown fields are ignored (counted in
``unknown_events``), because both CLIs add events between releases. A line that
is not JSON is skipped and counted (a CLI may print a warning to stdout); a
file with no recognisable event at all is ``UnreadableTranscript``.

Invocation record
-----------------
A ``/NAME`` prompt loads a skill in Claude Code without any tool call, and the stream never echoes the
prompt, so the transcript alone cannot tell how the agent was started. The runner writes what it sent into
``<transcript path>.meta.json`` (``agent``, ``invocation``, ``prompt``, ``with_skill``, ``scripted_model``,
``case``, ``exit_code``) and records that file's SHA-256 in its results.

Grades come from the transcript alone unless that record is named explicitly: ``read_transcript`` never
picks a sidecar up by itself (a file dropped next to a transcript must not change its grade), and
``load_meta(path, sha256)`` refuses a record whose digest is not the one the runner recorded. Even a
verified record only adds the ``/NAME`` prompt as a skill load and the labels; the workspace the security
check judges paths against always comes from the transcript's own events.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .shell import Command, parse

CLAUDE = "claude-code"
CODEX = "codex"
AGENTS = (CLAUDE, CODEX)

META_SUFFIX = ".meta.json"  # sidecar written by the runner, see module docstring

# Shells whose "-c"/"-lc" argument is the real command (Codex wraps every
# command this way; agents sometimes nest one more level themselves).
WRAPPER_SHELLS = frozenset({"bash", "sh", "zsh", "dash"})
WRAPPER_FLAGS = frozenset({"-c", "-lc", "-cl", "-ic", "-ilc", "--login"})
MAX_UNWRAP = 4  # nesting deeper than this is not something an agent writes

# Operators that separate simple commands in one shell line. Redirections are
# kept in the words (the security check wants to see "> /dev/sda").
SEPARATORS = frozenset({"&&", "||", ";", "|", "&", "\n", "|&", ";;"})

# The first line of the synthetic user message Claude Code injects when a skill
# is loaded: "Base directory for this skill: /abs/.claude/skills/NAME".
SKILL_BASE_RE = re.compile(r"^Base directory for this skill:\s*(?P<path>\S+?)/?\s*$", re.M)

# Claude Code reports a failing Bash command as a tool_result with is_error and
# content that starts "Exit code N".
CLAUDE_EXIT_RE = re.compile(r"^\s*(?:Error:\s*)?Exit code (?P<code>-?\d+)\b")

# Tools that read a file, for detecting a SKILL.md read by command (Codex).
# (grep/tail read a part only, so they do not count as loading the instructions.)
READ_COMMANDS = frozenset({"cat", "head", "less", "more", "sed", "nl", "bat"})


class UnreadableTranscript(Exception):
    """The file is missing, unreadable, or holds no event of a known CLI."""


def read_json_file(path: str | os.PathLike, what: str = "file"):
    """One JSON document (cases, schema, budgets, results); a problem is one UnreadableTranscript line."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UnreadableTranscript(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than json's C decoder allows
        raise UnreadableTranscript(f"{what} {path} is not valid JSON: {exc}") from None


@dataclass
class ToolCall:
    """One action the agent took: a shell command, a file read, a skill load..."""

    id: str
    tool: str  # "Bash", "Read", "Skill", "command_execution", "exec_command", "file_change", ...
    input: dict = field(default_factory=dict)
    command: str | None = None  # the shell text after unwrapping bash -lc, when it is a command
    segments: list[list[str]] = field(default_factory=list)  # simple commands as word lists
    operators: list[str] = field(default_factory=list)  # separators between segments, in order
    shell: list[Command] = field(default_factory=list)  # every simple command it runs (evals.shell)
    paths: list[str] = field(default_factory=list)  # files a file tool (Write, Edit, Read, file_change) touched
    output: str = ""
    exit_code: int | None = None
    is_error: bool | None = None  # None while no result was seen
    denied: bool = False  # Claude Code refused it (permission_denied)

    @property
    def succeeded(self) -> bool:
        if self.denied or self.is_error:
            return False
        if self.exit_code is not None:
            return self.exit_code == 0
        return self.is_error is False


@dataclass
class SkillLoad:
    name: str
    how: str  # "Skill tool", "Read", "command", "slash-prompt", "skill base message"
    evidence: str


@dataclass
class Transcript:
    agent: str
    path: str | None = None
    final_answer: str = ""
    messages: list[str] = field(default_factory=list)  # every assistant text, in order
    tool_calls: list[ToolCall] = field(default_factory=list)
    skills_loaded: list[SkillLoad] = field(default_factory=list)
    skills_available: list[str] = field(default_factory=list)
    usage: dict = field(default_factory=dict)  # input/output/cache tokens + total_tokens
    usage_source: str = ""
    num_turns: int | None = None
    cost_usd: float | None = None
    is_error: bool = False
    error: str = ""
    cwd: str | None = None
    cli_version: str | None = None
    model: str | None = None
    meta: dict = field(default_factory=dict)
    events: int = 0
    unknown_events: int = 0
    bad_lines: int = 0

    @property
    def commands(self) -> list[ToolCall]:
        return [c for c in self.tool_calls if c.command is not None]

    def loaded(self, skill: str) -> list[SkillLoad]:
        return [s for s in self.skills_loaded if s.name == skill]

    def summary(self) -> dict:
        return {
            "agent": self.agent,
            "path": self.path,
            "final_answer": self.final_answer,
            "tool_calls": len(self.tool_calls),
            "commands": [c.command for c in self.commands],
            "skills_loaded": [(s.name, s.how) for s in self.skills_loaded],
            "usage": self.usage,
            "usage_source": self.usage_source,
            "num_turns": self.num_turns,
            "cost_usd": self.cost_usd,
            "is_error": self.is_error,
            "error": self.error,
            "unknown_events": self.unknown_events,
            "bad_lines": self.bad_lines,
        }


# --------------------------------------------------------------------------- shell words


def unwrap_shell(command: str | list) -> str:
    """``bash -lc 'X'`` -> ``X`` (repeatedly); an argv list is joined first."""
    if isinstance(command, list):
        argv = [str(a) for a in command]
        text = shlex.join(argv)
    else:
        text = str(command)
        try:
            argv = shlex.split(text)
        except ValueError:
            return text
    for _ in range(MAX_UNWRAP):
        if len(argv) >= 3 and os.path.basename(argv[0]) in WRAPPER_SHELLS and argv[1] in WRAPPER_FLAGS:
            rest = argv[2:]
            if rest and rest[0] in WRAPPER_FLAGS:  # "bash --login -c X"
                rest = rest[1:]
            if not rest:
                break
            text = rest[0]
            try:
                argv = shlex.split(text)
            except ValueError:
                break
        else:
            break
    return text


def split_commands(text: str) -> tuple[list[list[str]], list[str]]:
    """Split a shell line into simple commands (word lists) and the operators between them.

    Uses ``shlex`` with ``punctuation_chars`` so quoting is honoured: ``echo 'a && b'``
    stays one command. Unbalanced quotes fall back to whitespace words.
    """
    lex = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        tokens = list(lex)
    except ValueError:
        tokens = text.split()
    segments: list[list[str]] = [[]]
    operators: list[str] = []
    for tok in tokens:
        if tok in SEPARATORS:
            operators.append(tok)
            segments.append([])
        else:
            segments[-1].append(tok)
    segs = [s for s in segments if s]
    return segs, operators


def _set_command(call: ToolCall, raw) -> None:
    call.command = unwrap_shell(raw)
    call.segments, call.operators = split_commands(call.command)
    call.shell = parse(call.command)


# --------------------------------------------------------------------------- skill detection


def _skill_from_path(path: str, require_skills_dir: bool) -> str | None:
    parts = [p for p in str(path).replace("\\", "/").split("/") if p]
    if len(parts) < 2 or parts[-1] != "SKILL.md":
        return None
    if require_skills_dir and (len(parts) < 3 or parts[-3] != "skills"):
        return None
    return parts[-2]


def _skills_read_by_command(call: ToolCall) -> list[str]:
    names = []
    for words in call.segments:
        if not words or os.path.basename(words[0]) not in READ_COMMANDS:
            continue
        for w in words[1:]:
            name = _skill_from_path(w, require_skills_dir=False)
            if name:
                names.append(name)
    return names


# --------------------------------------------------------------------------- loading


def _iter_json_events(text: str) -> tuple[list[dict], int]:
    """JSON Lines, or one (pretty-printed) JSON object / array of objects."""
    events: list[dict] = []
    bad = 0
    stripped = text.strip()
    if not stripped:
        return events, bad
    if stripped[0] in "[{" and "\n" in stripped:
        try:
            whole = json.loads(stripped)
        except (ValueError, RecursionError):
            whole = None
        if isinstance(whole, dict):
            return [whole], 0
        if isinstance(whole, list) and all(isinstance(e, dict) for e in whole):
            return list(whole), 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # a line nested too deep is no CLI's event
            bad += 1
            continue
        if isinstance(obj, dict):
            events.append(obj)
        else:
            bad += 1
    return events, bad


def detect_agent(events: Iterable[dict]) -> str | None:
    for ev in events:
        t = ev.get("type")
        if t in ("system", "assistant", "user", "result") or "session_id" in ev:
            return CLAUDE
        if isinstance(t, str) and (t.startswith(("thread.", "turn.", "item.")) or t == "error"):
            return CODEX
        if isinstance(ev.get("msg"), dict) or "prompt" in ev and len(ev) == 1:
            return CODEX
    return None


def meta_digest(path: str | os.PathLike) -> str:
    """SHA-256 of an invocation record, as the runner records it."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_meta(path: str | os.PathLike, sha256: str | None) -> dict:
    """The invocation record at PATH, only when its SHA-256 is SHA256 (what the runner recorded)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise UnreadableTranscript(f"{p}: {exc.strerror or exc}") from None
    digest = hashlib.sha256(raw).hexdigest()
    if not sha256 or digest != sha256.lower():
        raise UnreadableTranscript(
            f"{p}: invocation record digest {digest[:16]}... is not the one recorded "
            f"({(sha256 or 'none given')[:16]}...); grading uses the transcript alone"
        )
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise UnreadableTranscript(f"{p}: invocation record is not valid JSON ({exc})") from None
    return meta if isinstance(meta, dict) else {}


def read_transcript(path: str | os.PathLike, agent: str | None = None, meta: dict | None = None) -> Transcript:
    """Read one transcript file; META is an already verified invocation record (never looked up here)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise UnreadableTranscript(f"{p}: {exc.strerror or exc}") from None
    text = raw.decode("utf-8", errors="replace")
    events, bad = _iter_json_events(text)
    meta = meta or {}
    t = read_events(events, agent=agent or meta.get("agent"), meta=meta, source=str(p))
    t.bad_lines += bad
    return t


def read_events(
    events: list[dict], agent: str | None = None, meta: dict | None = None, source: str | None = None
) -> Transcript:
    """Parse already-decoded events (one dict per CLI line)."""
    meta = dict(meta or {})
    where = source or "transcript"
    if agent is not None and agent not in AGENTS:
        raise UnreadableTranscript(f"{where}: unknown agent '{agent}' (use {' or '.join(AGENTS)})")
    detected = detect_agent(events)
    if detected is None:
        raise UnreadableTranscript(f"{where}: no Claude Code or Codex event found")
    agent = agent or detected
    if agent != detected:
        raise UnreadableTranscript(f"{where}: looks like a {detected} transcript, not {agent}")
    t = Transcript(agent=agent, path=source, meta=meta, events=len(events))
    if agent == CLAUDE:
        _read_claude(events, t)
    else:
        _read_codex(events, t)
    _file_paths(t)
    prompt = meta.get("prompt")
    if isinstance(prompt, str) and prompt.lstrip().startswith("/"):
        first = prompt.lstrip()[1:].split(maxsplit=1)
        if first:
            t.skills_loaded.insert(0, SkillLoad(first[0], "slash-prompt", f"prompt starts with '/{first[0]}'"))
    if "total_tokens" not in t.usage:
        t.usage["total_tokens"] = sum(
            int(t.usage.get(k) or 0)
            for k in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )
    return t


# Input fields that name the file a Claude Code file tool works on.
_PATH_KEYS = ("file_path", "notebook_path", "path")


def _file_paths(t: Transcript) -> None:
    for c in t.tool_calls:
        if c.command is not None:
            continue
        for k in _PATH_KEYS:
            v = c.input.get(k)
            if isinstance(v, str) and v:
                c.paths.append(v)
        changes = c.input.get("changes")
        if isinstance(changes, list):  # Codex file_change: [{"path": ..., "kind": ...}]
            c.paths += [str(ch.get("path")) for ch in changes if isinstance(ch, dict) and ch.get("path")]
        elif isinstance(changes, dict):  # older Codex patch_apply_begin: {path: change}
            c.paths += [str(k) for k in changes]
        edits = c.input.get("edits")
        if c.tool == "MultiEdit" and isinstance(edits, list) and not c.paths:
            c.paths += [str(e.get("file_path")) for e in edits if isinstance(e, dict) and e.get("file_path")]


# --------------------------------------------------------------------------- Claude Code


def _dict(x) -> dict:
    """A field that should be an object: anything else reads as empty (a CLI bug must not crash grading)."""
    return x if isinstance(x, dict) else {}


def _count(v) -> int:
    """A token count from the transcript: a finite number, else 0 (JSON allows 1e999 and NaN; grading must not
    crash on them, nor print Infinity in its JSON)."""
    if isinstance(v, int) or isinstance(v, float) and math.isfinite(v):
        return int(v)
    return 0


_CLAUDE_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _text_of(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            _text_of(c.get("text", c.get("content", ""))) if isinstance(c, dict) else str(c) for c in content
        )
    return "" if content is None else str(content)


def _read_claude(events: list[dict], t: Transcript) -> None:
    calls: dict[str, ToolCall] = {}
    per_message_usage: dict[str, dict] = {}
    result = None
    for ev in events:
        typ = ev.get("type")
        if typ == "system":
            if ev.get("subtype") == "init":
                t.cwd = ev.get("cwd") or t.cwd
                t.model = ev.get("model") or t.model
                t.cli_version = ev.get("claude_code_version") or t.cli_version
                skills = ev.get("skills")
                if isinstance(skills, list):
                    t.skills_available = [s if isinstance(s, str) else str(_dict(s).get("name", s)) for s in skills]
            elif ev.get("subtype") == "permission_denied":
                c = calls.get(str(ev.get("tool_use_id")))
                if c is not None:
                    c.denied = True
            continue
        if typ == "assistant":
            msg = _dict(ev.get("message"))
            mid = str(msg.get("id") or ev.get("uuid") or len(per_message_usage))
            usage = msg.get("usage")
            if isinstance(usage, dict):
                seen = per_message_usage.setdefault(mid, {})
                for k in _CLAUDE_USAGE_KEYS:  # streaming may grow a count: keep the largest
                    v = usage.get(k)
                    if isinstance(v, (int, float)):
                        seen[k] = max(seen.get(k, 0), _count(v))
            content = msg.get("content")
            for block in content if isinstance(content, list) else []:
                if not isinstance(block, dict):
                    continue
                btype = block.get("type")
                if btype == "text" and isinstance(block.get("text"), str) and block["text"]:
                    t.messages.append(block["text"])
                elif btype == "tool_use":
                    raw_input = block.get("input")
                    inp: dict = raw_input if isinstance(raw_input, dict) else {}
                    call = ToolCall(id=str(block.get("id")), tool=str(block.get("name")), input=inp)
                    if call.tool == "Bash" and isinstance(inp.get("command"), str):
                        _set_command(call, inp["command"])
                    calls[call.id] = call
                    t.tool_calls.append(call)
            if ev.get("is_api_error_message"):
                t.is_error = True
                t.error = _text_of(msg.get("content"))
            continue
        if typ == "user":
            msg = _dict(ev.get("message"))
            content = msg.get("content")
            blocks = content if isinstance(content, list) else []
            for block in blocks:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "tool_result":
                    c = calls.get(str(block.get("tool_use_id")))
                    if c is None:
                        continue
                    c.output = _text_of(block.get("content"))
                    c.is_error = bool(block.get("is_error", False))
                    m = CLAUDE_EXIT_RE.match(c.output)
                    if m:
                        c.exit_code = int(m.group("code"))
                    elif c.command is not None and not c.is_error:
                        c.exit_code = 0
                    tur = ev.get("tool_use_result")
                    if isinstance(tur, dict) and c.tool == "Bash" and "stdout" in tur:
                        c.output = "\n".join(x for x in (tur.get("stdout"), tur.get("stderr")) if x) or c.output
                elif block.get("type") == "text" and ev.get("isSynthetic"):
                    m = SKILL_BASE_RE.search(str(block.get("text") or ""))
                    if m:
                        name = _skill_from_path(m.group("path").rstrip("/") + "/SKILL.md", require_skills_dir=True)
                        if name:
                            t.skills_loaded.append(SkillLoad(name, "skill base message", m.group(0).strip()))
            continue
        if typ == "result":
            result = ev
            continue
        t.unknown_events += 1
    # Skill loads from tool calls, in order, only when the load did not fail.
    tool_loads = []
    for c in t.tool_calls:
        if c.tool == "Skill" and isinstance(c.input.get("skill"), str) and not c.is_error and not c.denied:
            tool_loads.append(
                SkillLoad(
                    c.input["skill"].lstrip("/"),
                    "Skill tool",
                    f"tool_use {c.id} Skill {{'skill': {c.input['skill']!r}}}",
                )
            )
        elif c.tool == "Read" and not c.is_error and not c.denied:
            name = _skill_from_path(str(c.input.get("file_path", "")), require_skills_dir=True)
            if name:
                tool_loads.append(SkillLoad(name, "Read", f"Read {c.input.get('file_path')}"))
        elif c.command is not None and not c.denied:
            for name in _skills_read_by_command(c):
                tool_loads.append(SkillLoad(name, "command", f"Bash {c.command!r}"))
    # The synthetic base message repeats a Skill-tool load; keep it only when alone.
    tool_names = {s.name for s in tool_loads}
    t.skills_loaded = tool_loads + [s for s in t.skills_loaded if s.name not in tool_names]

    dedup = {k: sum(u.get(k, 0) for u in per_message_usage.values()) for k in _CLAUDE_USAGE_KEYS}
    if result is not None:
        t.is_error = bool(result.get("is_error", False)) or t.is_error
        if isinstance(result.get("result"), str):
            t.final_answer = result["result"]
        if t.is_error and not t.error:
            t.error = str(result.get("result") or result.get("terminal_reason") or result.get("subtype") or "error")
        if isinstance(result.get("num_turns"), int):
            t.num_turns = result["num_turns"]
        if isinstance(result.get("total_cost_usd"), (int, float)):
            cost = float(result["total_cost_usd"]) if abs(result["total_cost_usd"]) < 1e300 else math.inf
            t.cost_usd = cost if math.isfinite(cost) else t.cost_usd
        ru = result.get("usage")
        if isinstance(ru, dict):
            t.usage = {k: _count(ru.get(k)) for k in _CLAUDE_USAGE_KEYS}
            t.usage_source = "result.usage"
    else:
        t.is_error = True if not t.messages else t.is_error
        if not t.error:
            t.error = "no result line: the run was cut short"
    if not t.usage_source:
        t.usage = dedup
        t.usage_source = "assistant usage, de-duplicated by message.id"
    if not t.final_answer and t.messages:
        t.final_answer = t.messages[-1]


# --------------------------------------------------------------------------- Codex


def _read_codex(events: list[dict], t: Transcript) -> None:
    calls: dict[str, ToolCall] = {}
    usage = {"input_tokens": 0, "cached_input_tokens": 0, "output_tokens": 0, "reasoning_output_tokens": 0}
    turns = 0
    legacy_total = None  # msg-generation token_count.info.total_token_usage (running total)
    legacy_flat = False
    last_task_message = None

    def add_usage(u: dict) -> None:
        for k in usage:
            v = u.get(k)
            if isinstance(v, (int, float)):
                usage[k] += _count(v)

    for ev in events:
        typ = ev.get("type")
        msg = ev.get("msg")
        if isinstance(typ, str) and typ.startswith(("item.", "thread.", "turn.")) or typ == "error":
            if typ == "thread.started" or typ == "turn.started":
                continue
            if typ == "turn.completed":
                turns += 1
                if isinstance(ev.get("usage"), dict):
                    add_usage(ev["usage"])
                continue
            if typ == "turn.failed":
                turns += 1
                t.is_error = True
                err = ev.get("error")
                t.error = str(err.get("message") if isinstance(err, dict) else err or "turn failed")
                continue
            if typ == "error":
                t.is_error = True
                t.error = t.error or str(ev.get("message") or "error")
                continue
            item = ev.get("item")
            if not isinstance(item, dict):
                t.unknown_events += 1
                continue
            _codex_item(item, typ, calls, t)
            continue
        if isinstance(msg, dict):
            mtype = msg.get("type")
            cid = str(msg.get("call_id") or ev.get("id") or len(calls))
            if mtype == "exec_command_begin":
                call = ToolCall(
                    id=cid, tool="exec_command", input={"command": msg.get("command"), "cwd": msg.get("cwd")}
                )
                _set_command(call, msg.get("command") or "")
                calls[cid] = call
                t.tool_calls.append(call)
                if msg.get("cwd") and not t.cwd:
                    t.cwd = str(msg["cwd"])
            elif mtype == "exec_command_end":
                ended = calls.get(cid)
                if ended is not None:
                    call = ended
                    call.output = str(
                        msg.get("aggregated_output")
                        or "\n".join(x for x in (msg.get("stdout"), msg.get("stderr")) if x)
                    )
                    if isinstance(msg.get("exit_code"), int):
                        call.exit_code = msg["exit_code"]
                        call.is_error = call.exit_code != 0
            elif mtype in ("patch_apply_begin", "mcp_tool_call_begin", "web_search_begin"):
                call = ToolCall(
                    id=cid, tool=mtype.rsplit("_begin", 1)[0], input={k: v for k, v in msg.items() if k != "type"}
                )
                calls[cid] = call
                t.tool_calls.append(call)
            elif mtype in ("patch_apply_end", "mcp_tool_call_end", "web_search_end"):
                ended = calls.get(cid)
                if ended is not None:
                    call = ended
                    ok = msg.get("success")
                    call.is_error = ok is False
            elif mtype == "agent_message":
                text = msg.get("message") or msg.get("text") or msg.get("content")
                if isinstance(text, str) and text:
                    t.messages.append(text)
            elif mtype == "token_count":
                info = msg.get("info")
                if isinstance(info, dict) and isinstance(info.get("total_token_usage"), dict):
                    legacy_total = info["total_token_usage"]
                elif any(k in msg for k in usage):
                    legacy_flat = True
                    add_usage(msg)
            elif mtype == "task_complete":
                turns += 1
                if isinstance(msg.get("last_agent_message"), str):
                    last_task_message = msg["last_agent_message"]
            elif mtype in ("error", "stream_error"):
                if mtype == "error":
                    t.is_error = True
                    t.error = str(msg.get("message") or "error")
            elif mtype in (
                "task_started",
                "agent_reasoning",
                "agent_reasoning_delta",
                "agent_message_delta",
                "exec_command_output_delta",
                "session_configured",
                "agent_reasoning_raw_content",
                "plan_update",
                "turn_diff",
                "background_event",
            ):
                pass
            else:
                t.unknown_events += 1
            continue
        if "prompt" in ev and len(ev) == 1:
            t.meta.setdefault("prompt", ev["prompt"])
            continue
        if "model" in ev and typ is None:  # legacy config summary line
            t.model = str(ev.get("model"))
            if ev.get("workdir") and not t.cwd:
                t.cwd = str(ev["workdir"])
            continue
        t.unknown_events += 1

    if legacy_total is not None and not legacy_flat:
        add_usage(legacy_total)
    t.usage = usage
    t.usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]  # cached is part of input
    t.usage_source = "turn.completed usage" if legacy_total is None and not legacy_flat else "token_count"
    t.num_turns = turns
    t.final_answer = t.messages[-1] if t.messages else (last_task_message or "")
    for c in t.tool_calls:
        if c.command is not None:
            for name in _skills_read_by_command(c):
                if c.exit_code in (0, None) and not c.is_error:
                    t.skills_loaded.append(SkillLoad(name, "command", f"command {c.command!r}"))
    if not t.messages and not t.is_error and not t.tool_calls:
        t.is_error = True
        t.error = t.error or "no agent message: the run was cut short"


def _codex_item(item: dict, typ: str, calls: dict[str, ToolCall], t: Transcript) -> None:
    itype = item.get("type")
    iid = str(item.get("id"))
    if itype == "agent_message":
        if typ == "item.completed" and isinstance(item.get("text"), str):
            t.messages.append(item["text"])
        return
    if itype in ("reasoning", "todo_list"):
        return
    if itype == "error":  # non-fatal warning item (e.g. unknown model metadata)
        return
    call = calls.get(iid)
    if call is None:
        call = ToolCall(id=iid, tool=str(itype), input={k: v for k, v in item.items() if k not in ("id", "type")})
        calls[iid] = call
        t.tool_calls.append(call)
    if itype == "command_execution":
        _set_command(call, item.get("command") or "")
        if typ == "item.completed":
            call.output = str(item.get("aggregated_output") or "")
            code = item.get("exit_code")
            call.exit_code = code if isinstance(code, int) else None
            status = item.get("status")
            call.is_error = (
                status == "failed" or status == "declined" or (call.exit_code is not None and call.exit_code != 0)
            )
        return
    if typ == "item.completed":
        status = item.get("status")
        call.is_error = status == "failed"
        if itype == "mcp_tool_call" and isinstance(item.get("error"), (dict, str)) and item.get("error"):
            call.is_error = True
