"""Reading checkpoint folders from their metadata only: never tensors, never torch, never unpickling.

Why this exists: the commonest Megatron FSDP checkpoint failures are format mix-ups. A recipe that still
saves ``torch_dist``, an ``fsdp_dtensor`` checkpoint loaded into a run without Megatron FSDP, a tracker that
points at an iteration that was never written. Bridge only finds out at load time, after the job has queued
and started on many GPUs. Everything needed to tell these apart sits in a few small files, so this module
reads those and nothing else; it stays fast on a multi-terabyte checkpoint.

How Bridge 0.6.2 itself decides (``megatron/bridge/training/checkpointing.py`` and
``megatron/bridge/training/utils/checkpoint_utils.py``), mirrored here:

* A checkpoint *root* holds ``latest_train_state.pt`` (Bridge's tracker, read first) or Megatron-LM's
  ``latest_checkpointed_iteration.txt`` (an integer or ``release``), and ``iter_%07d`` folders.
* A folder is an *iteration folder* when it holds any of ``run_config.yaml``, ``train_state.pt``,
  ``metadata.json`` or ``.metadata`` (``_ITERATION_DIR_MARKERS``).
* Its format (``_get_checkpoint_format``): ``metadata.json`` that Megatron-Core accepts means
  ``torch_dist`` (its ``sharded_backend`` names the backend); else a PyTorch DCP ``.metadata`` means
  ``fsdp_dtensor``; else ``config.json`` plus Hugging Face weights means ``hf``; anything else raises
  ``NotImplementedError: Unknown checkpoint format``. We also recognise Megatron-LM's legacy ``torch``
  layout (``mp_rank_XX/model_optim_rng.pt``) so we can say what to do with it.
* When loading from a root, Bridge asserts that ``checkpoint.ckpt_format`` equals the format found on
  disk ("Checkpoint format '...' from config differs from inferred format '...'"); config validation asserts
  Megatron FSDP saves ``fsdp_dtensor`` and that ``fsdp_dtensor`` is only used with Megatron FSDP.

Pickles are never executed. ``train_state.pt`` is a torch zip archive and DCP's ``.metadata`` is a bare
pickle; both can run arbitrary code if unpickled. ``pickle_reader.read_pickle_tree`` instead walks the opcode stream with
``pickletools.genops`` and rebuilds plain data with inert placeholders for globals and calls: nothing is
imported or called. The numbers Bridge stores as one-element tensors (``step`` and friends) are read as raw
little-endian bytes from the archive member the pickle names. torch's own reader is used only with
``--trust-pickle`` and only if torch is installed.

The readers live in ``checkpoint_files`` (one per small file) and ``pickle_reader``
(the no-unpickle pickle walker); this module classifies folders and judges them.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
from dataclasses import dataclass, field

from ..findings import Finding, InputError, oserror_to_input
from ..shell import mfsdp_command
from . import migration
from .checkpoint_files import (
    DCP_METADATA,
    DCP_SHARD_RE,
    FSDP_DTENSOR_MODEL_KEY_PREFIX,
    HF_CONFIG,
    HF_EXPORT_SUBDIR,
    HF_WEIGHT_FILES,
    HF_WEIGHT_RES,
    ITER_DIR_RE,
    ITERATION_MARKERS,
    LEGACY_COMMON,
    LEGACY_MODEL_FILE,
    LEGACY_RANK_DIR_RE,
    MAX_ITER_SCAN,
    MAX_LISTED,
    MCORE_COMMON_STATE_KEY,
    MCORE_DIST_CONFIG,
    MCORE_DIST_CONFIG_TEXT,
    MCORE_MODEL_KEY_GROUPS,
    RELEASE_DIR,
    RUN_CONFIG,
    TRACKER_TRAIN_STATE,
    TRACKER_TXT,
    TRAIN_STATE,
    UNSAFE_PICKLE_TEXT,
    _read_small,
    read_dcp_metadata,
    read_run_config,
    read_tracker_txt,
    read_train_state,
    summarize_run_config,
)

# A .metadata the opcode walk refused (too large, too many opcodes): an error until --trust-pickle's torch read
# accepts it (cli/ckpt.py), since Bridge unpickles it on every rank and nothing here saw what it imports.
UNCHECKED_RULE = "MFSDP-CKPT-METADATA-UNCHECKED"

# ----------------------------------------------------------------------------------------------------------
# Folders
# ----------------------------------------------------------------------------------------------------------


@dataclass
class IterationInfo:
    path: str
    iteration: int | None
    format: str | None = None  # one of FORMATS, or None when nothing recognisable is there
    entries: list[str] = field(default_factory=list)
    backend: str | None = None  # metadata.json sharded_backend
    payload: bool = False
    shard_files: list[str] = field(default_factory=list)
    missing_shards: list[str] = field(default_factory=list)
    short_shards: list[str] = field(default_factory=list)
    dcp: dict | None = None
    run_config: dict | None = None
    train_state: dict | None = None
    problems: list[str] = field(default_factory=list)
    has_hf_export: bool = False
    dcp_problems: list[str] = field(default_factory=list)  # .metadata damaged/empty/not DCP: the load would fail
    unsafe: list[str] = field(default_factory=list)  # code a pickle would run when loaded ("file: module.name")
    outside_shards: list[str] = field(default_factory=list)  # shard paths leaving the folder
    unchecked: str | None = None  # why .metadata was not walked in full (its content was not checked for code)
    # A torch_dist save without the metadata.json Megatron-Core writes last (interrupted, or copied without it):
    # the evidence that it is torch_dist all the same. Empty for every complete save.
    incomplete: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d: dict[str, object] = {
            "path": self.path,
            "iteration": self.iteration,
            "format": self.format,
            "payload": self.payload,
        }
        if self.backend:
            d["sharded_backend"] = self.backend
        if self.shard_files:
            d["shard_files"] = len(self.shard_files)
        if self.missing_shards:
            d["missing_shards"] = self.missing_shards[:MAX_LISTED]
            d["missing_shard_count"] = len(self.missing_shards)
        if self.short_shards:
            d["short_shards"] = self.short_shards[:MAX_LISTED]
        if self.dcp is not None:
            d["dcp_metadata"] = {k: v for k, v in self.dcp.items() if k != "files"}
        if self.train_state is not None:
            d["train_state"] = self.train_state
        if self.has_hf_export:
            d["hf_export"] = True
        if self.problems:
            d["problems"] = self.problems
        if self.incomplete:
            d["incomplete_save"] = {"missing": MCORE_DIST_CONFIG, "evidence": self.incomplete}
        for key in ("dcp_problems", "unsafe", "outside_shards"):
            if getattr(self, key):
                d[key] = getattr(self, key)
        return d


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        raise oserror_to_input(path, exc, "cannot list the folder") from None


def _isdir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


def _isfile(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def is_hf_dir(path: str, entries: list[str]) -> bool:
    """Bridge's ``is_hf_checkpoint_dir``: config.json plus a known weight file or shard."""
    if HF_CONFIG not in entries:
        return False
    return any(n in entries for n in HF_WEIGHT_FILES) or any(r.match(n) for n in entries for r in HF_WEIGHT_RES)


