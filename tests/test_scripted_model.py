"""Unit tests of evals/scripted_model.py over real HTTP on 127.0.0.1 (no agent CLI needed).

The end-to-end tests (test_evals_e2e.py) prove the real CLIs accept these replies; these pin the wire shapes,
the turn selection, the labelling, the request log and the bounds one by one.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evals import scripted_model as sm  # noqa: E402

SKILL = "nemo-mbridge-perf-megatron-fsdp"
SKILL_DIR = f".claude/skills/{SKILL}"
SCRIPT = {
    "scripted": True,
    "turns": [
        {"load_skill": True},
        {"say": "Checking the config.", "run": "python3 {skill_dir}/scripts/mfsdp.py check cfg.yaml"},
        {"final": "The config has two errors."},
    ],
}
ANTHROPIC_TOOLS = [{"name": "Bash", "input_schema": {}}, {"name": "Skill", "input_schema": {}}]


def post(url: str, body, headers: dict | None = None) -> tuple[int, str, str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def sse(text: str) -> list[tuple[str, dict]]:
    events = []
    for chunk in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def anthropic_from_sse(text: str) -> dict:
    """Rebuild the message from the stream the way an SDK client does."""
    events = sse(text)
    assert events[0][0] == "message_start" and events[-1][0] == "message_stop"
    msg = events[0][1]["message"]
    blocks: dict[int, dict] = {}
    partial: dict[int, str] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif name == "content_block_delta":
            d = data["delta"]
            if d["type"] == "text_delta":
                blocks[data["index"]]["text"] += d["text"]
            else:
                partial[data["index"]] = partial.get(data["index"], "") + d["partial_json"]
        elif name == "message_delta":
            msg["stop_reason"] = data["delta"]["stop_reason"]
    for i, js in partial.items():
        blocks[i]["input"] = json.loads(js)
    msg["content"] = [blocks[i] for i in sorted(blocks)]
    return msg


@pytest.fixture
def server(tmp_path):
    with sm.ScriptedModelServer(SCRIPT, SKILL, SKILL_DIR, log_path=tmp_path / "log.jsonl") as srv:
        yield srv


def user_turn(text="Is my config right?"):
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def test_binds_loopback_only(server):
    assert server.base_url.startswith("http://127.0.0.1:")
    assert server._httpd.server_address[0] == "127.0.0.1"


def test_anthropic_stream_first_turn_loads_the_skill(server):
    status, ctype, text = post(
        server.base_url + "/v1/messages?beta=true",
        {"model": "m", "stream": True, "tools": ANTHROPIC_TOOLS, "messages": [user_turn()]},
    )
    assert status == 200 and ctype.startswith("text/event-stream")
    msg = anthropic_from_sse(text)
    assert msg["stop_reason"] == "tool_use"
    assert msg["content"] == [
        {"type": "tool_use", "id": "toolu_scripted_0", "name": "Skill", "input": {"skill": SKILL}}
    ]
    assert msg["model"] == sm.SCRIPTED_MODEL_NAME and "scripted" in msg["id"]


def test_anthropic_turn_follows_the_ids_sent_back(server):
    history = [
        user_turn(),
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_scripted_0", "name": "Skill", "input": {"skill": SKILL}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_scripted_0", "content": "Launching skill"}],
        },
    ]
    status, _, text = post(
        server.base_url + "/v1/messages", {"stream": True, "tools": ANTHROPIC_TOOLS, "messages": history}
    )
    msg = anthropic_from_sse(text)
    assert [b["type"] for b in msg["content"]] == ["text", "tool_use"]
    assert msg["content"][0]["text"] == f"{sm.SCRIPTED_LABEL}: Checking the config."
    assert msg["content"][1]["name"] == "Bash"
    assert msg["content"][1]["input"]["command"] == f"python3 {SKILL_DIR}/scripts/mfsdp.py check cfg.yaml"
    history += [{"role": "assistant", "content": [msg["content"][1]]}]
    _, _, text = post(server.base_url + "/v1/messages", {"stream": True, "tools": ANTHROPIC_TOOLS, "messages": history})
    final = anthropic_from_sse(text)
    assert final["stop_reason"] == "end_turn"
    assert final["content"] == [{"type": "text", "text": f"{sm.SCRIPTED_LABEL}: The config has two errors."}]
    assert server.turns_served() == [1, 2]


def test_anthropic_side_request_does_not_advance(server):
    _, _, text = post(server.base_url + "/v1/messages", {"stream": False, "messages": [user_turn("title?")]})
    msg = json.loads(text)
    assert msg["content"][0]["text"].startswith(sm.SCRIPTED_LABEL)
    assert server.requests[-1]["turn"] is None
    _, _, text = post(server.base_url + "/v1/messages", {"tools": ANTHROPIC_TOOLS, "messages": [user_turn()]})
    assert json.loads(text)["content"][0]["name"] == "Skill"


def test_past_the_script_end_gives_a_final_text():
    model = sm.ScriptedModel(SCRIPT, SKILL, SKILL_DIR)
    body = {
        "tools": ANTHROPIC_TOOLS,
        "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_scripted_7"}]}],
    }
    msg, index = model.anthropic_message(body, 100)
    assert index == 8 and msg["stop_reason"] == "end_turn"
    assert msg["content"][0]["text"].startswith(sm.SCRIPTED_LABEL) and "no turn 8" in msg["content"][0]["text"]


def test_count_tokens_and_unknown_paths(server):
    status, _, text = post(server.base_url + "/v1/messages/count_tokens", {"messages": [user_turn()]})
    assert status == 200 and json.loads(text)["input_tokens"] > 0
    status, _, _ = post(server.base_url + "/v1/nothing", {})
    assert status == 404


@pytest.mark.parametrize(
    "tool, expect",
    [
        ("exec_command", {"cmd": f"cat {SKILL_DIR}/SKILL.md", "yield_time_ms": sm.CODEX_YIELD_TIME_MS}),
        ("shell_command", {"command": f"cat {SKILL_DIR}/SKILL.md", "timeout_ms": sm.CODEX_TIMEOUT_MS}),
        ("shell", {"command": ["bash", "-lc", f"cat {SKILL_DIR}/SKILL.md"], "timeout_ms": sm.CODEX_TIMEOUT_MS}),
    ],
)
def test_responses_skill_load_is_a_shell_read_of_skill_md(server, tool, expect):
    status, ctype, text = post(
        server.base_url + "/v1/responses",
        {
            "model": "gpt-5.5",
            "stream": True,
            "tools": [{"type": "function", "name": tool}],
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        },
    )
    assert status == 200 and ctype.startswith("text/event-stream")
    events = sse(text)
    assert events[0][0] == "response.created" and events[-1][0] == "response.completed"
    done = [d["item"] for n, d in events if n == "response.output_item.done"]
    assert len(done) == 1 and done[0]["type"] == "function_call" and done[0]["name"] == tool
    assert done[0]["call_id"] == "call_scripted_0" and json.loads(done[0]["arguments"]) == expect
    usage = events[-1][1]["response"]["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0


def test_responses_turns_and_final_message(server):
    tools = [{"type": "function", "name": "exec_command"}]
    inp = [
        {"type": "message", "role": "user", "content": []},
        {"type": "function_call", "call_id": "call_scripted_0", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_scripted_0", "output": "SKILL.md text"},
    ]
    events = sse(post(server.base_url + "/v1/responses", {"stream": True, "tools": tools, "input": inp})[2])
    items = [d["item"] for n, d in events if n == "response.output_item.done"]
    assert [i["type"] for i in items] == ["message", "function_call"]
    assert json.loads(items[1]["arguments"]) == {
        "cmd": f"python3 {SKILL_DIR}/scripts/mfsdp.py check cfg.yaml",
        "yield_time_ms": sm.CODEX_YIELD_TIME_MS,
    }
    inp += [items[1], {"type": "function_call_output", "call_id": "call_scripted_1", "output": "2 errors"}]
    events = sse(post(server.base_url + "/v1/responses", {"stream": True, "tools": tools, "input": inp})[2])
    items = [d["item"] for n, d in events if n == "response.output_item.done"]
    assert items[-1]["type"] == "message"
    assert items[-1]["content"][0]["text"] == f"{sm.SCRIPTED_LABEL}: The config has two errors."


def test_request_log_redacts_credentials(server, tmp_path):
    post(
        server.base_url + "/v1/messages",
        {"tools": ANTHROPIC_TOOLS, "messages": [user_turn("secret-free")]},
        headers={"x-api-key": "sk-should-not-appear", "Authorization": "Bearer sk-nor-this"},
    )
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert len(lines) == len(server.requests) == 1
    entry = json.loads(lines[0])
    assert entry["body"]["messages"][0]["content"][0]["text"] == "secret-free"
    assert "sk-should-not-appear" not in lines[0] and "sk-nor-this" not in lines[0]
    headers = {k.lower(): v for k, v in entry["headers"].items()}
    assert headers["x-api-key"] == headers["authorization"] == "<redacted>"


def test_request_limit(monkeypatch, server):
    monkeypatch.setattr(sm, "MAX_REQUESTS", 2)
    codes = [post(server.base_url + "/v1/messages", {"messages": [user_turn()]})[0] for _ in range(3)]
    assert codes == [200, 200, 429]


def test_oversized_body_is_refused_unread(server):
    host, port = server.base_url[len("http://") :].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (sm.MAX_BODY_BYTES + 1)
        )
        assert s.recv(100).startswith(b"HTTP/1.1 413")


def test_scripted_failure_status(tmp_path):
    with sm.ScriptedModelServer(SCRIPT, SKILL, SKILL_DIR, fail_with_status=400) as srv:
        status, _, text = post(srv.base_url + "/v1/messages", {"messages": [user_turn()]})
    assert status == 400 and json.loads(text)["error"]["message"].startswith(sm.SCRIPTED_LABEL)


def test_stops_by_itself_when_idle():
    srv = sm.ScriptedModelServer(SCRIPT, SKILL, SKILL_DIR, idle_timeout_s=0.3).start()
    url = srv.base_url
    deadline = time.monotonic() + 10
    while srv.stopped_reason is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert srv.stopped_reason == "idle timeout"
    time.sleep(0.5)
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/v1/models", timeout=2)


@pytest.mark.parametrize(
    "bad, why",
    [
        ({"turns": [{"final": "x"}]}, '"scripted": true'),
        ({"scripted": True, "turns": []}, "non-empty"),
        ({"scripted": True, "turns": [{"final": "x"}, {"run": "ls"}]}, "not the last"),
        ({"scripted": True, "turns": [{"run": "ls", "final": "x"}]}, "exactly one"),
        ({"scripted": True, "turns": [{"run": "  "}, {"final": "x"}]}, "non-empty command"),
        ({"scripted": True, "turns": [{"load_skill": True}]}, "last turn must be"),
    ],
)
def test_validate_script_names_the_problem(bad, why):
    with pytest.raises(sm.ScriptError, match=why):
        sm.validate_script(bad)


def test_shipped_scripts_are_valid_and_labelled():
    scripts = sorted((Path(__file__).resolve().parent.parent / "evals" / "scripted").glob("*.json"))
    assert scripts, "evals/scripted/ holds no script"
    for path in scripts:
        data = sm.load_script(path)
        assert data["case"] == path.stem
        assert sm.SCRIPTED_LABEL in data.get("note", ""), f"{path.name}: the note must say {sm.SCRIPTED_LABEL}"
