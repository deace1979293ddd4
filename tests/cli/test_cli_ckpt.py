"""``mfsdp.py ckpt``: exit codes, JSON contract, bad input without tracebacks, no torch needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _helpers_ckptlog import CKPT, REAL_CKPT, copy_tree, without_read_override
from conftest import MFSDP

JSON_KEYS = {"ok", "findings", "format", "iterations", "config"}  # the minimum
FINDING_KEYS = {"rule", "severity", "path", "message", "fix"}  # same shape as `check`


def run_json(cli, *args):
    proc = cli("ckpt", *args, "--format", "json")
    assert "Traceback" not in proc.stderr
    return proc, json.loads(proc.stdout)


@pytest.mark.parametrize(
    "name,code,fmt",
    [
        ("fsdp_dtensor_ok", 0, "fsdp_dtensor"),
        ("torch_dist_ddp", 0, "torch_dist"),
        ("hf_llama", 0, "hf"),
        ("tracker_missing", 1, "fsdp_dtensor"),
        ("no_payload", 1, None),
        ("config_torch_dist_dcp_on_disk", 1, "fsdp_dtensor"),
        ("dtensor_without_mfsdp", 1, "fsdp_dtensor"),
        ("legacy_torch", 1, "torch"),
    ],
)
def test_exit_codes_and_json(cli, name, code, fmt):
    proc, obj = run_json(cli, str(CKPT / name))
    assert proc.returncode == code
    assert set(obj) >= JSON_KEYS and obj["format"] == fmt
    assert obj["ok"] is (code == 0)
    for f in obj["findings"]:
        assert set(f) >= FINDING_KEYS and f["severity"] in ("error", "warning", "info")
    assert any(f["severity"] == "error" for f in obj["findings"]) is (code == 1)


def test_expect(cli, tmp_path):
    empty = tmp_path / "passing.json"
    empty.write_text('{"passing": []}')
    proc = cli(
        "ckpt",
        str(CKPT / "torch_dist_ddp"),
        "--expect",
        "fsdp_dtensor",
        "--format",
        "json",
        env={"MFSDP_MIGRATION_TABLE": str(empty)},
    )
    obj = json.loads(proc.stdout)
    assert proc.returncode == 1
    f = next(f for f in obj["findings"] if f["rule"] == "MFSDP-CKPT-EXPECT")
    assert "mfsdp.py convert" not in f["fix"] and "references/checkpoints.md" in f["fix"]  # not recorded as passing
    passing = tmp_path / "passing2.json"
    passing.write_text('{"passing": [{"from": "torch_dist", "to": "fsdp_dtensor", "models": ["dense"]}]}')
    proc = cli(
        "ckpt",
        str(CKPT / "torch_dist_ddp"),
        "--expect",
        "fsdp_dtensor",
        "--format",
        "json",
        env={"MFSDP_MIGRATION_TABLE": str(passing)},
    )
    f = next(f for f in json.loads(proc.stdout)["findings"] if f["rule"] == "MFSDP-CKPT-EXPECT")
    assert f["fix"].startswith(f"python3 {MFSDP.resolve()} convert ") and f["fix"].endswith("--to fsdp_dtensor")
    assert cli("ckpt", str(CKPT / "fsdp_dtensor_ok"), "--expect", "fsdp_dtensor").returncode == 0


def test_json_carries_run_config_and_iterations(cli):
    _, obj = run_json(cli, str(CKPT / "fsdp_dtensor_ok"))
    assert obj["iterations"] == [20] and obj["latest"] == 20
    assert obj["config"]["checkpoint.ckpt_format"] == "fsdp_dtensor"
    assert obj["config"]["ddp.use_megatron_fsdp"] is True
    assert obj["details"]["tracker"]["latest_train_state.pt"]["step"] == 20


def test_text_report(cli):
    proc = cli("ckpt", str(CKPT / "config_torch_dist_dcp_on_disk"))
    assert proc.returncode == 1
    assert "format:     fsdp_dtensor" in proc.stdout
    assert "MFSDP-CKPT-FORMAT-MISMATCH" in proc.stdout and "fix:" in proc.stdout


def test_real_run_copy(cli):
    proc, obj = run_json(cli, str(REAL_CKPT))
    assert obj["format"] == "fsdp_dtensor" and obj["latest"] == 10
    assert proc.returncode == 1  # the 214 MB shard was left out of the fixture
    assert {f["rule"] for f in obj["findings"] if f["severity"] == "error"} == {"MFSDP-CKPT-NO-PAYLOAD"}


def test_help_teaches(cli):
    proc = cli("ckpt", "--help")
    assert proc.returncode == 0
    assert "examples:" in proc.stdout and "--expect fsdp_dtensor" in proc.stdout and "--trust-pickle" in proc.stdout


def _unusable(tmp_path, kind):
    p = tmp_path / "x"
    if kind == "missing":
        return p
    if kind == "file":
        p.write_text("not a folder")
    elif kind == "loop":
        os.symlink(tmp_path / "y", p)
        os.symlink(p, tmp_path / "y")
    elif kind == "empty_dir":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "random_dir":
        p.mkdir()
        (p / "notes.txt").write_text("hello")
    return p


@pytest.mark.parametrize("kind", ["missing", "file", "loop", "empty_dir", "fifo", "random_dir"])
def test_unusable_path_exit_2_one_line(cli, tmp_path, kind):
    proc = cli("ckpt", str(_unusable(tmp_path, kind)))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""


def test_permission_denied(tmp_path):
    root = copy_tree(CKPT / "fsdp_dtensor_ok", tmp_path / "ck")
    os.chmod(root, 0)
    try:
        proc = subprocess.run(
            [*without_read_override(), sys.executable, str(MFSDP), "ckpt", str(root)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.chmod(root, 0o755)
    assert proc.returncode == 2 and "permission denied" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_unreadable_iteration_does_not_hide_others(cli, tmp_path):
    """A broken symlink loop inside the root is reported, not fatal."""
    root = copy_tree(CKPT / "fsdp_dtensor_ok", tmp_path / "ck")
    os.symlink(root / "iter_0000009", root / "iter_0000008")
    os.symlink(root / "iter_0000008", root / "iter_0000009")
    proc, obj = run_json(cli, str(root))
    assert obj["format"] == "fsdp_dtensor" and proc.returncode in (0, 1)


def test_runs_without_torch(cli, tmp_path):
    """Shadow torch with a module that fails on import: ckpt must not notice."""
    fake = tmp_path / "shadow" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('torch must not be imported by ckpt')\n")
    env = {"PYTHONPATH": str(tmp_path / "shadow")}
    proc = cli("ckpt", str(CKPT / "fsdp_dtensor_ok"), env=env)
    assert proc.returncode == 0, proc.stderr
    proc = cli("ckpt", str(CKPT / "fsdp_dtensor_ok"), "--trust-pickle", env=env)
    assert proc.returncode == 0 and "--trust-pickle" in proc.stderr and "Traceback" not in proc.stderr


def test_deeply_nested_run_config_is_reported_not_a_segfault(cli, tmp_path):
    """libyaml's composer overflowed the C stack on a 50,000-level run_config.yaml: ckpt died with SIGSEGV."""
    root = copy_tree(REAL_CKPT, tmp_path / "ck")
    (root / "iter_0000010" / "run_config.yaml").write_text("- " * 50_000 + "x\n")
    proc, obj = run_json(cli, str(root))
    assert proc.returncode in (0, 1), proc.returncode
    assert any("nested more than" in f["message"] for f in obj["findings"])