def inspect_iteration(path: str, iteration: int | None, deep: bool = True) -> IterationInfo:
    """Detect one iteration folder's format the way Bridge does; with ``deep`` read its metadata too."""
    info = IterationInfo(path=path, iteration=iteration)
    entries = _listdir(path)
    info.entries = entries
    shards = [n for n in entries if DCP_SHARD_RE.match(n)]
    info.shard_files = shards
    info.has_hf_export = _isdir(os.path.join(path, HF_EXPORT_SUBDIR))
    if MCORE_DIST_CONFIG in entries:
        cfg_path = os.path.join(path, MCORE_DIST_CONFIG)
        try:
            meta = json.loads(_read_small(cfg_path, 1 << 20).decode("utf-8", "replace"))
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep for json
            meta = None
            info.problems.append(f"{MCORE_DIST_CONFIG} unreadable ({exc}); Megatron-Core will fail to load it")
        backend = meta.get("sharded_backend") if isinstance(meta, dict) else None
        if isinstance(backend, str):
            info.backend = backend
            info.format = "torch_dist" if backend == "torch_dist" else ("zarr" if backend == "zarr" else backend)
        elif meta is not None:
            info.problems.append(f"{MCORE_DIST_CONFIG} has no 'sharded_backend'")
        if info.format is None:
            info.format = "torch_dist"  # Bridge tries dist_checkpointing first and fails there
        if info.format == "torch_dist":
            info.payload = DCP_METADATA in entries and bool(shards)
        else:  # zarr and other old backends keep one folder per tensor
            info.payload = any(_isdir(os.path.join(path, n)) for n in entries if n != HF_EXPORT_SUBDIR)
    elif DCP_METADATA in entries:
        info.format = "fsdp_dtensor"  # Bridge: "Assume fsdp_dtensor for PyTorch DCP format"
        info.payload = bool(shards)
    elif is_hf_dir(path, entries):
        info.format = "hf"
        info.payload = True
    else:
        legacy = [n for n in entries if LEGACY_RANK_DIR_RE.match(n) and _isdir(os.path.join(path, n))]
        if legacy:
            info.format = "torch"
            info.payload = any(_isfile(os.path.join(path, n, LEGACY_MODEL_FILE)) for n in legacy)
            info.shard_files = legacy
    if deep:
        _read_iteration_metadata(info)
    if info.format == "fsdp_dtensor":
        _torch_dist_without_marker(info)
    return info


