"""mfsdp_lib.runs.logs: streaming parse of training logs, smoke judgement, failure signatures."""

from __future__ import annotations

import io
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _helpers_ckptlog import LOGS, REAL_LOG, nan_from_40_log, real_logs
from mfsdp_lib.findings import InputError
from mfsdp_lib.runs import logs as L


def analyse_bytes(data: bytes, chunk: int | None = None) -> L.LogReport:
    stream = io.BytesIO(data) if chunk is None else _Trickle(data, chunk)
    return L.analyse(stream, source="test")


class _Trickle:
    """A stream that hands out at most N bytes per read, to cut lines at every possible place."""

    def __init__(self, data: bytes, n: int):
        self.data, self.n, self.pos = data, n, 0

    def read(self, _size: int) -> bytes:
        out = self.data[self.pos : self.pos + self.n]
        self.pos += len(out)
        return out


def rules(findings, severity=None):
    return {f.rule for f in findings if severity is None or f.severity == severity}


def real_iteration_lines() -> list[str]:
    return [line for line in REAL_LOG.read_text().splitlines() if re.search(r"\] iteration\s+\d+/", line)]


# --- the real log -------------------------------------------------------------------------------------------


def test_real_log_facts():
    rep = L.analyse(open(REAL_LOG, "rb"), str(REAL_LOG))
    lines = real_iteration_lines()
    assert rep.iterations == len(lines) == 10
    assert (rep.first_iteration, rep.last_iteration, rep.train_iters) == (1, 10, 10)
    loss = rep.loss_summary()
    # The README names the last loss; the first is read from the first iteration line itself.
    assert loss["key"] == "lm loss" and loss["last"] == pytest.approx(1.002306e01)
    assert loss["first"] == float(re.search(r"lm loss: (\S+)", lines[0]).group(1))
    assert loss["last_finite"] is True
    assert rep.saves == [
        {
            "iteration": 10,
            "path": "/workspace/checkpoints",
            "format": "fsdp_dtensor",
            "completed": True,
            "line": rep.saves[0]["line"],
        }
    ]
    assert not L.judge(rep)


def test_parse_fields_is_field_scoped():
    line = real_iteration_lines()[0]
    fields = L.parse_fields(L.ITER_RE.search(line).group(3))
    assert fields["lm loss"] == "1.042395E+01"
    assert fields["loss scale"] == "1.0" and fields["number of nan iterations"] == "0"
    assert fields["elapsed time per iteration (ms)"] == "8887.8"


def test_bridge_still_prints_fields_this_parser_relies_on(bridge_src):
    text = (bridge_src / "megatron/bridge/training/utils/train_utils.py").read_text()
    assert '" iteration {:8d}/{:8d} |"' in text
    assert '" number of nan iterations: {:3d} |"' in text  # the last field: completeness marker
    assert "if avg >= 0.0:" in text  # why a NaN loss is absent rather than printed
    body = text[text.index('" number of skipped iterations') :]
    assert body.index("number of skipped iterations") < body.index("number of nan iterations")
    losses = (bridge_src / "megatron/bridge/training/losses.py").read_text()
    assert '{"lm loss": reporting_loss}' in losses


def test_checkpoint_messages_match_bridge(bridge_src):
    text = (bridge_src / "megatron/bridge/training/checkpointing.py").read_text()
    assert 'f"saving checkpoint at iteration {train_state.step:7d} to {save_dir} in {ckpt_format} format"' in text
    assert "successfully saved checkpoint from iteration" in text
    assert "successfully loaded checkpoint from {load_dir} " in text
    assert "will not load any checkpoints and will start from random" in text


# --- derived fixtures ----------------------------------------------------------------------------------------


def test_multirank_prefixes_and_ranks():
    rep = L.analyse(open(LOGS / "multirank_interleaved.log", "rb"))
    assert rep.ranks_seen == {0, 1}
    assert rep.iterations == 10 and rep.loss_summary()["last_finite"]
    assert not rules(L.judge(rep), "error")


