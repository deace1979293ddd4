"""A scripted stand-in for a model API, on 127.0.0.1 only, so the REAL agent CLIs can run end to end in CI.

Why: CI has no model API key, yet the eval loop is worth running for real there: the real ``skills`` install,
the real Claude Code / Codex binary discovering the skill, loading SKILL.md with its own tool, executing our
scripts with its own shell, writing its own transcript. Only the *model's* turns are replayed from a script;
everything the CLI adds (envelope, tool execution, tool results, usage aggregation) is real.

Mechanism:
* One small ``ThreadingHTTPServer`` per run, bound to 127.0.0.1 on a free port. It speaks two dialects:
  - Anthropic Messages (``POST /v1/messages``, streaming SSE or plain JSON; ``/v1/messages/count_tokens``),
    which Claude Code uses when ``ANTHROPIC_BASE_URL`` points here;
  - OpenAI Responses (``POST /v1/responses``, streaming SSE), the only wire API Codex 0.163 accepts for a custom
    ``model_providers`` entry (its binary rejects ``wire_api = "chat"``).
* A final text may quote the tool's figures as ``{mem:STRATEGY:COLUMN}`` (``evals.fill``): they are filled in
  from the tool results in the request, so the scripted answer reports what the tool printed in that run.
* A script (``evals/scripted/<case>.json``) is a list of abstract turns, each one of
  ``{"load_skill": true}`` (Claude Code: a ``Skill`` tool call; Codex: a shell command that prints SKILL.md,
  which is how Codex loads a skill), ``{"run": "<command>"}`` (Claude Code: ``Bash``; Codex: its shell tool), or
  ``{"final": "<text>"}``. ``{skill_dir}`` and ``{skill}`` in a command are replaced with where the agent's
  project holds the skill, so one script serves both agents.
* The turn to answer is read from the request itself, not from server state: every tool call we emit carries the
  id ``..._scripted_<turn>``, so the highest such id in the conversation sent back to us tells which turn comes
  next. That makes side requests (titles, topic checks, retries) harmless: a request that offers no tools gets a
  short labelled text and does not advance the script.
* Every reply is labelled: final texts start with ``SCRIPTED_LABEL``, ids contain ``scripted``, the model name
  says ``scripted``; nobody reading a transcript can take it for a model's work.
* Every request is logged (body parsed, credentials redacted) in memory and, when asked, to a JSON Lines file, so
  tests can assert what the CLI really sent (the skill listing, the tool results).
* Bounded: at most ``MAX_REQUESTS`` requests, ``MAX_BODY_BYTES`` per body; the server stops by itself after
  ``idle_timeout_s`` without a request or ``max_lifetime_s`` in all; turns past the script's end get a final text.

Token counts in replies are synthetic (a fixed 4-bytes-per-token estimate of the request and the reply), never a
model's; results carry ``scripted_model: true`` so reports never present them as a model's performance.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .fill import fill

SCRIPTED_LABEL = "SCRIPTED MODEL REPLY"
# Shown as the model name in every reply so the CLI's own transcript records that no model answered.
SCRIPTED_MODEL_NAME = "scripted-model"
LOOPBACK = "127.0.0.1"
# A run of one eval case makes a handful of requests; anything near this is a loop, so stop answering.
MAX_REQUESTS = 200
# Claude Code's requests carry its whole system prompt and tool schemas (~100-200 KB); 16 MiB is far above that.
MAX_BODY_BYTES = 16 * 1024 * 1024
# The CLI stays silent between requests only while a tool runs; our scripts finish in seconds.
DEFAULT_IDLE_TIMEOUT_S = 180.0
DEFAULT_MAX_LIFETIME_S = 1800.0
# Synthetic usage: a rough bytes-per-token ratio, so budgets scale with what was really sent.
BYTES_PER_TOKEN = 4
TURN_KINDS = ("load_skill", "run", "final")
# How long Codex waits on a scripted command. Its exec_command hands back after yield_time_ms
# (10 s unless asked, 30 s at most) with the command still running and no exit status, and its
# shell tools stop a command at timeout_ms (10 s unless asked). On a loaded machine (CI runs the
# cases in parallel) the skill's script can pass 10 s, and a run without an exit status is one the
# grader cannot credit; so the scripted turns ask for the most, as a model does for a slow command.
CODEX_YIELD_TIME_MS = 30_000
CODEX_TIMEOUT_MS = 120_000
_ID_TURN = re.compile(r"_scripted_(\d+)")
_REDACT_HEADERS = {"authorization", "x-api-key", "openai-api-key", "api-key", "cookie"}


class ScriptError(ValueError):
    """A script file is not a usable scripted-model script (one line, for the caller to print)."""


def validate_script(script: Any, where: str = "script") -> dict:
    """Check the shape of a script and return it; raise ScriptError naming the first problem."""
    if not isinstance(script, dict):
        raise ScriptError(f"{where}: expected a JSON object")
    if script.get("scripted") is not True:
        raise ScriptError(f'{where}: must say "scripted": true so nobody mistakes it for a model')
    turns = script.get("turns")
    if not isinstance(turns, list) or not turns:
        raise ScriptError(f"{where}: 'turns' must be a non-empty list")
    for i, turn in enumerate(turns):
        kinds = [k for k in TURN_KINDS if k in turn] if isinstance(turn, dict) else []
        if len(kinds) != 1:
            raise ScriptError(f"{where}: turn {i} must have exactly one of {', '.join(TURN_KINDS)}")
        if kinds[0] == "final":
            if not isinstance(turn["final"], str):
                raise ScriptError(f"{where}: turn {i} 'final' must be text")
            if i != len(turns) - 1:
                raise ScriptError(f"{where}: turn {i} is final but is not the last turn")
        if kinds[0] == "run" and not (isinstance(turn["run"], str) and turn["run"].strip()):
            raise ScriptError(f"{where}: turn {i} 'run' must be a non-empty command")
        if "say" in turn and not isinstance(turn["say"], str):
            raise ScriptError(f"{where}: turn {i} 'say' must be text")
    if "final" not in turns[-1]:
        raise ScriptError(f"{where}: the last turn must be a 'final' text")
    return script


def load_script(path: str | Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ScriptError(f"{path}: cannot read script ({exc})") from None
    return validate_script(data, str(path))


def labelled(text: str) -> str:
    """Prefix a reply with the scripted label (once)."""
    return text if text.startswith(SCRIPTED_LABEL) else f"{SCRIPTED_LABEL}: {text}"


def _tokens(n_bytes: int) -> int:
    return max(1, n_bytes // BYTES_PER_TOKEN)


def _strings_of(conversation: Any, kind: str) -> list[str]:
    """The texts of the tool results (blocks or items of type KIND) in a request's conversation, in order."""
    out: list[str] = []

    def walk(x: Any, inside: bool) -> None:
        if isinstance(x, str):
            if inside:
                out.append(x)
        elif isinstance(x, dict):
            now = inside or x.get("type") == kind
            for v in x.values():
                walk(v, now)
        elif isinstance(x, list):
            for v in x:
                walk(v, inside)

    walk(conversation, False)
    return out


