"""Signing and verifying the whole skill folder as one OpenSSF Model Signing bundle.

What is signed
    Every file that ``npx skills add`` installs, so a changed, added or removed
    script is caught, not only the five documents NVIDIA signs. The signed set is
    decided by ONE fixed rule, the same in a working tree, in CI's fresh clone
    after ``bash scripts/dev.sh test`` and in an installed copy (which has no
    ``.git``):

        every regular file under the skill folder, except
        * ``skill.oms.sig`` itself (it cannot sign itself);
        * what the ``skills`` installer never copies: any folder named ``.git``,
          ``__pycache__`` or ``__pypackages__`` and any file named
          ``metadata.json`` (constants ``INSTALLER_SKIPS_*``, read from the CLI
          source of ``skills`` 1.5.18), so the installed copy verifies;
        * local build products, matched by name at any depth
          (``BUILD_PRODUCT_DIRS``, ``BUILD_PRODUCT_SUFFIXES``): ``.venv``,
          ``node_modules``, ``.cache``, ``.pytest_cache``, ``.hypothesis``,
          ``build``, ``dist``, ``*.egg-info``, ``*.pyc`` ...

    ``.gitignore`` lists the same names (a test keeps the two in step), so a
    file git would commit is signed and a file git ignores is not. Git is not
    consulted for the set: a rule that needs ``.git`` could not be checked in the
    installed copy. Git is used only as a guard when signing: ``sign`` refuses
    when the set holds files git does not track (they would be missing from
    every clone) or misses tracked ones (they would be installed unsigned).

How
    The bundle is made by the ``model-signing`` library (certificate signer:
    private key, signing certificate, chain [intermediate, root]) in the shape
    NVIDIA ships: Sigstore bundle v0.3, x509 certificate chain, DSSE envelope
    over an in-toto statement with predicateType ``PREDICATE_TYPE``, subject name
    ``SKILL_NAME``, file serialization with sha256. The serialization records
    ``skill.oms.sig`` and the top-level build-product folders in
    ``ignore_paths``, so the stock ``model_signing verify certificate`` command
    also accepts a clean checkout.

    ``verify`` first lets ``model-signing`` check the certificate chain up to the
    given root and the DSSE signature over the statement, then compares the
    signed digests with the files on disk and names every file that differs.
    It works on any folder signed that way, NVIDIA's own skills included (their
    signature was made with the file outside the folder; it is excluded here
    by name either way).

What ``verify`` checks (beyond the signed set)
    Signing leaves build products out, but verifying does not trust them: every
    file in the folder that is not in the bundle is reported, whatever its name
    (``all_files``). That covers what Python or an agent could load instead of
    the signed source: bytecode in ``__pycache__`` or a sourceless ``yaml.pyc``
    beside the scripts (Python imports it when no ``.py`` shadows it, and may
    prefer a ``__pycache__`` entry whose header matches the source), a planted
    ``*.egg-info`` (``importlib.metadata`` believes it), hidden files. Only the
    bundle itself and ``.git`` are exempt. ``dev_tree=True`` (``verify
    --dev-tree``, for a maintainer's working tree after the tests ran) also
    accepts the top-level tool folders (``DEV_TREE_DIRS``) and ``__pycache__``.

Binding to the release
    The in-toto subject is the skill's name; ``card.yaml`` (signed like every
    file) carries ``name`` and ``version``. ``verify`` checks that the subject is
    the card's name, and ``expect_version`` (``verify --expect-version X``)
    requires the card's version to be X, so an older signed release, intact as
    it may be, does not pass for the one the user meant to install.

``model-signing`` (+ ``pyopenssl``) is imported only when signing or verifying,
with a one-line hint when absent; listing the signed set needs the standard
library only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from .. import SKILL_NAME as _SKILL_NAME
from ..findings import InputError

SKILL_NAME = _SKILL_NAME  # the in-toto subject name is the skill's name, as NVIDIA names theirs
SIGNATURE_NAME = "skill.oms.sig"  # where NVIDIA's skills keep the bundle, at the skill root
PREDICATE_TYPE = "https://model_signing/signature/v1.0"  # model-signing's statement type
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
HASH_ALGORITHM = "sha256"  # NVIDIA's bundles use sha256 file serialization

# Read from the `skills` CLI (1.5.18, dist/cli.mjs, copyDirectory): it skips these when installing.
INSTALLER_SKIPS_DIRS = frozenset({".git", "__pycache__", "__pypackages__"})
INSTALLER_SKIPS_FILES = frozenset({"metadata.json"})
# Local build products of dev.sh, pip, pytest, hypothesis, npm and the GPU staging folders; matched by
# name at any depth. Keep in step with .gitignore (tests/integrity/test_signature.py checks it).
BUILD_PRODUCT_DIRS = frozenset(
    {
        ".venv",
        ".venv310",
        "venv",
        "node_modules",
        ".cache",
        ".pytest_cache",
        ".hypothesis",
        ".mypy_cache",
        ".ruff_cache",
        ".tox",
        "build",
        "dist",
        ".whl",
        ".gpuwork",
    }
)
BUILD_PRODUCT_DIR_SUFFIXES = (".egg-info",)
BUILD_PRODUCT_SUFFIXES = (".pyc", ".pyo")
# A git worktree keeps `.git` as a file; it is never part of the skill.
VCS_FILES = frozenset({".git"})
# verify --dev-tree: the tool folders a maintainer's checkout holds at its top after `bash scripts/dev.sh test`.
DEV_TREE_DIRS = BUILD_PRODUCT_DIRS - {"build", "dist"}  # build/ and dist/ are never a checkout's tool folders
CARD = "card.yaml"  # carries the skill's name and version; signed like every file

INSTALL_HINT = (
    "needs the OpenSSF model-signing library: pip install 'model-signing==1.1.1' 'pyopenssl==26.4.0' "
    "(or: bash scripts/dev.sh test, which sets up its own virtualenv)"
)


class VerificationError(Exception):
    """The signature does not hold; ``problems`` names each file or check that failed."""

    def __init__(self, summary: str, problems: list[str] | None = None):
        super().__init__(summary)
        self.problems = list(problems or [])


@dataclass
class Verified:
    files: list[str]
    subject: str
    signer: str
    chain: list[str] = field(default_factory=list)
    version: str | None = None


def _dir_is_excluded(name: str) -> bool:
    return name in INSTALLER_SKIPS_DIRS or name in BUILD_PRODUCT_DIRS or name.endswith(BUILD_PRODUCT_DIR_SUFFIXES)


def _file_is_excluded(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    if rel == SIGNATURE_NAME or name in INSTALLER_SKIPS_FILES or name in VCS_FILES:
        return True
    return name.endswith(BUILD_PRODUCT_SUFFIXES)


def is_signed_path(rel: str) -> bool:
    """True when the POSIX path ``rel`` (relative to the skill root) belongs to the signed set."""
    parts = rel.split("/")
    if any(_dir_is_excluded(p) for p in parts[:-1]):
        return False
    return not _file_is_excluded(rel)


def skill_root(directory: str | os.PathLike | None) -> pathlib.Path:
    """The folder to sign/verify: DIR, else the skill this script belongs to."""
    path = pathlib.Path(directory) if directory else pathlib.Path(__file__).resolve().parents[3]
    if not path.is_dir():
        raise InputError(f"{path}: not a folder")
    return path.resolve()


def signed_files(root: pathlib.Path) -> list[str]:
    """The signed set under ``root``: POSIX paths sorted as paths, part by part (see the module docstring)."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not _dir_is_excluded(d))
        rel_dir = pathlib.Path(dirpath).relative_to(root).as_posix()
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if _file_is_excluded(rel):
                continue
            full = pathlib.Path(dirpath) / name
            if full.is_symlink():
                # The installer copies a link's target, so its digest would depend on where it points.
                raise InputError(f"{rel}: is a symbolic link; the skill must hold real files")
            if not full.is_file():  # a FIFO would hang the hashing, a device never ends
                raise InputError(f"{rel}: is not a regular file (a pipe, socket or device); the skill holds files")
            out.append(rel)
        # A symlinked folder is listed among dirnames but not followed: sign it as what it is, an error.
        for d in dirnames:
            if (pathlib.Path(dirpath) / d).is_symlink():
                rel = d if rel_dir == "." else f"{rel_dir}/{d}"
                raise InputError(f"{rel}: is a symbolic link to a folder; the skill must hold real files")
    # In the bundle's order: model_signing sorts its resources as paths (part by part), so "a/x" comes before
    # "a-b/x", where a plain string sort puts "a-b/x" first ('-' sorts before '/').
    return sorted(out, key=pathlib.PurePosixPath)


