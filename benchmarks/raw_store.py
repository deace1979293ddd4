"""The raw GPU results, kept as one archive and read through one resolver.

Why: the benchmarks' raw files (GPU logs, engine reports, the configs the runs built: several hundred
files, some 10 MB) are the maintainers' evidence behind BENCHMARK.md, not something the agent reads. The
repository root is the skill folder and the ``skills`` installer copies every file of it, so as loose files
they would land in every user's project, where an agent's searches walk them. Kept as one deterministic
``benchmarks/results/raw.tar.xz`` (about 0.2 MB), an install carries one opaque file that the signature still
covers, and the evidence is unchanged.

What reads it: every reader (the result scripts under ``benchmarks/``, the tests, the eval report) asks
``folder()`` / ``path(...)`` for a file, and the archive is extracted once into the user's cache:
``<cache>/raw-results/<first KEY_HEX hex digits of the archive's SHA-256>/`` with ``<cache>`` the folder the
library's bytecode cache uses (``bytecode_cache.app_cache``: ``$XDG_CACHE_HOME`` or ``~/.cache``, then the
skill's name). Keyed by the archive's digest, a changed archive gets a new folder and a stale one is never
read. Extraction is into a private temporary folder renamed into place, so a reader never sees half a tree
and two readers at once both end with the same complete one. Every member is checked first: regular files
only (no links, devices or folders of their own), a relative POSIX name with no ``..``, no duplicates, and
bounds on the count and sizes (``MAX_MEMBERS``, ``MAX_FILE_BYTES``, ``MAX_TOTAL_BYTES``).

What results print: result JSONs and BENCHMARK.md keep naming ``benchmarks/results/raw/...`` (``LOGICAL``),
the folder as it was recorded. ``logical(p)`` turns a path in the extracted (or a loose) folder into that
name; ``resolve(arg)`` turns such a name, given on a command line, back into a folder that exists, so the
commands BENCHMARK.md prints still run from the repository root.

Determinism: the archive holds files only, sorted by name, with mtime ``MTIME``, uid/gid 0, no owner names,
mode 0644 (0755 where the source was executable), GNU tar headers (no pax records, whose contents could
vary), compressed by xz at ``XZ_PRESET``. Packing the same files again gives the same bytes, so the archive
changes in git only when its contents do.

Commands (run from anywhere; standard library only):

    python3 benchmarks/raw_store.py add DIR_OR_FILE [...] [--replace]
        add files to the archive: a path inside benchmarks/results/raw/ keeps its name there; any other
        folder is stored under its own name (``add /tmp/out/gpu_x_1xh200`` -> ``gpu_x_1xh200/...``).
        A different file already stored under the same name is refused (exit 1) unless --replace.
    python3 benchmarks/raw_store.py pack [--replace]
        fold every loose file under benchmarks/results/raw/ into the archive, check it reads back, then
        remove the loose folder (``git rm`` where it is tracked) and stage the archive. Idempotent: with no
        loose folder it changes nothing.
    python3 benchmarks/raw_store.py list          every stored name with its size
    python3 benchmarks/raw_store.py extract [--to DIR]
        print the extracted folder (the cache's, or a new DIR that must not exist yet)

Exit codes: 0 done, 1 refused (a conflicting file), 2 unusable input (no archive, an unsafe member, a source
that does not exist).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import lzma
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))
from mfsdp_lib.bytecode_cache import app_cache  # noqa: E402  (the user's cache folder for this skill)

LOGICAL = "benchmarks/results/raw"  # the name results and BENCHMARK.md give the raw folder
ARCHIVE = ROOT / "benchmarks" / "results" / "raw.tar.xz"
LOOSE = ROOT / LOGICAL  # where new raw files are copied before `pack` folds them in
CACHE_SUBDIR = "raw-results"
KEY_HEX = 16  # 64 bits of the archive's digest name its extracted folder
MTIME = 0  # every member's timestamp: the bytes must not depend on when files were copied
XZ_PRESET = 9  # `xz -9`: the archive is written rarely and read once per user
# Bounds an archive must respect before anything is written: today some 560 files of at most ~1 MB, 10 MB in
# all; the bounds leave room to grow and stop a corrupt or hostile archive from filling a disk.
MAX_MEMBERS = 20_000
MAX_FILE_BYTES = 64 * 2**20
MAX_TOTAL_BYTES = 1 * 2**30


class StoreError(Exception):
    """Unusable input: a missing archive or source, or an unsafe member (exit 2)."""


class Conflict(Exception):
    """A different file is already stored under a name being added (exit 1)."""


# ---------------------------------------------------------------------------------------------------------------
# Reading


def digest(archive: Path = ARCHIVE) -> str:
    try:
        return hashlib.sha256(Path(archive).read_bytes()).hexdigest()
    except OSError as e:
        raise StoreError(f"{archive}: cannot read the raw-results archive ({e.strerror or e})") from None


def _check_name(name: str) -> str:
    p = PurePosixPath(name)
    if not name or name != p.as_posix() or p.is_absolute() or any(part in ("", ".", "..") for part in p.parts):
        raise StoreError(f"unsafe member name {name!r}: names must be relative, normalized and stay inside")
    if "\\" in name or "\x00" in name:
        raise StoreError(f"unsafe member name {name!r}")
    return name


def members(archive: Path = ARCHIVE) -> dict[str, tuple[bytes, int]]:
    """Every stored file: ``{name: (bytes, mode)}``, after checking every member (see the module docstring)."""
    out: dict[str, tuple[bytes, int]] = {}
    total = 0
    try:
        with tarfile.open(archive, mode="r:xz") as tf:
            for count, m in enumerate(tf, start=1):
                if count > MAX_MEMBERS:
                    raise StoreError(f"{archive}: more than {MAX_MEMBERS} members")
                if not m.isreg():
                    raise StoreError(f"{archive}: {m.name!r} is not a regular file (links and devices are refused)")
                name = _check_name(m.name)
                if name in out or any(str(parent) in out for parent in PurePosixPath(name).parents):
                    raise StoreError(f"{archive}: {name!r} is stored twice (or under a file's name)")
                if m.size > MAX_FILE_BYTES:
                    raise StoreError(f"{archive}: {name!r} is {m.size} bytes, above {MAX_FILE_BYTES}")
                total += m.size
                if total > MAX_TOTAL_BYTES:
                    raise StoreError(f"{archive}: more than {MAX_TOTAL_BYTES} bytes in all")
                f = tf.extractfile(m)
                data = f.read() if f is not None else b""
                if len(data) != m.size:
                    raise StoreError(f"{archive}: {name!r} is truncated")
                out[name] = (data, 0o755 if m.mode & 0o111 else 0o644)
    except FileNotFoundError:
        raise StoreError(f"{archive}: no raw-results archive here") from None
    except (tarfile.TarError, lzma.LZMAError, EOFError) as e:
        raise StoreError(f"{archive}: not a readable .tar.xz ({e})") from None
    return out


def _write_tree(files: dict[str, tuple[bytes, int]], dest: Path) -> None:
    for name, (data, mode) in files.items():
        target = dest.joinpath(*PurePosixPath(name).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)


def cache_root(environ=None) -> Path:
    return Path(app_cache(environ)) / CACHE_SUBDIR


def folder(archive: Path = ARCHIVE, cache: Path | None = None) -> Path:
    """The extracted raw folder for ``archive`` (extracted on first use; see the module docstring)."""
    key = digest(archive)[:KEY_HEX]
    base = Path(cache) if cache is not None else cache_root()
    final = base / key
    if final.is_dir():  # only ever made by renaming a finished copy into place
        return final
    files = members(archive)
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=base))
    try:
        _write_tree(files, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # not another reader's finished copy: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def path(*parts: str) -> Path:
    """A file or folder in the raw results, by its name under ``benchmarks/results/raw/``."""
    return folder().joinpath(*parts)


def locate(name: str, results: Path = ARCHIVE.parent) -> Path | None:
    """``name`` in the raw results kept beside a results folder: a loose ``RESULTS/raw/NAME`` (not packed yet)
    when there, else in ``RESULTS/raw.tar.xz``; None when neither holds it."""
    parts = PurePosixPath(_check_name(name)).parts
    loose = Path(results).joinpath(LOOSE.name, *parts)
    if loose.exists():
        return loose
    archive = Path(results) / ARCHIVE.name
    if archive.is_file():
        stored = folder(archive).joinpath(*parts)
        if stored.exists():
            return stored
    return None


def _under(p: Path, top: Path) -> PurePosixPath | None:
    try:
        return PurePosixPath(p.relative_to(top).as_posix())
    except ValueError:
        return None


def logical(p) -> str | None:
    """``benchmarks/results/raw/<name>`` for a path in the extracted folder (any archive's) or the loose one;
    None for any other path (the caller keeps its own way of naming it)."""
    for norm in (os.path.abspath, os.path.realpath):  # as given, then with links resolved (~/.cache may be one)
        q = Path(norm(p))
        rel = _under(q, Path(norm(LOOSE)))
        if rel is None:
            inside = _under(q, Path(norm(cache_root())))
            if inside is not None and inside.parts and not inside.parts[0].startswith("."):
                rel = PurePosixPath(*inside.parts[1:]) if len(inside.parts) > 1 else PurePosixPath(".")
        if rel is not None:
            return LOGICAL if str(rel) == "." else f"{LOGICAL}/{rel}"
    return None


def resolve(arg) -> Path:
    """A raw folder named on a command line: itself when it exists, else (a name under
    ``benchmarks/results/raw``, from the repository root or the current folder) its extracted copy."""
    p = Path(arg)
    if p.exists():
        return p
    for base in (Path.cwd(), ROOT):
        full = Path(os.path.abspath(base / p))
        rel = _under(full, Path(os.path.abspath(LOOSE)))
        if rel is not None:
            return folder().joinpath(*rel.parts)
    return p


# ---------------------------------------------------------------------------------------------------------------
# Writing


def pack_bytes(files: dict[str, tuple[bytes, int]]) -> bytes:
    """The archive's bytes for ``files`` (deterministic: same files, same bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name in sorted(files):
            data, mode = files[_check_name(name)]
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), MTIME, 0o755 if mode & 0o111 else 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tf.addfile(info, io.BytesIO(data))
    return lzma.compress(buf.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET)


