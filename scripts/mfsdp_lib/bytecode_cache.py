"""The library's bytecode, cached per user outside the signed skill folder.

Compiling the library is most of what a ``check`` costs: without a cache every call compiles some fifty
modules again. A ``__pycache__`` beside the sources is no option: the skill folder is signed, a ``.pyc``
there is a file the signature does not cover (``skill_signature.py verify`` reports it), and a planted one
could run instead of the signed source. So the entry point (``scripts/mfsdp.py``) points Python's
``sys.pycache_prefix`` at a folder of the user's own, where Python mirrors each source's absolute path:

* ``PYTHONPYCACHEPREFIX`` (or ``-X pycache_prefix``) when the user set one: the interpreter already reads
  every module's bytecode from there, so ours goes there too (never when it lies inside the skill folder);
* else ``$XDG_CACHE_HOME/nemo-mbridge-perf-megatron-fsdp/pycache`` (an absolute ``XDG_CACHE_HOME`` only, as
  the XDG base-directory spec says), else ``~/.cache/nemo-mbridge-perf-megatron-fsdp/pycache``;
* that default folder is made ``0700`` and used only while it is a real directory (not a link) owned by this
  user with no group or other access, inside a parent nobody else can write; anything else, or a folder that
  cannot be made, means no cache: every module is compiled from the signed source, silently, as before.

The bytecode the tool writes is *checked-hash* (PEP 552): the header holds a hash of the source, and Python
compares it with the source on every import instead of trusting the source's size and modification time, so
a skill folder replaced by another version whose files keep size and time (archives with normalised times)
never runs stale bytecode. Python's own import system only writes timestamp bytecode, so it writes none here
(``sys.dont_write_bytecode`` stays on); ``store()`` writes the modules this run imported when the command
ends (the standard library's and PyYAML's too: under a prefix Python reads theirs from it as well). ``PYTHONDONTWRITEBYTECODE`` / ``-B`` is honoured: the cache is read, never written.

Why this is no weaker than Python's own cache of site-packages (see SECURITY.md): whoever can write that
folder is this user (or root), who can already change the user's site-packages, shell start-up files and the
skill folder itself; the hash check is about staleness, not about a hostile writer, and the ownership and
permission checks are what keeps other users out.
"""

from __future__ import annotations

import os
import stat
import sys

APP = "nemo-mbridge-perf-megatron-fsdp"
# A prefix that cannot exist (a path under the null device): Python then neither reads nor writes any
# __pycache__ entry. The entry point sets it before importing anything of the library, and it stays when
# there is no usable cache folder.
NO_CACHE = os.path.join(os.devnull, "no-bytecode")
# Checked-hash bytecode: PEP 552 flags (bit 0: hash-based, bit 1: check the source against it on import).
PEP552_CHECKED_HASH = 0b11
HEADER_BYTES = 16  # magic (4), flags (4), source hash (8)
PRIVATE_MODE = 0o700  # the folders the tool makes: only this user may list, read or write them

_state: dict = {"prefix": None}
# Source files the import system compiled in this run (heard through the "compile" audit event): the modules
# whose bytecode is missing or stale in the cache. Only those are written, so a warm call reads nothing twice.
_compiled: set[str] = set()


def _heard(event: str, args: tuple) -> None:
    if event == "compile" and len(args) > 1 and isinstance(args[1], str):
        _compiled.add(args[1])


def app_cache(environ=None) -> str:
    """``$XDG_CACHE_HOME/<APP>`` (absolute values only), else ``~/.cache/<APP>``: the user's folder for this
    skill, which also holds the developers' environments (``mfsdp_lib/devenv.py``)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):  # the spec: a relative path is invalid and is ignored
        home = env.get("HOME") or os.path.expanduser("~")
        base = os.path.join(home, ".cache")
    return os.path.join(base, APP)


def default_dir(environ=None) -> str:
    """``$XDG_CACHE_HOME/<APP>/pycache`` (absolute values only), else ``~/.cache/<APP>/pycache``."""
    return os.path.join(app_cache(environ), "pycache")


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _private(path: str, uid: int) -> bool:
    """A real directory (no link) of this user's, which no group or other user can enter or write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not (st.st_mode & 0o077)