def _torch_dist_without_marker(info: IterationInfo) -> None:
    """A DCP folder without ``metadata.json`` is fsdp_dtensor to Bridge; say torch_dist when everything else is.

    Bridge (``_get_checkpoint_format``) calls any folder with a DCP ``.metadata`` and no Megatron-Core
    ``metadata.json`` fsdp_dtensor. But a torch_dist save writes ``metadata.json`` last
    (``dist_checkpointing/serialization.py :: save``: shards and ``.metadata`` first, then ``save_config``), so an
    interrupted save, or a copy that drops files of that name, leaves a torch_dist folder Bridge misnames. The
    other evidence still tells: the legacy ``common.pt``, Megatron-Core's ``common_state`` object, model tensors
    named as Megatron-Core names them (``decoder.``, ``embedding.``) rather than under Bridge's fsdp_dtensor
    ``model.`` prefix, and the run config's recorded format as support. The tensor names outvote the run config
    (a run that recorded torch_dist but saved ``model.`` keys is a mismatch, reported as such).
    """
    torch_dist: list[str] = []
    entries = set(info.entries)
    if LEGACY_COMMON in entries:
        torch_dist.append(
            f"{LEGACY_COMMON} (Megatron-Core's torch_dist common state; fsdp_dtensor saves never write it)"
        )
    dcp = info.dcp or {}
    if dcp.get("common_state"):
        torch_dist.append(f"the {MCORE_COMMON_STATE_KEY!r} entry Megatron-Core's torch_dist save writes")
    groups = set(dcp.get("key_groups") or ())
    dtensor_names = any(g.split(".")[0] == FSDP_DTENSOR_MODEL_KEY_PREFIX for g in groups)
    mcore_names = sorted(g for g in groups if g in MCORE_MODEL_KEY_GROUPS)
    if mcore_names and not dtensor_names:
        torch_dist.append(
            f"model tensors named {', '.join(g + '.*' for g in mcore_names)} (torch_dist's names; fsdp_dtensor's "
            f"start with {FSDP_DTENSOR_MODEL_KEY_PREFIX}.)"
        )
    if not torch_dist or dtensor_names:
        return
    recorded = summarize_run_config(info.run_config).get("checkpoint.ckpt_format") if info.run_config else None
    if recorded == "torch_dist":
        torch_dist.append(f"{RUN_CONFIG} records checkpoint.ckpt_format=torch_dist")
    info.format = "torch_dist"
    info.incomplete = torch_dist


def _read_iteration_metadata(info: IterationInfo) -> None:
    entries = set(info.entries)
    if RUN_CONFIG in entries:
        cfg, err = read_run_config(os.path.join(info.path, RUN_CONFIG))
        if err:
            info.problems.append(f"{RUN_CONFIG}: {err}")
        info.run_config = cfg
    if TRAIN_STATE in entries:
        ts, err = read_train_state(os.path.join(info.path, TRAIN_STATE))
        if err and UNSAFE_PICKLE_TEXT in err:
            info.unsafe.append(f"{TRAIN_STATE}: {err}")
        elif err:
            info.problems.append(f"{TRAIN_STATE}: {err}")
        info.train_state = ts
    if DCP_METADATA in entries and info.format in ("fsdp_dtensor", "torch_dist"):
        dcp, err = read_dcp_metadata(os.path.join(info.path, DCP_METADATA))
        if err:
            info.dcp_problems.append(f"{DCP_METADATA} {err}")
        if dcp and dcp.get("unsafe"):
            info.unsafe.append(f"{DCP_METADATA} names {', '.join(dcp['unsafe'][:4])}")
            dcp = None
        info.dcp = dcp
        if dcp:
            info.outside_shards = list(dcp.get("outside") or [])
            info.unchecked = dcp.get("unchecked") or None
            for rel, need in dcp["files"].items():
                p = os.path.join(info.path, rel)
                try:
                    have = os.stat(p).st_size
                except OSError:
                    info.missing_shards.append(rel)
                    continue
                if have < need:
                    info.short_shards.append(f"{rel} ({have} of {need} bytes)")
            if dcp["files"] and len(info.missing_shards) == len(dcp["files"]):
                info.payload = False
            if not dcp["files"] and info.outside_shards:
                info.payload = False


@dataclass
class CheckpointReport:
    path: str
    kind: str  # "root" or "iteration"
    format: str | None
    iterations: list[int | str]
    latest: int | str | None
    tracker: dict
    inspected: IterationInfo | None
    others: list[IterationInfo]
    config: dict
    findings: list[Finding]

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "kind": self.kind,
            "format": self.format,
            "iterations": self.iterations,
            "latest": self.latest,
            "tracker": self.tracker,
            "config": self.config,
            "inspected": self.inspected.to_dict() if self.inspected else None,
            "other_iterations": [o.to_dict() for o in self.others],
        }


def _classify(path: str, entries: list[str]) -> str | None:
    if any(m in entries for m in ITERATION_MARKERS):
        return "iteration"
    if TRACKER_TRAIN_STATE in entries or TRACKER_TXT in entries:
        return "root"
    iter_like = [n for n in entries if ITER_DIR_RE.match(n) or n == RELEASE_DIR]
    if any(_isdir(os.path.join(path, n)) for n in iter_like):
        return "root"
    if is_hf_dir(path, entries):
        return "iteration"
    if any(LEGACY_RANK_DIR_RE.match(n) for n in entries):
        return "iteration"
    return None


