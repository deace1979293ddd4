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
pickle; both can run arbitrary code if unpickled. ``_PickleTree`` instead walks the opcode stream with
``pickletools.genops`` and rebuilds plain data with inert placeholders for globals and calls: nothing is
imported or called. The numbers Bridge stores as one-element tensors (``step`` and friends) are read as raw
little-endian bytes from the archive member the pickle names. torch's own reader is used only with
``--trust-pickle`` and only if torch is installed.
"""

from __future__ import annotations

import errno
import json
import os
import pickletools
import re
import stat
import struct
import zipfile
from dataclasses import dataclass, field

from .findings import Finding, InputError, oserror_to_input

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
# Safe pickle reading
# ----------------------------------------------------------------------------------------------------------


class PickleUnreadable(Exception):
    """The opcode stream uses something we do not model, or is damaged."""


@dataclass(eq=False)
class Global:
    """A class or function the pickle names (never imported)."""

    module: str
    name: str

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(eq=False)
class Call:
    """What unpickling *would* have built by calling ``func(*args)``; ``state`` is what BUILD would set."""

    func: object
    args: tuple = ()
    state: object = None

    @property
    def qualname(self) -> str:
        return self.func.qualname if isinstance(self.func, Global) else "?"


@dataclass(eq=False)
class PersistentRef:
    """A persistent id (torch zip archives use them for tensor storages)."""

    pid: object


def read_pickle_tree(data: bytes, persistent: bool = False):
    """Rebuild the value a pickle describes, without executing anything.

    Walks ``pickletools.genops`` and keeps our own stack and memo; GLOBAL/STACK_GLOBAL become ``Global``
    placeholders, REDUCE/NEWOBJ/INST/OBJ become ``Call`` records, BUILD stores the state on the record.
    Raises ``PickleUnreadable`` for damaged streams or opcodes a data file has no reason to use.
    """
    stack: list = []
    marks: list[int] = []
    memo: dict = {}

    def pop_mark() -> list:
        if not marks:
            raise PickleUnreadable("MARK missing")
        i = marks.pop()
        items = stack[i:]
        del stack[i:]
        return items

    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name in ("PROTO", "FRAME"):
                continue
            if name == "STOP":
                if len(stack) != 1:
                    raise PickleUnreadable("unbalanced stack at STOP")
                return stack[0]
            if name == "MARK":
                marks.append(len(stack))
            elif name in ("NONE",):
                stack.append(None)
            elif name in ("NEWTRUE", "NEWFALSE"):
                stack.append(name == "NEWTRUE")
            elif name in (
                "INT",
                "BININT",
                "BININT1",
                "BININT2",
                "LONG",
                "LONG1",
                "LONG4",
                "FLOAT",
                "BINFLOAT",
                "STRING",
                "BINSTRING",
                "SHORT_BINSTRING",
                "UNICODE",
                "BINUNICODE",
                "SHORT_BINUNICODE",
                "BINUNICODE8",
                "BINBYTES",
                "SHORT_BINBYTES",
                "BINBYTES8",
                "BYTEARRAY8",
            ):
                stack.append(arg)
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name == "EMPTY_DICT":
                stack.append({})
            elif name == "EMPTY_SET":
                stack.append(set())
            elif name == "LIST":
                stack.append(pop_mark())
            elif name == "TUPLE":
                stack.append(tuple(pop_mark()))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                if len(stack) < n:
                    raise PickleUnreadable("stack underflow")
                items = tuple(stack[-n:])
                del stack[-n:]
                stack.append(items)
            elif name == "DICT":
                items = pop_mark()
                stack.append({_hashable(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)})
            elif name == "FROZENSET":
                stack.append(frozenset(_hashable(x) for x in pop_mark()))
            elif name == "APPEND":
                v = stack.pop()
                _as(stack[-1], list).append(v)
            elif name == "APPENDS":
                items = pop_mark()
                _as(stack[-1], list).extend(items)
            elif name == "SETITEM":
                v = stack.pop()
                k = stack.pop()
                _as(stack[-1], dict)[_hashable(k)] = v
            elif name == "SETITEMS":
                items = pop_mark()
                d = _as(stack[-1], dict)
                for i in range(0, len(items) - 1, 2):
                    d[_hashable(items[i])] = items[i + 1]
            elif name == "ADDITEMS":
                items = pop_mark()
                _as(stack[-1], set).update(_hashable(x) for x in items)
            elif name == "POP":
                if stack:
                    stack.pop()
                elif marks:  # POP with an empty frame above a MARK behaves as POP_MARK
                    marks.pop()
            elif name == "POP_MARK":
                pop_mark()
            elif name == "DUP":
                stack.append(stack[-1])
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise PickleUnreadable("memo key missing")
                stack.append(memo[arg])
            elif name == "GLOBAL":
                module, _, qual = str(arg).partition(" ")
                stack.append(Global(module, qual))
            elif name == "STACK_GLOBAL":
                qual = stack.pop()
                module = stack.pop()
                stack.append(Global(str(module), str(qual)))
            elif name == "REDUCE":
                args = stack.pop()
                func = stack.pop()
                stack.append(Call(func, tuple(args) if isinstance(args, (tuple, list)) else (args,)))
            elif name == "NEWOBJ":
                args = stack.pop()
                cls = stack.pop()
                stack.append(Call(cls, tuple(args) if isinstance(args, (tuple, list)) else (args,)))
            elif name == "NEWOBJ_EX":
                kwargs = stack.pop()
                args = stack.pop()
                cls = stack.pop()
                stack.append(Call(cls, tuple(args) if isinstance(args, (tuple, list)) else (args,), kwargs))
            elif name == "BUILD":
                state = stack.pop()
                obj = stack[-1]
                if isinstance(obj, Call):
                    obj.state = state
                else:
                    raise PickleUnreadable("BUILD on a non-object")
            elif name == "INST":
                module, _, qual = str(arg).partition(" ")
                stack.append(Call(Global(module, qual), tuple(pop_mark())))
            elif name == "OBJ":
                items = pop_mark()
                if not items:
                    raise PickleUnreadable("OBJ without class")
                stack.append(Call(items[0], tuple(items[1:])))
            elif name in ("PERSID", "BINPERSID"):
                if not persistent:
                    raise PickleUnreadable("persistent id in a plain pickle")
                pid = arg if name == "PERSID" else stack.pop()
                stack.append(PersistentRef(pid))
            else:  # EXT1/2/4, NEXT_BUFFER, READONLY_BUFFER: no data file needs them
                raise PickleUnreadable(f"unsupported opcode {name}")
    except PickleUnreadable:
        raise
    except (ValueError, IndexError, KeyError, TypeError, AttributeError, struct.error) as exc:
        raise PickleUnreadable(f"damaged pickle ({type(exc).__name__}: {exc})") from None
    raise PickleUnreadable("no STOP opcode (truncated)")


def _hashable(k):
    try:
        hash(k)
        return k
    except TypeError:
        return repr(k)


def _as(obj, typ):
    if not isinstance(obj, typ):
        raise PickleUnreadable(f"expected {typ.__name__} on the stack")
    return obj


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
    from .config_io import MAX_YAML_DEPTH, yaml_depth

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

    def to_dict(self) -> dict:
        d = {"path": self.path, "iteration": self.iteration, "format": self.format, "payload": self.payload}
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
    return info


def _read_iteration_metadata(info: IterationInfo) -> None:
    entries = set(info.entries)
    if RUN_CONFIG in entries:
        cfg, err = read_run_config(os.path.join(info.path, RUN_CONFIG))
        if err:
            info.problems.append(f"{RUN_CONFIG}: {err}")
        info.run_config = cfg
    if TRAIN_STATE in entries:
        ts, err = read_train_state(os.path.join(info.path, TRAIN_STATE))
        if err:
            info.problems.append(f"{TRAIN_STATE}: {err}")
        info.train_state = ts
    if DCP_METADATA in entries and info.format in ("fsdp_dtensor", "torch_dist"):
        dcp, err = read_dcp_metadata(os.path.join(info.path, DCP_METADATA))
        if err:
            info.problems.append(f"{DCP_METADATA}: {err}")
        info.dcp = dcp
        if dcp:
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
    if any(ITER_DIR_RE.match(n) for n in entries) or RELEASE_DIR in entries:
        if any(_isdir(os.path.join(path, n)) for n in entries if ITER_DIR_RE.match(n) or n == RELEASE_DIR):
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
        iter_dirs: dict[int | str, str] = {}
        for n in entries:
            m = ITER_DIR_RE.match(n)
            full = os.path.join(path, n)
            if (m or n == RELEASE_DIR) and _isdir(full):
                iter_dirs[int(m.group(1)) if m else RELEASE_DIR] = full
                if len(iter_dirs) >= MAX_ITER_SCAN:
                    break
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
                    f"point there (cp {path}/iter_{newest:07d}/{TRAIN_STATE} {path}/{TRACKER_TRAIN_STATE}; "
                    f"echo {newest} > {path}/{TRACKER_TXT})"
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
        for key in iterations:
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
    usable = [o.iteration for o in others if o.payload and o.iteration is not None]
    fallback = max(usable) if usable else None
    for info in ([inspected] if inspected else []) + others:
        _judge_iteration(info, findings, fallback if info is inspected else None)
    cfg_summary = summarize_run_config(inspected.run_config) if inspected and inspected.run_config else {}
    fmt = inspected.format if inspected else None
    if inspected is not None:
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
                    f"run 'mfsdp.py ckpt {path} --trust-pickle' with torch installed, or check the file is complete",
                )
            )
    if TRACKER_TXT in entries:
        it, release, err = read_tracker_txt(os.path.join(path, TRACKER_TXT))
        tracker[TRACKER_TXT] = RELEASE_DIR if release else (it if err is None else {"error": err})
        txt_iter = RELEASE_DIR if release else it
        if err:
            findings.append(
                Finding(
                    "MFSDP-CKPT-TRACKER-BAD",
                    "error",
                    os.path.join(path, TRACKER_TXT),
                    f"{TRACKER_TXT} {err}; Megatron-LM and Bridge exit when parsing it",
                    f"write the last saved iteration number into it (echo N > {os.path.join(path, TRACKER_TXT)})",
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
                f"make them agree: echo {ts_iter} > {os.path.join(path, TRACKER_TXT)}",
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
    """Say which documented conversion applies, with the command; an error when --expect is not met."""
    fmt = info.format
    src = info.path
    hf_id = cfg.get("model.hf_model_id") or "<HF model id or path>"
    tp = cfg.get("model.tensor_model_parallel_size") or 1
    cp = cfg.get("model.context_parallel_size") or 1
    ep = cfg.get("model.expert_model_parallel_size") or 1
    par = f"--tp {tp} --cp {cp} --ep {ep}"
    glu = cfg.get("model.gated_linear_unit")
    # checkpoint_inspector cannot tell gated (SwiGLU/GeGLU) fc1 weights from plain ones: --swiglu is manual.
    swiglu = (
        "--swiglu"
        if _truthy(glu)
        else ""
        if glu is False
        else "[--swiglu if the MLP is SwiGLU (model.gated_linear_unit=true)]"
    )
    inspector = (
        f"torchrun --nproc_per_node=<gpus> {MLM_INSPECTOR} convert-torch-dist-to-fsdp-dtensor "
        f"{src} <output_dir> {swiglu}"
    ).rstrip()
    conversions = {
        ("torch_dist", "fsdp_dtensor"): (
            f"Megatron-LM (run from an NVIDIA/Megatron-LM checkout, on GPUs): {inspector}"
        ),
        ("hf", "fsdp_dtensor"): (
            f"Bridge (NVIDIA-NeMo/Megatron-Bridge checkout): torchrun --nproc_per_node=<gpus> "
            f"{BRIDGE_MFSDP_CONVERT} import --hf-model {src} --megatron-path <output_dir> {par} "
            "--ckpt-format fsdp_dtensor"
        ),
        ("fsdp_dtensor", "hf"): (
            f"Bridge: torchrun --nproc_per_node=<gpus> {BRIDGE_MFSDP_CONVERT} export --hf-model {hf_id} "
            f"--megatron-path {src} --hf-path <output_dir> {par} "
            "--ckpt-format fsdp_dtensor"
        ),
        ("fsdp_dtensor", "torch_dist"): (
            "no direct tool: export to Hugging Face with Bridge's "
            f"'{BRIDGE_MFSDP_CONVERT} export ...' then import with '{BRIDGE_CONVERT_SH} import --hf-model "
            "<hf_dir> --megatron-path <output_dir>' (torch_dist)"
        ),
        ("hf", "torch_dist"): (
            f"Bridge: {BRIDGE_CONVERT_SH} import --executor local --device gpu --hf-model {src} "
            "--megatron-path <output_dir>"
        ),
        ("torch", "torch_dist"): (
            "Megatron-LM: run its pretrain script once with --ckpt-format torch --load <root> "
            "--ckpt-convert-format torch_dist --ckpt-convert-save <output_dir> (it saves and exits)"
        ),
        ("torch", "fsdp_dtensor"): (
            "two steps: Megatron-LM --ckpt-convert-format torch_dist --ckpt-convert-save <dir> (torch -> "
            f"torch_dist), then {MLM_INSPECTOR} convert-torch-dist-to-fsdp-dtensor <dir>/torch/iter_N <output_dir>"
        ),
        ("torch_dist", "hf"): (
            f"Bridge: {BRIDGE_CONVERT_SH} export --executor local --device gpu --hf-model {hf_id} "
            f"--megatron-path {src} --hf-path <output_dir>"
        ),
    }
    if expect:
        if fmt != expect:
            how = conversions.get((fmt, expect), "no documented conversion path between these formats")
            findings.append(
                Finding(
                    "MFSDP-CKPT-EXPECT",
                    "error",
                    info.path,
                    f"expected {expect!r} but the checkpoint is {fmt!r}",
                    how,
                    {"expected": expect, "found": fmt},
                )
            )
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
                conversions[(fmt, target)],
                {"from": fmt, "to": target},
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
                conversions[("fsdp_dtensor", "hf")],
                {"from": fmt, "to": "hf"},
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
