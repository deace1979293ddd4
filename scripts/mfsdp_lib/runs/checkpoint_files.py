"""The small files of a checkpoint: names Bridge writes and readers for each (no tensors).

File names and formats as Bridge / Megatron-Core / PyTorch DCP write them, and one reader per
file: the trackers, ``train_state.pt``, DCP ``.metadata`` and ``run_config.yaml``. Each reader
returns ``(value, None)`` or ``(None, why it could not be read)``.
"""

from __future__ import annotations

import errno
import os
import re
import struct
import zipfile

from .pickle_reader import (
    Call,
    Global,
    PersistentRef,
    PickleTooLarge,
    PickleUnreadable,
    read_pickle_tree,
)

# --- file names Bridge / Megatron-Core / PyTorch DCP write (checkpoint_utils.py, dist_checkpointing) ---
TRACKER_TRAIN_STATE = "latest_train_state.pt"  # f"{TRACKER_PREFIX}_{TRAIN_STATE_FILE}"; Bridge reads it first
TRACKER_TXT = "latest_checkpointed_iteration.txt"  # Megatron-LM tracker, Bridge's fallback
TRAIN_STATE = "train_state.pt"
RUN_CONFIG = "run_config.yaml"
MCORE_DIST_CONFIG = "metadata.json"  # dist_checkpointing.core.CONFIG_FNAME, written last by a torch_dist save
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint metadata pickle
DCP_SHARD_RE = re.compile(r"^__\d+_\d+\.distcp$")  # FileSystemWriter shard names: __{rank}_{file}.distcp
LEGACY_COMMON = "common.pt"  # strategies/common.py COMMON_STATE_FNAME: torch_dist's common state before 0.19
# Megatron-Core 0.19 keeps a torch_dist save's common state in the DCP files as one ShardedObject
# ("common_state", global shape (1,), offset (0,): dist_checkpointing/serialization.py :: save), stored under its
# unique_key (mapping.py :: ShardedObject.unique_key); Bridge's fsdp_dtensor saves never write it.
MCORE_COMMON_STATE_KEY = "common_state/shard_0_1"
# What a torch_dist save's model tensors are called: the ShardedTensor keys of Megatron-Core's GPT/Mamba models
# (embedding., decoder., output_layer.), with no prefix. Bridge's fsdp_dtensor save nests the model under "model"
# (checkpointing.py :: preprocess_fsdp_dtensor_state_dict reads state_dict["model"]), so its keys start "model.".
MCORE_MODEL_KEY_GROUPS = ("embedding", "decoder", "output_layer")
FSDP_DTENSOR_MODEL_KEY_PREFIX = "model"
# The marker Megatron-Core writes last in a torch_dist save (core.py :: save_config of CheckpointingConfig with
# TorchDistSaveShardedStrategy's backend and version).
MCORE_DIST_CONFIG_TEXT = '{"sharded_backend": "torch_dist", "sharded_backend_version": 1}'
ITERATION_MARKERS = (RUN_CONFIG, TRAIN_STATE, MCORE_DIST_CONFIG, DCP_METADATA)  # Bridge's _ITERATION_DIR_MARKERS
ITER_DIR_RE = re.compile(r"^iter_(\d+)$")  # get_checkpoint_name: "iter_{:07d}"
RELEASE_DIR = "release"
HF_CONFIG = "config.json"
HF_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)  # Bridge's _HF_KNOWN_WEIGHT_FILES
HF_WEIGHT_RES = (re.compile(r"^model-\d+-of-\d+\.safetensors$"), re.compile(r"^pytorch_model-\d+-of-\d+\.bin$"))
LEGACY_RANK_DIR_RE = re.compile(r"^mp_rank_\d{2}(_\d{3})?$")  # Megatron-LM get_checkpoint_name for ckpt_format=torch
LEGACY_MODEL_FILE = "model_optim_rng.pt"
HF_EXPORT_SUBDIR = "hf"  # also_save_hf_checkpoint=True writes iter_*/hf/

FORMATS = ("fsdp_dtensor", "torch_dist", "hf", "torch", "zarr")

