"""skill.oms.sig: the bundle's shape, tamper detection, the signed set, NVIDIA's own skills.

Signing tests sign a throw-away copy of this skill with a throw-away certificate authority made at test
time (``signing_keys``, ``_helpers_ca``); nothing is written into the repository. The check of the
committed signature needs only the shipped root certificate. Only two groups may skip, each saying why:
NVIDIA's own signed skills (not ours to redistribute) and the comparison of the shipped root with the
release signing chain (held by the skill's signers).
"""

from __future__ import annotations

import base64
import json
import pathlib
import shutil
import subprocess
import sys

# The `sign` extra (bash scripts/dev.sh test installs it): a missing one is a failure, not a skip.
import model_signing  # noqa: E402,F401
import OpenSSL  # noqa: E402,F401
import pytest

from mfsdp_lib import SKILL_NAME
from mfsdp_lib.integrity import signature as sig

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "scripts" / "skill_signature.py"
SHIPPED_ROOT = ROOT / "signing" / "root.crt.pem"
NVIDIA_DRIFTED = {"SKILL.md", "card.yaml", "evals/evals.json"}  # per SOURCES.md of the fixture
MAX_SHOWN = 8  # files named in the committed-signature failure; `skill_signature.py verify` lists them all


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="session")
def keys(signing_keys):
    return signing_keys


@pytest.fixture(scope="module")
def _signed_template(tmp_path_factory, keys):
    """This skill's signed set (no .git), signed once for the module: signing hashes every file."""
    dest = tmp_path_factory.mktemp("signed") / sig.SKILL_NAME
    for rel in sig.signed_files(ROOT):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    sig.sign(dest, keys["key"], keys["cert"], keys["chain"])
    return dest


@pytest.fixture
def signed_copy(tmp_path, _signed_template):
    """A freshly signed copy of this skill's signed set, the test's own to tamper with."""
    dest = tmp_path / sig.SKILL_NAME
    shutil.copytree(_signed_template, dest, symlinks=True)
    return dest


def _bundle(path: pathlib.Path) -> dict:
    return json.loads((path / sig.SIGNATURE_NAME).read_text())


def _statement(path: pathlib.Path) -> dict:
    return json.loads(base64.b64decode(_bundle(path)["dsseEnvelope"]["payload"]))


def _fails_naming(path, keys, *needles):
    with pytest.raises(sig.VerificationError) as info:
        sig.verify(path, keys["root"])
    text = str(info.value) + "\n" + "\n".join(info.value.problems)
    for needle in needles:
        assert needle in text, text
    return info.value


# --- shape ---------------------------------------------------------------------------------------------


def test_bundle_has_nvidias_shape_and_covers_every_file(signed_copy):
    bundle = _bundle(signed_copy)
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert len(bundle["verificationMaterial"]["x509CertificateChain"]["certificates"]) == 3  # leaf, ICA, root
    assert bundle["dsseEnvelope"]["payloadType"] == "application/vnd.in-toto+json"
    st = _statement(signed_copy)
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://model_signing/signature/v1.0"
    assert [s["name"] for s in st["subject"]] == [SKILL_NAME]
    ser = st["predicate"]["serialization"]
    assert ser["method"] == "files" and ser["hash_type"] == "sha256"
    assert "skill.oms.sig" in ser["ignore_paths"]
    names = [r["name"] for r in st["predicate"]["resources"]]
    assert names == sig.signed_files(signed_copy)
    assert "skill.oms.sig" not in names
    # Code is signed too, not only documents.
    assert "scripts/mfsdp.py" in names and "scripts/skill_signature.py" in names
    assert {r["algorithm"] for r in st["predicate"]["resources"]} == {"sha256"}


def test_round_trip_verifies_and_names_the_signer(signed_copy, keys):
    ok = sig.verify(signed_copy, keys["root"])
    assert ok.subject == sig.SKILL_NAME
    assert ok.files == sig.signed_files(signed_copy)
    assert ok.signer == keys["signer"]
    assert ok.version == sig.card_identity(ROOT)[1]


# --- tampering -----------------------------------------------------------------------------------------


