"""Locate Megatron-Bridge / Megatron-Core *source text* without importing it.

The skill cites code in Megatron-Bridge and Megatron-Core (``anchors``), and
those citations are only worth something if they can be checked against the
code the user actually runs. Importing the packages is not an option: Bridge
imports Transformer Engine and CUDA at import time, which fails on a laptop and
is slow everywhere. ``importlib.util.find_spec`` is not an option either: for a
dotted name it imports the parent packages (``megatron.bridge`` runs
``megatron/bridge/__init__.py``). So a source is found by *metadata* only:

* an installed distribution, through ``importlib.metadata`` (its ``files`` list
  and ``locate_file``, plus its ``version``) - nothing is executed;
* a folder: an unpacked wheel or a site-packages folder (holding
  ``megatron/bridge`` or ``megatron/core``), a Megatron-Bridge checkout (holding
  ``src/megatron/bridge``), or a Megatron-LM checkout (holding ``megatron/core``);
* a wheel (``.whl``, a zip): read in place with ``zipfile``.

Every source answers the same three questions: its version, the text of a file
given by its path inside the distribution (``megatron/bridge/training/config.py``),
and the list of Python files it holds (to find an anchor that moved to another
file). Which distribution a cited path belongs to is decided by its prefix
(``PACKAGE_PREFIXES``), never by guessing.
"""

from __future__ import annotations

import ast
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

# Distribution names on PyPI, and the folders (as cited) each one ships.
# megatron-core 0.19.x ships ``megatron/training`` too (Bridge's config classes
# inherit from ``megatron.training.config``), so those paths resolve there.
DISTRIBUTIONS = {"bridge": "megatron-bridge", "mcore": "megatron-core"}
PACKAGE_PREFIXES = {
    "bridge": ("megatron/bridge/",),
    "mcore": ("megatron/core/", "megatron/training/"),
}
# Where each distribution keeps its version when there is no dist-info to read
# (a source checkout): MAJOR/MINOR/PATCH/PRE_RELEASE constants in this file.
PACKAGE_INFO = {"bridge": "megatron/bridge/package_info.py", "mcore": "megatron/core/package_info.py"}
# Layouts a folder may have: the folder itself holds ``megatron/``, or (a
# Megatron-Bridge checkout) ``src/`` holds it.
FOLDER_LAYOUTS = ("", "src")
MAX_SOURCE_BYTES = 8 * 1024 * 1024  # the largest Python file of Bridge / Megatron-Core is ~200 KB


def owner_of(path: str) -> str | None:
    """Which distribution ('bridge' or 'mcore') ships the cited path, or None."""
    for which, prefixes in PACKAGE_PREFIXES.items():
        if path.startswith(prefixes):
            return which
    return None


@dataclass
class Source:
    """One located distribution: where it is, its version, how to read it."""

    which: str  # 'bridge' or 'mcore'
    kind: str  # 'installed', 'folder' or 'wheel'
    location: str  # human-readable: folder, wheel file or site-packages
    version: str | None
    _root: Path | None = None  # folder sources and installed distributions
    _zip: zipfile.ZipFile | None = None
    _installed_files: list[str] = field(default_factory=list)
    _cache: dict = field(default_factory=dict)

    def read_text(self, relpath: str) -> str | None:
        """The text of ``relpath`` (as cited, e.g. ``megatron/core/...py``), or None if absent."""
        if relpath in self._cache:
            return self._cache[relpath]
        text = None
        try:
            if self._zip is not None:
                try:
                    if self._zip.getinfo(relpath).file_size <= MAX_SOURCE_BYTES:  # no zip bombs
                        text = self._zip.read(relpath).decode("utf-8", "replace")
                except KeyError:
                    text = None
            elif self._root is not None:
                p = self._root / relpath
                if p.is_file() and p.stat().st_size <= MAX_SOURCE_BYTES:
                    text = p.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = None
        self._cache[relpath] = text
        return text

    def python_files(self) -> list[str]:
        """Every ``.py`` file of this distribution, as cited paths, sorted."""
        prefixes = PACKAGE_PREFIXES[self.which]
        if self._zip is not None:
            names = self._zip.namelist()
        elif self._installed_files:
            names = self._installed_files
        elif self._root is not None:
            root = self._root
            names = []
            for prefix in prefixes:
                base = root / prefix
                if base.is_dir():
                    for dirpath, _dirs, files in os.walk(base):
                        for f in files:
                            if f.endswith(".py"):
                                names.append(Path(dirpath, f).relative_to(root).as_posix())
        return sorted(n for n in names if n.endswith(".py") and n.startswith(prefixes))

    def describe(self) -> str:
        return f"{DISTRIBUTIONS[self.which]} {self.version or '(version unknown)'} from {self.kind} {self.location}"