def _next_turn(ids: list[str]) -> int:
    turns = [int(m.group(1)) for i in ids if isinstance(i, str) for m in [_ID_TURN.search(i)] if m]
    return max(turns) + 1 if turns else 0


class ScriptedModel:
    """Turns a script into replies; pure logic, no sockets (unit-testable)."""

    def __init__(self, script: dict, skill: str, skill_dir: str):
        self.script = validate_script(script)
        self.skill = skill
        self.skill_dir = skill_dir.rstrip("/")

    def _expand(self, command: str) -> str:
        return command.replace("{skill_dir}", self.skill_dir).replace("{skill}", self.skill)

    def turn(self, index: int) -> dict:
        turns = self.script["turns"]
        if index < len(turns):
            return turns[index]
        return {"final": f"{SCRIPTED_LABEL}: the script has no turn {index}; stopping."}

    def command_for(self, turn: dict) -> str | None:
        """The shell command a turn runs (a Codex skill load is a command too), or None."""
        if "run" in turn:
            return self._expand(turn["run"])
        return None

    # ---- Anthropic Messages ---------------------------------------------------------------------------------
    @staticmethod
    def anthropic_turn_index(body: dict) -> int:
        ids = []
        for msg in body.get("messages") or []:
            if isinstance(msg, dict) and msg.get("role") == "assistant" and isinstance(msg.get("content"), list):
                ids += [str(b.get("id")) for b in msg["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
        return _next_turn(ids)

    def anthropic_message(self, body: dict, raw_len: int) -> tuple[dict, int | None]:
        content: list[dict[str, Any]]
        """The full assistant message for this request, and the script turn it answers (None: side request)."""
        tool_names = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        if "Bash" not in tool_names:
            index, content, stop = (
                None,
                [{"type": "text", "text": labelled("side request; nothing to add.")}],
                "end_turn",
            )
        else:
            index = self.anthropic_turn_index(body)
            turn = self.turn(index)
            content = []
            if turn.get("say"):
                content.append({"type": "text", "text": labelled(turn["say"])})
            if "final" in turn:
                final = fill(turn["final"], _strings_of(body.get("messages"), "tool_result"))
                content.append({"type": "text", "text": labelled(final)})
                stop = "end_turn"
            else:
                tool_id = f"toolu_scripted_{index}"
                if "load_skill" in turn:
                    content.append({"type": "tool_use", "id": tool_id, "name": "Skill", "input": {"skill": self.skill}})
                else:
                    command = self.command_for(turn)
                    content.append(
                        {
                            "type": "tool_use",
                            "id": tool_id,
                            "name": "Bash",
                            "input": {"command": command, "description": f"{SCRIPTED_LABEL} command"},
                        }
                    )
                stop = "tool_use"
        out_len = len(json.dumps(content))
        usage = turn_usage = {
            "input_tokens": _tokens(raw_len),
            "output_tokens": _tokens(out_len),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        if index is not None and isinstance(self.turn(index).get("usage"), dict):
            usage = {**turn_usage, **self.turn(index)["usage"]}
        tag = "side" if index is None else str(index)
        message = {
            "id": f"msg_scripted_{tag}_{int(time.time() * 1000)}",
            "type": "message",
            "role": "assistant",
            "model": SCRIPTED_MODEL_NAME,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        return message, index

    @staticmethod
    def anthropic_sse(message: dict) -> bytes:
        """The streaming form of a message, event by event as the Messages API sends it."""

        def ev(name: str, data: dict) -> str:
            return f"event: {name}\ndata: {json.dumps(data)}\n\n"

        usage = message["usage"]
        start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
        parts = [ev("message_start", {"type": "message_start", "message": start})]
        for i, block in enumerate(message["content"]):
            if block["type"] == "text":
                parts.append(
                    ev(
                        "content_block_start",
                        {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                    )
                )
                parts.append(
                    ev(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "text_delta", "text": block["text"]},
                        },
                    )
                )
            else:
                parts.append(
                    ev(
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {
                                "type": "tool_use",
                                "id": block["id"],
                                "name": block["name"],
                                "input": {},
                            },
                        },
                    )
                )
                parts.append(
                    ev(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
                        },
                    )
                )
            parts.append(ev("content_block_stop", {"type": "content_block_stop", "index": i}))
        parts.append(
            ev(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            )
        )
        parts.append(ev("message_stop", {"type": "message_stop"}))
        return "".join(parts).encode()

    # ---- OpenAI Responses -----------------------------------------------------------------------------------
    @staticmethod
    def responses_turn_index(body: dict) -> int:
        items = body.get("input")
        ids = [str(it.get("call_id")) for it in items if isinstance(it, dict)] if isinstance(items, list) else []
        return _next_turn(ids)

    @staticmethod
    def _shell_call(tools: list, command: str) -> tuple[str, dict]:
        """Name and arguments of a shell call, shaped for whichever shell tool the CLI offers."""
        names = {t.get("name"): t for t in tools if isinstance(t, dict)}
        if "shell_command" in names:
            return "shell_command", {"command": command, "timeout_ms": CODEX_TIMEOUT_MS}
        if "exec_command" in names:
            return "exec_command", {"cmd": command, "yield_time_ms": CODEX_YIELD_TIME_MS}
        if "shell" in names:
            return "shell", {"command": ["bash", "-lc", command], "timeout_ms": CODEX_TIMEOUT_MS}
        raise KeyError("the request offers no shell tool (shell_command, exec_command or shell)")

    def responses_output(self, body: dict, raw_len: int) -> tuple[list[dict], dict, int | None]:
        tools = body.get("tools") or []
        index = self.responses_turn_index(body) if tools else None
        turn = self.turn(index) if index is not None else {"final": labelled("side request; nothing to add.")}
        items: list[dict] = []
        tag = "side" if index is None else str(index)

        def message(text: str, n: int) -> dict:
            return {
                "type": "message",
                "id": f"msg_scripted_{tag}_{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": labelled(text), "annotations": []}],
            }

        if turn.get("say"):
            items.append(message(turn["say"], 0))
        if "final" in turn:
            items.append(message(fill(turn["final"], _strings_of(body.get("input"), "function_call_output")), 1))
        else:
            command = f"cat {self.skill_dir}/SKILL.md" if "load_skill" in turn else (self.command_for(turn) or "")
            try:
                name, args = self._shell_call(tools, command)
            except KeyError as exc:
                items.append(message(f"cannot run a command: {exc.args[0]}", 1))
            else:
                items.append(
                    {
                        "type": "function_call",
                        "id": f"fc_scripted_{tag}",
                        "call_id": f"call_scripted_{tag}",
                        "name": name,
                        "arguments": json.dumps(args),
                        "status": "completed",
                    }
                )
        out_len = len(json.dumps(items))
        usage: dict[str, Any] = {
            "input_tokens": _tokens(raw_len),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": _tokens(out_len),
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        extra = turn.get("usage")
        if isinstance(extra, dict):
            usage.update(extra)
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        return items, usage, index

    @staticmethod
    def responses_sse(items: list[dict], usage: dict, response_id: str) -> bytes:
        def ev(data: dict) -> str:
            return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n"

        base = {"id": response_id, "object": "response", "model": SCRIPTED_MODEL_NAME, "created_at": int(time.time())}
        parts = [ev({"type": "response.created", "response": {**base, "status": "in_progress", "output": []}})]
        for i, item in enumerate(items):
            parts.append(
                ev({"type": "response.output_item.added", "output_index": i, "item": {**item, "status": "in_progress"}})
            )
            if item["type"] == "message":
                text = item["content"][0]["text"]
                parts.append(
                    ev(
                        {
                            "type": "response.output_text.delta",
                            "item_id": item["id"],
                            "output_index": i,
                            "content_index": 0,
                            "delta": text,
                        }
                    )
                )
            parts.append(ev({"type": "response.output_item.done", "output_index": i, "item": item}))
        parts.append(
            ev(
                {
                    "type": "response.completed",
                    "response": {**base, "status": "completed", "output": items, "usage": usage},
                }
            )
        )
        return "".join(parts).encode()


class _QuietServer(ThreadingHTTPServer):
    """Records a connection error (a client that hangs up mid-reply) in the request log, not on stderr."""

    daemon_threads = True
    owner: ScriptedModelServer | None = None

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if self.owner is not None:
            self.owner.record({"time": time.time(), "connection_error": f"{type(exc).__name__}: {exc}"})


class ScriptedModelServer:
    """The HTTP server around a ScriptedModel. Use as a context manager; ``base_url`` is set once started."""

    def __init__(
        self,
        script: dict,
        skill: str,
        skill_dir: str,
        log_path: str | Path | None = None,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S,
        fail_with_status: int | None = None,
    ):
        self.model = ScriptedModel(script, skill, skill_dir)
        self.log_path = Path(log_path) if log_path else None
        self.idle_timeout_s = idle_timeout_s
        self.max_lifetime_s = max_lifetime_s
        # For error-path tests: answer every model request with this HTTP status.
        self.fail_with_status = fail_with_status
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._httpd: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self.base_url = ""
        self.stopped_reason: str | None = None

    # -- lifecycle --
    def start(self) -> ScriptedModelServer:
        handler = _make_handler(self)
        self._httpd = _QuietServer((LOOPBACK, 0), handler)
        self._httpd.owner = self
        self.base_url = f"http://{LOOPBACK}:{self._httpd.server_address[1]}"
        self._started = time.monotonic()
        serve = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        watch = threading.Thread(target=self._watchdog, daemon=True)
        self._threads = [serve, watch]
        serve.start()
        watch.start()
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.write_text("", encoding="utf-8")
        return self

    def _watchdog(self) -> None:
        while self._httpd is not None:
            now = time.monotonic()
            if now - self._last > self.idle_timeout_s:
                self.stop("idle timeout")
            elif now - self._started > self.max_lifetime_s:
                self.stop("lifetime limit")
            time.sleep(0.5)

    def stop(self, reason: str = "stopped") -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            self.stopped_reason = reason

            def close() -> None:
                httpd.shutdown()
                httpd.server_close()

            threading.Thread(target=close, daemon=True).start()

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- log --
    def record(self, entry: dict) -> None:
        with self._lock:
            entry["seq"] = len(self.requests)
            self.requests.append(entry)
            if self.log_path:
                with self.log_path.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(entry) + "\n")

    def model_requests(self) -> list[dict]:
        return [r for r in self.requests if r.get("dialect") in ("anthropic", "responses")]

    def turns_served(self) -> list[int]:
        return [r["turn"] for r in self.model_requests() if r.get("turn") is not None]


