"""The transcript reader on every real CLI sample in ../shared/transcripts and on hand-made ones."""

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


def _sample_files(shared: Path) -> list[Path]:
    base = shared / "transcripts"
    return sorted(p for p in base.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl", ".ndjson"))


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_reads_every_shared_sample(shared_dir):
    files = _sample_files(shared_dir)
    assert len(files) >= 10, files
    for f in files:
        t = read_transcript(f)
        expected = CLAUDE if "/claude/" in str(f) else CODEX
        assert t.agent == expected, f
        assert t.events >= 1
        # every run ends either in an answer or in a recorded error (single-message files: no result line)
        assert t.final_answer or t.is_error or t.tool_calls or f.parent.name.startswith("gleam_"), f
        assert t.usage["total_tokens"] >= 0


def test_gleam_messages_in_stream_order(shared_dir):
    d = shared_dir / "transcripts" / "claude" / "gleam_cli2.1.x_bash_ls"
    events = [
        json.loads((d / f"{n}.json").read_text())
        for n in ("system_message", "assistant_message", "user_message", "result_success")
    ]
    t = read_events(events)
    assert t.agent == CLAUDE and t.cli_version == "2.1.3"
    assert [c.command for c in t.commands] == ["ls -la"]
    assert t.commands[0].exit_code == 0 and t.commands[0].output.startswith("total 1976")
    assert t.final_answer == "Here are the files in the current directory."
    assert t.usage["output_tokens"] == 424 and t.usage_source == "result.usage"
    assert t.cost_usd == pytest.approx(0.24722425) and t.num_turns == 2
    assert t.skills_available == ["beads", "mala-logs"] and t.skills_loaded == []


def test_claude_skill_load_and_usage_dedup(shared_dir):
    path = shared_dir / "transcripts" / "claude" / "generated_cli2.1.332_skill_bash_read.jsonl"
    t = read_transcript(path)
    assert [(s.name, s.how) for s in t.skills_loaded] == [("hello-skill", "Skill tool")]
    assert [c.tool for c in t.tool_calls] == ["Skill", "Bash", "Read"]
    assert t.commands[0].segments == [["echo", "hello", ">", "out.txt"], ["cat", "out.txt"]]
    assert t.final_answer == "Done: out.txt contains hello." and not t.is_error
    assert (t.usage["input_tokens"], t.usage["output_tokens"]) == (260, 48)
    # without the result line, usage comes from assistant lines: msg_mock_0 repeats its usage on 3 blocks
    events = [e for e in _lines(path) if e.get("type") != "result"]
    t2 = read_events(events)
    assert t2.usage_source.startswith("assistant usage")
    assert t2.usage["input_tokens"] == 50 + 60 + 70 + 80  # not 3 * 50 + ...
    assert t2.final_answer == "Done: out.txt contains hello."


def test_claude_api_error_is_read_from_is_error(shared_dir):
    t = read_transcript(shared_dir / "transcripts" / "claude" / "generated_cli2.1.332_api_error.jsonl")
    assert t.is_error and "API Error: 400" in t.error


def test_claude_failed_skill_call_is_not_a_load(shared_dir):
    t = read_transcript(shared_dir / "transcripts" / "claude" / "generated_cli2.1.332_unknown_skill.jsonl")
    assert t.tool_calls[0].tool == "Skill" and t.tool_calls[0].is_error
    assert t.skills_loaded == []


def test_claude_permission_denied_marks_calls(shared_dir):
    t = read_transcript(shared_dir / "transcripts" / "claude" / "generated_cli2.1.332_permission_denied.jsonl")
    assert [c.denied for c in t.commands] == [True, True]
    assert t.commands[1].segments == [["curl", "-s", "http://127.0.0.1:9/x"], ["sh"]]
    assert t.commands[1].operators == ["|"]
    assert not any(c.succeeded for c in t.commands)


def test_codex_current_generation(shared_dir):
    t = read_transcript(shared_dir / "transcripts" / "codex" / "generated_cli0.163.0_skill_cmds.jsonl")
    assert t.agent == CODEX
    assert [c.command for c in t.commands] == [
        "cat /home/dev/.codex/skills/hello-skill/SKILL.md",
        "echo hello > out.txt && cat out.txt",
        "ls /nonexistent-dir",
    ]
    assert [(s.name, s.how) for s in t.skills_loaded] == [("hello-skill", "command")]
    assert [c.exit_code for c in t.commands] == [0, 0, 2] and t.commands[2].is_error
    assert (
        t.usage["input_tokens"] == 4600 and t.usage["output_tokens"] == 160 and t.usage["cached_input_tokens"] == 2400
    )
    assert t.final_answer == "Done: out.txt contains hello." and not t.is_error


def test_codex_046_unwraps_quoted_command(shared_dir):
    t = read_transcript(shared_dir / "transcripts" / "codex" / "agentcmd_cli0.46_stream-output-4.jsonl")
    assert [c.command for c in t.commands] == ["cat test.js"]
    assert t.final_answer.startswith("`test.js` simply contains")
    assert t.usage["input_tokens"] == 6087 and t.num_turns == 1


def test_codex_turn_failed_and_other_items(shared_dir):
    t = read_transcript(shared_dir / "transcripts" / "codex" / "generated_cli0.163.0_turn_failed.jsonl")
    assert t.is_error and "mock: invalid request" in t.error and t.final_answer == ""
    t = read_transcript(shared_dir / "transcripts" / "codex" / "generated_cli0.163.0_websearch_patch.jsonl")
    assert [c.tool for c in t.tool_calls] == ["web_search", "file_change"]
    assert t.final_answer == "Patched." and not t.is_error


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


def test_unknown_events_and_fields_are_tolerated(shared_dir):
    path = shared_dir / "transcripts" / "claude" / "generated_cli2.1.332_skill_bash_read.jsonl"
    events = _lines(path)
    noisy = []
    for e in events:
        e = dict(e, future_field={"nested": [1, 2]})
        noisy += [e, {"type": "stream_event", "event": {"type": "content_block_delta"}}]
    base, t = read_events(events), read_events(noisy)
    assert t.unknown_events == len(events)
    assert (t.final_answer, [c.command for c in t.commands], t.usage) == (
        base.final_answer,
        [c.command for c in base.commands],
        base.usage,
    )


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