def _resolve_path(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise oserror_to_input(path, exc) from None
    if not stat.S_ISDIR(st.st_mode):
        base = os.path.basename(os.path.normpath(path))
        hint = ""
        if base in ITERATION_MARKERS or base in (TRACKER_TXT, TRACKER_TRAIN_STATE) or DCP_SHARD_RE.match(base):
            hint = f"; give its folder instead: {os.path.dirname(os.path.abspath(path))}"
        raise InputError(f"{path}: is a file, not a checkpoint folder{hint}")
    return path


def inspect(path: str, expect: str | None = None) -> CheckpointReport:
    """Inspect a checkpoint root or one iteration folder and judge it. Raises InputError when unusable."""
    _resolve_path(path)
    entries = _listdir(path)
    kind = _classify(path, entries)
    if kind is None:
        shown = ", ".join(entries[:8]) + (" ..." if len(entries) > 8 else "") if entries else "nothing"
        raise InputError(
            f"{path}: not a checkpoint (no {TRACKER_TRAIN_STATE}, {TRACKER_TXT}, iter_NNNNNNN/, "
            f"{RUN_CONFIG}, {MCORE_DIST_CONFIG}, {DCP_METADATA}, Hugging Face config.json+weights or "
            f"mp_rank_XX/; found: {shown})"
        )
    findings: list[Finding] = []
    tracker: dict = {}
    others: list[IterationInfo] = []
    iterations: list[int | str] = []
    latest: int | str | None = None
    inspected: IterationInfo | None = None
    if kind == "iteration":
        m = ITER_DIR_RE.match(os.path.basename(os.path.normpath(path)))
        inspected = inspect_iteration(path, int(m.group(1)) if m else None)
        if inspected.iteration is None and inspected.train_state and isinstance(inspected.train_state.get("step"), int):
            inspected.iteration = inspected.train_state["step"]
        if inspected.iteration is not None:
            iterations = [inspected.iteration]
            latest = inspected.iteration
    else:
        # Every iteration folder is listed (names only: cheap), so the newest and the tracked one are never
        # missed however many there are; only the newest MAX_ITER_SCAN are opened below.
        iter_dirs: dict[int | str, str] = {}
        for n in entries:
            m = ITER_DIR_RE.match(n)
            full = os.path.join(path, n)
            if (m or n == RELEASE_DIR) and _isdir(full):
                iter_dirs[int(m.group(1)) if m else RELEASE_DIR] = full
        iterations = sorted(iter_dirs, key=lambda k: (isinstance(k, str), k if isinstance(k, int) else 0))
        tracker, tracked = _read_trackers(path, entries, findings)
        if not tracker:
            ints = [i for i in iterations if isinstance(i, int)]
            newest = max(ints) if ints else None
            findings.append(
                Finding(
                    "MFSDP-CKPT-NO-TRACKER",
                    "error",
                    path,
                    f"no {TRACKER_TRAIN_STATE} or {TRACKER_TXT}: loading this root, Bridge finds no iteration, prints "
                    "'could not find the metadata file' and starts from random initialisation",
                    (
                        f"point checkpoint.load at {os.path.join(path, _iter_name(newest))} (an iteration folder loads "
                        f"directly), or set checkpoint.ckpt_step={newest}"
                        if newest is not None
                        else "point checkpoint.load at an iteration folder"
                    )
                    + "; checkpoint.exit_on_missing_checkpoint=true makes a missing checkpoint fatal instead of silent",
                )
            )
        if tracked is not None and tracked not in iter_dirs:
            name = "release" if tracked == RELEASE_DIR else f"iter_{tracked:07d}"
            have = [i for i in iterations if isinstance(i, int)]
            newest = max(have) if have else None
            if newest is not None:
                fix = (
                    f"resume from iter_{newest:07d}: set checkpoint.ckpt_step={newest}, or make the tracker "
                    f"point there (cp {_q(path, _iter_name(newest), TRAIN_STATE)} {_q(path, TRACKER_TRAIN_STATE)}; "
                    f"echo {newest} > {_q(path, TRACKER_TXT)})"
                )
            else:
                fix = "no iteration folder exists: the save never completed; re-run the save or load another checkpoint"
            findings.append(
                Finding(
                    "MFSDP-CKPT-TRACKER-MISSING",
                    "error",
                    os.path.join(path, name),
                    f"the tracker points at {name}, which does not exist (present: "
                    f"{', '.join(_iter_name(i) for i in iterations) or 'none'}); Bridge would fail to load",
                    fix,
                    {"tracked": tracked, "present": iterations},
                )
            )
        latest = tracked if tracked in iter_dirs else None
        if latest is None and iterations:
            ints = [i for i in iterations if isinstance(i, int)]
            latest = max(ints) if ints else iterations[-1]
        newest_first = sorted(
            iterations, key=lambda k: (k == latest, isinstance(k, int), k if isinstance(k, int) else 0)
        )
        opened = set(newest_first[-MAX_ITER_SCAN:])
        for key in iterations:
            if key not in opened:
                continue
            full = iter_dirs[key]
            deep = key == latest
            try:
                info = inspect_iteration(full, key if isinstance(key, int) else None, deep=deep)
            except InputError as exc:  # one unreadable iteration must not hide the others
                info = IterationInfo(path=full, iteration=key if isinstance(key, int) else None)
                info.problems.append(str(exc))
            if deep:
                inspected = info
            else:
                others.append(info)
    if inspected is None:
        findings.append(
            Finding(
                "MFSDP-CKPT-NO-ITERATION",
                "error",
                path,
                "the checkpoint root has no iteration folder (iter_NNNNNNN/ or release/)",
                "the save did not complete; check the training log for the save and re-run it",
            )
        )
    usable = [o.iteration for o in others if o.payload and not o.incomplete and o.iteration is not None]
    fallback = max(usable) if usable else None
    for info in ([inspected] if inspected else []) + others:
        _judge_iteration(info, findings, fallback if info is inspected else None)
    cfg_summary = summarize_run_config(inspected.run_config) if inspected and inspected.run_config else {}
    fmt = inspected.format if inspected else None
    if inspected is not None and not inspected.incomplete:  # an incomplete save has its own finding
        _judge_config(inspected, cfg_summary, findings)
        _conversion_findings(inspected, cfg_summary, expect, findings)
    return CheckpointReport(
        path=path,
        kind=kind,
        format=fmt,
        iterations=iterations,
        latest=latest,
        tracker=tracker,
        inspected=inspected,
        others=others,
        config=cfg_summary,
        findings=findings,
    )


def _unloadable(info: IterationInfo) -> bool:
    """True when the iteration's metadata is damaged, unsafe or names files outside it: no load or conversion
    of it can succeed (or should be tried), so no conversion is offered."""
    return bool(info.dcp_problems or info.unsafe or info.outside_shards or info.incomplete)


def _q(*parts: str) -> str:
    """A path in a printed shell command: joined and quoted, so a folder with a space stays one word."""
    return shlex.quote(os.path.join(*parts))


def _iter_name(i) -> str:
    return RELEASE_DIR if i == RELEASE_DIR else f"iter_{i:07d}"


def _read_trackers(path: str, entries: list[str], findings: list[Finding]):
    """Which iteration a resume would load: latest_train_state.pt first, then the Megatron-LM text file."""
    tracker: dict = {}
    ts_iter = txt_iter = None
    if TRACKER_TRAIN_STATE in entries:
        ts, err = read_train_state(os.path.join(path, TRACKER_TRAIN_STATE))
        tracker[TRACKER_TRAIN_STATE] = ts if ts is not None else {"error": err}
        if ts and isinstance(ts.get("step"), int):
            ts_iter = ts["step"]
        elif err:
            findings.append(
                Finding(
                    "MFSDP-CKPT-TRACKER-UNREADABLE",
                    "warning",
                    os.path.join(path, TRACKER_TRAIN_STATE),
                    f"cannot read the step from {TRACKER_TRAIN_STATE} without unpickling: {err}",
                    "check the file is complete, or with torch installed run: "
                    + mfsdp_command("ckpt", path, "--trust-pickle"),
                )
            )
    if TRACKER_TXT in entries:
        it, release, err = read_tracker_txt(os.path.join(path, TRACKER_TXT))
        tracker[TRACKER_TXT] = RELEASE_DIR if release else (it if err is None else {"error": err})
        txt_iter = RELEASE_DIR if release else it
        if err:
            # Bridge parses the text file only when latest_train_state.pt is absent (checkpointing.py ::
            # _load_checkpoint_from_path and _resolve_checkpoint_iteration: the train-state tracker first, then
            # read_metadata, which asserts the iteration is > 0): beside it, only Megatron-LM's tools read it.
            bridge_reads_it = TRACKER_TRAIN_STATE not in entries
            findings.append(
                Finding(
                    "MFSDP-CKPT-TRACKER-BAD",
                    "error" if bridge_reads_it else "warning",
                    os.path.join(path, TRACKER_TXT),
                    f"{TRACKER_TXT} {err}; "
                    + (
                        "Megatron-LM and Bridge exit when parsing it"
                        if bridge_reads_it
                        else f"Bridge reads {TRACKER_TRAIN_STATE} instead and never parses it, but Megatron-LM's "
                        "tools exit on it"
                    ),
                    f"write the last saved iteration number into it (echo N > {_q(path, TRACKER_TXT)})",
                )
            )
    if ts_iter is not None and txt_iter is not None and ts_iter != txt_iter:
        findings.append(
            Finding(
                "MFSDP-CKPT-TRACKER-DISAGREE",
                "warning",
                path,
                f"{TRACKER_TRAIN_STATE} says step {ts_iter} but {TRACKER_TXT} says {txt_iter}; Bridge uses "
                f"{TRACKER_TRAIN_STATE}, Megatron-LM tools use the text file",
                f"make them agree: echo {ts_iter} > {_q(path, TRACKER_TXT)}",
            )
        )
    tracked = ts_iter if ts_iter is not None else txt_iter
    return tracker, tracked


def _judge_iteration(info: IterationInfo, findings: list[Finding], fallback: int | None) -> None:
    name = info.path
    earlier = (
        f"resume from iter_{fallback:07d}, which is complete, with checkpoint.ckpt_step={fallback}"
        if fallback is not None
        else "resume from an earlier complete iteration with checkpoint.ckpt_step=N"
    )
    if info.format is None:
        markers = [m for m in ITERATION_MARKERS if m in info.entries]
        findings.append(
            Finding(
                "MFSDP-CKPT-NO-PAYLOAD",
                "error",
                name,
                f"iteration folder holds no checkpoint payload (found: {_names(info.entries) or 'nothing'}; "
                f"no {MCORE_DIST_CONFIG}, {DCP_METADATA} + *.distcp, HF weights or mp_rank_XX/)"
                + ("; Bridge raises 'Unknown checkpoint format' on it" if markers else ""),
                f"the save was interrupted or the files were not copied: re-save, or {earlier}",
                {"entries": info.entries[:MAX_LISTED], "entry_count": len(info.entries)},
            )
        )
        return
    if not info.payload:
        what = {
            "torch_dist": f"{DCP_METADATA} and *.distcp shards",
            "fsdp_dtensor": "*.distcp shards",
            "torch": f"mp_rank_XX/{LEGACY_MODEL_FILE}",
            "zarr": "per-tensor folders",
        }.get(info.format, "weights")
        findings.append(
            Finding(
                "MFSDP-CKPT-NO-PAYLOAD",
                "error",
                name,
                f"{info.format} metadata is present but the payload ({what}) is missing"
                + (f": {_names(info.missing_shards)}" if info.missing_shards else ""),
                f"the save was interrupted or only metadata was copied: copy the shard files too, or {earlier}",
                {"missing": info.missing_shards[:MAX_LISTED], "missing_count": len(info.missing_shards)},
            )
        )
    elif info.missing_shards or info.short_shards:
        parts = []
        if info.missing_shards:
            parts.append(f"missing {len(info.missing_shards)}: {_names(info.missing_shards, 4)}")
        if info.short_shards:
            parts.append(f"shorter than {DCP_METADATA} records: {_names(info.short_shards, 4)}")
        findings.append(
            Finding(
                "MFSDP-CKPT-SHARDS-INCOMPLETE",
                "error",
                name,
                f"shard files named in {DCP_METADATA} are incomplete ({'; '.join(parts)})",
                "copy the checkpoint again completely (or re-save it); loading would fail reading these shards",
                {
                    "missing": info.missing_shards[:MAX_LISTED],
                    "short": info.short_shards[:MAX_LISTED],
                    "missing_count": len(info.missing_shards),
                    "short_count": len(info.short_shards),
                },
            )
        )
    if info.incomplete:
        findings.append(_incomplete_save(info, earlier))
    if info.format == "zarr":
        findings.append(
            Finding(
                "MFSDP-CKPT-ZARR",
                "error",
                name,
                "metadata.json names sharded_backend 'zarr', a backend Megatron-Core 0.19 no longer loads",
                "convert it with an older Megatron-Core to torch_dist first, then to fsdp_dtensor (see below)",
            )
        )
    for p in info.unsafe:
        findings.append(
            Finding(
                "MFSDP-CKPT-UNSAFE-PICKLE",
                "error",
                name,
                f"{p}: loading this checkpoint unpickles it on every rank, which would import and run that code",
                "do not load this checkpoint; get it again from a source you trust (this tool never unpickled it)",
            )
        )
    if info.outside_shards:
        findings.append(
            Finding(
                "MFSDP-CKPT-SHARD-OUTSIDE",
                "error",
                name,
                f"{DCP_METADATA} names shard files outside the checkpoint folder: {_names(info.outside_shards, 4)}; "
                "DCP would read them from there",
                "do not load this checkpoint; a saved checkpoint names only files inside its own folder",
                {"outside": info.outside_shards[:MAX_LISTED]},
            )
        )
    for p in info.dcp_problems:
        findings.append(
            Finding(
                "MFSDP-CKPT-DCP-METADATA-BAD",
                "error",
                name,
                f"{p}; Bridge's load unpickles this file first, on every rank: a file this tool cannot read is "
                "damaged (the load fails) or built to defeat a reader, so the checkpoint is not consistent",
                f"do not load this iteration: the save was interrupted or the file was damaged in the copy; copy it "
                f"again from its source, or {earlier}",
            )
        )
    if info.unchecked:
        # An error, not a warning: a file the walk refused may hold anything Bridge's load would unpickle and run,
        # so the checkpoint cannot be called consistent (exit 1, "ok": false) until someone vouches for it.
        findings.append(
            Finding(
                UNCHECKED_RULE,
                "error",
                name,
                f"{DCP_METADATA} was not checked ({info.unchecked}): only its shard file names were read, so the "
                "classes and functions it would import when Bridge unpickles it on every rank are unknown",
                "do not load this checkpoint unless it comes from a source you trust; 'mfsdp.py ckpt PATH "
                "--trust-pickle' reads it with torch's own DCP reader (which runs the pickle) and accepts it if "
                "torch can",
                {"reason": info.unchecked},
            )
        )
    for p in info.problems:
        findings.append(
            Finding(
                "MFSDP-CKPT-METADATA-UNREADABLE",
                "warning",
                name,
                p,
                "check the file is complete; the tool reads it without executing any pickle",
            )
        )


def _incomplete_save(info: IterationInfo, earlier: str) -> Finding:
    """A torch_dist save without its metadata.json: what Bridge would make of it, and the ways back.

    Neither load works on the folder as it is: with ``ckpt_format=torch_dist`` Bridge's format assertion stops
    it (the folder looks fsdp_dtensor), and with ``fsdp_dtensor`` the DCP load finds none of the model's tensor
    names, which Bridge's default ``checkpoint.strict_fsdp_dtensor_load=false`` (partial load) skips, so the run
    continues from its initial weights. Restoring the marker is the repair: a copy of the original, or, when the
    shards ``.metadata`` names are all there at full size (``.metadata`` is written after every shard), the
    one line Megatron-Core writes.
    """
    marker = os.path.join(info.path, MCORE_DIST_CONFIG)
    complete = info.payload and not (info.missing_shards or info.short_shards or info.unchecked)
    rewrite = (
        f"; if the original is lost, every shard .metadata names is here at full size, so the marker can be "
        f"written again: echo {shlex.quote(MCORE_DIST_CONFIG_TEXT)} > {_q(marker)}"
        if complete
        else ""
    )
    return Finding(
        "MFSDP-CKPT-INCOMPLETE-SAVE",
        "error",
        info.path,
        f"incomplete torch_dist save: {DCP_METADATA} and the shards are here but not {MCORE_DIST_CONFIG}, the marker "
        f"Megatron-Core writes last (evidence for torch_dist: {'; '.join(info.incomplete)}). Bridge takes a folder "
        f"with {DCP_METADATA} and no {MCORE_DIST_CONFIG} for fsdp_dtensor, so no load works as it is: "
        "checkpoint.ckpt_format=torch_dist stops at \"Checkpoint format 'torch_dist' from config differs from "
        "inferred format 'fsdp_dtensor'\", and ckpt_format=fsdp_dtensor finds none of its model tensor names (with "
        "the default checkpoint.strict_fsdp_dtensor_load=false it skips them and trains from the initial weights)",
        f"restore {MCORE_DIST_CONFIG}, then load with checkpoint.ckpt_format=torch_dist: if the folder was copied, "
        f"copy it again from the source (copies that skip files of that name, such as the `skills` installer, drop "
        f"it){rewrite}. If the save itself was interrupted, {earlier}",
        {"missing": MCORE_DIST_CONFIG, "evidence": info.incomplete, "marker": marker},
    )


def _names(items: list[str], limit: int = MAX_LISTED) -> str:
    return ", ".join(items[:limit]) + (f" ... (+{len(items) - limit} more)" if len(items) > limit else "")


def _truthy(v) -> bool:
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "1", "yes"))