def test_changed_byte_is_named(signed_copy, keys):
    target = signed_copy / "scripts" / "mfsdp.py"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    err = _fails_naming(signed_copy, keys, "scripts/mfsdp.py: changed")
    assert len(err.problems) == 1


def test_added_file_is_named(signed_copy, keys):
    (signed_copy / "scripts" / "evil.py").write_text("import os\n")
    _fails_naming(signed_copy, keys, "scripts/evil.py: added")


def test_added_dotfile_and_gitignore_are_caught(signed_copy, keys):
    # The installer copies dotfiles; model-signing's default would skip .gitignore, this rule does not.
    (signed_copy / "references").mkdir(exist_ok=True)
    (signed_copy / "references" / ".hidden").write_text("x")
    _fails_naming(signed_copy, keys, "references/.hidden: added")


def test_removed_file_is_named(signed_copy, keys):
    (signed_copy / "scripts" / "mfsdp_lib" / "findings.py").unlink()
    _fails_naming(signed_copy, keys, "scripts/mfsdp_lib/findings.py: removed")


def test_edited_dsse_payload_is_rejected(signed_copy, keys):
    path = signed_copy / sig.SIGNATURE_NAME
    bundle = json.loads(path.read_text())
    st = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    # Make the statement bless a tampered script: the DSSE signature no longer covers the statement.
    for res in st["predicate"]["resources"]:
        if res["name"] == "scripts/mfsdp.py":
            res["digest"] = "0" * 64
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(st).encode()).decode()
    path.write_text(json.dumps(bundle))
    (signed_copy / "scripts" / "mfsdp.py").write_text("tampered\n")
    err = _fails_naming(signed_copy, keys, "DSSE signature does not match")
    assert err.problems == ["skill.oms.sig: DSSE signature invalid"]


def test_wrong_root_is_rejected(signed_copy, tmp_path):
    from _helpers_ca import make_chain

    other = make_chain(tmp_path / "other-ca", label="Other")["root"]
    with pytest.raises(sig.VerificationError) as info:
        sig.verify(signed_copy, other)
    assert "does not chain to the root" in str(info.value)


def test_build_products_are_not_signed_but_verify_reports_them(signed_copy, keys):
    """Signing leaves build products out; verifying names each one (a .pyc or egg-info can be loaded)."""
    rels = [
        ".venv/bin/python",
        "node_modules/skills/package.json",
        ".cache/node/x",
        ".pytest_cache/v/cache/lastfailed",
        ".hypothesis/examples/ab",
        "scripts/__pycache__/a.pyc",
        "tests/__pycache__/b.cpython-311.pyc",
        "x.egg-info/PKG-INFO",
        "build/lib/a.py",
        "scripts/mfsdp_lib/stale.pyc",
    ]
    for rel in rels:
        p = signed_copy / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("local build product\n")
    assert sig.signed_files(signed_copy) == [r["name"] for r in _statement(signed_copy)["predicate"]["resources"]]
    err = _fails_naming(signed_copy, keys, *[f"{r}: " for r in rels])
    assert len(err.problems) == len(rels)
    # a maintainer's working tree: the top-level tool folders and __pycache__ are accepted, nothing else
    err = _fails_naming(signed_copy, keys, "x.egg-info/PKG-INFO", "build/lib/a.py", "scripts/mfsdp_lib/stale.pyc")
    with pytest.raises(sig.VerificationError) as info:
        sig.verify(signed_copy, keys["root"], dev_tree=True)
    assert sorted(p.split(":")[0] for p in info.value.problems) == [
        "build/lib/a.py",
        "scripts/mfsdp_lib/stale.pyc",
        "x.egg-info/PKG-INFO",
    ]


