"""Property-based fuzzing of every reader of untrusted input (hypothesis).

The property, for each reader: whatever the bytes, it answers with its documented result or its one
"unusable input" error (``InputError`` -> exit 2 at the CLI), never another exception, and within a time
bound. In-process for volume (hundreds of inputs per reader), plus a few runs of the real CLI in a subprocess,
where a crash of the interpreter itself (a segfault) or a hang would show.

Strategies are built from the formats' own grammar (YAML with anchors, aliases and duplicate keys; pickle
opcode streams; Bridge log lines; Sigstore bundles) so that the fuzzer reaches past the first syntax check.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import time
import zipfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mfsdp_lib import config_io
from mfsdp_lib.findings import InputError
from mfsdp_lib.runs import checkpoint_files as F
from mfsdp_lib.runs import checkpoints as C
from mfsdp_lib.runs import logs
from mfsdp_lib.runs.pickle_reader import PickleUnreadable, read_pickle_tree

BOUND_S = 5.0  # seconds one input may take in-process; hostile inputs above are answered in well under 1 s
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _timed(fn, *a, **kw):
    start = time.monotonic()
    try:
        return fn(*a, **kw)
    finally:
        assert time.monotonic() - start < BOUND_S, f"{fn.__name__} took too long"


# --------------------------------------------------------------------------- YAML configs

names = st.sampled_from(["ddp", "dist", "checkpoint", "train", "model", "optimizer", "x", "use_megatron_fsdp", "a"])
scalars = st.one_of(
    st.sampled_from(["true", "no", "1", "1e9", "~", "null", "'q'", '"d"', "[]", "{}", "&a 1", "*a", "!!str x"]),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=8),
)


@st.composite
def yaml_texts(draw):
    """Indented YAML-ish lines: mappings, sequences, flow collections, anchors, aliases, duplicates, junk."""
    lines = []
    for _ in range(draw(st.integers(0, 25))):
        indent = "  " * draw(st.integers(0, 4))
        kind = draw(st.integers(0, 5))
        if kind == 0:
            lines.append(f"{indent}{draw(names)}:")
        elif kind == 1:
            lines.append(f"{indent}{draw(names)}: {draw(scalars)}")
        elif kind == 2:
            lines.append(f"{indent}- {draw(scalars)}")
        elif kind == 3:
            lines.append(f"{indent}{draw(names)}: &{draw(names)} [{', '.join(draw(st.lists(scalars, max_size=4)))}]")
        elif kind == 4:
            lines.append(f"{indent}{draw(names)}: [*{draw(names)}, *{draw(names)}]")
        else:
            lines.append(draw(st.text(max_size=20)))
    return "\n".join(lines) + "\n"


@FUZZ
@given(yaml_texts())
def test_fuzz_yaml_config_reader(text):
    try:
        data = _timed(config_io.parse_yaml, text, "fuzz.yaml")
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(data, dict)
    try:
        _timed(config_io.merge_file, config_io.base_config(None), data, "fuzz.yaml")
    except InputError:
        pass


@FUZZ
@given(st.binary(max_size=3000))
def test_fuzz_config_file_bytes(tmp_path, data):
    path = tmp_path / "cfg.yaml"
    path.write_bytes(data)
    try:
        _timed(config_io.load_effective, str(path))
    except InputError as exc:
        assert "\n" not in str(exc)


# --------------------------------------------------------------------------- pickles (.metadata, train_state.pt)

OPCODE_SNIPPETS = [
    b"(",
    b")",
    b"]",
    b"}",
    b"0",
    b"1",
    b"2",
    b"N",
    b"\x88",
    b"\x89",
    b"a",
    b"e",
    b"s",
    b"u",
    b"t",
    b"l",
    b"d",
    b"\x85",
    b"\x86",
    b"\x87",
    b"R",
    b"\x81",
    b"b",
    b"\x94",
    b"h\x00",
    b"q\x00",
    b"j\x00\x00\x00\x00",
    b"K\x07",
    b"J\xff\xff\xff\x7f",
    b"\x8a\x01\x01",
    b"G" + struct.pack(">d", 1.5),
    b"X\x03\x00\x00\x00abc",
    b"\x8c\x02ab",
    b"cos\nsystem\n",
    b"ctorch.distributed.checkpoint.metadata\nMetadata\n",
    b"\x93",
    b"\x8f",
    b"\x90",
    b"\x91",
    b"Q",
    b"P",
    b"i__main__\nX\n",
    b"o",
    b"\x82\x01",
    b"\x95\x00\x00\x00\x00\x00\x00\x00\x00",
    b"I12\n",
    b"L3\n",
]
pickles = st.builds(
    lambda head, body, stop: head + b"".join(body) + stop,
    st.sampled_from([b"", b"\x80\x02", b"\x80\x04", b"\x80\x05"]),
    st.lists(st.sampled_from(OPCODE_SNIPPETS), max_size=60),
    st.sampled_from([b".", b"", b".."]),
)


@FUZZ
@given(st.one_of(pickles, st.binary(max_size=400)))
def test_fuzz_pickle_walker(data):
    try:
        _timed(read_pickle_tree, data, persistent=True, globals_out=[])
    except PickleUnreadable:
        pass


@FUZZ
@given(st.one_of(pickles, st.binary(max_size=400)))
def test_fuzz_dcp_metadata_reader(tmp_path, data):
    path = tmp_path / ".metadata"
    path.write_bytes(data)
    summary, err = _timed(F.read_dcp_metadata, str(path))
    assert (summary is None) != (err is None)
    if summary is not None:
        json.dumps(summary)  # plain data only: nothing recursive or unhashable leaks out


@FUZZ
@given(st.one_of(pickles, st.binary(max_size=300)), st.sampled_from(["archive/data.pkl", "data.pkl", "x"]))
def test_fuzz_train_state_reader(tmp_path, data, member):
    path = tmp_path / "train_state.pt"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(member, data)
        zf.writestr("archive/data/0", b"\x01" * 8)
    path.write_bytes(buf.getvalue())
    state, err = _timed(F.read_train_state, str(path))
    assert (state is None) != (err is None)


@FUZZ
@given(st.binary(max_size=64))
def test_fuzz_tracker_reader(tmp_path, data):
    path = tmp_path / "latest_checkpointed_iteration.txt"
    path.write_bytes(data)
    it, release, err = _timed(F.read_tracker_txt, str(path))
    assert err is None or (it is None and not release)


@FUZZ
@given(yaml_texts())
def test_fuzz_run_config_reader(tmp_path, text):
    path = tmp_path / "run_config.yaml"
    path.write_text(text, encoding="utf-8")
    data, err = _timed(F.read_run_config, str(path))
    assert (data is None) != (err is None)


REAL_ITER = Path(__file__).resolve().parents[1] / "fixtures" / "ckpt" / "fsdp_dtensor_ok" / "iter_0000020"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(pickles, st.binary(max_size=200)),
    yaml_texts(),
    st.binary(max_size=16),
    st.sampled_from(["iter_0000020", "iter_0000001", "release", "junk"]),
)
def test_fuzz_checkpoint_folder(tmp_path_factory, meta, run_config, tracker, name):
    root = tmp_path_factory.mktemp("ck")
    it = root / name
    it.mkdir()
    (it / ".metadata").write_bytes(meta)
    (it / "run_config.yaml").write_text(run_config, encoding="utf-8")
    (it / "__0_0.distcp").write_bytes((REAL_ITER / "__0_0.distcp").read_bytes()[:64])
    (root / "latest_checkpointed_iteration.txt").write_bytes(tracker)
    try:
        rep = _timed(C.inspect, str(root))
    except InputError:
        return
    json.dumps(rep.to_dict(), default=str)


# --------------------------------------------------------------------------- logs

log_lines = st.one_of(
    st.sampled_from(
        [
            " [2026-12-02 16:54:43] iteration        1/      10 | lm loss: 1.0E+01 | number of nan iterations:   0 |",
            " iteration       10/      10 | lm loss: nan | number of skipped iterations: 1 | number of nan iterations: 1 |",
            "Traceback (most recent call last):",
            "RuntimeError: CUDA error: out of memory",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "  rank      : 1 (local_rank: 1)",
            "  exitcode  : -9 (pid: 1)",
            "  traceback : Signal 9 (SIGKILL) received by PID 1",
            "====",
            "failed (exitcode: -11) local_rank: 3 (pid: 9) of binary: /usr/bin/python3",
            "1 passed in 3.21s",
            'SMOKE_RESULT {"a": [[[[1]]]]}',
            "Megatron-FSDP requires the fsdp_dtensor checkpointing format!",
            "saving checkpoint at iteration      10 to /c in fsdp_dtensor format",
        ]
    ),
    st.text(max_size=80),
)
log_prefixes = st.sampled_from(["", "[rank0]:", "[rank1]: ", "[default3]:", "12: ", "\x1b[31m"])


@FUZZ
@given(st.lists(st.tuples(log_prefixes, log_lines), max_size=40), st.sampled_from(["\n", "\r\n", "\r"]))
def test_fuzz_log_reader(lines, newline):
    data = newline.join(p + ln for p, ln in lines).encode("utf-8", "surrogateescape")
    rep = _timed(logs.analyse, io.BytesIO(data), "fuzz.log")
    try:
        findings = logs.judge(rep)
    except InputError:
        return
    json.dumps(rep.to_dict())
    assert all(f.severity in ("error", "warning", "info") for f in findings)


# --------------------------------------------------------------------------- signature bundles


@FUZZ
@given(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
        lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=8), c, max_size=3)),
        max_leaves=10,
    ),
    st.booleans(),
)
def test_fuzz_signature_bundle_reader(tmp_path, payload, wrap):
    from mfsdp_lib.integrity import signature as sig

    if wrap:
        text = json.dumps({"dsseEnvelope": {"payload": base64.b64encode(json.dumps(payload).encode()).decode()}})
    else:
        text = json.dumps(payload)
    path = tmp_path / "skill.oms.sig"
    path.write_text(text)
    try:
        _timed(sig.read_statement, path)
    except (InputError, sig.VerificationError):
        pass


# --------------------------------------------------------------------------- the real CLI, in a subprocess

CLI_FUZZ = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _cli_ok(p):
    assert p.returncode in (0, 1, 2), (p.returncode, p.stderr[-500:])
    assert "Traceback" not in p.stderr


@CLI_FUZZ
@given(yaml_texts(), st.sampled_from(["check", "enable", "memory"]))
def test_fuzz_cli_config_commands(cli, tmp_path_factory, text, command):
    path = tmp_path_factory.mktemp("c") / "cfg.yaml"
    path.write_text(text, encoding="utf-8")
    _cli_ok(cli(command, str(path), timeout=30))


@CLI_FUZZ
@given(st.one_of(pickles, st.binary(max_size=300)))
def test_fuzz_cli_ckpt(cli, tmp_path_factory, meta):
    root = tmp_path_factory.mktemp("k")
    it = root / "iter_0000001"
    it.mkdir()
    (it / ".metadata").write_bytes(meta)
    (root / "latest_checkpointed_iteration.txt").write_text("1\n")
    _cli_ok(cli("ckpt", str(root), "--format", "json", timeout=30))


@CLI_FUZZ
@given(st.lists(st.tuples(log_prefixes, log_lines), max_size=30))
def test_fuzz_cli_log(cli, tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("l") / "x.log"
    path.write_bytes("\n".join(p + ln for p, ln in lines).encode("utf-8", "surrogateescape"))
    _cli_ok(cli("log", str(path), timeout=30))