def _judge_config(info: IterationInfo, cfg: dict, findings: list[Finding]) -> None:
    cfg_path = os.path.join(info.path, RUN_CONFIG)
    if info.run_config is None:
        if info.format in ("torch_dist", "fsdp_dtensor") and RUN_CONFIG not in info.entries:
            findings.append(
                Finding(
                    "MFSDP-CKPT-NO-RUN-CONFIG",
                    "warning",
                    info.path,
                    f"no {RUN_CONFIG}: the recorded checkpoint.ckpt_format and Megatron FSDP settings cannot be "
                    "compared with what is on disk (a Megatron-LM checkpoint, or the save did not finish)",
                    f"make sure the loading run sets checkpoint.ckpt_format={info.format}",
                )
            )
        return
    recorded = cfg.get("checkpoint.ckpt_format")
    mfsdp = _truthy(cfg.get("ddp.use_megatron_fsdp")) or _truthy(cfg.get("dist.use_megatron_fsdp"))
    fsdp2 = _truthy(cfg.get("dist.use_torch_fsdp2"))
    on_disk = info.format
    if recorded and on_disk in ("torch_dist", "fsdp_dtensor") and recorded != on_disk:
        findings.append(
            Finding(
                "MFSDP-CKPT-FORMAT-MISMATCH",
                "error",
                "checkpoint.ckpt_format",
                f"{RUN_CONFIG} records ckpt_format={recorded!r} but the folder holds {on_disk!r}; loading it with "
                f"that config stops at Bridge's assertion \"Checkpoint format '{recorded}' from config differs from "
                f"inferred format '{on_disk}'\"",
                f"load with checkpoint.ckpt_format={on_disk}, or convert the checkpoint (see the conversion finding)",
                {"file": cfg_path, "recorded": recorded, "on_disk": on_disk},
            )
        )
    if on_disk == "fsdp_dtensor" and (not _truthy(cfg.get("ddp.use_megatron_fsdp")) or fsdp2):
        why = "dist.use_torch_fsdp2=true" if fsdp2 else "ddp.use_megatron_fsdp is not true"
        findings.append(
            Finding(
                "MFSDP-CKPT-DTENSOR-WITHOUT-MFSDP",
                "error",
                "ddp.use_megatron_fsdp",
                f'an fsdp_dtensor checkpoint, but its run config has {why}; Bridge asserts "fsdp_dtensor '
                'checkpoint format only supports Megatron FSDP" when saving or loading it',
                "load it in a Megatron FSDP run (dist.use_megatron_fsdp=true ddp.use_megatron_fsdp=true "
                "ddp.data_parallel_sharding_strategy=optim_grads_params checkpoint.ckpt_format=fsdp_dtensor "
                "dist.use_torch_fsdp2=false), or export it to Hugging Face (see the conversion finding)",
                {"file": cfg_path},
            )
        )
    if mfsdp and on_disk in ("torch_dist", "zarr", "torch"):
        findings.append(
            Finding(
                "MFSDP-CKPT-MFSDP-NOT-DTENSOR",
                "error",
                "checkpoint.ckpt_format",
                f"the run config enables Megatron FSDP but the checkpoint is {on_disk!r}; Bridge asserts "
                '"Megatron-FSDP requires the fsdp_dtensor checkpointing format!" whenever save or load is set',
                "convert it to fsdp_dtensor (see the conversion finding), then load with checkpoint.ckpt_format=fsdp_dtensor",
                {"file": cfg_path},
            )
        )


