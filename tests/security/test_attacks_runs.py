"""Hostile checkpoints, launch lines and planted package metadata: one test per attack (SECURITY.md).

Checkpoint attacks start from the committed real fixture (``tests/fixtures/ckpt/fsdp_dtensor_ok``, saved by
Bridge 0.6.2) and change only what the attack needs; every command runs in a subprocess with a time limit.
"""

from __future__ import annotations

import json
import os
import shlex
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _helpers_ckptlog import CKPT_STORED, materialise

TIMEOUT = 30
ITER = "iter_0000020"
SHARD_RECORD = b"X" + struct.pack("<I", 12) + b"__0_0.distcp"  # BINUNICODE relative_path in the real .metadata


def _ckpt(tmp_path) -> Path:
    return materialise(CKPT_STORED / "fsdp_dtensor_ok", tmp_path / "ck")


def _json(cli, *args):
    start = time.monotonic()
    p = cli("ckpt", *map(str, args), "--format", "json", timeout=TIMEOUT)
    elapsed = time.monotonic() - start
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode in (0, 1, 2), (p.returncode, p.stderr)
    return p, (json.loads(p.stdout) if p.stdout.strip() else None), elapsed


def _rules(obj, severity="error"):
    return {f["rule"] for f in obj["findings"] if f["severity"] == severity}


def _u(text: str) -> bytes:
    b = text.encode()
    return b"X" + struct.pack("<I", len(b)) + b


# --------------------------------------------------------------------------- 5. .metadata: crash, time, code


def test_5_metadata_nested_200000_deep_is_refused_not_a_segfault(cli, tmp_path):
    root = _ckpt(tmp_path)
    # a dict whose key is a tuple nested 200,000 deep: hashing it recursed in C and killed the interpreter
    deep = b"\x80\x02}" + b")" + b"\x85" * 200_000 + b"K\x01s."
    (root / ITER / ".metadata").write_bytes(deep)
    p, obj, elapsed = _json(cli, root)
    assert p.returncode == 1 and "MFSDP-CKPT-DCP-METADATA-BAD" in _rules(obj), obj["findings"]
    assert elapsed < 10
    # nested lists (no hashing) and a value that contains itself are refused the same way
    (root / ITER / ".metadata").write_bytes(b"\x80\x02" + b"]" * 5000 + b"a" * 4999 + b".")
    p, obj, _ = _json(cli, root)
    assert any("nested more than" in f["message"] for f in obj["findings"]), obj["findings"]
    (root / ITER / ".metadata").write_bytes(b"\x80\x02]q\x00h\x00a.")
    p, obj, _ = _json(cli, root)
    assert any("contains itself" in f["message"] for f in obj["findings"]), obj["findings"]


@pytest.mark.parametrize("mib", [8, 16])
def test_5_large_hostile_metadata_answers_in_seconds(cli, tmp_path, mib):
    root = _ckpt(tmp_path)
    body = b"N0" * (mib * 1024 * 1024 // 2)  # one-byte opcodes: the slowest input per byte for the walk
    (root / ITER / ".metadata").write_bytes(b"\x80\x02" + body + b"N.")
    p, obj, elapsed = _json(cli, root)
    assert elapsed < 10, elapsed
    assert p.returncode == 1 and "MFSDP-CKPT-DCP-METADATA-BAD" in _rules(obj)


_METADATA_HEAD = b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81}" + _u("state_dict_metadata")