def all_files(root: pathlib.Path, dev_tree: bool = False) -> list[str]:
    """Every entry under ``root`` that is not a folder: what Python or an agent could find there.

    Only the bundle and ``.git`` are left out (and with ``dev_tree`` the top-level ``DEV_TREE_DIRS`` and any
    ``__pycache__``). Symbolic links and special files are listed too (as what they are named), never followed.
    """
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = pathlib.Path(dirpath).relative_to(root).as_posix()
        keep = []
        for d in sorted(dirnames):
            rel = d if rel_dir == "." else f"{rel_dir}/{d}"
            if d == ".git" or (dev_tree and (d == "__pycache__" or (rel_dir == "." and d in DEV_TREE_DIRS))):
                continue
            if (pathlib.Path(dirpath) / d).is_symlink():
                out.append(rel)  # a link to a folder: listed, never followed
                continue
            keep.append(d)
        dirnames[:] = keep
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rel == SIGNATURE_NAME or (rel_dir == "." and name in VCS_FILES):
                continue
            out.append(rel)
    return sorted(out)


def _extra_reason(rel: str) -> str:
    name = rel.rsplit("/", 1)[-1]
    parts = rel.split("/")
    if name.endswith(BUILD_PRODUCT_SUFFIXES) or "__pycache__" in parts:
        return "unsigned bytecode: Python can run it instead of the signed source (delete it; run with python3 -B)"
    if any(p.endswith(BUILD_PRODUCT_DIR_SUFFIXES) or p.endswith(".dist-info") for p in parts):
        return "unsigned package metadata: importlib.metadata would believe it (delete it)"
    if name.startswith(".") or any(p.startswith(".") for p in parts[:-1]):
        return "added hidden file (in the folder, but not signed)"
    return "added (in the folder, but not signed)"