def test_ansi_and_carriage_returns():
    rep = L.analyse(open(LOGS / "ansi_cr.log", "rb"))
    assert rep.iterations == 10 and rep.loss_summary()["last"] == pytest.approx(10.02306)
    assert not L.judge(rep)


def test_nan_loss_is_missing_field_not_number():
    rep = L.analyse(open(LOGS / "nan_loss.log", "rb"))
    loss = rep.loss_summary()
    assert rep.last_iteration == 10 and loss["missing_at_last_iteration"] and not loss["last_finite"]
    assert rep.nan == 4 and rep.skipped == 4
    found = L.judge(rep)
    assert "MFSDP-LOG-LOSS-NOT-FINITE" in rules(found, "error")
    assert {"MFSDP-LOG-NAN-ITERATIONS", "MFSDP-LOG-SKIPPED-ITERATIONS"} <= rules(found, "warning")


def test_printed_nan_or_inf_loss_is_not_finite():
    line = real_iteration_lines()[-1]
    for bad in ("NAN", "INF"):
        rep = analyse_bytes(re.sub(r"lm loss: \S+", f"lm loss: {bad}", line).encode() + b"\n")
        assert not rep.loss_summary()["last_finite"]
        assert "MFSDP-LOG-LOSS-NOT-FINITE" in rules(L.judge(rep))


def test_truncated_log_ignores_partial_line():
    rep = L.analyse(open(LOGS / "truncated.log", "rb"))
    assert rep.truncated_last_line and rep.partial_iteration_lines == 1
    assert rep.last_iteration == 7
    found = L.judge(rep)
    assert not rules(found, "error")
    assert {"MFSDP-LOG-TRUNCATED", "MFSDP-LOG-INCOMPLETE-RUN"} <= rules(found, "warning")


def test_resume_log_counts_load_and_save():
    rep = L.analyse(open(LOGS / "resume.log", "rb"))
    assert rep.loads == [
        {"iteration": 10, "path": "/workspace/checkpoints", "completed": True, "line": rep.loads[0]["line"]}
    ]
    assert rep.saves[0]["iteration"] == 15 and rep.saves[0]["completed"]
    assert (rep.first_iteration, rep.last_iteration) == (11, 15)


def test_restart_detected_when_logs_are_appended():
    data = REAL_LOG.read_bytes() * 2
    rep = analyse_bytes(data)
    assert rep.iterations == 20 and rep.restarts == 1
    assert "MFSDP-LOG-RESTARTS" in rules(L.judge(rep), "info")


@pytest.mark.parametrize(
    "name,rule",
    [
        ("oom.log", "MFSDP-LOG-CUDA-OOM"),
        ("ckpt_format_assert.log", "MFSDP-LOG-CKPT-FORMAT-ASSERT"),
        ("nan_check_raised.log", "MFSDP-LOG-NAN-CHECK"),
    ],
)
def test_failure_fixtures(name, rule):
    found = L.judge(L.analyse(open(LOGS / name, "rb")))
    assert rule in rules(found, "error")


def test_pytest_summaries():
    ok = L.analyse(open(LOGS / "pytest_pass.log", "rb"))
    assert ok.pytest["passed"] == 1 and ok.pytest["failed"] == 0 and not L.judge(ok)
    bad = L.analyse(open(LOGS / "pytest_fail.log", "rb"))
    assert bad.pytest["failed"] == 1 and bad.pytest_failed_tests == ["tests/test_smoke.py::test_megatron_fsdp_smoke"]
    assert "MFSDP-LOG-PYTEST-FAILED" in rules(L.judge(bad), "error")


@pytest.mark.parametrize(
    "summary,ok",
    [
        ("===== 1 passed in 48.31s =====", True),
        ("1 passed, 2 warnings in 3.02s", True),
        ("====== 1 failed, 3 passed in 9.10s (0:00:09) ======", False),
        ("===== 1 passed, 1 error in 2.00s =====", False),
        ("===== no tests ran in 0.01s =====", False),
        ("===== 2 skipped in 0.10s =====", False),
    ],
)
def test_pytest_summary_variants(summary, ok):
    rep = analyse_bytes(REAL_LOG.read_bytes() + summary.encode() + b"\n")
    assert rep.pytest is not None
    assert ("MFSDP-LOG-PYTEST-FAILED" not in rules(L.judge(rep))) is ok