def collect(sources: list[Path], loose: Path = LOOSE) -> dict[str, tuple[bytes, int]]:
    """The files under each source with the names they get in the archive (see ``add`` in the docstring)."""
    out: dict[str, tuple[bytes, int]] = {}
    loose = Path(os.path.abspath(loose))
    for src in sources:
        src = Path(os.path.abspath(src))
        if not src.exists():
            raise StoreError(f"{src}: no such file or folder")
        rel = _under(src, loose)
        prefix = rel if rel is not None else PurePosixPath(src.name)
        walk = [src] if src.is_file() else sorted(q for q in src.rglob("*") if not q.is_dir())
        for q in walk:
            if q.is_symlink() or not q.is_file():
                raise StoreError(f"{q}: not a regular file (links and devices are not stored)")
            if "__pycache__" in q.parts:
                continue
            sub = PurePosixPath(q.relative_to(src).as_posix()) if q != src else PurePosixPath(".")
            name = str(prefix / sub) if str(sub) != "." else str(prefix)
            if name == ".":
                continue
            if name in out:
                raise StoreError(f"{q}: {name} is given twice")
            out[_check_name(name)] = (q.read_bytes(), 0o755 if q.stat().st_mode & stat.S_IXUSR else 0o644)
    return out


def merge(old: dict, new: dict, replace: bool) -> dict:
    clashes = sorted(n for n in new if n in old and old[n][0] != new[n][0])
    if clashes and not replace:
        raise Conflict(
            f"{len(clashes)} file(s) differ from the stored ones (--replace to overwrite): " + ", ".join(clashes[:10])
        )
    return {**old, **new}


