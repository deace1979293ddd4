"""benchmarks/raw_store.py: the raw GPU results as one archive, read through one resolver.

What is held here: the repository keeps no loose raw folder beside the archive (an install would carry it);
the archive is canonical (re-packing its files gives its bytes) and round-trips through extraction; every
raw path that BENCHMARK.md, the result files and the product text cite is in it; an unsafe archive is
refused before anything is written; ``add`` refuses to overwrite a different file; ``pack`` folds a loose
folder in and removes it; and no reader joins a path to the raw folder itself instead of asking the resolver.
"""

from __future__ import annotations

import ast
import fnmatch
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path, PurePosixPath

import pytest

import raw_store as rs
from conftest import ROOT

# Raw paths the result files name that were never files in the repository: the smoke run's own output folder
# on the GPU machine (its checkpoint; `cli_smoke.json` beside it is the record that was copied).
NOT_KEPT = {"gpu_smoke_1xh200/cli_smoke": "the smoke run's output folder on the GPU machine, not copied"}
# Where a cited raw path may stand: what BENCHMARK.md is built from, and the product text an agent or user reads.
CITING = ("BENCHMARK.md", "card.yaml", "skill-card.md", "SKILL.md", "benchmarks/results/*.json", "references/*.md")
CITED = re.compile(r"benchmarks/results/raw/([A-Za-z0-9_.\-/*]+)")
# The code that reads raw files: everything Python in these folders goes through the resolver.
READERS = ("benchmarks", "tests", "evals", "scripts")


@pytest.fixture(scope="module")
def stored() -> dict[str, tuple[bytes, int]]:
    return rs.members()


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


# --------------------------------------------------------------------------------------------- the repository


def test_no_loose_raw_folder_is_kept_beside_the_archive():
    tracked = _git("ls-files", "--", rs.LOGICAL).split()
    assert not tracked, f"{len(tracked)} loose raw file(s) tracked: run `python3 benchmarks/raw_store.py pack`"
    assert not rs.LOOSE.exists(), f"{rs.LOGICAL}/ is on disk and would be installed: run raw_store.py pack"
    assert _git("ls-files", "--", str(rs.ARCHIVE.relative_to(ROOT))).strip() == "benchmarks/results/raw.tar.xz"


def test_archive_is_canonical_and_round_trips(stored, tmp_path):
    assert stored, "the raw-results archive is empty"
    assert rs.pack_bytes(stored) == rs.ARCHIVE.read_bytes(), "re-packing the stored files changes the archive"
    out = rs.folder(rs.ARCHIVE, tmp_path / "cache")
    assert out.name == rs.digest()[: rs.KEY_HEX]
    back = rs.collect([out], out)
    assert back == stored
    with tarfile.open(rs.ARCHIVE, mode="r:xz") as tf:
        infos = tf.getmembers()
    assert [i.name for i in infos] == sorted(i.name for i in infos)
    assert {(i.mtime, i.uid, i.gid, i.uname, i.gname) for i in infos} == {(rs.MTIME, 0, 0, "", "")}
    assert not any(i.pax_headers for i in infos)
    assert rs.folder(rs.ARCHIVE, tmp_path / "cache") == out  # extracted once, then reused


def _citations() -> list[tuple[str, str]]:
    out = []
    for pattern in CITING:
        for f in sorted(ROOT.glob(pattern)):
            for m in CITED.finditer(f.read_text(encoding="utf-8")):
                out.append((f.relative_to(ROOT).as_posix(), m.group(1).rstrip(".,;:/")))
    return out


def test_every_cited_raw_path_is_in_the_archive(stored):
    names = set(stored)
    folders = {str(p) for n in names for p in PurePosixPath(n).parents if str(p) != "."}
    cited = _citations()
    assert len({c for _f, c in cited}) > 50, "fewer raw citations than BENCHMARK.md and the results make"
    missing = []
    for where, name in cited:
        if any(name == k or name.startswith(k + "/") for k in NOT_KEPT):
            continue
        if name in names or name in folders or ("*" in name and fnmatch.filter(names | folders, name)):
            continue
        missing.append(f"{where}: {rs.LOGICAL}/{name}")
    assert not missing, missing


# --------------------------------------------------------------------------------------------- the mechanism


