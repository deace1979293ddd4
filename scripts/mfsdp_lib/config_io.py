"""Loading Megatron-Bridge configs into an effective ``{section: {key: value}}`` dict.

Bridge configs reach users in three shapes, and ``check``/``enable`` accept all three:

* a full ``run_config.yaml`` (what ``ConfigContainer.to_yaml()`` writes into every
  checkpoint): every field, with ``_target_`` keys naming the classes;
* a partial override file with a few sections (``ddp:``, ``checkpoint:`` ...);
* Hydra-style ``section.key=value`` overrides from the command line.

The effective config is layered the way Bridge layers them: the Bridge 0.6.x defaults
of every field the rules read (``schema.FIELDS``), optionally a full BASE config (what a
recipe launcher applies a partial ``--config-file`` to), then the file (the embedded
Llama 3 8B recipe dump when no file is given), then the overrides.

Values are coerced the way OmegaConf's typed nodes coerce them, because that is what a
user expects from Bridge's YAML: ``"True"``, ``"yes"`` and ``3`` become a bool, ``"4"``
an int; ``"maybe"`` for a bool or ``2.5`` for an int are rejected. (Bridge's own merge
goes through an untyped ``OmegaConf.create`` dict, so it would store such a value
unchecked and fail later, or never: rejecting it here is the point.) Enum values (the
sharding strategy, the checkpoint format ...) must be one of the allowed values: Bridge
stores ``optim_grad_params`` silently.

Everything the user got wrong raises ``InputError`` with one line (a did-you-mean for
unknown sections and keys, the line number for YAML syntax errors), which the CLI
prints before exiting 2.

Speed: this module imports only ``yaml`` (with the C loader when available); ``difflib``
is imported only to build a did-you-mean.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence

from . import schema as S
from .findings import InputError

try:
    import yaml
except ImportError:  # reported as one line when a YAML file must be read (see _need_yaml)
    yaml = None
    _Loader = None
else:
    try:  # libyaml: several times faster than the pure-Python loader on an 800-line dump
        _Loader = yaml.CSafeLoader
    except AttributeError:  # PyYAML built without libyaml
        _Loader = yaml.SafeLoader

HERE = os.path.dirname(os.path.abspath(__file__))
EMBEDDED_DEFAULT = os.path.join(os.path.dirname(HERE), "data", "llama3_8b_pretrain.yaml")
EMBEDDED_NAME = "embedded Llama 3 8B pretrain recipe (Bridge 0.6.2)"

MAX_FILE_BYTES = 16 * 1024 * 1024  # a run_config.yaml is ~30 KB; anything this large is not a config
# A run_config.yaml nests 4 levels deep. libyaml's C composer recurses once per level and overflows the C stack
# (a segfault, no exception) somewhere past 20,000 levels, which a 60 KB line of "- - - ..." reaches.
MAX_YAML_DEPTH = 100
# A full run_config.yaml dump composes to ~1,500 nodes and uses no aliases; these bound what hostile YAML can cost.
# MAX_YAML_NODES bounds the values aliases ADD (a node reached again through an alias counts each time): the plain
# nodes of a file are bounded by MAX_FILE_BYTES already, and a legitimate dataset.blend can list 250,000 paths.
MAX_YAML_ALIASES = 100
MAX_YAML_NODES = 200_000

# OmegaConf BooleanNode spellings (case-insensitive), plus any int-parsable string (!= 0).
_TRUE = ("y", "yes", "on", "true")
_FALSE = ("n", "no", "off", "false")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$|^[+-]?(inf|nan)$", re.I)

_embedded_cache: dict | None = None

# Characters Python's str.splitlines() breaks on (and other controls): an error message is
# printed as ONE stderr line, so user text echoed into it must not contain them.
_BREAKS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")


def one_line(text: str) -> str:
    return _BREAKS.sub(" ", str(text)).strip()


def input_error(msg: str) -> InputError:
    """An InputError whose message is guaranteed to be a single line."""
    return InputError(one_line(msg))


# --------------------------------------------------------------------------- reading


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words a user recognises."""
    import stat

    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_regular(path: str, limit: int, what: str = "file") -> bytes:
    """The bytes of the REGULAR file ``path`` (at most ``limit``), or InputError saying why not.

    Only regular files are read: a named pipe without a writer blocks ``open()`` forever, a device such as
    /dev/zero never ends, and a socket cannot be opened. The kind is checked with ``stat`` before opening,
    the file is opened with O_NONBLOCK (so a path swapped for a FIFO in between cannot hang the open) and
    checked again with ``fstat`` on the open descriptor, and at most ``limit + 1`` bytes are read.
    """
    import stat

    if "\x00" in path:
        raise input_error(f"{path!r}: not a valid file name (contains a NUL byte)")
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise input_error(f"{path}: is {file_kind(st.st_mode)}, expected a regular {what}")
        if st.st_size > limit:
            raise input_error(f"{path}: {st.st_size} bytes is too large for a {what} (the limit is {limit} bytes)")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise input_error(f"{path}: is {file_kind(os.fstat(fd).st_mode)}, expected a regular {what}")
            chunks, size = [], 0
            while size <= limit:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
        finally:
            os.close(fd)
        if len(data) > limit:
            raise input_error(f"{path}: more than {limit} bytes is too large for a {what} (the limit is {limit} bytes)")
    except FileNotFoundError:
        raise input_error(f"{path}: no such file") from None
    except PermissionError:
        raise input_error(f"{path}: permission denied") from None
    except (OSError, ValueError) as exc:
        raise input_error(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    return data


def read_text(path: str) -> str:
    """The file's text, or InputError naming what is wrong with it."""
    if "\x00" in path:
        raise input_error(f"{path!r}: not a valid file name (contains a NUL byte)")
    if os.path.isdir(path):
        raise input_error(f"{path}: is a directory, expected a YAML config file (a run_config.yaml or overrides)")
    data = read_regular(path, MAX_FILE_BYTES, "config file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise input_error(f"{path}: not UTF-8 text (byte {exc.start}); is this a YAML file?") from None


def _need_yaml() -> None:
    if yaml is None:
        raise input_error(
            "PyYAML is not installed for this Python; install it with: "
            f"{os.path.basename(sys.executable) or 'python3'} -m pip install PyYAML"
        )


def parse_yaml(text: str, name: str) -> dict:
    """Parse YAML text into a mapping; InputError with the line for syntax errors."""
    data = safe_yaml(text, name)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise input_error(
            f"{name}: the top level must be a mapping of sections (ddp:, checkpoint:, ...), found a {_yaml_type(data)}"
        )
    for k in data:
        if not isinstance(k, str):
            raise input_error(f"{name}: top-level key {k!r} is not a section name")
    return data


def safe_yaml(text: str, name: str, loader=None):
    """Bounded, strict YAML loading: the one way this skill turns YAML text into data.

    On top of PyYAML's safe loader (no Python objects are ever built):

    * nesting deeper than ``MAX_YAML_DEPTH`` is refused before libyaml composes the document (its C
      composer recurses per level and crashes the interpreter on a deep enough document);
    * more than ``MAX_YAML_ALIASES`` aliases, or a document whose aliases expand to more than
      ``MAX_YAML_NODES`` nodes (the "billion laughs" bomb: 9 anchors of 9 aliases each stand for 9**9
      values), is refused; Bridge configs use no aliases at all;
    * a duplicate key in any mapping is an error naming the key and both lines. PyYAML silently keeps
      the last value, while OmegaConf's loader, which Bridge uses to read a config file
      (``OmegaConf.load`` in megatron/bridge/training/utils/omegaconf_utils.py), raises "found duplicate
      key" (omegaconf 2.3.1 omegaconf/_utils.py, OmegaConfLoader.construct_mapping).

    Returns the loaded value (None for an empty document); raises InputError otherwise.
    """
    _need_yaml()
    if "\x00" in text:
        raise input_error(f"{name}: contains NUL bytes; not a YAML file")
    loader_cls = loader or _Loader
    assert loader_cls is not None  # _need_yaml() above: PyYAML is there
    try:
        depth, aliases = _scan_events(text, loader_cls)
        if depth > MAX_YAML_DEPTH:
            raise input_error(f"{name}: nested more than {MAX_YAML_DEPTH} levels deep; not a Bridge config")
        if aliases > MAX_YAML_ALIASES:
            raise input_error(
                f"{name}: more than {MAX_YAML_ALIASES} YAML aliases (*name); Bridge configs use none, "
                "and many aliases can expand into an enormous document"
            )
        ld = loader_cls(text)
        try:
            node = ld.get_single_node()
            if node is None:
                return None
            _check_nodes(node, name)
            return ld.construct_document(node)
        finally:
            ld.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        what = (exc.problem or exc.context or "syntax error").strip()
        raise input_error(f"{name}: YAML syntax error at {where}: {what}") from None
    except yaml.YAMLError as exc:
        raise input_error(
            f"{name}: YAML error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    except (RecursionError, ValueError, OverflowError, MemoryError) as exc:
        raise input_error(f"{name}: cannot parse YAML: {type(exc).__name__}") from None


def _check_nodes(root, name: str) -> None:
    """Walk the composed node graph once (iteratively): duplicate keys, and the size aliases expand to.

    An alias is the same node object reached again; every visit after a node's first is a value the alias
    adds, as a consumer that walks the loaded data would see it. Those repeats are what is bounded
    (``MAX_YAML_NODES``), not the plain nodes, however many a long list holds.
    """
    stack = [(root, "")]
    seen_nodes: set[int] = set()
    repeated = 0
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:
            repeated += 1
            if repeated > MAX_YAML_NODES:
                raise input_error(
                    f"{name}: its YAML aliases expand to more than {MAX_YAML_NODES} repeated values (each alias "
                    "repeats a whole subtree); not a Bridge config"
                )
        else:
            seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        stack.append((value_node, path))
                        continue
                    key = key_node.value
                    here = f"{path}.{key}" if path else key
                    if key in seen:
                        raise input_error(
                            f"{name}: duplicate key '{here}' at line {key_node.start_mark.line + 1} (first at line "
                            f"{seen[key] + 1}); YAML would keep only the last value silently, and Bridge's loader "
                            "(OmegaConf) rejects the file: keep one"
                        )
                    seen[key] = key_node.start_mark.line
                else:
                    here = path
                    stack.append((key_node, path))
                stack.append((value_node, here))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                if isinstance(item, yaml.ScalarNode) and id(item) not in seen_nodes:
                    seen_nodes.add(id(item))  # a plain list item: nothing below it to check (long lists stay fast)
                else:
                    stack.append((item, f"{path}[{i}]"))


def _scan_events(text: str, loader=None) -> tuple[int, int]:
    """(nesting depth, alias count) of ``text`` from libyaml's event stream, which is produced iteratively
    and so cannot overflow the stack the way composing the document can; stops early past the limits."""
    depth = deepest = aliases = 0
    for event in yaml.parse(text, Loader=loader or _Loader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_YAML_DEPTH:
                break
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_YAML_ALIASES:
                break
    return deepest, aliases


def yaml_depth(text: str, loader=None) -> int:
    """How deep collections nest in ``text`` (stops counting past MAX_YAML_DEPTH)."""
    return _scan_events(text, loader)[0]


def load_yaml(path: str) -> dict:
    return parse_yaml(read_text(path), path)


def embedded_default() -> dict:
    """The embedded Llama 3 8B recipe dump (parsed once per process)."""
    global _embedded_cache
    _need_yaml()
    if _embedded_cache is None:
        with open(EMBEDDED_DEFAULT, encoding="utf-8") as fh:
            _embedded_cache = yaml.load(fh.read(), Loader=_Loader)
    return _embedded_cache


# --------------------------------------------------------------------------- overrides


def parse_value(text: str):
    """A Hydra override value: null, bools, ints, floats, quoted strings, [lists], else a string."""
    t = text.strip()
    if t == "":
        return ""
    low = t.lower()
    if low == "null":
        return None
    if low in ("true", "false"):
        return low == "true"
    if _INT.match(t):
        return int(t)
    if _FLOAT.match(t):
        return float(t)
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return re.sub(r"\\(.)", r"\1", t[1:-1])  # Hydra quoted string: backslash escapes the next char
    if t[0] == "[" and t[-1] == "]":
        inner = t[1:-1].strip()
        return [parse_value(x) for x in inner.split(",")] if inner else []
    if t[0] == "{" and t[-1] == "}":
        return _parse_flat_dict(t) if t[1:-1].strip() else {}
    return t


def _parse_flat_dict(text: str):
    """A flat Hydra dict ``{k:v,...}`` (the ``{_target_:torch.float32,_call_:false}`` form Bridge
    instantiates into a dtype), or the text itself when it is not one (nested or malformed)."""
    out = {}
    for part in text[1:-1].split(","):
        key, sep, value = part.partition(":")
        key = key.strip()
        if not sep or not _KEY.match(key) or any(c in value for c in "{}[]"):
            return text
        out[key] = parse_value(value)
    return out


# A word that names a config key: [+|++]section.key[.sub...] (Hydra's add / force-add prefixes allowed).
_DOTTED_KEY = re.compile(r"^\+{0,2}([A-Za-z_][A-Za-z0-9_]*)(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json")  # model.yaml is a file name, not the key model.yaml


def refuse_unusable_override(item: str) -> None:
    """InputError for what Hydra users type that is no ``section.key=value`` override; nothing otherwise.

    * ``~section.key`` (Hydra's deletion): Bridge's launchers parse it, then copy back into the config only the
      keys still present (megatron/bridge/training/utils/omegaconf_utils.py :: process_config_with_overrides:
      parse_hydra_overrides, then apply_overrides, which sets each key it is given), so the recipe's value stays
      and the deletion changes nothing. Not supported here either: clearing a value is ``section.key=null``.
    * ``section.key`` without ``=VALUE`` (and no file of that name): an override missing its value.
    Anything else (a file name, a real override) passes; the callers decide what it is.
    """
    if not isinstance(item, str):
        return
    word = item.strip()
    if word.startswith("~"):
        key = word[1:].partition("=")[0].lstrip("+")
        raise input_error(
            f"{item!r}: Hydra's deletion (~KEY) is not supported: Bridge's launchers accept it but then keep the "
            f"recipe's value (only the keys left are applied), so it changes nothing; to clear the value write "
            f"{key or 'section.key'}=null"
        )
    if "=" in word or os.path.exists(word) or word.lower().endswith(_CONFIG_SUFFIXES):
        return
    m = _DOTTED_KEY.match(word)
    if m and m.group(1) in S.CONTAINER_KEYS:
        raise input_error(f"{item!r}: an override missing =VALUE; write it as {word.lstrip('+')}=VALUE")


def parse_override(item: str) -> tuple[str, object]:
    """``section.key=value`` (also ``+section.key=value`` / ``++...``) -> (dotted path, value)."""
    if not isinstance(item, str) or "=" not in item:
        raise input_error(f"override {item!r}: expected section.key=value (e.g. ddp.use_megatron_fsdp=true)")
    path, _, value = item.partition("=")
    path = path.strip().lstrip("+")
    parts = path.split(".")
    if not path or not all(_KEY.match(p) for p in parts):
        raise input_error(f"override {item!r}: '{path}' is not a dotted key like ddp.use_megatron_fsdp")
    return path, parse_value(value)


def parse_env(items: Sequence[str]) -> dict:
    """``["NAME=VALUE", ...]`` -> ``{NAME: VALUE}``; InputError for a malformed item."""
    out = {}
    for item in items or ():
        name, sep, value = str(item).partition("=")
        if not sep or not _ENV_NAME.match(name):
            raise input_error(f"--env {item!r}: expected NAME=VALUE (e.g. --env CUDA_DEVICE_MAX_CONNECTIONS=32)")
        out[name] = value
    return out


# --------------------------------------------------------------------------- validation / coercion


def _yaml_type(v) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "mapping"
    return type(v).__name__


def _article(typ: str) -> str:
    return f"an {typ}" if typ[0] in "aeiou" else f"a {typ}"


def _unknown_hint(section: str, key: str, known) -> str:
    why = S.NOT_IN_THIS_RELEASE.get(f"{section}.{key}")
    return f": {why}" if why else _did_you_mean(key, set(known) | family_keys(section))


def _did_you_mean(word: str, choices) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def coerce(path: str, value, where: str = ""):
    """Coerce ``value`` for schema field ``path`` like OmegaConf would; InputError if it cannot."""
    rec = S.FIELDS.get(path)
    if rec is None:
        return value
    typ, _default, choices, nullable, _src = rec
    loc = f"{where}: " if where else ""
    if value is None:
        if nullable or path in S.REQUIRED or path in S.FAMILY_NULLABLE:
            return None
        raise input_error(f"{loc}{path}=null is not allowed: expected {_article(typ)}")
    bad = f"{loc}{path}={value!r}: expected {_article(typ)}"
    if typ == S.BOOL:
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return value != 0
        if isinstance(value, str):
            s = value.strip()
            if _INT.match(s):
                return int(s) != 0
            if s.lower() in _TRUE:
                return True
            if s.lower() in _FALSE:
                return False
        raise input_error(f"{bad} (true/false, yes/no, on/off or an integer)")
    if typ == S.INT:
        if isinstance(value, bool):
            raise input_error(f"{bad}, found a bool")
        if isinstance(value, int):
            return value
        if isinstance(value, str) and _INT.match(value.strip()):
            return int(value.strip())
        raise input_error(f"{bad}, found {_yaml_type(value)} {value!r}")
    if typ == S.FLOAT:
        if isinstance(value, bool):
            raise input_error(f"{bad}, found a bool")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str) and _FLOAT.match(value.strip()):
            return float(value.strip())
        raise input_error(f"{bad}, found {_yaml_type(value)} {value!r}")
    if typ == S.STR:
        if isinstance(value, (dict, list)):
            raise input_error(f"{bad}, found a {_yaml_type(value)}")
        if isinstance(value, bool) or not isinstance(value, str):  # OmegaConf's StringNode stores str(True) == "True"
            value = str(value)
        if choices is not None and value not in choices:
            raise input_error(
                f"{loc}{path}={value!r} is not one of {', '.join(choices)}"
                f"{_did_you_mean(value, choices)}; Bridge would accept it silently and fail later"
            )
        return value
    if typ == S.LIST:
        if not isinstance(value, list):
            raise input_error(f"{bad}, found {_yaml_type(value)} {value!r}")
        return value
    if typ == S.DICT:
        if not isinstance(value, dict):
            raise input_error(f"{bad}, found a {_yaml_type(value)}")
        return value
    return value


def _check_env_vars(value, where: str) -> None:
    loc = f"{where}: " if where else ""
    if not isinstance(value, dict):
        raise input_error(f"{loc}env_vars must be a mapping NAME: value, found a {_yaml_type(value)}")
    for name, v in value.items():
        if not isinstance(name, str) or not name:
            raise input_error(f"{loc}env_vars: variable names must be non-empty strings, found {name!r}")
        if not isinstance(v, (str, int, float, bool)):
            raise input_error(
                f"{loc}env_vars.{name}: must be a scalar, found a {_yaml_type(v)} "
                "(Bridge's apply_environment_variables raises TypeError)"
            )


SECTION_KEYS_FILE = os.path.join(os.path.dirname(HERE), "data", "section_keys.json")
_section_keys_cache: dict | None = None


def family_keys(section: str) -> frozenset:
    """Every field a section can hold across the recipe families (model: MLA, hybrid Mamba, MoE, VLM ...).

    Read from ``data/section_keys.json`` (generated from the pinned wheels by tests/gen_section_keys.py),
    once, and only when a key is not among the embedded recipe's: the common path pays nothing.
    """
    global _section_keys_cache
    if _section_keys_cache is None:
        import json

        try:
            with open(SECTION_KEYS_FILE, encoding="utf-8") as fh:
                raw = json.load(fh)
        except (OSError, ValueError):
            raw = {}
        _section_keys_cache = {k: frozenset(v) for k, v in raw.items() if isinstance(v, list)}
    return _section_keys_cache.get(section, frozenset())


def _is_known(section: str, key: str, known: set | None) -> bool:
    return known is None or key in known or key in family_keys(section)


def _known_keys(section: str, user_section: Mapping | None) -> set | None:
    """Keys Bridge knows in ``section``, or None when we cannot tell (another class).

    The embedded recipe's keys and the rule table's; ``_is_known`` adds the other families' fields.
    """
    if section == "mixed_precision":
        return set(S.MIXED_PRECISION_KEYS) | {"_target_"}
    if section == "comm_overlap":
        return set(S.COMM_OVERLAP_KEYS) | {"_target_"}
    base = embedded_default().get(section)
    if not isinstance(base, dict):
        return None
    if user_section is not None:
        target = user_section.get("_target_")
        if target is not None and target != base.get("_target_"):
            return None  # another class (another model provider, dataset type): its own fields
    keys = set(base)
    keys.update(p.split(".", 1)[1] for p in S.FIELDS if p.startswith(section + "."))
    return keys


def validate_section(section: str, value, where: str):
    """Check and coerce one top-level section of a file; returns the coerced value."""
    loc = f"{where}: " if where else ""
    if section not in S.CONTAINER_KEYS and section != "_target_":
        raise input_error(
            f"{loc}unknown section '{section}'{_did_you_mean(section, S.CONTAINER_KEYS)}; "
            f"sections are {', '.join(sorted(S.CONTAINER_KEYS))}"
        )
    if section == "_target_":
        return value
    if section == "env_vars":
        value = {} if value is None else value
        _check_env_vars(value, where)
        return value
    if section == "mixed_precision":
        if value is None:
            return None
        if isinstance(value, str):
            if value not in S.MIXED_PRECISION_PRESETS:
                raise input_error(
                    f"{loc}mixed_precision={value!r} is not a Bridge preset"
                    f"{_did_you_mean(value, S.MIXED_PRECISION_PRESETS)} (Bridge raises ValueError "
                    "'Unknown mixed-precision recipe')"
                )
            return value
        if not isinstance(value, dict):
            raise input_error(f"{loc}mixed_precision must be a preset name or a mapping, found a {_yaml_type(value)}")
    if value is None:
        if section in ("ddp", "dist", "checkpoint", "train", "model", "optimizer"):
            raise input_error(f"{loc}section '{section}' is null; Bridge needs it (give a mapping or leave it out)")
        return None
    if not isinstance(value, dict):
        if any(p.startswith(section + ".") for p in S.FIELDS) or section in ("ddp", "dist", "checkpoint"):
            raise input_error(f"{loc}section '{section}' must be a mapping of keys, found a {_yaml_type(value)}")
        return value
    known = _known_keys(section, value)
    out = {}
    for key, v in value.items():
        if not isinstance(key, str):
            raise input_error(f"{loc}{section}: key {key!r} is not a field name")
        if not _is_known(section, key, known):
            raise input_error(f"{loc}unknown key '{section}.{key}'{_unknown_hint(section, key, known)}")
        out[key] = coerce(f"{section}.{key}", v, where)
    return out


def set_path(cfg: dict, path: str, value, where: str = "override") -> None:
    """Apply one override to the effective config, validating it like a file value."""
    parts = path.split(".")
    section = parts[0]
    if len(parts) == 1:
        cfg[section] = validate_section(section, value, where)
        return
    if section not in S.CONTAINER_KEYS:
        raise input_error(f"{where} {path}: unknown section '{section}'{_did_you_mean(section, S.CONTAINER_KEYS)}")
    if section == "env_vars":
        if len(parts) != 2:
            raise input_error(f"{where} {path}: env_vars takes env_vars.NAME=value")
        env = dict(cfg.get("env_vars") or {})
        env[parts[1]] = value  # null is refused below, as Bridge's apply_environment_variables does
        _check_env_vars(env, where)
        cfg["env_vars"] = env
        return
    node = cfg.get(section)
    if section == "mixed_precision" and isinstance(node, str):
        # Bridge holds a preset as a plain string until runtime_config_update(); a Hydra override of
        # one of its fields fails there too (a string has no keys). Say how to do it instead.
        raise input_error(
            f"{where} {path}: mixed_precision is the preset '{node}', not a mapping; choose another "
            f"preset (mixed_precision=NAME) or write the whole mapping with _target_: "
            f"megatron.bridge.training.mixed_precision.MixedPrecisionConfig"
        )
    if node is None:
        if section in ("mixed_precision", "comm_overlap"):
            node = {}
        else:
            raise input_error(f"{where} {path}: section '{section}' is null in the config")
    if not isinstance(node, dict):
        raise input_error(f"{where} {path}: section '{section}' is a {_yaml_type(node)}, not a mapping")
    node = dict(node)
    if len(parts) > 2:
        # Deeper keys (model.some_struct.field): navigate existing mappings only.
        cur = node
        for p in parts[1:-1]:
            nxt = cur.get(p)
            if not isinstance(nxt, dict):
                raise input_error(f"{where} {path}: '{p}' is not a mapping in section '{section}'")
            cur[p] = nxt = dict(nxt)
            cur = nxt
        cur[parts[-1]] = value
        cfg[section] = node
        return
    key = parts[1]
    nested = node.get("transformer") if section == "model" else None
    if isinstance(nested, dict) and key in nested:  # GPTModelConfig: Bridge proxies model.X to model.transformer.X
        nested = dict(nested)
        nested[key] = coerce(path, value, f"{where} {path}".strip())
        node["transformer"] = nested
        cfg[section] = node
        return
    known = _known_keys(section, node)
    if not _is_known(section, key, known):
        raise input_error(f"{where} {path}: unknown key '{section}.{key}'{_unknown_hint(section, key, known)}")
    node[key] = coerce(path, value, f"{where} {path}".strip())
    cfg[section] = node


# --------------------------------------------------------------------------- the effective config


def _defaults() -> dict:
    return S.section_defaults()


def merge_file(cfg: dict, data: Mapping, where: str) -> dict:
    """Merge a parsed file over ``cfg`` (section by section, key by key)."""
    for section, value in data.items():
        value = validate_section(section, value, where)
        if isinstance(value, dict) and isinstance(cfg.get(section), dict) and section != "env_vars":
            merged = dict(cfg[section])
            merged.update(value)
            cfg[section] = merged
        else:
            cfg[section] = value
    return cfg


def load_file_data(path: str | None) -> tuple[dict, str]:
    """(parsed mapping, display name) of CONFIG, or of the embedded default when None."""
    if path is None:
        return embedded_default(), EMBEDDED_NAME
    path = resolve_config_path(path)
    return load_yaml(path), path


# A checkpoint iteration folder holds the config Bridge wrote as this file.
RUN_CONFIG_NAME = "run_config.yaml"


def resolve_config_path(path: str) -> str:
    """A checkpoint folder (``iter_0000010/``) stands for the ``run_config.yaml`` inside it."""
    try:
        if os.path.isdir(path) and os.path.isfile(os.path.join(path, RUN_CONFIG_NAME)):
            return os.path.join(path, RUN_CONFIG_NAME)
    except ValueError:  # NUL in the path: read_text reports it
        pass
    return path


# ``base`` value meaning "the embedded Llama 3 8B recipe" (``--base embedded``).
EMBEDDED_BASE = "embedded"
# ``base`` value meaning "the file alone, over Bridge's dataclass defaults" (``--base defaults``).
DEFAULTS_BASE = "defaults"

# The ConfigContainer fields that have no default (megatron/bridge/training/config.py: ConfigContainer): a file
# without one of them cannot build a ConfigContainer by itself. It is a --config-file that a recipe launcher
# merges over the recipe's config (training/utils/omegaconf_utils.py: process_config_with_overrides,
# OmegaConf.merge(recipe, yaml)), so judging it over bare dataclass defaults misses what the recipe sets
# (checkpoint saving, the parallel layout, the batch sizes, the model).
REQUIRED_SECTIONS = ("train", "model", "optimizer", "scheduler", "dataset", "logger", "tokenizer", "checkpoint")

# What a recipe sets that a partial file judged alone (over dataclass defaults) does not show.
NOT_SEEN_ALONE = "checkpoint saving and loading, the parallel layout, batch sizes, precision and the model"


def missing_sections(data: Mapping) -> list[str]:
    """The ConfigContainer sections without a default that ``data`` lacks (empty: a full config)."""
    return [s for s in REQUIRED_SECTIONS if s not in data]


def choose_base(base: str | None, data: Mapping) -> str | None:
    """The base a CONFIG is judged over, as ``base_config`` takes it.

    ``--base`` wins (``defaults``: none). Without it, a partial file (``missing_sections``) is judged over
    the embedded Llama 3 8B recipe, the way a recipe launcher applies it; a full config over nothing but
    the dataclass defaults of the fields it leaves out.
    """
    if base == DEFAULTS_BASE:
        return None
    if base is not None:
        return base
    return EMBEDDED_BASE if missing_sections(data) else None


def base_summary(base: str | None, data: Mapping, name: str) -> tuple[dict, str | None]:
    """(the ``base`` JSON object, a one-line note for the text header or None) for CONFIG ``data``."""
    missing = missing_sections(data)
    chosen = choose_base(base, data)
    info: dict = {
        "name": chosen if chosen is not None else (DEFAULTS_BASE if base == DEFAULTS_BASE else None),
        "partial": bool(missing),
        "missing_sections": missing,
    }
    if not missing:
        return info, None
    lacks = f"{name} has no {', '.join(missing)} section{'s' if len(missing) > 1 else ''}"
    if chosen is None:
        note = (
            f"{lacks}: judged alone, over Bridge's dataclass defaults; what a recipe sets is not seen "
            f"({NOT_SEEN_ALONE}). --base RUN_CONFIG.yaml judges it over your recipe's config"
        )
    else:
        over = "the " + EMBEDDED_NAME if chosen == EMBEDDED_BASE else chosen
        note = (
            f"{lacks}: a recipe launcher merges it over its recipe, so it is judged over {over}. "
            "--base RUN_CONFIG.yaml for your recipe's config (any run_config.yaml it wrote), "
            "--base defaults for the file alone"
        )
    return info, note


def base_config(base: str | None) -> dict:
    """Bridge defaults, with a full BASE config merged over them when given.

    BASE is what a partial override file is layered on at launch time: Bridge's recipe
    launchers apply ``--config-file overrides.yaml`` to a recipe, not to bare dataclass
    defaults. ``"embedded"`` is the embedded Llama 3 8B recipe.
    """
    cfg = _defaults()
    if base is None or base == DEFAULTS_BASE:
        return cfg
    if base == EMBEDDED_BASE:
        return merge_file(cfg, embedded_default(), EMBEDDED_NAME)
    base = resolve_config_path(base)
    return merge_file(cfg, load_yaml(base), base)


def load_effective(path: str | None, overrides: Sequence[str] = (), base: str | None = None) -> dict:
    """Bridge defaults [⊕ BASE] ⊕ CONFIG (embedded recipe when None) ⊕ ``section.key=value`` overrides.

    ``base`` is taken as given (``choose_base`` picks the recipe a partial CONFIG is judged over)."""
    data, name = load_file_data(path)
    cfg = merge_file(base_config(base), data, name)
    apply_overrides(cfg, overrides)
    return cfg


def overrides_alone(overrides: Sequence[str]) -> dict:
    """Only the ``section.key=value`` overrides, over no config at all (each validated as ``set_path`` does).

    For ``memory`` when the user names the model another way (--params, --model, --hf-config): every key the
    overrides leave out stays absent, so the estimate assumes for it what it assumes without any config,
    instead of taking the embedded recipe's layout, sequence length and strategy.
    """
    cfg: dict = {}
    for item in overrides or ():
        p, v = parse_override(item)
        section = p.split(".", 1)[0]
        if "." in p and section in S.CONTAINER_KEYS and section not in cfg:
            cfg[section] = {}
        set_path(cfg, p, v, "override")
    return cfg


def apply_overrides(cfg: dict, overrides: Sequence[str]) -> dict:
    for item in overrides or ():
        p, v = parse_override(item)
        set_path(cfg, p, v, "override")
    return cfg


def get(cfg: Mapping, path: str, default=None):
    """Value at a dotted path of a nested mapping, or ``default`` when any part is missing."""
    node = cfg
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


# --------------------------------------------------------------------------- writing


# How long ``edit_lock`` waits for another writer of the same folder (e.g. a second ``enable --in-place``).
EDIT_LOCK_TIMEOUT_S = 60.0


class EditLock:
    """An exclusive ``flock`` on the folder of ``path``, held from reading a file to writing it back.

    ``enable --in-place`` reads CONFIG, computes, and writes it back; two of them at once would each write
    their own result over the other's (a lost update). Holding this lock across the read-modify-write
    serialises them, so every change lands. The lock is taken on the folder itself (an O_RDONLY descriptor;
    Linux and macOS allow flock on it), so no lock file is left in the user's folder, and it is released when
    the descriptor closes, including when the process dies. Where flock is unavailable (Windows, some
    network file systems) no lock is taken; the compare-before-write in ``write_atomic`` still refuses to
    overwrite a file that changed since it was read.
    """

    def __init__(self, path: str, timeout: float = EDIT_LOCK_TIMEOUT_S):
        self.folder = os.path.dirname(os.path.realpath(path)) or "."
        self.timeout = timeout
        self.fd: int | None = None

    def __enter__(self) -> EditLock:
        try:
            import fcntl
        except ImportError:
            return self
        import time

        try:
            fd = os.open(self.folder, os.O_RDONLY)
        except OSError:
            return self  # the write reports the folder's problem in its own words
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.fd = fd
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise input_error(
                        f"{self.folder}: another process has been editing a file here for {self.timeout:.0f} s; "
                        "nothing was written, try again"
                    ) from None
                time.sleep(0.02)
            except OSError:  # flock not supported here
                os.close(fd)
                return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def edit_lock(path: str) -> EditLock:
    """Take the folder lock of ``path`` now (see ``EditLock``); it is released when the result is closed
    or garbage-collected, or at exit."""
    return EditLock(path).__enter__()


def writable_target(path: str, follow_links: bool = True) -> tuple[str, os.stat_result | None]:
    """Where writing ``path`` really goes, and its stat; InputError unless it is a regular file or absent.

    A symbolic link is followed to its target, so the link itself survives (a replaced link would silently
    stop pointing at the user's file). Anything but a regular file is refused: ``os.replace`` over a device
    node, a FIFO or a socket would turn it into a regular file (as root, /dev/null).
    """
    import stat

    if os.path.islink(path) and not follow_links:
        raise input_error(
            f"{path}: is a symbolic link (to {os.readlink(path)}); this output is never written through a link"
        )
    real = os.path.realpath(path) if os.path.islink(path) else path
    try:
        st = os.stat(real)
    except FileNotFoundError:
        if os.path.islink(path):
            raise input_error(
                f"{path}: is a broken symbolic link (to {os.readlink(path)}); nothing was written"
            ) from None
        return real, None
    except OSError as exc:
        raise input_error(f"{path}: cannot write: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise input_error(
            f"{path}: is {file_kind(st.st_mode)}; only a regular file is ever replaced, nothing was written"
        )
    return real, st


def _backup(path: str) -> str:
    """Copy ``path`` to a NEW ``PATH.bak`` (``.bak.1`` ...): created with O_EXCL, so a backup, or anything
    else already there (a link planted under that name), is never overwritten, even by a concurrent run."""
    import shutil

    n = 0
    while True:
        bak = path + ".bak" if n == 0 else f"{path}.bak.{n}"
        try:
            fd = os.open(bak, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            break
        except FileExistsError:
            n += 1
            if n > 10_000:
                raise input_error(f"{path}: 10,000 backups exist already; remove old {path}.bak.* files") from None
        except OSError as exc:  # read-only folder, name too long: the user's input, not a bug
            raise input_error(
                f"{path}: cannot keep a backup at {bak} ({exc.strerror or exc}); nothing was written"
            ) from None
    try:
        with open(path, "rb") as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst)
        shutil.copystat(path, bak)
    except OSError as exc:
        raise input_error(
            f"{path}: cannot keep a backup at {bak} ({exc.strerror or exc}); nothing was written"
        ) from None
    return bak


def write_atomic(
    path: str, text: str, backup: bool = False, expect_text: str | None = None, follow_links: bool = True
) -> str | None:
    """Write ``text`` to ``path`` atomically (temp file in the same folder, fsync, rename).

    Only a regular file (or a new name) is ever written; a symbolic link is written through to its target
    (``writable_target``). With ``backup``, an existing file is first copied to a new ``PATH.bak``
    (``PATH.bak.1`` ... when that exists; never overwritten), so nothing of the user's is lost. With
    ``expect_text``, the write is refused when the file no longer holds that text (someone changed it since
    it was read). Returns the backup path.
    """
    import tempfile

    shown = path
    path, st = writable_target(path, follow_links)
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(folder):
        raise input_error(f"{shown}: folder {folder} does not exist")
    bak = None
    mode = None
    if st is not None:
        mode = st.st_mode & 0o777
        if expect_text is not None:
            try:
                now = read_regular(path, MAX_FILE_BYTES, "config file").decode("utf-8", "replace")
            except InputError:
                now = None
            if now != expect_text:
                raise input_error(f"{shown}: changed while it was being edited; nothing was written, run again")
        if backup:
            bak = _backup(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise input_error(f"{path}: cannot write in {folder}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):  # disk full, quota: one line, and the old file is untouched
            raise input_error(f"{path}: cannot write ({exc.strerror or exc}); the file was left as it was") from None
        raise
    return bak