# Limits that keep us fast and bounded on hostile or huge input.
MAX_SMALL_FILE = 16 * 1024 * 1024  # run_config.yaml, metadata.json, train_state.pt: real ones are KBs
# .metadata grows with tensors x ranks (hundreds of MB for thousands of GPUs). The opcode walk runs at ~1 million
# opcodes a second in pure Python (pickle_reader.MAX_OPS bounds it), so past MAX_DCP_FULL_PARSE, or past MAX_OPS,
# we only scan the bytes for the shard file names it references.
MAX_DCP_FULL_PARSE = 8 * 1024 * 1024
MAX_DCP_SCAN = 4 * 1024 * 1024 * 1024  # a names-only scan reads ~1 GB/s; larger is not a DCP .metadata
SCAN_CHUNK = 8 * 1024 * 1024
DCP_NAME_IN_PICKLE_RE = re.compile(rb"(__\d+_\d+\.distcp)")  # relative_path strings, memoized once each
DCP_METADATA_CLASS = b"torch.distributed.checkpoint.metadata"
MAX_ITER_SCAN = 1000  # iteration folders opened per root (the newest; all are listed by name)
MAX_LISTED = 12  # file names quoted in a message or a finding's extra; counts stay exact

# torch storage class -> struct format of one element (train_state.pt stores scalars as 1-element tensors)
_STORAGE_FMT = {
    "LongStorage": "q",
    "IntStorage": "i",
    "ShortStorage": "h",
    "CharStorage": "b",
    "ByteStorage": "B",
    "BoolStorage": "?",
    "FloatStorage": "f",
    "DoubleStorage": "d",
}
_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float64": 8,
    "double": 8,
    "int64": 8,
    "long": 8,
    "int32": 4,
    "int": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

# Where conversions live (checked in the repositories, cited exactly).
MLM_INSPECTOR = "tools/checkpoint/checkpoint_inspector.py"  # NVIDIA/Megatron-LM (core_v0.19.0 and main)
BRIDGE_MFSDP_CONVERT = "examples/conversion/mfsdp/convert_checkpoints_fsdp.py"  # NVIDIA-NeMo/Megatron-Bridge r0.6.0
BRIDGE_CONVERT_SH = "scripts/conversion/convert.sh"  # NVIDIA-NeMo/Megatron-Bridge r0.6.0, HF <-> torch_dist


# ----------------------------------------------------------------------------------------------------------
# The small files
# ----------------------------------------------------------------------------------------------------------


def _open_regular(path: str) -> int:
    """An O_RDONLY descriptor of the REGULAR file ``path``; OSError for a FIFO, device, socket or folder
    (a FIFO planted as .metadata would block a plain open() forever)."""
    import stat

    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return fd