def file_digest(path: pathlib.Path) -> str:
    h = hashlib.new(HASH_ALGORITHM)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- git guard (sign only) ---------------------------------------------------------------------------------


def git_tracked(root: pathlib.Path) -> list[str] | None:
    """Files git tracks when ``root`` is the top of a git work tree, else None (no git, or a sub-folder)."""
    if shutil.which("git") is None:
        return None
    try:
        top = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=60
        )
        if top.returncode != 0 or pathlib.Path(top.stdout.strip()).resolve() != root:
            return None
        ls = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if ls.returncode != 0:
        return None
    return sorted(p for p in ls.stdout.decode("utf-8", "surrogateescape").split("\0") if p)


def git_guard(root: pathlib.Path, files: list[str]) -> list[str]:
    """Problems that would make the signature fail in a fresh clone; empty when fine or not a git checkout."""
    tracked = git_tracked(root)
    if tracked is None:
        return []
    expected = {p for p in tracked if is_signed_path(p)}
    present = set(files)
    problems = [
        f"{p}: not tracked by git (commit it, delete it, or add it to .gitignore and to "
        f"BUILD_PRODUCT_DIRS in scripts/mfsdp_lib/integrity/signature.py)"
        for p in sorted(present - expected)
    ]
    problems += [f"{p}: tracked by git but missing on disk" for p in sorted(expected - present)]
    unsigned = [
        p
        for p in tracked
        if not is_signed_path(p)
        and not any(seg in INSTALLER_SKIPS_DIRS or seg in INSTALLER_SKIPS_FILES for seg in p.split("/"))
        and p != SIGNATURE_NAME
        and p.split("/")[-1] not in VCS_FILES
    ]
    problems += [
        f"{p}: tracked by git but matches a build-product name, so it would be installed unsigned" for p in unsigned
    ]
    return problems


# --- model-signing glue ---------------------------------------------------------------------------------