def test_git_checkout_refuses_to_sign_an_untracked_file(tmp_path, keys):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "SKILL.md").write_text("---\nname: x\ndescription: y\n---\n")
    (repo / ".gitignore").write_text(".venv/\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    (repo / "notes.txt").write_text("scratch\n")
    proc = run_tool(
        "sign",
        "--key",
        keys["key"],
        "--cert",
        keys["cert"],
        "--chain",
        keys["chain"][0],
        "--chain",
        keys["chain"][1],
        repo,
    )
    assert proc.returncode == 2
    assert "notes.txt: not tracked by git" in proc.stderr
    assert not (repo / sig.SIGNATURE_NAME).exists()
    (repo / "notes.txt").unlink()
    (repo / ".venv").mkdir()
    (repo / ".venv" / "x").write_text("build product\n")
    proc = run_tool(
        "sign",
        "--key",
        keys["key"],
        "--cert",
        keys["cert"],
        "--chain",
        keys["chain"][0],
        "--chain",
        keys["chain"][1],
        repo,
    )
    assert proc.returncode == 0, proc.stderr


# --- the signed set and .gitignore agree ---------------------------------------------------------------


def _gitignore_patterns() -> list[str]:
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def test_every_gitignored_name_is_outside_the_signed_set():
    for pat in _gitignore_patterns():
        name = pat.strip("/")
        if pat.endswith("/"):
            sample = f"sub/{name.replace('*', 'x')}/file.txt"
        else:
            sample = f"sub/{name.replace('*', 'x')}"
        assert not sig.is_signed_path(sample), (
            f".gitignore has {pat!r} but {sample} would be signed: add the name to BUILD_PRODUCT_DIRS or "
            f"BUILD_PRODUCT_SUFFIXES in scripts/mfsdp_lib/integrity/signature.py (names match at any depth)"
        )


def test_every_build_product_name_is_gitignored():
    patterns = set(_gitignore_patterns())
    for name in sig.BUILD_PRODUCT_DIRS | {"__pycache__", "__pypackages__"}:
        assert f"{name}/" in patterns or f"/{name}/" in patterns, f"{name}/ missing from .gitignore"
    for suffix in sig.BUILD_PRODUCT_SUFFIXES:
        assert f"*{suffix}" in patterns
    for suffix in sig.BUILD_PRODUCT_DIR_SUFFIXES:
        assert f"*{suffix}/" in patterns


def test_installer_skips_are_not_signed():
    assert not sig.is_signed_path("tests/fixtures/ckpt/metadata.json")
    assert not sig.is_signed_path(".git/config")
    assert not sig.is_signed_path("skill.oms.sig")
    assert sig.is_signed_path("references/skill.oms.sig.md")
    assert sig.is_signed_path(".gitattributes")


# --- NVIDIA's signed skills ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nemo-mbridge-perf-megatron-fsdp", "nemo-mbridge-perf-activation-recompute"])
def test_nvidia_intact_skills_verify(nvidia_skills, name):
    base = nvidia_skills
    proc = run_tool("verify", "--root", base / "nvidia-agent-capabilities-root.pem", base / name)
    assert proc.returncode == 0, proc.stderr
    assert "verified: 5 files" in proc.stdout
    assert f"subject '{name}'" in proc.stdout


def test_nvidia_drifted_skill_is_rejected_naming_its_files(nvidia_skills):
    base = nvidia_skills
    proc = run_tool(
        "verify", "--root", base / "nvidia-agent-capabilities-root.pem", base / "nemo-mbridge-perf-cuda-graphs"
    )
    assert proc.returncode == 1
    named = {ln.strip().split(":")[0] for ln in proc.stderr.splitlines()[1:] if ln.strip()}
    assert named == NVIDIA_DRIFTED, proc.stderr
    assert "changed" in proc.stderr and "Traceback" not in proc.stderr


def test_nvidia_skill_with_our_root_is_untrusted(nvidia_skills):
    proc = run_tool("verify", "--root", SHIPPED_ROOT, nvidia_skills / "nemo-mbridge-perf-megatron-fsdp")
    assert proc.returncode == 1
    assert "does not chain to the root" in proc.stderr


# --- CLI contract --------------------------------------------------------------------------------------


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    proc = run_tool("verify", tmp_path / "absent")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not a folder" in proc.stderr
    proc = run_tool("verify", tmp_path)
    assert proc.returncode == 2 and "skill.oms.sig: no such file" in proc.stderr
    proc = run_tool("sign", "--key", tmp_path / "nokey.pem", "--cert", tmp_path / "c.pem", tmp_path)
    assert proc.returncode == 2 and "private key" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / sig.SIGNATURE_NAME).write_text("{not json")
    proc = run_tool("verify", tmp_path)
    assert proc.returncode == 1 and "not a Sigstore bundle" in proc.stderr