def test_metadata_json_nested_too_deep_is_a_finding(cli, tmp_path):
    """json.loads raises RecursionError (not ValueError) past ~1,000 levels: ckpt exited 3 'internal error'."""
    root = copy_tree(REAL_CKPT, tmp_path / "ck")
    (root / "iter_0000010" / "metadata.json").write_text("[" * 100_000 + "]" * 100_000)
    proc, obj = run_json(cli, str(root))
    assert proc.returncode in (0, 1), proc.stderr
    assert any("metadata.json unreadable" in f["message"] for f in obj["findings"])


def _big_metadata_ckpt(tmp_path, monkeypatch):
    """The real fixture with a walk limit below its .metadata's size: the unchecked-metadata error, in-process."""
    from mfsdp_lib.runs import checkpoint_files

    monkeypatch.setattr(checkpoint_files, "MAX_DCP_FULL_PARSE", 1000)
    root = copy_tree(REAL_CKPT, tmp_path / "ck")
    (root / "iter_0000010" / "__0_0.distcp").write_bytes(b"")  # the fixture keeps metadata only: add its shard
    return root


@pytest.mark.parametrize("torch_reads", [True, False], ids=["torch-reads-it", "torch-refuses"])
def test_trust_pickle_vouches_for_unchecked_metadata_only_when_torch_reads_it(
    tmp_path, monkeypatch, capsys, torch_reads
):
    """--trust-pickle: once torch's DCP reader read the file, the unchecked error becomes a warning (exit 0);
    if torch could not read it (or is absent), the error stays. torch cannot be installed here, so its reader
    is replaced by a stand-in returning what it returns (labelled: the one mock in this module)."""
    import mfsdp
    from mfsdp_lib.runs import checkpoints

    root = _big_metadata_ckpt(tmp_path, monkeypatch)
    assert mfsdp.main(["ckpt", str(root), "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False
    answer = ({"entries": 3, "keys_sample": []}, None) if torch_reads else (None, "torch could not read .metadata")
    monkeypatch.setattr(checkpoints, "trusted_dcp_summary", lambda path: answer)  # stand-in for torch's reader
    code = mfsdp.main(["ckpt", str(root), "--format", "json", "--trust-pickle"])
    out = json.loads(capsys.readouterr().out)
    f = next(f for f in out["findings"] if f["rule"] == "MFSDP-CKPT-METADATA-UNCHECKED")
    if torch_reads:
        assert code == 0 and out["ok"] is True and f["severity"] == "warning" and "--trust-pickle" in f["message"]
    else:
        assert code == 1 and out["ok"] is False and f["severity"] == "error"


def test_printed_commands_quote_paths_and_name_the_installed_script(cli, tmp_path):
    """A checkpoint under a folder with a space, inspected from the user's project: the convert command and the
    tracker repairs paste as they are (one word per path, the skill's mfsdp.py by its absolute path)."""
    import shlex

    root = copy_tree(CKPT / "torch_dist_ddp", tmp_path / "my ckpts" / "run 1")
    proc, obj = run_json(cli, str(root))
    fix = next(f["fix"] for f in obj["findings"] if f["rule"] == "MFSDP-CKPT-CONVERT")
    words = shlex.split(fix)
    assert words[:3] == ["python3", str(MFSDP.resolve()), "convert"], words
    assert words[3] == str(root / "iter_0000020") and words[5:7] == ["--to", "fsdp_dtensor"], words
    # a tracker that points nowhere: the repair commands quote the folder too
    (root / "latest_checkpointed_iteration.txt").write_text("30\n")
    (root / "latest_train_state.pt").unlink()
    proc, obj = run_json(cli, str(root))
    fix = next(f["fix"] for f in obj["findings"] if f["rule"] == "MFSDP-CKPT-TRACKER-MISSING")
    echo = fix[fix.index("echo ") :].rstrip(")")
    assert shlex.split(echo) == ["echo", "20", ">", str(root / "latest_checkpointed_iteration.txt")], echo