def _safe_parent(path: str, uid: int) -> bool:
    """A parent nobody else can write (else our folder could be renamed away and replaced): this user's or
    root's, and not group/other writable unless sticky (as /tmp: only the owner may rename in it)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if st.st_uid not in (uid, 0):
        return False
    return not (st.st_mode & 0o022) or bool(st.st_mode & stat.S_ISVTX)


def prepare(folder: str) -> bool:
    """Make ``folder`` and its app parent (``0700``) when missing; True when both are private to this user."""
    uid = getattr(os, "geteuid", lambda: None)()
    if uid is None:  # no POSIX ownership to check (not a platform the tools ship for): no cache
        return False
    app = os.path.dirname(folder)
    try:
        os.makedirs(os.path.dirname(app), mode=PRIVATE_MODE, exist_ok=True)
        for path in (app, folder):
            try:
                os.mkdir(path, PRIVATE_MODE)
            except FileExistsError:
                pass
    except OSError:
        return False
    return _safe_parent(os.path.dirname(app), uid) and _private(app, uid) and _private(folder, uid)


def choose(skill_root: str, explicit: str | None, environ=None) -> str | None:
    """The cache folder to use, or None for no cache.

    ``explicit``: the ``sys.pycache_prefix`` the interpreter started with (``PYTHONPYCACHEPREFIX``). It is the
    user's own choice for every module the interpreter loads, so it is used as it is, unless it lies inside the
    skill folder, where no bytecode may be written.
    """
    if explicit:
        return None if _inside(explicit, skill_root) else os.path.abspath(explicit)
    folder = default_dir(environ)
    if _inside(folder, skill_root) or not prepare(folder):
        return None
    return folder


def enable(skill_root: str, explicit: str | None) -> str | None:
    """Point ``sys.pycache_prefix`` at the chosen folder (``NO_CACHE`` when none); returns the folder."""
    folder = choose(skill_root, explicit)
    sys.pycache_prefix = folder or NO_CACHE
    sys.dont_write_bytecode = True  # the import system would write timestamp bytecode; store() writes ours
    _state["prefix"] = folder
    if folder and not sys.flags.dont_write_bytecode:
        sys.addaudithook(_heard)
    return folder


def _fresh(cached: str, source: bytes, magic: bytes, source_hash) -> bool:
    try:
        with open(cached, "rb") as fh:
            head = fh.read(HEADER_BYTES)
    except OSError:
        return False
    return (
        len(head) == HEADER_BYTES
        and head[:4] == magic
        and int.from_bytes(head[4:8], "little") == PEP552_CHECKED_HASH
        and head[8:] == source_hash(source)
    )


def store() -> int:
    """Write checked-hash bytecode for the modules this run imported whose cache entry is missing or stale;
    returns how many were written. Silent: a cache that cannot be written only costs speed.

    Every module imported after ``enable()``, not only the skill's: while the prefix points at the cache,
    Python looks there for the standard library's and PyYAML's bytecode too, not in their own
    ``__pycache__`` (what ``PYTHONPYCACHEPREFIX`` does for every module of the interpreter).
    """
    prefix = _state["prefix"]
    if not prefix or sys.flags.dont_write_bytecode or sys.pycache_prefix != prefix:
        return 0
    import importlib.util
    import marshal

    magic, source_hash = importlib.util.MAGIC_NUMBER, importlib.util.source_hash
    under = prefix.rstrip(os.sep) + os.sep  # choose() made sure the prefix is outside the skill folder
    written = 0
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        origin, cached = getattr(spec, "origin", None), getattr(spec, "cached", None)
        # spec.cached is the prefix joined with the source's path (no link resolution needed): a string test
        if not (origin and cached and origin.endswith(".py") and cached.startswith(under)):
            continue
        if origin not in _compiled:
            continue  # read from the cache (its hash matched the source), or not compiled by this run
        try:
            with open(origin, "rb") as fh:
                source = fh.read()
            if _fresh(cached, source, magic, source_hash):
                continue
            code = compile(source, origin, "exec", dont_inherit=True)
            data = magic + PEP552_CHECKED_HASH.to_bytes(4, "little") + source_hash(source) + marshal.dumps(code)
            _write_atomic(cached, data)
            written += 1
        except (OSError, SyntaxError, ValueError):
            continue
    return written


def _write_atomic(path: str, data: bytes) -> None:
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=PRIVATE_MODE, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