@pytest.mark.parametrize(
    "body, reason",
    [
        # more opcodes than the walk takes (3 million nested marks, 3 MB): it falls back to a names-only scan
        (_METADATA_HEAD + b"(" * 3_000_000 + _u("__0_0.distcp") + b"sb.", "opcodes"),
        # past the size walked in full (16 MiB of one-byte opcodes), with the class and shard name a scan looks for
        (_METADATA_HEAD + b"N" * (16 * 1024 * 1024) + _u("__0_0.distcp") + b"sb.", "bytes"),
    ],
    ids=["nested-3M-opcodes", "16MiB"],
)
def test_5_metadata_the_walk_refuses_is_never_ok(cli, tmp_path, body, reason):
    """A .metadata too large or too complex to walk names the right class and shard, yet what it would import
    is unknown: an error that says not to load it and why, exit 1, "ok": false (it once exited 0, ok)."""
    root = _ckpt(tmp_path)
    (root / ITER / ".metadata").write_bytes(body)
    p, obj, elapsed = _json(cli, root)
    assert elapsed < 10, elapsed
    assert p.returncode == 1 and obj["ok"] is False, obj["findings"]
    f = next(f for f in obj["findings"] if f["rule"] == "MFSDP-CKPT-METADATA-UNCHECKED")
    assert f["severity"] == "error" and reason in f["message"] and "do not load" in f["fix"], f
    text = cli("ckpt", str(root), timeout=TIMEOUT)
    assert text.returncode == 1 and "ERROR" in text.stdout and "MFSDP-CKPT-METADATA-UNCHECKED" in text.stdout


@pytest.mark.parametrize(
    "key",
    [b")" + b"\x85" * 200_000, b"K\x07", b")"],
    ids=["tuple-nested-200000-deep", "int", "empty-tuple"],
)
def test_5_metadata_whose_state_dict_key_is_not_a_string_is_malformed(cli, tmp_path, key):
    """A Metadata pickle whose state-dict key is a tuple nested 200,000 deep (or any non-string): torch's
    FileSystemWriter writes string keys only (Metadata.state_dict_metadata: dict[str, ...]), so the file is
    malformed. It was reported ok with a conversion hint; now it is an error naming .metadata, no conversion."""
    root = _ckpt(tmp_path)
    (root / ITER / ".metadata").write_bytes(_METADATA_HEAD + b"}" + key + b"K\x01ssb.")
    p, obj, elapsed = _json(cli, root)
    assert elapsed < 10
    assert p.returncode in (1, 2) and obj is not None and obj["ok"] is False, (p.returncode, obj)
    f = next(f for f in obj["findings"] if f["rule"] == "MFSDP-CKPT-DCP-METADATA-BAD")
    assert ".metadata" in f["message"] and "not a string" in f["message"] and "do not load" in f["fix"], f
    assert "MFSDP-CKPT-CONVERT" not in {g["rule"] for g in obj["findings"]}, obj["findings"]


def test_5_metadata_nested_past_the_depth_limit_says_do_not_load(cli, tmp_path):
    """A well-formed Metadata whose state holds lists nested 150 deep (pickle itself would load it): refused by
    the walk, so an error telling the user not to load it, never ok."""
    root = _ckpt(tmp_path)
    (root / ITER / ".metadata").write_bytes(_METADATA_HEAD + b"}s" + _u("x") + b"]" * 150 + b"a" * 149 + b"sb.")
    p, obj, _ = _json(cli, root)
    assert p.returncode == 1 and obj["ok"] is False
    f = next(f for f in obj["findings"] if f["rule"] == "MFSDP-CKPT-DCP-METADATA-BAD")
    assert "nested more than" in f["message"] and "do not load" in f["fix"], f


def _malicious_metadata(extra_call: bytes) -> bytes:
    """A DCP Metadata whose storage_data holds a REDUCE of a function: what pickle.load would call."""
    return (
        b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81}"
        + _u("state_dict_metadata")
        + b"}s"
        + _u("storage_data")
        + extra_call
        + b"sb."
    )


@pytest.mark.parametrize(
    "call",
    [b"cos\nsystem\n" + _u("touch PWNED") + b"\x85R", b"cbuiltins\neval\n" + _u("1") + b"\x85R"],
    ids=["os.system", "builtins.eval"],
)
def test_5_malicious_pickle_in_metadata_is_an_error_and_never_runs(cli, tmp_path, call):
    root = _ckpt(tmp_path)
    (root / ITER / ".metadata").write_bytes(_malicious_metadata(call))
    p = cli("ckpt", str(root), "--format", "json", cwd=tmp_path, timeout=TIMEOUT)
    obj = json.loads(p.stdout)
    assert p.returncode == 1 and "MFSDP-CKPT-UNSAFE-PICKLE" in _rules(obj), obj["findings"]
    msg = next(f["message"] for f in obj["findings"] if f["rule"] == "MFSDP-CKPT-UNSAFE-PICKLE")
    assert ("os.system" in msg) or ("builtins.eval" in msg)
    assert not (tmp_path / "PWNED").exists()