def _conversion_findings(info: IterationInfo, cfg: dict, expect: str | None, findings: list[Finding]) -> None:
    """Say which conversion applies; a command only for a path recorded as passing (``migration``)."""
    fmt = info.format
    src = info.path
    hf_id = cfg.get("model.hf_model_id") or "<HF model id or folder>"
    passing = migration.passing_paths()

    unloadable = _unloadable(info)

    def how(source: str | None, target: str) -> str:
        if unloadable:  # a conversion reads what a load reads: never advise one that will fail
            return "no conversion can read this iteration (see the errors above); fix or replace it first"
        if (source, target) in passing:
            return migration.convert_command(src, target, hf_ref=hf_id if target == "hf" and source != "hf" else None)
        return (
            f"no conversion from {source} to {target} is recorded as run and checked yet, so no command is "
            f"given; what was run, on what, and the result: {migration.REFERENCE}"
        )

    if expect:
        if fmt != expect:
            findings.append(
                Finding(
                    "MFSDP-CKPT-EXPECT",
                    "error",
                    info.path,
                    f"expected {expect!r} but the checkpoint is {fmt!r}",
                    how(fmt, expect),
                    {"expected": expect, "found": fmt},
                )
            )
        return
    if unloadable:
        return
    # No --expect: suggest the path that matters for Megatron FSDP.
    if fmt in ("torch_dist", "hf", "torch"):
        target = "fsdp_dtensor"
        note = {
            "torch_dist": "to resume it under Megatron FSDP, convert it to fsdp_dtensor",
            "hf": (
                "Hugging Face weights load only via checkpoint.pretrained_checkpoint (checkpoint.load "
                "refuses them); to get a native Megatron FSDP checkpoint"
            ),
            "torch": 'Bridge 0.6.2 cannot load the legacy torch format ("Unknown checkpoint format"); '
            "to use it with Megatron FSDP",
        }[fmt]
        severity = "error" if fmt == "torch" else "info"
        findings.append(
            Finding(
                "MFSDP-CKPT-CONVERT",
                severity,
                info.path,
                f"{note}: {fmt} -> {target}",
                how(fmt, target),
                {"from": fmt, "to": target, "recorded_passing": (fmt, target) in passing},
            )
        )
    elif fmt == "fsdp_dtensor":
        findings.append(
            Finding(
                "MFSDP-CKPT-CONVERT",
                "info",
                info.path,
                "fsdp_dtensor loads only into Megatron FSDP runs; to share the weights or train without Megatron "
                "FSDP, export to Hugging Face",
                how(fmt, "hf"),
                {"from": fmt, "to": "hf", "recorded_passing": (fmt, "hf") in passing},
            )
        )


def trusted_dcp_summary(path: str) -> tuple[dict | None, str | None]:
    """With --trust-pickle: read .metadata with torch's own DCP reader (executes the pickle)."""
    try:
        from torch.distributed.checkpoint import FileSystemReader  # noqa: WPS433 (optional, heavy)
    except Exception:  # torch missing or broken
        return None, "torch is not installed; --trust-pickle needs it (pip install torch)"
    try:
        md = FileSystemReader(path).read_metadata()
    except Exception as exc:  # anything torch raises on a bad file
        return None, f"torch could not read {DCP_METADATA}: {type(exc).__name__}: {exc}"
    sdm = md.state_dict_metadata
    return {"entries": len(sdm), "keys_sample": sorted(sdm)[:10]}, None