def _tar(entries) -> bytes:
    """An .tar.xz of ENTRIES: (TarInfo, data or None)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tf:
        for info, data in entries:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind=tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


@pytest.mark.parametrize(
    "entries, says",
    [
        ([_file("../escape.txt")], "unsafe member name"),
        ([_file("/etc/passwd")], "unsafe member name"),
        ([_file("a/./b")], "unsafe member name"),
        ([_link("a/link", "/etc/passwd")], "not a regular file"),
        ([_link("a/hard", "a/x", tarfile.LNKTYPE)], "not a regular file"),
        ([_file("a/x"), _file("a/x", b"y")], "stored twice"),
        ([_file("a"), _file("a/x")], "stored twice"),
    ],
)
def test_an_unsafe_archive_is_refused_before_anything_is_written(tmp_path, entries, says):
    archive = tmp_path / "raw.tar.xz"
    archive.write_bytes(_tar(entries))
    with pytest.raises(rs.StoreError, match=says):
        rs.folder(archive, tmp_path / "cache")
    assert not (tmp_path / "escape.txt").exists()
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] if (tmp_path / "cache").exists() else True


def test_size_and_count_bounds_are_enforced(tmp_path, monkeypatch):
    archive = tmp_path / "raw.tar.xz"
    archive.write_bytes(_tar([_file("a", b"12345"), _file("b", b"12345")]))
    monkeypatch.setattr(rs, "MAX_FILE_BYTES", 4)
    with pytest.raises(rs.StoreError, match="above 4"):
        rs.members(archive)
    monkeypatch.setattr(rs, "MAX_FILE_BYTES", 100)
    monkeypatch.setattr(rs, "MAX_TOTAL_BYTES", 8)
    with pytest.raises(rs.StoreError, match="bytes in all"):
        rs.members(archive)
    monkeypatch.setattr(rs, "MAX_TOTAL_BYTES", 100)
    monkeypatch.setattr(rs, "MAX_MEMBERS", 1)
    with pytest.raises(rs.StoreError, match="more than 1 members"):
        rs.members(archive)
    archive.write_bytes(b"not an archive")
    with pytest.raises(rs.StoreError, match="not a readable"):
        rs.members(archive)


def _tree(top: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(text)
    return top


def test_add_refuses_a_different_file_and_replaces_only_when_told(tmp_path):
    loose, archive = tmp_path / "raw", tmp_path / "raw.tar.xz"
    _tree(loose, {"run_a/log.txt": "one", "run_a/sub/r.json": "{}"})
    assert rs.add([loose / "run_a"], archive=archive, loose=loose) == (2, True)
    first = archive.read_bytes()
    assert rs.add([loose / "run_a"], archive=archive, loose=loose) == (0, False)  # the same files: unchanged
    assert archive.read_bytes() == first
    (loose / "run_a" / "log.txt").write_text("two")
    with pytest.raises(rs.Conflict, match="run_a/log.txt"):
        rs.add([loose / "run_a"], archive=archive, loose=loose)
    assert archive.read_bytes() == first
    assert rs.add([loose / "run_a"], replace=True, archive=archive, loose=loose) == (1, True)
    assert rs.members(archive)["run_a/log.txt"][0] == b"two"
    # a folder outside the loose one is stored under its own name
    other = _tree(tmp_path / "elsewhere" / "run_b", {"x.log": "b"})
    rs.add([other], archive=archive, loose=loose)
    assert set(rs.members(archive)) == {"run_a/log.txt", "run_a/sub/r.json", "run_b/x.log"}


def test_pack_folds_the_loose_folder_in_removes_it_and_is_idempotent(tmp_path):
    loose, archive = tmp_path / "raw", tmp_path / "raw.tar.xz"
    _tree(loose, {"run_a/log.txt": "one"})
    rs.add([loose], archive=archive, loose=loose)
    _tree(loose, {"run_a/log.txt": "one", "run_c/new.json": "{}"})
    said = rs.pack(archive=archive, loose=loose, use_git=False)
    assert "packed 2 loose file(s)" in said and not loose.exists()
    assert set(rs.members(archive)) == {"run_a/log.txt", "run_c/new.json"}
    before = archive.read_bytes()
    assert "nothing to pack" in rs.pack(archive=archive, loose=loose, use_git=False)
    assert archive.read_bytes() == before
    _tree(loose, {"run_a/log.txt": "changed"})  # a conflict keeps the loose folder and the archive
    with pytest.raises(rs.Conflict):
        rs.pack(archive=archive, loose=loose, use_git=False)
    assert loose.exists() and archive.read_bytes() == before


def test_pack_untracks_files_git_still_lists_only_when_the_archive_holds_them(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    loose, archive = _tree(tmp_path / "raw", {"run_a/log.txt": "one"}), tmp_path / "raw.tar.xz"
    git("add", "raw")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "-m", "raw")
    rs.add([loose], archive=archive, loose=loose)
    shutil.rmtree(loose)  # deleted by hand, the deletion not staged
    rs.write({"run_a/log.txt": (b"changed", 0o644)}, archive)
    with pytest.raises(rs.StoreError, match="does not hold"):
        rs._untrack_packed(archive, loose, tmp_path)
    rs.write({"run_a/log.txt": (b"one", 0o644)}, archive)
    assert rs._untrack_packed(archive, loose, tmp_path) == 1
    tracked = subprocess.run(["git", "-C", str(tmp_path), "ls-files"], capture_output=True, text=True).stdout
    assert "raw/" not in tracked


def test_cli_exit_codes(tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "raw_store.py"), *args], capture_output=True, text=True
        )

    listed = run("list")
    assert listed.returncode == 0 and f"{rs.LOGICAL}/rehearse_1xh200/" in listed.stdout
    assert run("add", str(tmp_path / "missing")).returncode == 2
    extracted = run("extract", "--to", str(tmp_path / "copy"))
    assert extracted.returncode == 0 and (tmp_path / "copy" / "rehearse_1xh200").is_dir()
    assert run("extract", "--to", str(tmp_path / "copy")).returncode == 2  # never into an existing folder


def test_logical_and_resolve_name_the_recorded_folder():
    folder = rs.path("rehearse_1xh200")
    assert rs.logical(folder) == f"{rs.LOGICAL}/rehearse_1xh200"
    assert rs.logical(rs.folder()) == rs.LOGICAL
    assert rs.logical(rs.LOOSE / "x" / "y.json") == f"{rs.LOGICAL}/x/y.json"
    assert rs.logical(ROOT / "benchmarks" / "results" / "suite_speed.json") is None
    assert rs.resolve(f"{rs.LOGICAL}/rehearse_1xh200") == folder  # a command BENCHMARK.md prints still runs
    assert rs.resolve(ROOT / "scripts") == ROOT / "scripts"


# --------------------------------------------------------------------------------------------- no bypass


def _chain(node: ast.AST) -> list[ast.AST]:
    """The operands of ``a / b / c`` in order."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _chain(node.left) + _chain(node.right)
    return [node]