def test_5_malicious_pickle_in_train_state_is_an_error(cli, tmp_path):
    import zipfile

    root = _ckpt(tmp_path)
    ts = root / ITER / "train_state.pt"
    with zipfile.ZipFile(ts, "w") as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02}" + _u("step") + b"cos\nsystem\n" + _u("id") + b"\x85Rs.")
    p, obj, _ = _json(cli, root)
    assert p.returncode == 1 and "MFSDP-CKPT-UNSAFE-PICKLE" in _rules(obj), obj["findings"]


def test_5_real_metadata_is_still_read_in_full(cli, tmp_path):
    p, obj, _ = _json(cli, _ckpt(tmp_path))
    assert p.returncode == 0, obj["findings"]
    assert obj["details"]["inspected"]["dcp_metadata"]["tensors"] > 0


def test_5_fifo_as_metadata_does_not_hang(cli, tmp_path):
    root = _ckpt(tmp_path)
    (root / ITER / ".metadata").unlink()
    os.mkfifo(root / ITER / ".metadata")
    p, obj, elapsed = _json(cli, root)
    assert elapsed < 10 and "MFSDP-CKPT-DCP-METADATA-BAD" in _rules(obj)


# --------------------------------------------------------------------------- 8. 10,005 iteration folders


def test_8_ten_thousand_and_five_iterations_name_the_newest(cli, tmp_path):
    root = _ckpt(tmp_path)
    for i in range(1, 10_006):
        if i != 20:
            (root / f"iter_{i:07d}").mkdir()
    newest = root / "iter_0010005"
    for name in os.listdir(root / ITER):
        os.link(root / ITER / name, newest / name)
    (root / "latest_checkpointed_iteration.txt").write_text("10005\n")
    (root / "latest_train_state.pt").unlink()
    p, obj, elapsed = _json(cli, root)
    assert obj["latest"] == 10005 and len(obj["iterations"]) == 10_005
    assert "MFSDP-CKPT-TRACKER-MISSING" not in _rules(obj), obj["findings"]
    assert elapsed < TIMEOUT


# --------------------------------------------------------------------------- 11. shard paths, empty .metadata


@pytest.mark.parametrize("rel", ["../../outside.distcp", "/tmp/outside.distcp", "..\\..\\outside.distcp"])
def test_11_shard_paths_outside_the_folder_are_not_followed(cli, tmp_path, rel):
    root = _ckpt(tmp_path)
    meta = root / ITER / ".metadata"
    data = meta.read_bytes()
    assert data.count(SHARD_RECORD) == 1
    meta.write_bytes(data.replace(SHARD_RECORD, _u(rel)))
    target = (root / ITER / rel) if not rel.startswith("/") else Path(rel)
    if "\\" not in rel:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"\0" * (1 << 20))  # the outside file exists and is large enough
    p, obj, _ = _json(cli, root)
    assert p.returncode == 1 and "MFSDP-CKPT-SHARD-OUTSIDE" in _rules(obj), obj["findings"]
    msg = next(f["message"] for f in obj["findings"] if f["rule"] == "MFSDP-CKPT-SHARD-OUTSIDE")
    assert rel in msg


def test_11_empty_metadata_is_an_error(cli, tmp_path):
    root = _ckpt(tmp_path)
    (root / ITER / ".metadata").write_bytes(b"")
    p, obj, _ = _json(cli, root)
    assert p.returncode == 1 and "MFSDP-CKPT-DCP-METADATA-BAD" in _rules(obj)
    assert any("empty" in f["message"] for f in obj["findings"])


# --------------------------------------------------------------------------- 7. smoke: metacharacters stay inert


METACHARS = ["o;touch M1", "o$(touch M2)", "o`touch M3`", "o' ; touch M4 ; '", 'o" && touch M5 "', "o\ntouch M6"]


