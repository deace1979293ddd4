"""Streaming judge of Megatron-Bridge / Megatron-Core training logs and pytest output.

Why: a run that "finished" is not a healthy run. The seed's smoke criteria are exactly: at least one training
iteration, a finite loss at the last one, no known failure, and (when the run was driven by pytest) the expected
pytest summary. Those answers are buried in multi-rank, coloured, carriage-return-ridden logs that can be
gigabytes long; this module reads them once, line by line, in bounded memory.

The line format is Bridge 0.6.2's ``training_log`` (``megatron/bridge/training/utils/train_utils.py``)::

     [2026-12-02 16:54:43] iteration       10/      10 | consumed samples: 80 | ... | lm loss: 1.002306E+01 |
     loss scale: 1.0 | grad norm: 2.055 | ... | number of skipped iterations:   0 | number of nan iterations:   0 |

Two facts from that code shape the parser: every loss is printed only ``if avg >= 0.0`` - so a NaN loss is
*absent* from its line rather than printed as ``nan`` - and ``number of nan iterations`` is always the last
field, which is how a complete line is told from a truncated or spliced one.

Input clean-up before matching: ANSI escapes are removed, ``\\r`` splits a line (progress bars), torchrun's
``[rank0]:`` / ``[default0]:`` prefixes and srun's ``0:`` labels are stripped, undecodable bytes become U+FFFD,
and a line longer than ``MAX_LINE`` is cut. Failure signatures are matched field-scoped: the exact message
from the source, anchored after the usual logging / exception-class prefix, never as a loose substring.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
from dataclasses import dataclass, field

from ..findings import Finding, InputError, oserror_to_input

CHUNK = 1 << 20  # read size; memory stays O(CHUNK + MAX_LINE) whatever the log size
MAX_LINE = 1 << 20  # longer "lines" (binary junk, a runaway print) are cut here
MAX_KEPT = 50  # checkpoint events / failed tests kept in the report; counts stay exact
NUL_SHARE_BINARY = 0.01  # >1% NUL bytes and nothing recognisable: call it a binary file

ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# torchrun --tee / local_ranks_filter prefixes ("[default0]:", "[rank3]:"), possibly stacked; srun --label "12: ".
RANK_PREFIX_RE = re.compile(r"^(?:\[(?:rank|default)(\d+)\]:[ ]?|(\d{1,5}): (?=\S| \[))+")

# Bridge's training_log line: " iteration {:8d}/{:8d} |" then "key: value |" fields.
ITER_RE = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
LAST_FIELD = "number of nan iterations"  # always printed last: marks a complete line
LOSS_KEY = "lm loss"  # Bridge's default loss key (training/losses.py returns {"lm loss": ...})

SAVE_START_RE = re.compile(r"^saving checkpoint at iteration\s+(\d+) to (.+?) in (\w+) format\s*$")
SAVE_DONE_RE = re.compile(r"^successfully saved (?:local )?checkpoint from iteration\s+(\d+)(?: to (\S+))?")
LOAD_START_RE = re.compile(r"^loading (?:release )?(?:distributed )?checkpoint from (\S+)(?: at iteration (\d+))?\s*$")
LOAD_DONE_RE = re.compile(r"^successfully loaded checkpoint from (\S+) \[[^\]]*\] at iteration (\d+)")
NO_LOAD_RE = re.compile(r"^will not load any checkpoints and will start from random")
TRAINING_MARKERS = (
    "> initializing torch distributed",
    "Starting training loop at iteration",
    "time to initialize megatron",
    "[after megatron is initialized]",
    "> building train, validation, and test datasets",
    "INFO:megatron.",
    "WARNING:megatron.",
    "ERROR:megatron.",
)  # line starts Megatron/Bridge print during start-up (str.startswith: fast)
EXCEPTION_RE = re.compile(r"^((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt)): (.*)$")
TRACEBACK_HEAD = "Traceback (most recent call last):"  # CPython's header of an uncaught exception's report
TRACEBACK_WINDOW = 2000  # lines within which a traceback's exception line is expected (frames, chained causes)
# torch.distributed.elastic (torch 2.x): the agent's line when a worker dies, and its end-of-run summary
# (torch/distributed/elastic/multiprocessing/api.py "failed (exitcode: ...)"; errors/__init__.py ChildFailedError).
AGENT_FAILED_RE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: \d+\) of binary")
CHILD_FAILED = "ChildFailedError"
CHILD_FIELD_RE = re.compile(r"^(rank|exitcode|traceback|error_file)\s*:\s*(.*)$")
SIGNAL_NAMES = {6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM", 7: "SIGBUS", 4: "SIGILL"}
SMOKE_RESULT_PREFIX = "SMOKE_RESULT "  # printed by the skill's smoke runner with a JSON object

PYTEST_COUNT_RE = re.compile(r"(\d+) (failed|passed|skipped|deselected|xfailed|xpassed|warnings?|errors?|rerun)\b")
PYTEST_SUMMARY_RE = re.compile(
    r"^(?:=+ )?((?:\d+ (?:failed|passed|skipped|deselected|xfailed|xpassed|warnings?|errors?|rerun)(?:, )?)+|"
    r"no tests ran) in [\d.]+s(?: \([\d:]+\))?(?: =+)?$"
)
PYTEST_FAILED_RE = re.compile(r"^(?:FAILED|ERROR) (\S+::\S+|\S+\.py)")

# What may stand before a message on its line: bracketed stamps ("[2026-..]", "[E1218 ... ProcessGroupNCCL.cpp:629]",
# "[Rank 0]"), a logging level with logger name, and an exception class name.
_PREFIX = (
    r"^(?:\[[^\]]{0,120}\]\s*)*"
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)(?::[\w.]*)?:\s*)?"
    r"(?:(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|IsEnabled)\s*:\s*)?"
)


@dataclass(frozen=True)
class Signature:
    """A known failure: the exact message (regex, field-scoped) and what to do about it.

    ``needles``: literals of which one must occur for the regex to be tried (fast rejection on huge logs);
    ``source`` is ``(where, path, exact quote)``: ``bridge`` / ``mcore`` are checked against the pinned wheels
    by the tests, ``external`` names a third-party file and version.
    """

    rule: str
    needles: tuple[str, ...]
    pattern: str
    title: str
    fix: str
    source: tuple[str, str, str]

    def compile(self) -> re.Pattern:
        return re.compile(_PREFIX + self.pattern)


SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "MFSDP-LOG-CKPT-FORMAT-ASSERT",
        ("requires the fsdp_dtensor checkpointing format",),
        r"Megatron-FSDP requires the fsdp_dtensor checkpointing format!",
        "Megatron FSDP with a checkpoint format other than fsdp_dtensor (config validation assertion)",
        "set checkpoint.ckpt_format=fsdp_dtensor; an existing torch_dist checkpoint must be converted first "
        "(run 'mfsdp.py ckpt DIR --expect fsdp_dtensor' for the command)",
        (
            "bridge",
            "megatron/bridge/training/config.py",
            "Megatron-FSDP requires the fsdp_dtensor checkpointing format!",
        ),
    ),
    Signature(
        "MFSDP-LOG-DTENSOR-NEEDS-MFSDP",
        ("fsdp_dtensor checkpoint format only supports Megatron FSDP",),
        r"fsdp_dtensor checkpoint format only supports Megatron FSDP",
        "ckpt_format=fsdp_dtensor in a run without Megatron FSDP (or with torch FSDP2)",
        "either enable Megatron FSDP (dist.use_megatron_fsdp=true ddp.use_megatron_fsdp=true "
        "dist.use_torch_fsdp2=false) or save torch_dist (checkpoint.ckpt_format=torch_dist)",
        ("bridge", "megatron/bridge/training/config.py", "fsdp_dtensor checkpoint format only supports Megatron FSDP"),
    ),
    Signature(
        "MFSDP-LOG-CKPT-FORMAT-MISMATCH",
        ("from config differs from inferred format",),
        r"Checkpoint format '([\w-]+)' from config differs from inferred format '([\w-]+)' for (.+?)\.?$",
        "checkpoint.ckpt_format disagrees with the checkpoint on disk (load-time assertion)",
        "load with checkpoint.ckpt_format set to the inferred format, or convert the checkpoint; "
        "'mfsdp.py ckpt DIR' shows both and the conversion command",
        ("bridge", "megatron/bridge/training/checkpointing.py", "from config differs from inferred format"),
    ),
    Signature(
        "MFSDP-LOG-CKPT-UNKNOWN-FORMAT",
        ("Unknown checkpoint format in ",),
        r"Unknown checkpoint format in (\S+)",
        "the iteration folder to load holds no metadata.json, .metadata or Hugging Face weights",
        "the save was incomplete or the path is wrong: run 'mfsdp.py ckpt DIR' and resume from a complete "
        "iteration (checkpoint.ckpt_step=N)",
        (
            "bridge",
            "megatron/bridge/training/checkpointing.py",
            'raise NotImplementedError(f"Unknown checkpoint format in {checkpoint_path}")',
        ),
    ),
    Signature(
        "MFSDP-LOG-HF-DIR-AS-LOAD",
        ("checkpoint.load does not support HuggingFace-format directories",),
        r"checkpoint\.load does not support HuggingFace-format directories\.",
        "a Hugging Face folder was given as checkpoint.load",
        "give it as checkpoint.pretrained_checkpoint instead (or convert it: 'mfsdp.py ckpt DIR' shows how)",
        (
            "bridge",
            "megatron/bridge/training/checkpointing.py",
            "checkpoint.load does not support HuggingFace-format directories.",
        ),
    ),
    Signature(
        "MFSDP-LOG-MFSDP-AND-FSDP2",
        ("use_torch_fsdp2",),
        r"(?:use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive\.|"
        r"Using use_megatron_fsdp and use_torch_fsdp2 at the same time is not supported\.)",
        "Megatron FSDP and torch FSDP2 both enabled",
        "keep one: for Megatron FSDP set dist.use_torch_fsdp2=false",
        (
            "bridge",
            "megatron/bridge/training/config.py",
            "use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive.",
        ),
    ),
    Signature(
        "MFSDP-LOG-CUDA-MAX-CONNECTIONS",
        ("CUDA_DEVICE_MAX_CONNECTIONS",),
        r"FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset\.",
        "CUDA_DEVICE_MAX_CONNECTIONS=1 with Megatron FSDP",
        "unset CUDA_DEVICE_MAX_CONNECTIONS (or set it > 1, e.g. 8) in the launch environment; performance "
        "recipes set it to 1 for tensor-parallel overlap, which Megatron FSDP cannot use",
        ("bridge", "megatron/bridge/training/config.py", "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset."),
    ),
    Signature(
        "MFSDP-LOG-TP-PP-DP-MAPPING",
        ("use_tp_pp_dp_mapping",),
        r"use_tp_pp_dp_mapping is not supported with Megatron FSDP",
        "dist.use_tp_pp_dp_mapping=true with Megatron FSDP",
        "set dist.use_tp_pp_dp_mapping=false",
        ("bridge", "megatron/bridge/training/config.py", "use_tp_pp_dp_mapping is not supported with Megatron FSDP"),
    ),
    Signature(
        "MFSDP-LOG-FSDP2-PG-COLLECTION",
        ("unexpected keyword argument 'pg_collection'",),
        r"(?:TypeError: )?((?:\w+\.)*\w+)\.__init__\(\) got an unexpected keyword argument 'pg_collection'",
        "a wrapper (torch FSDP2's TorchFullyShardedDataParallel, or a model layer) got Megatron-Core's pg_collection "
        "argument it does not accept: mismatched Bridge / Megatron-Core versions",
        "install the pinned pair (megatron-bridge 0.6.2 with megatron-core 0.19.2, whose _ddp_wrap passes "
        "pg_collection only to non-FSDP2 wrappers), or use Megatron FSDP instead of torch FSDP2 "
        "(dist.use_torch_fsdp2=false dist.use_megatron_fsdp=true ddp.use_megatron_fsdp=true)",
        ("mcore", "megatron/training/models/dist_utils.py", 'dp_init_kwargs["pg_collection"] = pg_collection'),
    ),
    Signature(
        "MFSDP-LOG-CUDA-OOM",
        ("out of memory",),
        r"(?:CUDA out of memory\. Tried to allocate|CUDA error: out of memory)",
        "CUDA out of memory",
        "estimate first with 'mfsdp.py memory CONFIG --gpu-mem-gib N'; then use "
        "ddp.data_parallel_sharding_strategy=optim_grads_params, a smaller train.micro_batch_size, activation "
        "recomputation (model.recompute_granularity=selective), and PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        ("external", "PyTorch c10/cuda/CUDACachingAllocator.cpp (torch 2.x)", "CUDA out of memory. Tried to allocate"),
    ),
    Signature(
        "MFSDP-LOG-NCCL-TIMEOUT",
        ("Watchdog caught collective operation timeout",),
        r"Watchdog caught collective operation timeout: (\S.*?) ran for (\d+) milliseconds",
        "a NCCL collective timed out (a rank stalled, died or desynchronised)",
        "find the first rank that failed earlier in the log (its error is the cause); for slow but healthy steps "
        "(first checkpoint save, data loading) raise dist.distributed_timeout_minutes; rerun with NCCL_DEBUG=INFO",
        (
            "external",
            "PyTorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (torch 2.x)",
            "Watchdog caught collective operation timeout: ",
        ),
    ),
    Signature(
        "MFSDP-LOG-NCCL-ERROR",
        ("NCCL",),
        r"(?:NCCL error in: |nccl(?:UnhandledCuda|System|Internal|InvalidArgument|InvalidUsage|Remote)Error: )",
        "NCCL error",
        "rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET; check every rank started and that all nodes use "
        "the same NCCL and network settings; an ncclRemoteError usually means another rank died first",
        ("external", "PyTorch torch/csrc/distributed/c10d/NCCLUtils.hpp (torch 2.x)", "NCCL error in: "),
    ),
    Signature(
        "MFSDP-LOG-NAN-CHECK",
        ("Unexpected result",),
        r"(?:Rank \d+, node \S+, device \d+, iteration #?\d+: )?Unexpected result \S+.*?"
        r"\(message='(found (?:NaN|Inf) in [^']*)'\)",
        "NaN/Inf detected by Megatron-Core's result validation (loss or gradient norm)",
        "check the data and the learning-rate warm-up; make sure bf16 is on for both model and optimizer; to "
        "localise, keep rerun_state_machine.check_for_nan_in_loss and ddp.check_for_nan_in_grad enabled",
        ("bridge", "megatron/bridge/training/losses.py", "found NaN in local forward loss calculation"),
    ),
    Signature(
        "MFSDP-LOG-DATASET-HELPERS",
        ("Failed to compile the C++ dataset helper functions",),
        r"Failed to compile the C\+\+ dataset helper functions",
        "Megatron-Core's compile_helpers() ran 'make' in megatron/core/datasets and it failed (the PyPI wheel "
        "ships helpers_cpp*.so but no Makefile)",
        "add a Makefile in site-packages/megatron/core/datasets whose target is helpers_cpp$(python3-config "
        "--extension-suffix) built from helpers.cpp with $(python3 -m pybind11 --includes); the shipped .so is "
        "already current, so make then does nothing",
        ("mcore", "megatron/core/datasets/utils.py", "Failed to compile the C++ dataset helper functions"),
    ),
    Signature(
        "MFSDP-LOG-GRAD-ACCUM-FUSION",
        ("fused_weight_gradient_mlp_cuda",),
        r"ColumnParallelLinear was called with gradient_accumulation_fusion set to True but the custom CUDA "
        r"extension fused_weight_gradient_mlp_cuda module is not found",
        "gradient_accumulation_fusion=True without APEX's fused_weight_gradient_mlp_cuda",
        "set model.gradient_accumulation_fusion=False (Bridge's performance FSDP overrides turn it on; they are "
        "not portable to an environment without APEX)",
        (
            "mcore",
            "megatron/core/tensor_parallel/layers.py",
            "ColumnParallelLinear was called with gradient_accumulation_fusion set ",
        ),
    ),
    Signature(
        "MFSDP-LOG-HF-HUB-OFFLINE",
        ("couldn't find them in the cached files", "outgoing traffic has been disabled", "offline mode is enabled"),
        r"(?:We couldn't connect to '[^']+' to load the files, and couldn't find them in the cached files\.|"
        r"Cannot find the requested files in the disk cache and outgoing traffic has been disabled|"
        r"Cannot reach \S+: offline mode is enabled\.)",
        "the recipe reads the model config from the Hugging Face hub, which is unreachable or disabled",
        "put the model's config in the HF cache on a connected machine and run with HF_HUB_OFFLINE=1, or build "
        "the model provider directly (e.g. GPTModelProvider) for a smoke test",
        (
            "external",
            "transformers 5.25.0 utils/hub.py; huggingface_hub 2.4.0 file_download.py / utils/_http.py",
            "couldn't find them in the cached files",
        ),
    ),
)


@dataclass
class SignatureHit:
    rule: str
    count: int
    first_line: int
    text: str


@dataclass
class LogReport:
    source: str
    lines: int = 0
    bytes: int = 0
    nul_bytes: int = 0
    truncated_last_line: bool = False
    cut_lines: int = 0
    ranks_seen: set = field(default_factory=set)
    iterations: int = 0
    partial_iteration_lines: int = 0
    duplicate_iteration_lines: int = 0
    first_iteration: int | None = None
    last_iteration: int | None = None
    train_iters: int | None = None
    restarts: int = 0
    losses: dict = field(default_factory=dict)  # key -> {"first": (it, v), "last": (it, v)}
    last_line_loss_keys: tuple = ()
    skipped: int = 0
    nan: int = 0  # sum of the lines' 'number of nan iterations' (Bridge restarts the counter after each line)
    nan_lines: int = 0  # iteration lines whose counter was > 0
    # The first iteration line that shows a NaN/Inf (loss left out or not finite, or the NaN counter > 0):
    # {"iteration", "after" (the line before it: the NaN began in between), "line", "last_finite": (it, v) | None}
    first_nan: dict | None = None
    saves: list = field(default_factory=list)
    saves_total: int = 0
    loads: list = field(default_factory=list)
    loads_total: int = 0
    started_from_scratch: bool = False
    pytest: dict | None = None
    pytest_failed_tests: list = field(default_factory=list)
    hits: dict = field(default_factory=dict)
    last_exception: str | None = None
    training_markers: int = 0
    smoke_result: dict | None = None
    failures: list = field(default_factory=list)  # {"rank", "why", "line"}: ranks that failed, first MAX_KEPT
    failures_total: int = 0
    recovered: int = 0  # tracebacks after which the same rank went on logging iterations
    launcher_failed: bool = False  # torchrun reported a failed child (ChildFailedError / "failed (exitcode")
    error_after_last_iteration: str | None = None  # the log ends in an error: the exception after the last iteration
    error_line: int | None = None  # the line of error_after_last_iteration
    current_rank: int | None = None  # rank prefix of the line being read (None: no prefix)
    _open_tracebacks: dict = field(default_factory=dict)  # rank -> line of its unfinished "Traceback" header
    _child: dict = field(default_factory=dict)  # the ChildFailedError summary entry being read
    _in_child_summary: bool = False

    def add_failure(self, rank, why: str, line: int) -> None:
        self.failures_total += 1
        if len(self.failures) < MAX_KEPT and not any(
            f["rank"] == rank and f["why"] == why[:400] for f in self.failures
        ):
            self.failures.append({"rank": rank, "why": why[:400], "line": line})

    # --- derived -------------------------------------------------------------------------------------
    def loss_key(self) -> str | None:
        if LOSS_KEY in self.losses:
            return LOSS_KEY
        return next(iter(self.losses), None)

    def failure_list(self) -> list:
        """The failures the report names: the ranks' own, or the launcher's / the final error when no rank's is
        known, so a finding that names a failure never sits beside an empty list."""
        if self.failures:
            return self.failures
        if self.error_after_last_iteration:
            return [{"rank": None, "why": self.error_after_last_iteration, "line": self.error_line}]
        if self.launcher_failed:
            return [{"rank": None, "why": "torchrun reported a failed child process", "line": self.error_line}]
        return []

    def nan_summary(self, key: str | None) -> dict:
        """Where the loss first went NaN/Inf, and the last finite loss before it (the last one when none)."""
        f = self.first_nan
        if f is not None:
            last = f["last_finite"]
        else:
            last = self.losses[key].get("last_finite") if key in self.losses else None
        return {
            "first_nonfinite_iteration": f["iteration"] if f else None,
            "first_nonfinite_after": f["after"] if f else None,
            "first_nonfinite_line": f["line"] if f else None,
            "last_finite_iteration": last[0] if last else None,
            "last_finite_value": _num(last[1]) if last else None,
        }

    def loss_summary(self) -> dict:
        key = self.loss_key()
        if key is None:
            return {
                "key": None,
                "first": None,
                "last": None,
                "last_finite": False,
                "last_iteration": None,
                **self.nan_summary(None),
            }
        rec = self.losses[key]
        first_it, first_v = rec["first"]
        last_it, last_v = rec["last"]
        missing_at_end = self.last_iteration is not None and key not in self.last_line_loss_keys
        finite = (not missing_at_end) and last_v is not None and math.isfinite(last_v)
        return {
            "key": key,
            "first": _num(first_v),
            "first_iteration": first_it,
            "last": None if missing_at_end else _num(last_v),
            "last_iteration": self.last_iteration if missing_at_end else last_it,
            "last_finite": finite,
            "missing_at_last_iteration": missing_at_end,
            **self.nan_summary(key),
        }

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "lines": self.lines,
            "iterations": {
                "count": self.iterations,
                "first": self.first_iteration,
                "last": self.last_iteration,
                "train_iters": self.train_iters,
                "restarts": self.restarts,
                "partial_lines": self.partial_iteration_lines,
                "duplicate_lines": self.duplicate_iteration_lines,
            },
            "loss": self.loss_summary(),
            "skipped_iterations": self.skipped,
            "nan_iterations": self.nan,
            "nan_iteration_lines": self.nan_lines,
            "checkpoints": {
                "saves": self.saves,
                "saves_total": self.saves_total,
                "loads": self.loads,
                "loads_total": self.loads_total,
                "started_from_scratch": self.started_from_scratch,
            },
            "pytest": self.pytest if self.pytest is None else {**self.pytest, "failed_tests": self.pytest_failed_tests},
            "signatures": [
                {"rule": h.rule, "count": h.count, "first_line": h.first_line, "text": h.text}
                for h in self.hits.values()
            ],
            "last_exception": self.last_exception,
            "ranks": sorted(self.ranks_seen),
            "truncated_last_line": self.truncated_last_line,
            "smoke_result": self.smoke_result,
            "failures": self.failure_list(),
            "launcher_failed": self.launcher_failed,
            "error_after_last_iteration": self.error_after_last_iteration,
        }

    def is_training_log(self) -> bool:
        return bool(
            self.iterations
            or self.partial_iteration_lines
            or self.hits
            or self.pytest
            or self.training_markers
            or self.saves_total
            or self.loads_total
            or self.failures_total
            or self.launcher_failed
        )


def _num(v):
    if v is None:
        return None
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


# ------------------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------------------


def open_log(path: str):
    """A binary file object for PATH or '-' (stdin). Raises InputError for what cannot be read as a log."""
    if path == "-":
        if sys.stdin is None:  # started with stdin closed (`<&-`, some daemons): nothing to read
            raise InputError("-: standard input is closed; pipe the log in or give the log file")
        return sys.stdin.buffer
    try:
        st = os.stat(path)
    except OSError as exc:
        raise oserror_to_input(path, exc) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: is a folder; give the log file (or '-' for stdin)")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
        raise InputError(f"{path}: is a device or socket, not a log file")
    try:
        # O_NONBLOCK so that a named pipe without a writer does not hang the open; reads are made blocking
        # again so process substitution (<(...)) streams normally.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except PermissionError:
        raise InputError(f"{path}: permission denied") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror or exc})") from None


def iter_lines(stream, report: LogReport):
    """Yield decoded lines from a binary stream in bounded memory; count bytes, NULs, cut lines."""
    buf = b""
    skipping = False  # inside an over-long line whose head was already emitted
    while True:
        try:
            chunk = stream.read(CHUNK)
        except OSError as exc:
            raise InputError(f"{report.source}: read failed ({exc.strerror or exc})") from None
        if not chunk:
            break
        report.bytes += len(chunk)
        report.nul_bytes += chunk.count(b"\0")
        buf += chunk
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            raw = buf[start:nl]
            start = nl + 1
            if skipping:
                skipping = False
                continue
            yield from _segments(raw)
        buf = buf[start:]
        if len(buf) > MAX_LINE:
            if not skipping:
                report.cut_lines += 1
                yield from _segments(buf[:MAX_LINE])
            skipping = True
            buf = b""
    if buf and not skipping:
        report.truncated_last_line = True
        yield from _segments(buf)


def _segments(raw: bytes):
    """A raw line split at carriage returns (progress-bar rewrites), decoded leniently."""
    for seg in raw.split(b"\r"):
        if seg:
            yield seg.decode("utf-8", "replace")


def clean(line: str, report: LogReport | None = None) -> str:
    """ANSI removed, rank prefixes removed (recording the rank), trailing blanks trimmed."""
    if "\x1b" in line:
        line = ANSI_RE.sub("", line)
    m = RANK_PREFIX_RE.match(line)
    if report is not None:
        report.current_rank = None
    if m:
        if report is not None:
            for r in re.findall(r"\[(?:rank|default)(\d+)\]:|^(\d{1,5}): ", m.group(0)):
                report.ranks_seen.add(int(r[0] or r[1]))
                report.current_rank = int(r[0] or r[1])
        line = line[m.end() :]
    return line.strip()


# ------------------------------------------------------------------------------------------------------------
# Judging
# ------------------------------------------------------------------------------------------------------------

_COMPILED = [(s, s.compile()) for s in SIGNATURES]
# One pass over the line finds whether any signature's needle is present; only then are the regexes tried.
# This keeps the per-line cost flat however many signatures there are (a few MB/s -> tens of MB/s).
_ANY_NEEDLE = re.compile("|".join(re.escape(n) for s in SIGNATURES for n in s.needles))


def parse_fields(rest: str) -> dict[str, str]:
    """'key: value |' fields of an iteration line (split on '|', then on the first ': ')."""
    out: dict[str, str] = {}
    for part in rest.split("|"):
        key, sep, val = part.partition(":")
        if sep:
            out[key.strip()] = val.strip()
    return out


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def analyse(stream, source: str = "-") -> LogReport:
    rep = LogReport(source=source)
    for lineno, raw in enumerate(iter_lines(stream, rep), 1):
        rep.lines = lineno
        line = clean(raw, rep)
        if not line:
            continue
        if "iteration" in line:
            m = ITER_RE.search(line)
            if m:
                _iteration(rep, m, lineno)
                continue
        _events(rep, line, lineno)
    return rep


def _iteration(rep: LogReport, m: re.Match, lineno: int = 0) -> None:
    fields = parse_fields(m.group(3))
    if LAST_FIELD not in fields:  # truncated, or spliced with another rank's output
        rep.partial_iteration_lines += 1
        return
    it, total = int(m.group(1)), int(m.group(2))
    if it == rep.last_iteration and total == rep.train_iters:
        rep.duplicate_iteration_lines += 1  # the same line printed by more than one rank: count it once
        return
    if rep.last_iteration is not None and it < rep.last_iteration:
        rep.restarts += 1  # a resumed or re-run job appended to the same log
    rep.iterations += 1
    rep.error_after_last_iteration = None
    if rep.failures and not rep.launcher_failed:
        # The rank that printed this line is alive: a traceback it printed earlier was caught and logged
        # (a retried download, say), not the end of that rank.
        kept = [f for f in rep.failures if f["rank"] != rep.current_rank]
        rep.recovered += len(rep.failures) - len(kept)
        rep.failures_total -= len(rep.failures) - len(kept)
        rep.failures = kept
    if rep.first_iteration is None:
        rep.first_iteration = it
    previous = rep.last_iteration
    main = rep.loss_key()  # the loss followed so far (lm loss), before this line adds any
    rep.last_iteration = it
    rep.train_iters = total
    keys = []
    nonfinite = False
    for key, val in fields.items():
        if key.endswith("loss") and key != "loss scale":
            v = _float(val)
            rec = rep.losses.setdefault(key, {"first": (it, v), "last": (it, v), "last_finite": None})
            rec["last"] = (it, v)
            if v is not None and math.isfinite(v):
                rec["last_finite"] = (it, v)
            else:
                nonfinite = True
            keys.append(key)
    nan_count = int(_float(fields.get(LAST_FIELD, "0")) or 0)
    # Bridge leaves a loss out of its line when the average is NaN (printed only ``if avg >= 0.0``)
    left_out = main is not None and main not in keys
    if rep.first_nan is None and (nonfinite or left_out or nan_count > 0):
        followed = main or rep.loss_key()
        before = rep.losses[followed]["last_finite"] if followed in rep.losses else None
        if before is not None and before[0] == it:  # this line's own finite value is not "before" the NaN
            before = None
        rep.first_nan = {
            "iteration": it,
            "after": previous if previous is not None and previous < it else None,
            "line": lineno,
            "last_finite": before,
        }
    rep.last_line_loss_keys = tuple(keys)
    rep.skipped += int(_float(fields.get("number of skipped iterations", "0")) or 0)
    rep.nan += nan_count
    rep.nan_lines += nan_count > 0


def _signatures(rep: LogReport, line: str, lineno: int) -> None:
    for sig, rx in _COMPILED:
        if any(n in line for n in sig.needles) and rx.match(line):
            hit = rep.hits.get(sig.rule)
            if hit is None:
                rep.hits[sig.rule] = SignatureHit(sig.rule, 1, lineno, line[:400])
            else:
                hit.count += 1


def _events(rep: LogReport, line: str, lineno: int) -> None:
    if line.startswith(TRAINING_MARKERS):
        rep.training_markers += 1
    if _ANY_NEEDLE.search(line):
        _signatures(rep, line, lineno)
    if "checkpoint" in line:
        m = SAVE_START_RE.match(line)
        if m:
            rep.saves_total += 1
            if len(rep.saves) < MAX_KEPT:
                rep.saves.append(
                    {
                        "iteration": int(m.group(1)),
                        "path": m.group(2),
                        "format": m.group(3),
                        "completed": False,
                        "line": lineno,
                    }
                )
            return
        m = SAVE_DONE_RE.match(line)
        if m:
            it = int(m.group(1))
            for s in reversed(rep.saves):
                if s["iteration"] == it and not s["completed"]:
                    s["completed"] = True
                    break
            else:
                rep.saves_total += 1
                if len(rep.saves) < MAX_KEPT:
                    rep.saves.append(
                        {"iteration": it, "path": m.group(2), "format": None, "completed": True, "line": lineno}
                    )
            return
        m = LOAD_DONE_RE.match(line)
        if m:
            for ld in reversed(rep.loads):
                if not ld["completed"]:
                    ld.update(completed=True, iteration=int(m.group(2)))
                    break
            else:
                rep.loads_total += 1
                if len(rep.loads) < MAX_KEPT:
                    rep.loads.append(
                        {"iteration": int(m.group(2)), "path": m.group(1), "completed": True, "line": lineno}
                    )
            return
        m = LOAD_START_RE.match(line)
        if m:
            rep.loads_total += 1
            if len(rep.loads) < MAX_KEPT:
                rep.loads.append(
                    {
                        "iteration": int(m.group(2)) if m.group(2) else None,
                        "path": m.group(1),
                        "completed": False,
                        "line": lineno,
                    }
                )
            return
    if NO_LOAD_RE.match(line):
        rep.started_from_scratch = True
        return
    if " in " in line and (
        "passed" in line or "failed" in line or "error" in line or "no tests ran" in line or "skipped" in line
    ):
        m = PYTEST_SUMMARY_RE.match(line)
        if m:
            counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
            for n, word in PYTEST_COUNT_RE.findall(m.group(1)):
                word = {"error": "errors", "warning": "warnings"}.get(word, word)
                counts[word] = counts.get(word, 0) + int(n)
            rep.pytest = {"summary": line.strip("= "), "line": lineno, **counts}
            return
    if line.startswith(("FAILED ", "ERROR ")):
        m = PYTEST_FAILED_RE.match(line)
        if m and len(rep.pytest_failed_tests) < MAX_KEPT:
            rep.pytest_failed_tests.append(m.group(1))
    if line.startswith(SMOKE_RESULT_PREFIX):
        try:
            obj = json.loads(line[len(SMOKE_RESULT_PREFIX) :])
            if isinstance(obj, dict):
                rep.smoke_result = obj
        except (ValueError, RecursionError):  # RecursionError: nested too deep for json
            pass
        return
    _failures(rep, line, lineno)


def _failures(rep: LogReport, line: str, lineno: int) -> None:
    """Which rank failed and why: uncaught tracebacks, torchrun's failed children, an error at the end."""
    rank = rep.current_rank
    if line == TRACEBACK_HEAD:
        rep._open_tracebacks[rank] = lineno
        return
    if "exitcode" in line:
        m = AGENT_FAILED_RE.search(line)
        if m:
            rep.launcher_failed = True
            rep.add_failure(int(m.group(2)), f"local rank {m.group(2)} {_exit_words(int(m.group(1)))}", lineno)
            return
    if CHILD_FAILED in line and line.rstrip(": ").endswith(CHILD_FAILED):
        rep.launcher_failed = True
        rep._in_child_summary = True
        rep._child = {}
        rep.last_exception = line[:400]
        rep.error_after_last_iteration = line[:400]
        rep.error_line = lineno
        return
    if rep._in_child_summary:
        m = CHILD_FIELD_RE.match(line)
        if m:
            key, val = m.group(1), m.group(2).strip()
            rep._child[key] = val
            if key == "traceback" or (key == "error_file" and "exitcode" in rep._child):
                _flush_child(rep, lineno)
            return
        if line.startswith("=") and rep._child:
            _flush_child(rep, lineno)
    m = EXCEPTION_RE.match(line) if ("Error: " in line or "Exception: " in line or "Interrupt: " in line) else None
    if m:
        rep.last_exception = line[:400]
        rep.error_after_last_iteration = line[:400]
        rep.error_line = lineno
        start = rep._open_tracebacks.pop(rank, None)
        if start is not None and lineno - start <= TRACEBACK_WINDOW:
            rep.add_failure(rank, line, lineno)