# --- failure signatures --------------------------------------------------------------------------------------

# One realistic line per signature, as the message appears in a log (prefixes as torchrun/logging print them).
SIGNATURE_LINES = {
    "MFSDP-LOG-CKPT-FORMAT-ASSERT": "[rank0]: AssertionError: Megatron-FSDP requires the fsdp_dtensor checkpointing format!",
    "MFSDP-LOG-DTENSOR-NEEDS-MFSDP": "[rank3]: AssertionError: fsdp_dtensor checkpoint format only supports Megatron FSDP",
    "MFSDP-LOG-CKPT-FORMAT-MISMATCH": "[rank0]: AssertionError: Checkpoint format 'torch_dist' from config differs from "
    "inferred format 'fsdp_dtensor' for /ckpt/iter_0000010.",
    "MFSDP-LOG-CKPT-UNKNOWN-FORMAT": "NotImplementedError: Unknown checkpoint format in /ckpt/iter_0000020",
    "MFSDP-LOG-HF-DIR-AS-LOAD": "ValueError: checkpoint.load does not support HuggingFace-format directories. Use "
    "checkpoint.load with a native Megatron checkpoint for resume training",
    "MFSDP-LOG-MFSDP-AND-FSDP2": "[default0]:ValueError: use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive.",
    "MFSDP-LOG-CUDA-MAX-CONNECTIONS": "[rank1]: AssertionError: FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.",
    "MFSDP-LOG-TP-PP-DP-MAPPING": "AssertionError: use_tp_pp_dp_mapping is not supported with Megatron FSDP",
    "MFSDP-LOG-FSDP2-PG-COLLECTION": "[rank0]: TypeError: TorchFullyShardedDataParallel.__init__() got an unexpected "
    "keyword argument 'pg_collection'",
    "MFSDP-LOG-CUDA-OOM": "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
    "total capacity of 79.10 GiB of which 1.2 GiB is free.",
    "MFSDP-LOG-NCCL-TIMEOUT": "[rank1]:[E1202 16:55:43.421000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=12, OpType=_ALLGATHER_BASE, NumelIn=1, "
    "NumelOut=2, Timeout(ms)=600000) ran for 600018 milliseconds before timing out.",
    "MFSDP-LOG-NCCL-ERROR": "[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/"
    "c10d/NCCLUtils.cpp:77, unhandled system error (run with NCCL_DEBUG=INFO for details)",
    "MFSDP-LOG-NAN-CHECK": "RuntimeError: Rank 0, node h200-0, device 0, iteration 7: Unexpected result nan "
    "(message='found NaN in local forward loss calculation')",
    "MFSDP-LOG-DATASET-HELPERS": "ERROR:megatron.core.datasets.utils:Failed to compile the C++ dataset helper functions",
    "MFSDP-LOG-GRAD-ACCUM-FUSION": "[rank0]: RuntimeError: ColumnParallelLinear was called with "
    "gradient_accumulation_fusion set to True but the custom CUDA extension "
    "fused_weight_gradient_mlp_cuda module is not found. To use gradient_accumulation",
    "MFSDP-LOG-HF-HUB-OFFLINE": "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and "
    "couldn't find them in the cached files.",
}

# Lines that mention the same words but are not the failure: source shown in a traceback, prose, config echo.
NEAR_MISSES = [
    '            "Megatron-FSDP requires the fsdp_dtensor checkpointing format!"',
    "see docs: Megatron-FSDP requires the fsdp_dtensor checkpointing format! (we set it)",
    "  ckpt_format: 'fsdp_dtensor'",
    "  use_torch_fsdp2: False",
    "export CUDA_DEVICE_MAX_CONNECTIONS=1  # FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.",
    "INFO:megatron.core.distributed:NCCL version 2.27.3+cuda13.0",
    "  use_tp_pp_dp_mapping: false",
    "grep 'CUDA out of memory. Tried to allocate' run.log",
    "  check_for_nan_in_grad: True",
]