def _read_small(path: str, limit: int = MAX_SMALL_FILE) -> bytes:
    with os.fdopen(_open_regular(path), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes, not a metadata file")
    return data


# What a DCP .metadata may name (module, class) and so what torch imports and calls when Bridge unpickles it on
# every rank at load time. Read from the pickles torch 2.11's FileSystemWriter writes (the committed fixtures):
# the metadata dataclasses, torch.Size, dtypes, the layout helper and pathlib paths (StorageMeta.checkpoint_id).
# Anything else, os.system say, is code that the load would run.
DCP_ALLOWED_MODULE_CLASSES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
DCP_ALLOWED = frozenset(
    {
        ("torch", "Size"),
        ("torch", "device"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "bytearray"),
        ("builtins", "slice"),
        ("copyreg", "_reconstructor"),
        ("builtins", "object"),
    }
)
# train_state.pt (torch.save of TrainState.state_dict()): tensors are rebuilt from typed storages.
TRAIN_STATE_ALLOWED = frozenset(
    {("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor"), ("collections", "OrderedDict")}
)
UNSAFE_PICKLE_TEXT = "code that unpickling it would run"
_CLASS_NAME_RE = re.compile(r"^_?[A-Z][A-Za-z0-9_]*$")
_DTYPE_NAME_RE = re.compile(
    r"^(?:b?float\w*|u?int\d*|bool|half|double|long|short|c?complex\w*|cfloat|cdouble|q?u?int\w*)$"
)


def unsafe_globals(names: list, allowed: frozenset, class_modules: tuple = ()) -> list[str]:
    """The classes/functions among ``names`` (pickle_reader.Global) that are not on the allow-list."""
    bad = []
    for g in names:
        mod, name = g.module, g.name
        if (mod, name) in allowed:
            continue
        if mod in class_modules and _CLASS_NAME_RE.match(name):
            continue
        if mod == "torch" and (_DTYPE_NAME_RE.match(name) or name.endswith("Storage")):
            continue
        q = f"{mod}.{name}"
        if q not in bad:
            bad.append(q)
    return bad


def read_tracker_txt(path: str) -> tuple[int | None, bool, str | None]:
    """(iteration, release, problem) from latest_checkpointed_iteration.txt, as Bridge's read_metadata."""
    try:
        text = _read_small(path, 4096).decode("utf-8", "replace").strip()
    except OSError as exc:
        return None, False, f"cannot read: {exc.strerror or exc}"
    if text == "release":
        return None, True, None
    try:
        it = int(text)
    except ValueError:
        return None, False, f"holds {text[:40]!r}, not an iteration number or 'release'"
    if it <= 0:
        return None, False, f"holds {it}; Bridge asserts the iteration is > 0"
    return it, False, None


def read_train_state(path: str) -> tuple[dict | None, str | None]:
    """Scalars of a Bridge ``train_state.pt`` (step, consumed_train_samples, ...) without torch.

    The file is ``torch.save`` of ``TrainState.state_dict()``: a zip holding ``<name>/data.pkl`` and one
    ``<name>/data/<key>`` member per tensor storage. We map each dict entry to the storage its
    ``_rebuild_tensor_v2`` call names and decode the raw bytes.
    """
    try:
        if os.path.getsize(path) > MAX_SMALL_FILE:
            return None, f"{os.path.basename(path)} is larger than a train state ({MAX_SMALL_FILE} bytes)"
        os.close(_open_regular(path))
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
            if not pkl:
                return None, "no data.pkl inside (not a torch.save archive)"
            prefix = pkl[0][: -len("data.pkl")]
            order = "<"
            if prefix + "byteorder" in names:
                order = "<" if zf.read(prefix + "byteorder").strip() == b"little" else ">"
            if any(i.file_size > MAX_SMALL_FILE for i in zf.infolist()):  # no zip bombs: real members are bytes
                return None, "a member of the archive is too large for a train state"
            named: list = []
            tree = read_pickle_tree(zf.read(pkl[0]), persistent=True, globals_out=named)
            bad = unsafe_globals(named, TRAIN_STATE_ALLOWED)
            if bad:
                return None, f"data.pkl names {', '.join(bad[:4])}: {UNSAFE_PICKLE_TEXT}"
            if not isinstance(tree, dict):
                return None, "data.pkl does not hold a dict"
            out: dict = {}
            for key, val in tree.items():
                out[str(key)] = _scalar_from(val, zf, prefix, order, names)
            return out, None
    except zipfile.BadZipFile:
        return None, "not a zip archive (legacy torch.save or damaged); cannot read it without unpickling"
    except PickleUnreadable as exc:
        return None, f"data.pkl unreadable: {exc}"
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"


def _scalar_from(val, zf: zipfile.ZipFile, prefix: str, order: str, names: list[str]):
    if isinstance(val, (int, float, bool, str)) or val is None:
        return val
    if isinstance(val, Call) and val.qualname.endswith("_rebuild_tensor_v2") and val.args:
        ref = val.args[0]
        offset = val.args[1] if len(val.args) > 1 and isinstance(val.args[1], int) else 0
        size = val.args[2] if len(val.args) > 2 else ()
        numel = 1
        for s in size if isinstance(size, tuple) else ():
            numel *= s if isinstance(s, int) else 1
        if isinstance(ref, PersistentRef) and isinstance(ref.pid, tuple) and len(ref.pid) >= 3 and numel == 1:
            storage, key = ref.pid[1], str(ref.pid[2])
            fmt = _STORAGE_FMT.get(storage.name if isinstance(storage, Global) else "")
            member = f"{prefix}data/{key}"
            if fmt and member in names:
                raw = zf.read(member)
                width = struct.calcsize(fmt)
                chunk = raw[offset * width : (offset + 1) * width]
                if len(chunk) == width:
                    v = struct.unpack(order + fmt, chunk)[0]
                    return float(v) if fmt in "fd" else (bool(v) if fmt == "?" else int(v))
    return None


def read_dcp_metadata(path: str) -> tuple[dict | None, str | None]:
    """Summary of a PyTorch DCP ``.metadata`` pickle: entries, key groups, shard files with their sizes.

    The file is hostile until shown otherwise: Bridge unpickles it on every rank when it loads the checkpoint.
    It must be a regular, non-empty file; it is walked without unpickling, with bounded opcodes and nesting
    (``pickle_reader``); every class it names must be on ``DCP_ALLOWED`` (else ``summary["unsafe"]`` lists
    them); and every shard path it names must stay inside the iteration folder (``summary["outside"]``).
    """
    try:
        fd = _open_regular(path)
        size = os.fstat(fd).st_size
        with os.fdopen(fd, "rb") as f:
            if size == 0:
                return None, "is empty (0 bytes): the save was cut off; Bridge's load fails reading it"
            if size > MAX_DCP_SCAN:
                return None, f"{size} bytes is too large for a DCP .metadata"
            if size > MAX_DCP_FULL_PARSE:
                return _scan_dcp_names(path, size, f"{size:,} bytes, past the {MAX_DCP_FULL_PARSE:,} walked in full")
            data = f.read(MAX_DCP_FULL_PARSE + 1)
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"
    named: list = []
    try:
        tree = read_pickle_tree(data, globals_out=named)
    except PickleTooLarge as exc:
        return _scan_dcp_names(path, size, str(exc))
    except PickleUnreadable as exc:
        bad = unsafe_globals(named, DCP_ALLOWED, DCP_ALLOWED_MODULE_CLASSES)
        if bad:
            return {"unsafe": bad, "files": {}, "outside": []}, None
        return None, f"unreadable: {exc}"
    bad = unsafe_globals(named, DCP_ALLOWED, DCP_ALLOWED_MODULE_CLASSES)
    if bad:
        return {"unsafe": bad, "files": {}, "outside": []}, None
    if not (isinstance(tree, Call) and tree.qualname == "torch.distributed.checkpoint.metadata.Metadata"):
        return None, "not a torch.distributed.checkpoint Metadata pickle"
    state = tree.state if isinstance(tree.state, dict) else {}
    if not state and tree.args:  # older torch pickled Metadata positionally
        state = {"state_dict_metadata": tree.args[0]}
    sdm = state.get("state_dict_metadata") or {}
    malformed = _malformed_state_dict_metadata(sdm)
    if malformed:
        return None, f"is malformed: {malformed}"
    tensors = nbytes = objects = 0
    groups: dict[str, int] = {}
    dtypes: dict[str, int] = {}
    for key, md in sdm.items() if isinstance(sdm, dict) else ():
        group = _key_group(str(key))
        groups[group] = groups.get(group, 0) + 1
        kind = md.qualname.rsplit(".", 1)[-1] if isinstance(md, Call) else ""
        if kind == "TensorStorageMetadata":
            tensors += 1
            st = md.state if isinstance(md.state, dict) else {}
            dtype = _dtype_of(st.get("properties"))
            if dtype:
                dtypes[dtype] = dtypes.get(dtype, 0) + 1
            numel = _numel(st.get("size"))
            if numel is not None and dtype in _DTYPE_BYTES:
                nbytes += numel * _DTYPE_BYTES[dtype]
        else:
            objects += 1
    files: dict[str, int] = {}
    outside: list[str] = []
    storage = state.get("storage_data")
    for info in storage.values() if isinstance(storage, dict) else ():
        st = info.state if isinstance(info, Call) and isinstance(info.state, dict) else {}
        rel = st.get("relative_path")
        if rel is None and isinstance(info, Call) and info.args:
            rel = info.args[0]
        off, ln = st.get("offset", 0), st.get("length", 0)
        if isinstance(rel, str):
            if not shard_path_is_confined(rel):
                if rel not in outside and len(outside) < MAX_LISTED:
                    outside.append(rel)
                continue
            end = (off if isinstance(off, int) else 0) + (ln if isinstance(ln, int) else 0)
            files[rel] = max(files.get(rel, 0), end)
    return {
        "entries": len(sdm) if isinstance(sdm, dict) else 0,
        "tensors": tensors,
        "objects": objects,
        "tensor_bytes": nbytes,
        "key_groups": dict(sorted(groups.items())),
        "dtypes": dict(sorted(dtypes.items())),
        "files": dict(sorted(files.items())),
        "outside": outside,
        "unsafe": [],
        "version": state.get("version") if isinstance(state.get("version"), str) else None,
        "common_state": MCORE_COMMON_STATE_KEY in sdm,
    }, None


# What DCP's Metadata.state_dict_metadata maps: fully qualified state-dict keys (str) to one of these classes
# (torch/distributed/checkpoint/metadata.py: STORAGE_TYPES = Union[TensorStorageMetadata, BytesStorageMetadata]).
DCP_STORAGE_TYPES = (
    "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
    "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
)


def _describe(value) -> str:
    if isinstance(value, Call):
        return f"a {value.qualname} object"
    if isinstance(value, Global):
        return f"the name {value.qualname}"
    name = type(value).__name__
    return "a nested tuple or list" if name == "_Unhashable" else f"a {name}"


def _malformed_state_dict_metadata(sdm) -> str | None:
    """Why ``state_dict_metadata`` is not what DCP writes, or None.

    torch's planner writes one entry per state-dict key, keyed by the key's string (``dict[str, STORAGE_TYPES]``).
    A non-string key (a tuple nested thousands deep, which ``pickle_reader`` holds as a placeholder because
    hashing it would crash the interpreter) or a value of another class is no file DCP wrote: Bridge's load would
    unpickle it on every rank and fail, or worse, so the checkpoint must not be called consistent.
    """
    if not isinstance(sdm, dict):
        return f"state_dict_metadata is {_describe(sdm)}, not a dict"
    for key, md in sdm.items():
        if not isinstance(key, str):
            return f"a state-dict key is {_describe(key)}, not a string (DCP keys are state-dict names)"
        if not (isinstance(md, Call) and md.qualname in DCP_STORAGE_TYPES):
            return f"the entry for {key[:80]!r} is {_describe(md)}, not tensor or bytes storage metadata"
    return None


def shard_path_is_confined(rel: str) -> bool:
    """True when a shard path named by .metadata stays inside its iteration folder.

    DCP's FileSystemReader opens ``checkpoint_dir / relative_path``; an absolute path, a ``..`` component, a
    drive or a NUL would make the load read (and this tool vouch for) a file outside the checkpoint.
    """
    if not rel or "\x00" in rel or rel.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", rel):
        return False
    parts = re.split(r"[/\\]", rel)
    return ".." not in parts


_TWO_PART_GROUPS = ("model", "optimizer")  # "model.module" vs "model"; "optimizer.state" vs "optimizer.param_..."


def _scan_dcp_names(path: str, size: int, why: str) -> tuple[dict | None, str | None]:
    """Big .metadata: find the class name and the shard file names by a byte scan (C speed, no parsing).

    Extents are unknown in this mode, so shard sizes are not checked (``files`` maps each name to 0), and nor
    is what the pickle would import: ``unchecked`` carries ``why`` (the limit it passed), and the caller must
    not call such a checkpoint consistent.
    """
    names: set[bytes] = set()
    seen_class = common_state = False
    tail = b""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(SCAN_CHUNK)
            if not chunk:
                break
            buf = tail + chunk
            seen_class = seen_class or DCP_METADATA_CLASS in buf
            common_state = common_state or any(b in buf for b in _COMMON_STATE_BYTES)
            names.update(DCP_NAME_IN_PICKLE_RE.findall(buf))
            tail = buf[-64:]
    if not seen_class:
        return None, "not a torch.distributed.checkpoint Metadata pickle"
    files = {n.decode("ascii"): 0 for n in sorted(names)}  # the name pattern admits no path separators
    return {
        "entries": None,
        "tensors": None,
        "objects": None,
        "tensor_bytes": None,
        "key_groups": {},
        "dtypes": {},
        "files": files,
        "version": None,
        "outside": [],
        "unsafe": [],
        "unchecked": why,  # too large to walk: what it would import when unpickled was not checked
        "mode": f"names only ({size} bytes)",
        "common_state": common_state,
    }, None


# The key as a pickle stores it: BINUNICODE (protocol 2, what the committed real .metadata files use) or
# SHORT_BINUNICODE (protocol 4), each with its length before the text. A names-only scan finds the whole key this
# way without parsing, never a longer key that merely contains it.
_COMMON_STATE_BYTES = (
    b"X" + struct.pack("<I", len(MCORE_COMMON_STATE_KEY)) + MCORE_COMMON_STATE_KEY.encode(),
    b"\x8c" + bytes([len(MCORE_COMMON_STATE_KEY)]) + MCORE_COMMON_STATE_KEY.encode(),
)


def _key_group(key: str) -> str:
    """Leading part of a state-dict key ("model.module", "optimizer.state", "rng_state"): tells who saved it."""
    parts = key.split(".")
    if parts[0] in _TWO_PART_GROUPS and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def _dtype_of(props) -> str | None:
    st = props.state if isinstance(props, Call) else None
    if isinstance(st, dict):
        d = st.get("dtype")
    elif isinstance(st, tuple) and st:
        d = st[0]
    elif isinstance(props, Call) and props.args:
        d = props.args[0]
    else:
        return None
    return d.name if isinstance(d, Global) else None


def _numel(size) -> int | None:
    if isinstance(size, Call) and size.args:  # torch.Size((a, b))
        size = size.args[0]
    if isinstance(size, (tuple, list)) and all(isinstance(s, int) for s in size):
        n = 1
        for s in size:
            n *= s
        return n
    return None


def read_run_config(path: str) -> tuple[dict | None, str | None]:
    """The ``run_config.yaml`` Bridge wrote (``ConfigContainer.to_yaml()``); plain YAML, safe loader."""
    try:
        import yaml  # noqa: F401  (only to say so in one line when it is missing)
    except ImportError:
        return None, "PyYAML is not installed (pip install pyyaml)"
    try:
        text = _read_small(path).decode("utf-8", "replace")
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"
    from ..config_io import safe_yaml
    from ..findings import InputError

    try:  # bounded and strict: depth, aliases, duplicate keys (config_io.safe_yaml)
        data = safe_yaml(text, RUN_CONFIG)
    except InputError as exc:
        return None, str(exc).removeprefix(f"{RUN_CONFIG}: ")
    if not isinstance(data, dict):
        return None, "does not hold a mapping"
    return data, None


def summarize_run_config(cfg: dict) -> dict:
    """The fields that decide checkpoint compatibility, as recorded by the run."""

    def get(section: str, key: str):
        sec = cfg.get(section)
        return sec.get(key) if isinstance(sec, dict) else None

    return {
        "checkpoint.ckpt_format": get("checkpoint", "ckpt_format"),
        "ddp.use_megatron_fsdp": get("ddp", "use_megatron_fsdp"),
        "dist.use_megatron_fsdp": get("dist", "use_megatron_fsdp"),
        "dist.use_torch_fsdp2": get("dist", "use_torch_fsdp2"),
        "ddp.data_parallel_sharding_strategy": get("ddp", "data_parallel_sharding_strategy"),
        "ddp.use_distributed_optimizer": get("ddp", "use_distributed_optimizer"),
        "model.tensor_model_parallel_size": get("model", "tensor_model_parallel_size"),
        "model.pipeline_model_parallel_size": get("model", "pipeline_model_parallel_size"),
        "model.context_parallel_size": get("model", "context_parallel_size"),
        "model.expert_model_parallel_size": get("model", "expert_model_parallel_size"),
        "model.hf_model_id": get("model", "hf_model_id"),
        "model.gated_linear_unit": get("model", "gated_linear_unit"),  # gated MLP: the converter needs --swiglu
        "checkpoint.save": get("checkpoint", "save"),
        "checkpoint.load": get("checkpoint", "load"),
    }