def _model_signing() -> tuple[Any, Any, Any, Any]:
    try:
        import OpenSSL  # noqa: F401  (model-signing's certificate signer imports it)
        from model_signing import hashing, manifest, signing, verifying
    except ImportError as exc:
        raise InputError(f"{INSTALL_HINT} ({exc})") from None
    return hashing, manifest, signing, verifying


def _recorded_ignores() -> list[str]:
    """What the bundle records in ``ignore_paths`` (fixed, so two signings of the same files are alike).

    The signature file and the top-level build-product folders: with these recorded, the stock
    ``model_signing verify certificate --no-ignore-git-paths`` also accepts a checkout after set-up, except
    for nested ``__pycache__`` folders, which only this module's name rule can express.
    """
    return [SIGNATURE_NAME, *sorted(VCS_FILES | INSTALLER_SKIPS_DIRS | BUILD_PRODUCT_DIRS)]


def _hashing_config(root: pathlib.Path, files: list[str], subject: str | None):
    """A model-signing hashing config that hashes exactly ``files`` (and names the subject ``subject``)."""
    hashing, manifest, _, _ = _model_signing()
    base: Any = hashing.Config  # imported lazily (optional extra), so typed Any

    class _FixedSet(base):
        # model-signing walks the whole folder by default; the skill decides its own set, so pass it in.
        def hash(self, model_path, *, files_to_hash=None):  # noqa: A003 (library's name)
            m = super().hash(model_path, files_to_hash=[root / f for f in files])
            if subject is None:
                return m
            items = [
                manifest.FileManifestItem(path=pathlib.PurePosixPath(rd.identifier), digest=rd.digest)
                for rd in m.resource_descriptors()
            ]
            # The subject name is informative only (Manifest equality ignores it); model-signing takes it
            # from the folder's name, which is "ship" or "c" in a checkout, so set it to the skill's name.
            return manifest.Manifest(subject, items, m._serialization_type)  # noqa: SLF001 (pinned 1.1.1)

    cfg = _FixedSet().use_file_serialization(
        hashing_algorithm=HASH_ALGORITHM,
        allow_symlinks=False,
        ignore_paths=[pathlib.Path(p) for p in _recorded_ignores()],
    )
    # .gitignore / .gitattributes are installed with the skill, so they are signed (model-signing's default
    # would skip them); .git itself is never in the set.
    return cfg.set_ignored_paths(paths=_recorded_ignores(), ignore_git_paths=False)


def _need_file(path: str | os.PathLike, what: str) -> pathlib.Path:
    p = pathlib.Path(path)
    if not p.is_file():
        raise InputError(f"{what} {p}: no such file")
    return p


def sign(
    root: pathlib.Path, key: str, cert: str, chain: list[str], output: str | None = None, allow_untracked: bool = False
) -> tuple[pathlib.Path, list[str]]:
    """Write ``skill.oms.sig`` for ``root``; returns (signature path, signed files)."""
    key_p, cert_p = _need_file(key, "private key"), _need_file(cert, "signing certificate")
    chain_p = [_need_file(c, "chain certificate") for c in chain]
    files = signed_files(root)
    if not allow_untracked:
        problems = git_guard(root, files)
        if problems:
            raise InputError(
                "refusing to sign, the signature would not verify in a fresh clone: " + "; ".join(problems)
            )
    _, _, signing, _ = _model_signing()
    out = pathlib.Path(output) if output else root / SIGNATURE_NAME
    tmp = out.with_name(out.name + ".tmp")
    cfg = signing.Config().use_certificate_signer(
        private_key=key_p, signing_certificate=cert_p, certificate_chain=chain_p
    )
    cfg.set_hashing_config(_hashing_config(root, files, SKILL_NAME))
    try:
        cfg.sign(root, tmp)
    except (ValueError, OSError) as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"signing failed: {exc}") from None
    os.replace(tmp, out)  # atomic: a half-written bundle never replaces a good one
    return out, files


MAX_BUNDLE_BYTES = 16 * 1024 * 1024  # a bundle over ~400 files is ~100 KB