def test_cli_files_lists_the_signed_set():
    proc = run_tool("files")
    assert proc.returncode == 0
    assert proc.stdout.split() == sig.signed_files(ROOT)


def test_no_private_key_is_in_the_skill():
    assert not [p for p in sig.signed_files(ROOT) if p.endswith(".key.pem")], "a private key must never be in the skill"


def test_shipped_root_is_the_release_root(release_signing):
    assert SHIPPED_ROOT.read_bytes() == (release_signing / "root.crt.pem").read_bytes()


# --- the committed signature ---------------------------------------------------------------------------


def test_committed_signature_matches_the_committed_files():
    """Fails when someone changed the skill and forgot to re-sign (checked as a maintainer's tree)."""
    resign = "re-sign with: bash scripts/dev.sh sign   (then commit skill.oms.sig)"
    if not (ROOT / sig.SIGNATURE_NAME).is_file():
        pytest.fail(f"skill.oms.sig is missing; {resign}")
    try:
        sig.verify(ROOT, SHIPPED_ROOT, dev_tree=True)
    except sig.VerificationError as exc:
        shown = exc.problems[:MAX_SHOWN]
        more = f"; ... and {len(exc.problems) - MAX_SHOWN} more" if len(exc.problems) > MAX_SHOWN else ""
        pytest.fail(f"skill.oms.sig does not match the files; {resign}. {exc}: {'; '.join(shown)}{more}")


def test_symlinked_file_is_refused_with_its_name(signed_copy, keys):
    (signed_copy / "scripts" / "link.py").symlink_to(signed_copy / "scripts" / "mfsdp.py")
    proc = run_tool("verify", "--root", keys["root"], signed_copy)
    assert proc.returncode == 2 and "scripts/link.py: is a symbolic link" in proc.stderr


def test_symlinked_folder_is_refused_by_name_and_never_followed(signed_copy, keys, tmp_path):
    """A link to a folder outside the skill: named as a link, and nothing behind it is read or listed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "payload.py").write_text("import os\n")
    (signed_copy / "scripts" / "vendor").symlink_to(outside, target_is_directory=True)
    proc = run_tool("verify", "--root", keys["root"], signed_copy)
    assert proc.returncode == 2 and "scripts/vendor: is a symbolic link" in proc.stderr
    assert "payload.py" not in proc.stderr


@pytest.mark.parametrize(
    "payload",
    [
        [1],
        "x",
        {"predicateType": sig.PREDICATE_TYPE, "predicate": []},
        {"predicateType": sig.PREDICATE_TYPE, "predicate": {"resources": [5]}},
        {"predicateType": sig.PREDICATE_TYPE, "predicate": {"resources": 5}},
    ],
)
def test_edited_payload_of_any_shape_is_rejected_not_a_crash(tmp_path, payload):
    """The payload is parsed before its signature is checked: an edit to any JSON shape must be exit 1
    with a clear line (the issue's tamper case), not exit 3 'internal error'."""
    bundle = json.loads((ROOT / sig.SIGNATURE_NAME).read_text())
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    forged = tmp_path / "forged.sig"
    forged.write_text(json.dumps(bundle))
    proc = run_tool("verify", "--signature", forged, ROOT)
    assert proc.returncode == 1, proc.stderr
    assert "not an in-toto statement" in proc.stderr and "internal error" not in proc.stderr


def test_root_that_is_not_a_certificate_is_exit_2(tmp_path):
    junk = tmp_path / "root.pem"
    junk.write_bytes(b"\x00\x99 not a certificate\n")
    proc = run_tool("verify", "--root", junk, ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "not a PEM certificate" in proc.stderr and "internal error" not in proc.stderr


def test_bundle_nested_too_deep_is_rejected_not_a_crash(tmp_path):
    forged = tmp_path / "deep.sig"
    forged.write_text('{"dsseEnvelope": ' + "[" * 100_000 + "]" * 100_000 + "}")
    proc = run_tool("verify", "--signature", forged, ROOT)
    assert proc.returncode == 1 and "not a Sigstore bundle" in proc.stderr and "internal error" not in proc.stderr