def write(files: dict, archive: Path = ARCHIVE) -> bool:
    """Write the archive for ``files`` atomically; False when its bytes would not change."""
    data = pack_bytes(files)
    if archive.is_file() and archive.read_bytes() == data:
        return False
    tmp = archive.with_name(archive.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, archive)
    return True


def add(sources: list[Path], replace: bool = False, archive: Path = ARCHIVE, loose: Path = LOOSE) -> tuple[int, bool]:
    """Add ``sources`` to ``archive``; returns (files added or changed, whether the archive changed)."""
    old = members(archive) if archive.exists() else {}
    new = collect(sources, loose)
    merged = merge(old, new, replace)
    changed = sum(1 for n in new if old.get(n, (None,))[0] != new[n][0])
    return changed, write(merged, archive)


def _git(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def _untrack_packed(archive: Path, loose: Path, root: Path = ROOT) -> int:
    """Files git still tracks under a loose folder that is gone from disk (a deletion not yet staged): when every
    one is stored in the archive with the same bytes, stop tracking them; else refuse, naming them."""
    if _git("rev-parse", "--is-inside-work-tree", root=root).returncode != 0:
        return 0
    rel = os.path.relpath(loose, root)
    tracked = _git("ls-files", "-z", "--", rel, root=root).stdout.split("\0")
    tracked = [t for t in tracked if t]
    if not tracked:
        return 0
    stored = members(archive) if archive.exists() else {}
    blobs = subprocess.run(
        ["git", "-C", str(root), "cat-file", "--batch"],
        input="".join(f":{t}\n" for t in tracked).encode(),
        capture_output=True,
    ).stdout
    differ, pos = [], 0
    for t in tracked:
        header_end = blobs.index(b"\n", pos)
        size = int(blobs[pos:header_end].split()[2])
        data = blobs[header_end + 1 : header_end + 1 + size]
        pos = header_end + 1 + size + 1
        if stored.get(PurePosixPath(t).relative_to(rel).as_posix(), (None,))[0] != data:
            differ.append(t)
    if differ:
        raise StoreError(
            f"git tracks {len(differ)} file(s) under {rel}/ that {archive.name} does not hold as they are "
            f"(e.g. {differ[0]}): `git checkout -- {rel}` brings them back, then pack again"
        )
    _git("rm", "-r", "-q", "--cached", "--", rel, root=root)
    return len(tracked)


def pack(replace: bool = False, archive: Path = ARCHIVE, loose: Path = LOOSE, use_git: bool = True) -> str:
    """Fold the loose folder into the archive and remove it (see the module docstring)."""
    if not loose.exists():
        untracked = _untrack_packed(archive, loose) if use_git else 0
        if untracked:
            return f"no {LOGICAL}/ folder; {untracked} file(s) git still tracked there are in {archive.name}: untracked"
        return f"nothing to pack: no {LOGICAL}/ folder; {archive.name} unchanged"
    old = members(archive) if archive.exists() else {}
    new = collect([loose], loose)
    merged = merge(old, new, replace)
    write(merged, archive)
    back = members(archive)
    if any(back.get(n, (None,))[0] != v[0] for n, v in new.items()):
        raise StoreError(f"{archive}: a packed file did not read back the same; the loose folder is kept")
    in_git = use_git and _git("rev-parse", "--is-inside-work-tree").returncode == 0
    if in_git:
        _git("rm", "-r", "-q", "--cached", "--ignore-unmatch", "--", os.path.relpath(loose, ROOT))
    shutil.rmtree(loose)
    if in_git:
        _git("add", "--", os.path.relpath(archive, ROOT))
    staged = " (staged in git)" if in_git else ""
    return f"packed {len(new)} loose file(s) into {archive.name} ({len(back)} files, {archive.stat().st_size} bytes){staged}"


# ---------------------------------------------------------------------------------------------------------------
# Command line


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="raw_store.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a_add = sub.add_parser("add", help="add folders or files to the archive")
    a_add.add_argument("sources", nargs="+", type=Path)
    a_add.add_argument("--replace", action="store_true", help="overwrite stored files that differ")
    a_pack = sub.add_parser("pack", help=f"fold a loose {LOGICAL}/ folder into the archive and remove it")
    a_pack.add_argument("--replace", action="store_true", help="overwrite stored files that differ")
    sub.add_parser("list", help="every stored name with its size")
    a_ex = sub.add_parser("extract", help="print the extracted folder (or extract into a new --to DIR)")
    a_ex.add_argument("--to", type=Path, default=None)
    a = p.parse_args(argv)
    try:
        if a.cmd == "add":
            n, changed = add(a.sources, a.replace)
            print(f"{n} file(s) added or replaced; {ARCHIVE.name} {'rewritten' if changed else 'unchanged'}")
        elif a.cmd == "pack":
            print(pack(a.replace))
        elif a.cmd == "list":
            try:
                for name, (data, _mode) in sorted(members().items()):
                    print(f"{len(data):>10}  {LOGICAL}/{name}")
            except BrokenPipeError:  # `list | head`
                sys.stderr.close()
        elif a.cmd == "extract":
            if a.to is None:
                print(folder())
            else:
                if a.to.exists():
                    raise StoreError(f"{a.to}: exists; give a folder that does not exist yet")
                _write_tree(members(), a.to)
                print(a.to)
    except Conflict as e:
        print(f"raw_store: {e}", file=sys.stderr)
        return 1
    except StoreError as e:
        print(f"raw_store: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # an unwritable cache or archive folder
        print(f"raw_store: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
