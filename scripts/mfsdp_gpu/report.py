"""The JSON records the GPU runs write, progress lines, versions and where a failure happened.

A rehearsal writes one ``report.json`` (schema ``rehearse-run/1``, read by ``mfsdp_lib.runs.rehearse``
and the benchmarks), rewritten atomically after every phase so that a crash or a kill still leaves
everything that passed. A smoke rank writes ``rank<R>.json`` (read by ``mfsdp_lib.runs.smoke``).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
import time
import traceback

SCHEMA = "rehearse-run/1"
GIB = 2**30
# The packages whose versions every record carries.
VERSIONED = ("torch", "megatron-bridge", "megatron-core", "megatron-fsdp", "transformer-engine")


def jsonable(v):
    if isinstance(v, (str, int, bool, type(None))):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    return repr(v)


class Report:
    """The run's JSON record, rewritten atomically after every phase."""

    def __init__(self, out_dir: str, base: dict | None = None):
        self.dir = out_dir
        self.path = os.path.join(out_dir, "report.json")
        self.data: dict = {"schema": SCHEMA, "result": "running", "phases": {}, "first_failure": None}
        if base:
            self.data.update(base)
        self.phase: str | None = None
        self._t0: float | None = None

    def write(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(jsonable(self.data), fh, indent=1)
            fh.write("\n")
        os.replace(tmp, self.path)

    def begin(self, phase: str) -> None:
        self.phase = phase
        self._t0 = time.perf_counter()
        self.data["phases"][phase] = {"status": "running"}
        progress(f"{phase} ...")
        self.write()

    def end(self, phase: str | None = None, **extra) -> None:
        phase = phase or self.phase
        rec = self.data["phases"].setdefault(phase, {})
        rec["status"] = "passed"
        if self._t0 is not None and "wall_s" not in extra:
            rec["wall_s"] = round(time.perf_counter() - self._t0, 3)
        rec.update(extra)
        mem = extra.get("allocated_bytes")
        progress(
            f"{phase} passed ({rec.get('wall_s', 0):.1f} s" + (f", allocated {mem / GIB:.2f} GiB)" if mem else ")")
        )
        self.write()

    def fail(self, exc: BaseException, tb=None) -> None:
        phase = self.phase or "startup"
        frames = [(fs.filename, fs.lineno, fs.name) for fs in traceback.extract_tb(tb or exc.__traceback__)]
        rec = self.data["phases"].setdefault(phase, {})
        rec["status"] = "failed"
        if self._t0 is not None:
            rec["wall_s"] = round(time.perf_counter() - self._t0, 3)
        chain: list[str] = []
        cur = exc.__cause__ or exc.__context__
        while cur is not None and len(chain) < 4:
            chain.append(f"{type(cur).__name__}: {str(cur)[:500]}")
            cur = cur.__cause__ or cur.__context__
        self.data["first_failure"] = {
            "phase": phase,
            "step": (rec.get("current") or {}).get("iteration"),
            "sub_phase": (rec.get("current") or {}).get("phase"),
            "type": type(exc).__name__,
            "message": str(exc)[:4000],
            "frames": innermost_frames(frames),
            "caused_by": chain,
            "traceback_tail": "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))[-6000:],
        }
        self.data["result"] = "failed"
        progress(f"{phase} FAILED: {type(exc).__name__}: {str(exc)[:300]}")
        self.write()


def progress(msg: str) -> None:
    sys.stderr.write(f"[rehearse {_dt.datetime.now(_dt.timezone.utc).strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


class InputError(ValueError):
    """Bad input: one clear line, exit 2. Defined on this floor (every module of the package may import
    ``report``) so that ``args`` and ``bridge`` both raise it without importing each other."""


class Terminated(BaseException):
    """SIGTERM (a timeout): recorded as the failure of the running phase."""


def on_sigterm(signum, frame):
    raise Terminated(f"terminated by signal {signum} (timeout?)")


# Frames worth naming for a failure, innermost first in the report.
FRAME_MARKERS = {
    "bridge": "megatron/bridge/",
    "core": "megatron/core/",
    "fsdp": "megatron_fsdp/",
}


def innermost_frames(frames) -> dict:
    """From ``(filename, lineno, function)`` frames (outermost first): the innermost frame
    overall and the innermost in each of megatron/bridge, megatron/core, megatron_fsdp."""
    out = {}
    norm = [(str(f).replace("\\", "/"), ln, fn) for f, ln, fn in frames]
    if norm:
        f, ln, fn = norm[-1]
        out["innermost"] = f"{_short_path(f)}:{ln} in {fn}"
    for key, marker in FRAME_MARKERS.items():
        for f, ln, fn in reversed(norm):
            if marker in f:
                out[key] = f"{_short_path(f)}:{ln} in {fn}"
                break
    return out


def _short_path(path: str) -> str:
    for marker in ("megatron/", "megatron_fsdp/", "torch/", "transformer_engine/"):
        i = path.find(marker)
        if i >= 0:
            return path[i:]
    return os.path.basename(path)


def versions() -> dict:
    """Installed versions of the packages a GPU run depends on (None where absent)."""
    from importlib import metadata

    got: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            got[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            got[name] = None
    return got


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def scalar_or_repr(v):
    """A smoke record's value: JSON scalars as they are, anything else as its repr."""
    return v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)


def write_rank_record(out: str, rank: int, record: dict) -> None:
    """A smoke rank's ``rank<R>.json``, written atomically through a new file."""
    import tempfile

    path = os.path.join(out, f"rank{rank}.json")
    fd, tmp = tempfile.mkstemp(prefix=f".rank{rank}.", suffix=".tmp", dir=out)  # a new file: never through a link
    with os.fdopen(fd, "w") as fh:
        json.dump(record, fh, indent=1, default=str)
    os.replace(tmp, path)