def _flush_child(rep: LogReport, lineno: int) -> None:
    child, rep._child = rep._child, {}
    code = child.get("exitcode", "")
    m = re.match(r"(-?\d+)", code)
    why = _exit_words(int(m.group(1))) if m else f"failed (exitcode {code or '?'})"
    tb = child.get("traceback", "")
    if tb and not tb.startswith(("<N/A>", "To enable traceback")):
        why += f": {tb}"
    r = re.match(r"(\d+)", child.get("rank", ""))
    rep.add_failure(int(r.group(1)) if r else None, f"rank {r.group(1) if r else '?'} {why}", lineno)


def _exit_words(code: int) -> str:
    """torchrun's exit code in words: negative codes are the signal that killed the process."""
    if code < 0:
        name = SIGNAL_NAMES.get(-code, f"signal {-code}")
        extra = " (the kernel's out-of-memory killer or the scheduler, most often)" if -code == 9 else ""
        return f"was killed by {name}{extra} (exitcode {code})"
    return f"exited with code {code}"


def judge(rep: LogReport) -> list[Finding]:
    """Findings for the smoke criteria; raises InputError when the input holds no training log at all."""
    if rep.bytes == 0:
        raise InputError(f"{rep.source}: empty input, no training log")
    if not rep.is_training_log():
        if rep.nul_bytes > NUL_SHARE_BINARY * rep.bytes:
            raise InputError(f"{rep.source}: binary data ({rep.nul_bytes} NUL bytes), not a training log")
        raise InputError(
            f"{rep.source}: no training log found (no 'iteration N/ M |' lines, no Megatron/Bridge "
            "start-up lines, no pytest summary, no known failure)"
        )
    src = rep.source
    findings: list[Finding] = []
    for hit in rep.hits.values():
        sig = next(s for s in SIGNATURES if s.rule == hit.rule)
        findings.append(
            Finding(
                sig.rule,
                "error",
                f"{src}:{hit.first_line}",
                f"{sig.title}: {hit.text}" + (f" (x{hit.count})" if hit.count > 1 else ""),
                sig.fix,
                {"count": hit.count, "line": hit.first_line, "source": f"{sig.source[1]}"},
            )
        )
    if rep.failures_total or rep.launcher_failed or rep.error_after_last_iteration:
        findings.append(_failure_finding(rep))
    if rep.iterations == 0:
        tail = f"; last exception: {rep.last_exception}" if rep.last_exception else ""
        findings.append(
            Finding(
                "MFSDP-LOG-NO-ITERATIONS",
                "error",
                src,
                f"no complete training iteration line ('iteration N/ M | ... | number of nan iterations: K |'){tail}",
                "the run stopped before the first logged iteration: fix the first error above, and check "
                "logger.log_interval (lines are printed every log_interval iterations)",
            )
        )
    else:
        loss = rep.loss_summary()
        if loss["key"] is None:
            findings.append(
                Finding(
                    "MFSDP-LOG-NO-LOSS",
                    "error",
                    src,
                    "iteration lines carry no loss field ('lm loss: ...'); Bridge leaves a loss out when it is NaN",
                    "look for NaN earlier in the run (number of nan iterations) and check the loss function's keys",
                )
            )
        elif not loss["last_finite"]:
            if loss.get("missing_at_last_iteration"):
                msg = (
                    f"the last iteration ({rep.last_iteration}) has no '{loss['key']}' field: Bridge prints a "
                    "loss only when its average is >= 0, so it was NaN"
                )
            else:
                msg = f"the last '{loss['key']}' (iteration {loss['last_iteration']}) is {loss['last']}, not finite"
            where, window = _first_nan_words(loss)
            findings.append(
                Finding(
                    "MFSDP-LOG-LOSS-NOT-FINITE",
                    "error",
                    src,
                    msg + (f"; {where}" if where else ""),
                    (
                        f"look at {window}, where it started: "
                        if window
                        else "find the first iteration whose loss went NaN/Inf: "
                    )
                    + "lower the learning rate or lengthen warm-up, check the batches there, keep bf16 for model "
                    "and optimizer",
                    {k: v for k, v in loss.items() if k.startswith(("first_nonfinite", "last_finite_"))},
                )
            )
        if rep.nan:
            first = rep.first_nan
            findings.append(
                Finding(
                    "MFSDP-LOG-NAN-ITERATIONS",
                    "warning",
                    src,
                    f"Bridge counted {rep.nan} NaN iteration(s): the 'number of nan iterations' field summed over "
                    f"the {rep.nan_lines} iteration lines where it was not 0 (each line counts the iterations since "
                    "the line before)" + (f"; the first NaN shows at iteration {first['iteration']}" if first else ""),
                    "inspect the iterations around the first NaN; enable rerun_state_machine.check_for_nan_in_loss",
                    {"nan_iterations": rep.nan, "lines": rep.nan_lines},
                )
            )
        if rep.skipped:
            findings.append(
                Finding(
                    "MFSDP-LOG-SKIPPED-ITERATIONS",
                    "warning",
                    src,
                    f"{rep.skipped} iteration(s) were skipped (optimizer step not taken: overflow or NaN gradients)",
                    "a few early skips are normal with fp16 loss scaling; with bf16 they point at bad gradients",
                )
            )
        if (
            rep.train_iters
            and rep.last_iteration is not None
            and rep.last_iteration < rep.train_iters
            and not rep.hits
            and not rep.failures_total
            and not rep.launcher_failed
            and not rep.error_after_last_iteration
        ):
            findings.append(
                Finding(
                    "MFSDP-LOG-INCOMPLETE-RUN",
                    "warning",
                    src,
                    f"the last iteration logged is {rep.last_iteration} of train.train_iters={rep.train_iters}: "
                    "the run is still going, was stopped, or died without a known error",
                    "check the end of the log (and the scheduler's job record) for why it stopped",
                )
            )
        if rep.restarts:
            findings.append(
                Finding(
                    "MFSDP-LOG-RESTARTS",
                    "info",
                    src,
                    f"iteration numbers went backwards {rep.restarts} time(s): several runs are in this log",
                    "judge each run separately if the earlier one matters",
                )
            )
    if rep.pytest is not None:
        p = rep.pytest
        if p.get("failed") or p.get("errors") or not p.get("passed"):
            failed = f" ({', '.join(rep.pytest_failed_tests[:5])})" if rep.pytest_failed_tests else ""
            findings.append(
                Finding(
                    "MFSDP-LOG-PYTEST-FAILED",
                    "error",
                    f"{src}:{p['line']}",
                    f"pytest summary is '{p['summary']}'{failed}; the smoke test expects passes and no failures",
                    "read the failing test's output above the summary",
                )
            )
    if rep.truncated_last_line or rep.partial_iteration_lines:
        findings.append(
            Finding(
                "MFSDP-LOG-TRUNCATED",
                "warning",
                src,
                ("the log ends without a newline (still being written, or cut)" if rep.truncated_last_line else "")
                + ("; " if rep.truncated_last_line and rep.partial_iteration_lines else "")
                + (
                    f"{rep.partial_iteration_lines} incomplete iteration line(s) ignored"
                    if rep.partial_iteration_lines
                    else ""
                ),
                "judge the log again once the run has finished",
            )
        )
    if rep.started_from_scratch and rep.loads_total == 0:
        findings.append(
            Finding(
                "MFSDP-LOG-NO-CHECKPOINT-LOADED",
                "info",
                src,
                "the run found no checkpoint to load and started from random initialisation",
                "if a resume was intended, check checkpoint.load and the tracker with 'mfsdp.py ckpt DIR'",
            )
        )
    return findings