def test_every_signature_has_a_line():
    assert set(SIGNATURE_LINES) == {s.rule for s in L.SIGNATURES}


@pytest.mark.parametrize("rule", sorted(SIGNATURE_LINES))
def test_signature_matches_its_line(rule):
    rep = analyse_bytes((SIGNATURE_LINES[rule] + "\n").encode())
    assert set(rep.hits) == {rule}
    f = next(f for f in L.judge(rep) if f.rule == rule)
    assert f.severity == "error" and f.fix and f.path == "test:1"


@pytest.mark.parametrize("line", NEAR_MISSES)
def test_signatures_are_field_scoped(line):
    assert not analyse_bytes((line + "\n").encode()).hits


@pytest.mark.parametrize("sig", L.SIGNATURES, ids=lambda s: s.rule)
def test_signature_sources_are_real(sig, bridge_src, mcore_src):
    where, path, quote = sig.source
    if where == "external":  # third-party text (PyTorch, HF): the cited quote must be what the regex matches
        assert quote in SIGNATURE_LINES[sig.rule] and sig.compile().match(L.clean(SIGNATURE_LINES[sig.rule]))
        return
    base = bridge_src if where == "bridge" else mcore_src
    assert quote in (base / path).read_text()


def test_hf_offline_messages_match_pinned_hub_releases():
    """The three phrasings are those of transformers 5.25.0 / huggingface_hub 2.4.0 (checked when fetched)."""
    sig = next(s for s in L.SIGNATURES if s.rule == "MFSDP-LOG-HF-HUB-OFFLINE")
    rx = sig.compile()
    for line in (
        "LocalEntryNotFoundError: Cannot find the requested files in the disk cache and outgoing traffic "
        "has been disabled. To enable hf.co look-ups and downloads online, set 'local_files_only' to False.",
        "huggingface_hub.errors.OfflineModeIsEnabled: Cannot reach https://huggingface.co/api/models/x: "
        "offline mode is enabled. To disable it, please unset the `HF_HUB_OFFLINE` environment variable.",
    ):
        assert rx.match(line)


# --- the line reader -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_streaming_reassembles_lines_across_chunks(chunk, monkeypatch):
    monkeypatch.setattr(L, "CHUNK", chunk)
    data = REAL_LOG.read_bytes()
    rep = analyse_bytes(data, chunk)
    assert rep.iterations == 10 and rep.loss_summary()["last"] == pytest.approx(10.02306)


def test_overlong_line_is_cut_and_parsing_continues(monkeypatch):
    longest = max(len(line) for line in REAL_LOG.read_bytes().split(b"\n"))
    monkeypatch.setattr(L, "MAX_LINE", longest + 1)
    monkeypatch.setattr(L, "CHUNK", 256)
    data = b"x" * (5 * longest) + b"\n" + REAL_LOG.read_bytes()
    rep = analyse_bytes(data, 256)
    assert rep.cut_lines == 1 and rep.iterations == 10


def test_clean_strips_ansi_and_stacked_prefixes():
    rep = L.LogReport(source="t")
    assert L.clean("[default3]:[rank3]: \x1b[31mhello\x1b[0m", rep) == "hello"
    assert L.clean("12:  [2026-12-02 16:54:42] iteration 1/ 2 |", rep).startswith("[2026")
    assert rep.ranks_seen == {3, 12}


def test_binary_and_empty_input():
    with pytest.raises(InputError, match="empty"):
        L.judge(analyse_bytes(b""))
    with pytest.raises(InputError, match="binary"):
        L.judge(L.analyse(open(LOGS / "binary.bin", "rb")))
    with pytest.raises(InputError, match="no training log"):
        L.judge(analyse_bytes(b"hello\nworld\n"))


