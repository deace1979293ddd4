"""The transcript reader on hand-made transcripts and inline events (real CLI output: test_evals_cli_transcripts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evals.transcripts import (  # noqa: E402
    CLAUDE,
    CODEX,
    UnreadableTranscript,
    load_meta,
    meta_digest,
    read_events,
    read_transcript,
    split_commands,
    unwrap_shell,
)

HAND = ROOT / "tests" / "fixtures" / "transcripts"
SKILL = "nemo-mbridge-perf-megatron-fsdp"


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_codex_unwraps_quoted_command_and_reads_other_items():
    """Codex 0.4x wraps commands as "bash -lc '...'"; web_search and file_change items are tool calls too."""
    events = [
        {"type": "thread.started", "thread_id": "t"},
        {"type": "turn.started"},
        {
            "type": "item.completed",
            "item": {
                "id": "i0",
                "type": "command_execution",
                "command": "bash -lc 'cat test.js'",
                "aggregated_output": "x",
                "exit_code": 0,
                "status": "completed",
            },
        },
        {"type": "item.completed", "item": {"id": "i1", "type": "web_search", "query": "fsdp"}},
        {
            "type": "item.started",
            "item": {
                "id": "i2",
                "type": "file_change",
                "status": "in_progress",
                "changes": [{"path": "/p/a.py", "kind": "add"}],
            },
        },
        {
            "type": "item.completed",
            "item": {
                "id": "i2",
                "type": "file_change",
                "status": "completed",
                "changes": [{"path": "/p/a.py", "kind": "add"}],
            },
        },
        {"type": "item.completed", "item": {"id": "i3", "type": "agent_message", "text": "Patched."}},
        {"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 4, "output_tokens": 2}},
    ]
    t = read_events(events)
    assert [c.command for c in t.commands] == ["cat test.js"]
    assert [c.tool for c in t.tool_calls] == ["command_execution", "web_search", "file_change"]
    assert t.tool_calls[2].paths == ["/p/a.py"]
    assert t.final_answer == "Patched." and not t.is_error and t.num_turns == 1
    failed = read_events(
        events[:2] + [{"type": "error", "message": "bad request"}, {"type": "turn.failed", "error": {"message": "x"}}]
    )
    assert failed.is_error and failed.final_answer == ""


def test_codex_legacy_msg_generation():
    t = read_transcript(HAND / "codex_legacy_pass_decoy_csv.jsonl")
    assert t.agent == CODEX and t.cwd == "/tmp/eval-proj"
    assert [c.command for c in t.commands] == ["ls"] and t.commands[0].exit_code == 0
    assert t.usage["input_tokens"] == 3000 and t.usage_source == "token_count"
    assert "def mean_latency" in t.final_answer
    assert t.unknown_events == 1  # some_future_event is tolerated and counted
    assert t.meta["prompt"].startswith("Write a Python function")


def test_slash_prompt_from_invocation_record():
    path = HAND / "claude_slash_prompt_vs_fsdp2.jsonl"
    side = Path(str(path) + ".meta.json")
    assert read_transcript(path).skills_loaded == []  # a sidecar is never picked up by itself
    t = read_transcript(path, meta=load_meta(side, meta_digest(side)))
    assert t.tool_calls == []
    assert [(s.name, s.how) for s in t.skills_loaded] == [(SKILL, "slash-prompt")]
    assert t.meta["with_skill"] is True and t.meta["scripted_model"] is False
    # the same events without the record: no load can be seen
    assert read_events(_lines(HAND / "claude_slash_prompt_vs_fsdp2.jsonl")).skills_loaded == []


@pytest.mark.parametrize("content", [b"", b"\x00\x01\xff binary", b"not json at all\n", b'{"foo": 1}\n', b"[1, 2]\n"])
def test_unreadable_inputs_raise(tmp_path, content):
    p = tmp_path / "t.jsonl"
    p.write_bytes(content)
    with pytest.raises(UnreadableTranscript):
        read_transcript(p)


def test_missing_file_and_agent_mismatch(tmp_path):
    with pytest.raises(UnreadableTranscript):
        read_transcript(tmp_path / "none.jsonl")
    with pytest.raises(UnreadableTranscript, match="not codex"):
        read_transcript(HAND / "claude_pass_ckpt_assertion.jsonl", agent=CODEX)
    (tmp_path / "x.jsonl.meta.json").write_text("{broken")
    with pytest.raises(UnreadableTranscript, match="invocation record"):
        load_meta(tmp_path / "x.jsonl.meta.json", meta_digest(tmp_path / "x.jsonl.meta.json"))
    with pytest.raises(UnreadableTranscript, match="digest"):
        load_meta(tmp_path / "x.jsonl.meta.json", "0" * 64)


def test_truncated_stream_keeps_what_was_read(tmp_path):
    lines = (HAND / "claude_pass_ckpt_assertion.jsonl").read_text().splitlines()
    p = tmp_path / "cut.jsonl"
    p.write_text("\n".join(lines[:-2]) + "\n" + lines[-2][: len(lines[-2]) // 2])
    t = read_transcript(p)
    assert t.bad_lines == 1 and t.skills_loaded and t.commands
    assert t.is_error and "no result line" in t.error  # cut short: recorded as an error, not a crash


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("bash -lc ls", "ls"),
        ("/bin/bash -lc 'cat test.js'", "cat test.js"),
        (["bash", "-lc", "python3 scripts/mfsdp.py check a.yaml"], "python3 scripts/mfsdp.py check a.yaml"),
        ("bash -lc \"sh -c 'rm -rf /'\"", "rm -rf /"),
        ("python3 scripts/mfsdp.py check", "python3 scripts/mfsdp.py check"),
        ("bash -lc 'unbalanced", "bash -lc 'unbalanced"),
    ],
)
def test_unwrap_shell(raw, expected):
    assert unwrap_shell(raw) == expected


def test_split_commands_honours_quotes():
    segs, ops = split_commands("cd /p && python3 scripts/mfsdp.py check 'a && b.yaml' | tee o; echo done")
    assert segs == [
        ["cd", "/p"],
        ["python3", "scripts/mfsdp.py", "check", "a && b.yaml"],
        ["tee", "o"],
        ["echo", "done"],
    ]
    assert ops == ["&&", "|", ";"]


def test_cli_grade_exit_2_on_unreadable(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text("garbage\n")
    proc = subprocess.run(
        [sys.executable, "-m", "evals", "grade", "--case", "decoy-cuda-graphs", str(p)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "no Claude Code or Codex event" in proc.stderr


# Property: whatever a CLI prints (any JSON values in any known or unknown field), reading never crashes
# with anything but UnreadableTranscript, and grading a readable result never crashes at all.
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_FIELDS = [
    "message",
    "content",
    "usage",
    "item",
    "msg",
    "result",
    "skills",
    "text",
    "command",
    "error",
    "is_error",
    "num_turns",
    "tool_use_result",
    "input",
    "exit_code",
    "info",
    "status",
    "type",
    "name",
    "id",
]
# floats include inf and nan (json.loads reads 1e999 and NaN), integers include ones too large for a float
_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.just(10**400) | st.text(max_size=12)
_json = st.recursive(
    _leaf,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(_FIELDS), kids, max_size=4),
    max_leaves=12,
)
_types = st.sampled_from(
    [
        "system",
        "assistant",
        "user",
        "result",
        "item.completed",
        "item.started",
        "turn.completed",
        "turn.failed",
        "error",
        "thread.started",
        "x.unknown",
    ]
)
_event = st.builds(
    lambda t, extra: {**extra, "type": t}, _types, st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=4)
)
_legacy = st.builds(lambda m: {"id": "1", "msg": m}, st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=4))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_event | _legacy, min_size=1, max_size=6))
def test_random_events_never_crash(events):
    from evals import grader

    try:
        t = read_events(events)
    except UnreadableTranscript:
        return
    r = grader.grade(grader.get_case("mfsdp-ckpt-format-assertion"), t)
    assert set(r["dimensions"]) == set(grader.DIMENSIONS)


@pytest.mark.parametrize(
    "events",
    [
        [{"type": "assistant", "message": [1]}],
        [{"type": "user", "message": "x"}],
        [{"type": "system", "subtype": "init", "skills": [None, {"name": "a"}]}],
        [{"type": "assistant", "message": {"content": [{"type": "text", "text": 5}]}}],
        [{"type": "result", "usage": {"input_tokens": "7"}, "result": None}],
        [{"type": "user", "isSynthetic": True, "message": {"content": [{"type": "text", "text": None}]}}],
    ],
)
def test_malformed_fields_read_as_empty(events):
    t = read_events(events)
    assert t.agent == CLAUDE and isinstance(t.final_answer, str) and all(isinstance(m, str) for m in t.messages)


@pytest.mark.parametrize(
    "line",
    [
        '{"type":"turn.completed","usage":{"input_tokens":1e999}}',
        '{"type":"result","usage":{"input_tokens":-5,"output_tokens":1e400},"num_turns":1,"total_cost_usd":NaN}',
        '{"type":"result","usage":{"input_tokens":5},"total_cost_usd":1e999,"is_error":false,"result":"x"}',
        '{"type":"assistant","message":{"id":"a","content":[],"usage":{"output_tokens":Infinity}}}',
    ],
)
def test_non_finite_numbers_grade_to_valid_json(tmp_path, line):
    """A count of 1e999 crashed grading (int(inf)); a cost of 1e999 printed Infinity, which is not JSON."""
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "evals",
            "grade",
            "--case",
            "mfsdp-ckpt-format-assertion",
            str(path),
            "--format",
            "json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1), proc.stderr
    json.loads(proc.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the grade JSON"))


@pytest.mark.parametrize("sidecar", [False, True])
def test_json_nested_too_deep_is_unreadable_not_a_traceback(tmp_path, sidecar):
    """json.loads raises RecursionError (not ValueError) past ~1,000 levels; grade printed a traceback."""
    deep = "[" * 100_000 + "]" * 100_000
    path = tmp_path / "t.jsonl"
    extra: list[str] = []
    if sidecar:
        path.write_text((HAND / "claude_pass_ckpt_assertion.jsonl").read_text())
        side = tmp_path / "t.jsonl.meta.json"
        side.write_text(deep)
        extra = ["--meta", str(side), "--meta-sha256", meta_digest(side)]
    else:
        path.write_text('{"type":"assistant","message":' + deep + "}\n" + deep + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "evals", "grade", "--case", "mfsdp-ckpt-format-assertion", str(path), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-500:]
    assert "Traceback" not in proc.stderr