def _first_nan_words(loss: dict) -> tuple[str, str]:
    """("it first shows at iteration 40 ...; the last finite lm loss was 6.1 at iteration 39", "iterations 40-40")."""
    it = loss.get("first_nonfinite_iteration")
    if it is None:
        return "", ""
    after = loss.get("first_nonfinite_after")
    key = loss.get("key") or "loss"
    words = f"the first NaN/Inf shows at iteration {it}"
    if after is not None and after < it - 1:
        words += f" (it began in iterations {after + 1}-{it}: one line per logger.log_interval)"
        window = f"iterations {after + 1}-{it}"
    else:
        window = f"iteration {it}"
    if loss.get("last_finite_iteration") is not None:
        words += f"; the last finite {key} was {loss['last_finite_value']} at iteration {loss['last_finite_iteration']}"
    else:
        words += f"; no finite {key} was logged before it"
    return words, window


def _failure_finding(rep: LogReport) -> Finding:
    """One error naming the first failed rank and why; the others are counted (and listed in the JSON)."""
    first = rep.failures[0] if rep.failures else None
    if first is not None:
        who = "the launcher" if first["rank"] is None else f"rank {first['rank']}"
        msg = f"{who} failed at line {first['line']}: {first['why']}"
        others = sorted({str(f["rank"]) for f in rep.failures[1:] if f["rank"] != first["rank"]})
        if others:
            msg += f"; also failed: rank(s) {', '.join(others[:8])}"
    elif rep.launcher_failed:
        msg = "torchrun reported a failed child process (ChildFailedError)"
    else:
        msg = f"the log ends in an error after the last iteration: {rep.error_after_last_iteration}"
    if rep.launcher_failed and first is not None:
        msg += "; torchrun reported the job as failed"
    if rep.iterations and rep.train_iters:
        msg += f" (after iteration {rep.last_iteration} of {rep.train_iters})"
    return Finding(
        "MFSDP-LOG-RANK-FAILED",
        "error",
        f"{rep.source}:{first['line']}" if first else rep.source,
        msg,
        "a run with a failed rank is a failed run, however healthy the other ranks look: read that rank's "
        "traceback (the first failure is usually the cause; a killed rank with no traceback was most often "
        "out of host memory or stopped by the scheduler)",
        {
            "failures": rep.failure_list(),
            "failure_count": max(rep.failures_total, len(rep.failure_list())),
            "launcher_failed": rep.launcher_failed,
        },
    )