def _read_bundle_text(sig_path: pathlib.Path) -> str:
    if sig_path.exists() and not sig_path.is_file():
        raise InputError(f"{sig_path}: not a regular file")
    if sig_path.is_file() and sig_path.stat().st_size > MAX_BUNDLE_BYTES:
        raise InputError(f"{sig_path}: {sig_path.stat().st_size} bytes is too large for a signature bundle")
    return sig_path.read_text(encoding="utf-8")


def read_statement(sig_path: pathlib.Path) -> dict:
    """The in-toto statement inside a bundle (not authenticated: call after verification for trust)."""
    try:
        bundle = json.loads(_read_bundle_text(sig_path))
        env = bundle["dsseEnvelope"]
        statement = json.loads(base64.b64decode(env["payload"], validate=True))
    except FileNotFoundError:
        raise InputError(f"{sig_path}: no such file (sign with: bash scripts/dev.sh sign)") from None
    except (ValueError, KeyError, TypeError, binascii.Error, RecursionError) as exc:
        raise VerificationError(
            f"{sig_path.name}: not a Sigstore bundle with a DSSE envelope ({exc})",
            [f"{sig_path.name}: unreadable bundle"],
        ) from None
    # The payload is read before its signature is checked, so an edited one may have any JSON shape:
    # reject what the code below cannot walk (a list, a non-object predicate, resources without names).
    predicate = statement.get("predicate", {}) if isinstance(statement, dict) else None
    resources = predicate.get("resources", []) if isinstance(predicate, dict) else None
    subject = (statement.get("subject") or [{}]) if isinstance(statement, dict) else None
    if not (
        isinstance(resources, list)
        and all(
            isinstance(r, dict) and isinstance(r.get("name"), str) and isinstance(r.get("digest"), str)
            for r in resources
        )
        and isinstance(subject, list)
        and isinstance(subject[0], dict)
    ):
        raise VerificationError(
            f"{sig_path.name}: the DSSE payload is not an in-toto statement of signed files",
            [f"{sig_path.name}: malformed statement"],
        )
    return statement


def _signer_and_chain(sig_path: pathlib.Path) -> tuple[str, list[str]]:
    try:
        from cryptography import x509
        from cryptography.x509.oid import NameOID

        bundle = json.loads(sig_path.read_text(encoding="utf-8"))
        certs = bundle["verificationMaterial"]["x509CertificateChain"]["certificates"]
        names = []
        for c in certs:
            obj = x509.load_der_x509_certificate(base64.b64decode(c["rawBytes"]))
            cn = obj.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
            names.append(str(cn[0].value) if cn else obj.subject.rfc4514_string())
        return (names[0] if names else "?"), names
    except Exception:  # informative only; verification itself already passed
        return "?", []


def _file_problems(root: pathlib.Path, statement: dict, files: list[str], present: list[str]) -> list[str]:
    signed = {r["name"]: r["digest"] for r in statement.get("predicate", {}).get("resources", [])}
    problems = []
    on_disk = set(files) | set(present)
    for name in sorted(set(signed) | on_disk):
        if name not in on_disk:
            problems.append(f"{name}: removed (signed, but not in the folder)")
        elif name not in signed:
            problems.append(f"{name}: {_extra_reason(name)}")
        elif name not in files or not (root / name).is_file() or (root / name).is_symlink():
            problems.append(f"{name}: not a regular file (signed as one)")
        elif file_digest(root / name) != signed[name]:
            problems.append(f"{name}: changed (its {HASH_ALGORITHM} differs from the signed digest)")
    return problems


def card_identity(root: pathlib.Path) -> tuple[str | None, str | None]:
    """(name, version) from ``card.yaml`` at ``root``; (None, None) when there is no card or no such fields.

    Read with a line scan of the two top-level keys (no YAML library needed to verify)."""
    path = root / CARD
    if not path.is_file() or path.is_symlink():
        return None, None
    found: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh.read(1 << 20).splitlines():
                for key in ("name", "version"):
                    if line.startswith(f"{key}:"):
                        found.setdefault(key, line.split(":", 1)[1].split("#", 1)[0].strip().strip("'\""))
    except OSError:
        return None, None
    return found.get("name"), found.get("version")