def test_binary_junk_inside_a_real_log_is_tolerated():
    data = REAL_LOG.read_bytes()
    cut = data.index(b"Starting training loop")
    rep = analyse_bytes(data[:cut] + b"\x00\xff\xfe\x80garbage\x00\n" + data[cut:])
    assert rep.iterations == 10 and not L.judge(rep)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_never_crash(data):
    rep = analyse_bytes(data)
    try:
        L.judge(rep)
    except InputError:
        pass


# --- real runs (the copied H200 run, plus any under tests/fixtures/gpu-run/) --------------------------------


@pytest.mark.parametrize("path", real_logs(), ids=lambda p: p.name)
def test_real_logs_parse(path):
    rep = L.analyse(open(path, "rb"), str(path))
    assert rep.is_training_log()
    if rep.iterations:
        loss = rep.loss_summary()
        assert loss["key"] is not None and loss["first_iteration"] <= loss["last_iteration"]
        assert isinstance(loss["first"], float) and math.isfinite(loss["first"])


def test_spliced_iteration_line_is_ignored_not_misread():
    """Without torchrun prefixes two ranks can write into one line; the cut iteration line must not count."""
    lines = real_iteration_lines()
    spliced = lines[4][:90] + "WARNING:megatron.core.timers:rank 0 late\n" + lines[4][90:] + "\n"
    data = ("\n".join(lines[:4]) + "\n" + spliced + "\n".join(lines[5:]) + "\n").encode()
    rep = analyse_bytes(data)
    assert rep.partial_iteration_lines == 1 and rep.iterations == 9
    assert rep.last_iteration == 10 and rep.loss_summary()["last_finite"]


def test_same_iteration_from_two_ranks_counts_once():
    lines = real_iteration_lines()
    doubled = "".join(f"[default0]:{line}\n[default1]:{line}\n" for line in lines).encode()
    rep = analyse_bytes(doubled)
    assert rep.iterations == 10 and rep.duplicate_iteration_lines == 10 and rep.restarts == 0
    assert not L.judge(rep)


# --- where a NaN started ---------------------------------------------------------------------------------------


def test_nan_names_the_first_nan_iteration_and_the_last_finite_loss():
    rep = analyse_bytes(nan_from_40_log())
    loss = rep.loss_summary()
    assert loss["first_nonfinite_iteration"] == 40 and loss["first_nonfinite_after"] == 39
    assert loss["last_finite_iteration"] == 39 and loss["last_finite_value"] == pytest.approx(10.0 - 3.9)
    found = L.judge(rep)
    f = next(f for f in found if f.rule == "MFSDP-LOG-LOSS-NOT-FINITE")
    assert "iteration 40" in f.message and "iteration 39" in f.message and "6.1" in f.message, f.message
    assert "40" in f.fix and "find the first iteration" not in f.fix, f.fix
    # the NaN counter: a sum over lines, said as such, with the number of lines it was summed over
    n = next(f for f in found if f.rule == "MFSDP-LOG-NAN-ITERATIONS")
    assert rep.nan == 231 and rep.nan_lines == 21
    assert "231" in n.message and "21 iteration lines" in n.message and "> 0" not in n.message, n.message
    assert "iteration 40" in n.message


def test_nan_from_the_first_line_has_no_last_finite_loss():
    rep = analyse_bytes(nan_from_40_log(first_nan=1, last=5))
    loss = rep.loss_summary()
    assert loss["first_nonfinite_iteration"] == 1 and loss["last_finite_iteration"] is None


def test_failure_named_in_the_message_is_in_the_failures_list():
    """A log that ends in an exception after its last iteration (no traceback header, no launcher summary):
    the finding's message names the failure, so "failures" must hold it too."""
    data = (
        real_iteration_lines()[0].encode() + b"\nRuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    rep = analyse_bytes(data)
    f = next(f for f in L.judge(rep) if f.rule == "MFSDP-LOG-RANK-FAILED")
    d = f.to_dict()
    assert d["failures"] and d["failure_count"] == len(d["failures"]) >= 1, d
    assert "illegal memory access" in d["failures"][0]["why"] and d["failures"][0]["line"] == 2