def _const(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _named_results(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "results" in name.lower()


def bypasses(source: str) -> list[int]:
    """Lines where code builds a path into the raw results itself: ``... / "results" / "raw"``,
    ``RESULTS / "raw"``, a ``"results/raw"`` string joined, passed to ``Path``/``open``/``glob``, or a
    ``"raw/..."`` pattern globbed under a results folder. Strings that are only shown (commands, notes,
    docstrings) are not paths and are left alone."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            ops = _chain(node)
            for left, right in zip(ops, ops[1:], strict=False):
                if _const(right) == "raw" and (_const(left) == "results" or _named_results(left)):
                    lines.append(node.lineno)
            if any("results/raw" in (_const(o) or "") for o in ops):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in ("Path", "PurePath", "PosixPath", "open", "join", "joinpath", "glob", "rglob", "iglob"):
                for arg in node.args:
                    text = _const(arg) or ""
                    on_results = isinstance(func, ast.Attribute) and _named_results(func.value)
                    raw_glob = name in ("glob", "rglob") and text.startswith("raw/") and on_results
                    if "results/raw" in text or raw_glob:
                        lines.append(node.lineno)
    return sorted(set(lines))


def test_the_bypass_check_sees_each_way_of_joining_the_raw_folder():
    assert bypasses('RAW = ROOT / "benchmarks" / "results" / "raw" / "x"')
    assert bypasses('RAW = RESULTS / "raw"')
    assert bypasses('p = ROOT / "benchmarks/results/raw/x.json"')
    assert bypasses('p = Path("benchmarks/results/raw")')
    assert bypasses('p = os.path.join(ROOT, "benchmarks/results/raw")')
    assert bypasses('runs = results.glob("raw/gpu_*/*/run_config.yaml")')
    # shown strings, and raw folders of other things, are not paths into the raw results
    assert not bypasses('cmd = "python3 x.py --raw-dir benchmarks/results/raw/gpu_smoke_1xh200"')
    assert not bypasses('d = tmp_path / "raw" / "x"')
    assert not bypasses('def f():\n    """Reads benchmarks/results/raw/x."""')


def test_every_reader_goes_through_the_resolver():
    found = []
    for folder in READERS:
        for f in sorted((ROOT / folder).rglob("*.py")):
            if f == ROOT / "benchmarks" / "raw_store.py" or "__pycache__" in f.parts:
                continue
            for line in bypasses(f.read_text(encoding="utf-8")):
                found.append(f"{f.relative_to(ROOT)}:{line}")
    assert not found, "read the raw results through benchmarks/raw_store.py (path/folder/resolve): " + ", ".join(found)


def test_the_results_still_name_the_recorded_folders():
    """A result rebuilt from the extracted archive names `benchmarks/results/raw/...`, not the cache."""
    cache = str(rs.cache_root())
    for f in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        assert cache not in f.read_text(encoding="utf-8"), f.name
    assert json.loads((ROOT / "benchmarks" / "results" / "rehearse_1xh200.json").read_text())["raw"]["folder"] == (
        f"{rs.LOGICAL}/rehearse_1xh200"
    )