def verify(
    root: pathlib.Path,
    trust_root: str,
    signature: str | None = None,
    expect_version: str | None = None,
    dev_tree: bool = False,
) -> Verified:
    """Verify ``root`` against its bundle; raises VerificationError naming what failed."""
    sig_path = pathlib.Path(signature) if signature else root / SIGNATURE_NAME
    if sig_path.exists() and not sig_path.is_file():
        raise InputError(f"{sig_path}: not a regular file")
    if not sig_path.is_file():
        raise InputError(f"{sig_path}: no such file (sign with: bash scripts/dev.sh sign)")
    root_p = _need_file(trust_root, "root certificate")
    statement = read_statement(sig_path)
    if statement.get("predicateType") != PREDICATE_TYPE:
        raise VerificationError(
            f"{sig_path.name}: predicateType is {statement.get('predicateType')!r}, expected {PREDICATE_TYPE!r}"
        )
    algos = {r.get("algorithm") for r in statement.get("predicate", {}).get("resources", [])}
    if algos - {HASH_ALGORITHM}:
        raise VerificationError(f"{sig_path.name}: digests use {sorted(algos)}, only {HASH_ALGORITHM} is supported")
    files = signed_files(root)
    _, _, _, verifying = _model_signing()
    try:
        cfg = verifying.Config().use_certificate_verifier(certificate_chain=[root_p], log_fingerprints=False)
    except ValueError as exc:  # not PEM, or not a certificate: the user gave the wrong file
        raise InputError(f"root certificate {root_p}: not a PEM certificate ({exc})") from None
    cfg.set_hashing_config(_hashing_config(root, files, None))
    try:
        cfg.verify(root, sig_path)
    except ValueError as exc:
        if not str(exc).startswith("Signature mismatch"):
            raise VerificationError(
                f"the bundle's signature is invalid: {exc}", [f"{sig_path.name}: DSSE signature or statement invalid"]
            ) from None
    except Exception as exc:  # OpenSSL chain errors, malformed bundles, bad signatures
        text = str(exc) or type(exc).__name__
        if type(exc).__name__ == "X509StoreContextError":
            raise VerificationError(
                f"the signing certificate does not chain to the root {root_p} ({text})",
                [f"{sig_path.name}: untrusted certificate chain"],
            ) from None
        if type(exc).__name__ == "InvalidSignature":
            raise VerificationError(
                "the DSSE signature does not match the signed statement (the bundle's "
                "payload or signature was edited after signing)",
                [f"{sig_path.name}: DSSE signature invalid"],
            ) from None
        raise VerificationError(
            f"the bundle does not verify: {type(exc).__name__}: {text}", [f"{sig_path.name}: signature check failed"]
        ) from None
    # Past this point the DSSE signature held (model-signing checks it before hashing), so the statement is
    # authentic. Compare it with the folder ourselves: that names each file, and it also catches a file the
    # bundle's own ignore_paths would hide (NVIDIA's ignore .gitignore, which the installer does copy).
    problems = _file_problems(root, statement, files, all_files(root, dev_tree))
    if problems:
        raise VerificationError(f"{len(problems)} file(s) differ from what was signed", problems)
    signer, chain = _signer_and_chain(sig_path)
    subject = (statement.get("subject") or [{}])[0].get("name", "?")
    # Every file is now known to be as signed, card.yaml included: its name and version are the release's.
    signed_names = {r["name"] for r in statement.get("predicate", {}).get("resources", [])}
    name, version = card_identity(root) if CARD in signed_names else (None, None)
    if name is not None and subject != name:
        raise VerificationError(
            f"the bundle was made for '{subject}' but {CARD} names the skill '{name}'",
            [f"{SIGNATURE_NAME}: subject '{subject}' is not the skill's name '{name}'"],
        )
    if expect_version is not None:
        if version is None:
            raise VerificationError(
                f"--expect-version {expect_version}: the signed folder has no {CARD} with a version",
                [f"{CARD}: no signed version"],
            )
        if version != expect_version:
            raise VerificationError(
                f"this is release {version} of '{subject}', intact and signed, but not the expected {expect_version}",
                [f"{CARD}: version {version}, expected {expect_version}"],
            )
    return Verified(files=files, subject=subject, signer=signer, chain=chain, version=version)