def _make_handler(server: ScriptedModelServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "ScriptedModel/1"

        def log_message(self, *args) -> None:  # the request log replaces stderr chatter
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("x-scripted-model", "true")
            self.send_header("request-id", f"req_scripted_{len(server.requests)}")
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, message: str, dialect: str) -> None:
            if dialect == "anthropic":
                body = {"type": "error", "error": {"type": "invalid_request_error", "message": labelled(message)}}
            else:
                body = {"error": {"type": "invalid_request_error", "message": labelled(message), "code": None}}
            self._send(status, json.dumps(body).encode())

        def do_GET(self) -> None:
            server._last = time.monotonic()
            server.record(
                {
                    "time": time.time(),
                    "method": "GET",
                    "path": self.path,
                    "dialect": None,
                    "headers": _headers(self.headers),
                }
            )
            path = self.path.split("?")[0].rstrip("/")
            if path.endswith("/models"):
                self._send(200, json.dumps({"object": "list", "data": [], "models": []}).encode())
            else:
                self._send(404, json.dumps({"error": {"message": labelled(f"no {path} here")}}).encode())

        def do_HEAD(self) -> None:
            self._send(200, b"")

        def do_POST(self) -> None:
            server._last = time.monotonic()
            path = self.path.split("?")[0].rstrip("/")
            dialect = (
                "anthropic" if path.endswith("/messages") else "responses" if path.endswith("/responses") else None
            )
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                return self._error(413, "request body too large", dialect or "responses")
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {"_unparsed": raw[:2000].decode("utf-8", "replace")}
            entry = {
                "time": time.time(),
                "method": "POST",
                "path": self.path,
                "dialect": dialect,
                "headers": _headers(self.headers),
                "body": body,
                "turn": None,
            }
            if len(server.requests) >= MAX_REQUESTS:
                server.record(entry)
                return self._error(429, f"request limit {MAX_REQUESTS} reached", dialect or "responses")
            if path.endswith("/messages/count_tokens"):
                server.record(entry)
                return self._send(200, json.dumps({"input_tokens": _tokens(len(raw))}).encode())
            if dialect is None:
                server.record(entry)
                return self._error(404, f"no {path} here", "responses")
            if server.fail_with_status:
                server.record(entry)
                return self._error(server.fail_with_status, "scripted failure", dialect)
            if not isinstance(body, dict):
                server.record(entry)
                return self._error(400, "body is not a JSON object", dialect)
            if dialect == "anthropic":
                message, index = server.model.anthropic_message(body, len(raw))
                entry["turn"] = index
                entry["reply"] = message
                server.record(entry)
                if body.get("stream"):
                    return self._send(200, server.model.anthropic_sse(message), "text/event-stream")
                return self._send(200, json.dumps(message).encode())
            items, usage, index = server.model.responses_output(body, len(raw))
            entry["turn"] = index
            entry["reply"] = items
            server.record(entry)
            rid = f"resp_scripted_{'side' if index is None else index}_{len(server.requests)}"
            if body.get("stream", True):
                return self._send(200, server.model.responses_sse(items, usage, rid), "text/event-stream")
            return self._send(
                200,
                json.dumps(
                    {
                        "id": rid,
                        "object": "response",
                        "status": "completed",
                        "model": SCRIPTED_MODEL_NAME,
                        "output": items,
                        "usage": usage,
                    }
                ).encode(),
            )

    return Handler


def _headers(headers) -> dict:
    return {k: ("<redacted>" if k.lower() in _REDACT_HEADERS else v) for k, v in headers.items()}