def _version_from_package_info(text: str | None) -> str | None:
    """Read MAJOR/MINOR/PATCH/PRE_RELEASE constants the way package_info.py defines them."""
    if not text:
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    values: dict[str, object] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
        ):
            values[node.targets[0].id] = node.value.value
    if not all(k in values for k in ("MAJOR", "MINOR", "PATCH")):
        return None
    return f"{values['MAJOR']}.{values['MINOR']}.{values['PATCH']}{values.get('PRE_RELEASE', '') or ''}"


def _metadata_version(text: str) -> str | None:
    m = re.search(r"^Version:\s*(\S+)", text, re.MULTILINE)
    return m.group(1) if m else None


def _dist_info_version(which: str, names) -> str | None:
    """Version from ``<dist>-<version>.dist-info`` folder names (wheel or site-packages)."""
    stem = DISTRIBUTIONS[which].replace("-", "_")
    for n in names:
        m = re.match(rf"^{stem}-([^/]+?)\.dist-info(/|$)", n)
        if m:
            return m.group(1)
    return None


def from_folder(which: str, folder: str | os.PathLike) -> Source | None:
    base = Path(folder).expanduser()
    if not base.is_dir():
        return None
    package_dir = PACKAGE_PREFIXES[which][0].rstrip("/")  # megatron/bridge or megatron/core
    # The user may also point at the package folder itself (.../megatron/bridge).
    candidates = [base / layout if layout else base for layout in FOLDER_LAYOUTS]
    parts = package_dir.split("/")
    if base.resolve().parts[-len(parts) :] == tuple(parts):
        candidates.insert(0, base.resolve().parents[len(parts) - 1])
    for root in candidates:
        if (root / package_dir).is_dir():
            src = Source(which, "folder", str(root), None, _root=root)
            try:
                version = _dist_info_version(which, os.listdir(root))
            except OSError:
                version = None
            if version is None:
                version = _version_from_package_info(src.read_text(PACKAGE_INFO[which]))
            src.version = version
            return src
    return None


def from_wheel(which: str, wheel: str | os.PathLike) -> Source | None:
    path = Path(wheel).expanduser()
    if not path.is_file():
        return None
    try:
        zf = zipfile.ZipFile(path)
        names = zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return None
    if not any(n.startswith(PACKAGE_PREFIXES[which][0]) for n in names):
        return None
    src = Source(which, "wheel", str(path), None, _zip=zf)
    version = _dist_info_version(which, names)
    if version is None:
        version = _version_from_package_info(src.read_text(PACKAGE_INFO[which]))
    src.version = version
    return src


from .installed import installed_distribution  # noqa: E402  (facts from the real environment only)


def from_installed(which: str) -> Source | None:
    """The installed distribution, found through its metadata only (nothing is imported)."""
    dist = installed_distribution(DISTRIBUTIONS[which])
    if dist is None:
        return None
    files = [str(f).replace(os.sep, "/") for f in (dist.files or [])]
    root = Path(str(dist.locate_file("")))
    mine = [f for f in files if f.startswith(PACKAGE_PREFIXES[which])]
    if not mine:
        return None  # metadata without sources (e.g. a broken install)
    return Source(which, "installed", str(root), dist.version, _root=root, _installed_files=mine)


def locate(which: str, given: str | None = None) -> Source | None:
    """Find one distribution: the given folder or wheel, else the installed one."""
    if given:
        p = Path(given).expanduser()
        if p.is_dir():
            return from_folder(which, p)
        return from_wheel(which, p)
    return from_installed(which)
