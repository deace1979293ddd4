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
LEGACY_COMMON = "common.pt"  # pre-0.19 torch_dist kept common state here
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
# .metadata grows with tensors x ranks (hundreds of MB for thousands of GPUs). The opcode walk runs at ~1 MB/s
# in pure Python, so past MAX_DCP_FULL_PARSE we only scan the bytes for the shard file names it references.
MAX_DCP_FULL_PARSE = 16 * 1024 * 1024
SCAN_CHUNK = 8 * 1024 * 1024
DCP_NAME_IN_PICKLE_RE = re.compile(rb"(__\d+_\d+\.distcp)")  # relative_path strings, memoized once each
DCP_METADATA_CLASS = b"torch.distributed.checkpoint.metadata"
MAX_ITER_SCAN = 10000  # iteration folders listed per root
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


def _read_small(path: str, limit: int = MAX_SMALL_FILE) -> bytes:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes, not a metadata file")
    return data


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
            tree = read_pickle_tree(zf.read(pkl[0]), persistent=True)
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
    """Summary of a PyTorch DCP ``.metadata`` pickle: entries, key groups, shard files with their sizes."""
    try:
        size = os.path.getsize(path)
        if size > MAX_DCP_FULL_PARSE:
            return _scan_dcp_names(path, size)
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"
    try:
        tree = read_pickle_tree(data)
    except PickleUnreadable as exc:
        return None, f".metadata unreadable: {exc}"
    if not (isinstance(tree, Call) and tree.qualname == "torch.distributed.checkpoint.metadata.Metadata"):
        return None, "not a torch.distributed.checkpoint Metadata pickle"
    state = tree.state if isinstance(tree.state, dict) else {}
    if not state and tree.args:  # older torch pickled Metadata positionally
        state = {"state_dict_metadata": tree.args[0]}
    sdm = state.get("state_dict_metadata") or {}
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
    storage = state.get("storage_data")
    for info in storage.values() if isinstance(storage, dict) else ():
        st = info.state if isinstance(info, Call) and isinstance(info.state, dict) else {}
        rel = st.get("relative_path")
        if rel is None and isinstance(info, Call) and info.args:
            rel = info.args[0]
        off, ln = st.get("offset", 0), st.get("length", 0)
        if isinstance(rel, str):
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
        "version": state.get("version") if isinstance(state.get("version"), str) else None,
    }, None


_TWO_PART_GROUPS = ("model", "optimizer")  # "model.module" vs "model"; "optimizer.state" vs "optimizer.param_..."


def _scan_dcp_names(path: str, size: int) -> tuple[dict | None, str | None]:
    """Big .metadata: find the class name and the shard file names by a byte scan (C speed, no parsing).

    Extents are unknown in this mode, so shard sizes are not checked (``files`` maps each name to 0).
    """
    names: set[bytes] = set()
    seen_class = False
    tail = b""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(SCAN_CHUNK)
            if not chunk:
                break
            buf = tail + chunk
            seen_class = seen_class or DCP_METADATA_CLASS in buf
            names.update(DCP_NAME_IN_PICKLE_RE.findall(buf))
            tail = buf[-64:]
    if not seen_class:
        return None, "not a torch.distributed.checkpoint Metadata pickle"
    files = {n.decode("ascii"): 0 for n in sorted(names)}
    return {
        "entries": None,
        "tensors": None,
        "objects": None,
        "tensor_bytes": None,
        "key_groups": {},
        "dtypes": {},
        "files": files,
        "version": None,
        "mode": f"names only ({size} bytes)",
    }, None


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
        import yaml
    except ImportError:
        return None, "PyYAML is not installed (pip install pyyaml)"
    try:
        text = _read_small(path).decode("utf-8", "replace")
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader is ~10x faster on the 26 kB file
    from ..config_io import MAX_YAML_DEPTH, yaml_depth

    try:
        if yaml_depth(text, loader) > MAX_YAML_DEPTH:  # deeper crashes libyaml's composer (a segfault)
            return None, f"nested more than {MAX_YAML_DEPTH} levels deep; not a Bridge run config"
        data = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        return None, f"not valid YAML ({str(exc).splitlines()[0]})"
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