@pytest.mark.parametrize("out", METACHARS)
@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_7_dry_run_line_pasted_into_a_shell_runs_nothing_extra(cli, tmp_path, out, launcher):
    extra = ["--nnodes", "2"] if launcher == "srun" else []
    p = cli("smoke", "--dry-run", "--launcher", launcher, *extra, "--out", out, cwd=tmp_path, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr
    line = p.stdout.strip()
    argv = shlex.split(line)
    assert argv[argv.index("--out") + 1] == str(tmp_path / out)
    # what a user pasting it gets: the shell parses it to exactly that list (echo stands in for the launcher)
    shown = subprocess.run(
        ["bash", "-c", "printf '%s\\0' " + line], capture_output=True, cwd=tmp_path, timeout=TIMEOUT
    ).stdout.split(b"\0")[:-1]
    assert [a.decode() for a in shown] == argv
    assert not list(tmp_path.glob("M*"))


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_7_launch_runs_an_argument_list_without_a_shell(tmp_path, monkeypatch, launcher):
    """The real launch path, with the launcher replaced by a recorder on PATH (no GPU here)."""
    from conftest import SCRIPTS  # noqa: F401  (sys.path set-up)
    from mfsdp_lib.runs import smoke

    fake = tmp_path / "bin"
    fake.mkdir()
    rec = tmp_path / "argv.json"
    for name in ("srun", "pyrec"):
        script = fake / name
        script.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(rec)!r}, 'w'))\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    import argparse

    opts = argparse.Namespace(
        nproc_per_node=1,
        nnodes=2 if launcher == "srun" else 1,
        node_rank=0,
        master_addr=None,
        master_port=29500,
        launcher=launcher,
        strategy="optim_grads_params",
        model="tiny",
        iters=1,
        seq_length=8,
        global_batch_size=1,
        micro_batch_size=1,
        save_resume=False,
        out=str(tmp_path / "o;touch M"),
    )
    cmd = smoke.build_command(opts, python=str(fake / "pyrec"))
    assert smoke.launch(cmd, tmp_path / "train.log") == 0
    seen = json.loads(rec.read_text())
    assert seen[-1] == str(tmp_path / "o;touch M") and seen == cmd[1:]
    assert not (tmp_path / "M").exists() and not Path("M").exists()


# --------------------------------------------------------------------------- 6. planted *.egg-info


@pytest.fixture
def planted(root, tmp_path):
    """A copy of the skill's scripts/ with a megatron_bridge egg-info and a megatron/ package planted in it.

    Planted in a private copy, never in the skill folder itself: other tests copy that folder at the same
    time (the suite runs in parallel), and a half-removed plant there breaks their copy.
    """
    import importlib.metadata as md
    import shutil

    try:
        md.distribution("megatron-bridge")
        pytest.skip("megatron-bridge is really installed here: the planted one cannot be told apart by this test")
    except md.PackageNotFoundError:
        pass
    skill = tmp_path / "skill"
    shutil.copytree(root / "scripts", skill / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("SKILL.md", "card.yaml"):  # anchors reads the skill's own text
        shutil.copy2(root / name, skill / name)
    shutil.copytree(root / "references", skill / "references")
    egg = skill / "scripts" / "megatron_bridge-0.6.2.egg-info"
    pkg = skill / "scripts" / "megatron"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: megatron-bridge\nVersion: 0.6.2\n")
    (pkg / "bridge").mkdir(parents=True)
    (pkg / "bridge" / "__init__.py").write_text("raise SystemExit('planted megatron.bridge was imported')\n")
    return skill / "scripts" / "mfsdp.py"


def test_6_planted_egg_info_is_not_believed(planted):
    def run(*args):
        return subprocess.run(
            [sys.executable, str(planted), *args], capture_output=True, text=True, timeout=TIMEOUT, cwd=planted.parent
        )

    p = run("enable", "--recipe", "llama3_8b_pretrain_config")
    assert p.returncode == 2 and "needs Megatron-Bridge installed" in p.stderr, p.stderr
    p = run("anchors")
    assert p.returncode == 2 and "not installed" in p.stderr, p.stderr
    assert "planted" not in p.stderr


def test_6_environment_paths_leave_out_the_skill_folder(root):
    from mfsdp_lib.integrity import installed

    assert str(root / "scripts") in [str(Path(p).resolve()) for p in sys.path if p]
    assert all(not installed._inside_skill(p) for p in installed.environment_paths())
