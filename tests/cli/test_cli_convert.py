"""``mfsdp.py convert``: argument handling and refusals (exit 2, one line, nothing written), without torch.

The conversion itself needs torch, Megatron-Bridge and a GPU (tests/gpu/test_convert_gpu.py). Everything
here runs before any heavy import, so it must hold on this machine, which has no torch; the refusals are also
run under a Python where importing torch fails outright (a blocker on sys.path), to prove no refusal depends
on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _helpers_ckptlog import CKPT, copy_tree


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*")}


def _no_torch_env(tmp_path: Path) -> dict:
    """PYTHONPATH entries whose torch / megatron packages raise on import: no heavy import may happen."""
    block = tmp_path / "blocker"
    for name in ("torch", "megatron"):
        (block / name).mkdir(parents=True, exist_ok=True)
        (block / name / "__init__.py").write_text(f"raise ImportError('{name} must not be imported here')\n")
    return {"PYTHONPATH": str(block)}


def _refuse(cli, tmp_path, *args):
    """Run convert, expect exit 2 with one stderr line and nothing new on disk under tmp_path."""
    env = _no_torch_env(tmp_path)
    before = _snapshot(tmp_path)
    proc = cli("convert", *args, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    after = _snapshot(tmp_path)
    assert after == before, set(after) ^ set(before)
    return lines[0]


@pytest.fixture()
def src(tmp_path):
    return copy_tree(CKPT / "torch_dist_ddp", tmp_path / "src")


def test_help_teaches(cli):
    proc = cli("convert", "--help")
    assert proc.returncode == 0
    out = proc.stdout
    for word in ("torch_dist", "fsdp_dtensor", "hf", "load_optim=false", "optimizer", "world size 1", "--dry-run"):
        assert word in out, word
    assert "convert" in cli("--help").stdout


def test_refuses_non_empty_destination(cli, tmp_path, src):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("the user's file")
    line = _refuse(cli, tmp_path, str(src), str(dst), "--to", "fsdp_dtensor")
    assert "not empty" in line and (dst / "keep.txt").read_text() == "the user's file"


def test_refuses_destination_equal_to_or_inside_source(cli, tmp_path, src):
    assert "is the source" in _refuse(cli, tmp_path, str(src), str(src), "--to", "fsdp_dtensor")
    inside = src / "converted"
    assert "is the source" in _refuse(cli, tmp_path, str(src), str(inside), "--to", "fsdp_dtensor")
    it = next(src.glob("iter_*"))
    assert "is the source" in _refuse(cli, tmp_path, str(it), str(it / "x"), "--to", "fsdp_dtensor")


def test_refuses_a_file_as_destination(cli, tmp_path, src):
    f = tmp_path / "afile"
    f.write_text("x")
    assert "not a folder" in _refuse(cli, tmp_path, str(src), str(f), "--to", "fsdp_dtensor")


def test_refuses_unknown_format(cli, tmp_path, src):
    line = _refuse(cli, tmp_path, str(src), str(tmp_path / "dst"), "--to", "zarr")
    assert "torch_dist, fsdp_dtensor, hf" in line


def test_refuses_source_that_is_not_a_checkpoint(cli, tmp_path):
    empty = tmp_path / "nothing"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    assert "not a checkpoint" in _refuse(cli, tmp_path, str(empty), str(tmp_path / "dst"), "--to", "hf")
    missing = tmp_path / "missing"
    assert str(missing) in _refuse(cli, tmp_path, str(missing), str(tmp_path / "dst"), "--to", "hf")


def test_refuses_same_format(cli, tmp_path, src):
    assert "already torch_dist" in _refuse(cli, tmp_path, str(src), str(tmp_path / "dst"), "--to", "torch_dist")


def test_refuses_incomplete_source(cli, tmp_path):
    src = copy_tree(CKPT / "no_payload", tmp_path / "src")
    line = _refuse(cli, tmp_path, str(src), str(tmp_path / "dst"), "--to", "hf", "--hf-config", str(tmp_path))
    assert "refusing to convert" in line and "MFSDP-CKPT-NO-PAYLOAD" in line


def test_refuses_a_torch_dist_save_without_its_marker(cli, tmp_path):
    src = copy_tree(CKPT / "torch_dist_ddp", tmp_path / "src")
    (src / "iter_0000020" / "metadata.json").unlink()
    line = _refuse(cli, tmp_path, str(src), str(tmp_path / "dst"), "--to", "fsdp_dtensor")
    assert "refusing to convert" in line and "MFSDP-CKPT-INCOMPLETE-SAVE" in line


def test_refuses_legacy_torch(cli, tmp_path):
    src = copy_tree(CKPT / "legacy_torch", tmp_path / "src")
    assert "cannot be converted here" in _refuse(cli, tmp_path, str(src), str(tmp_path / "d"), "--to", "torch_dist")


def test_export_to_hf_needs_an_architecture(cli, tmp_path):
    src = copy_tree(CKPT / "fsdp_dtensor_ok", tmp_path / "src")
    line = _refuse(cli, tmp_path, str(src), str(tmp_path / "dst"), "--to", "hf")
    if "hf_model_id" in line:  # the fixture's run_config records none
        assert "--hf-config" in line
    bad = tmp_path / "not_hf"
    bad.mkdir()
    line = _refuse(cli, tmp_path, str(src), str(tmp_path / "dst"), "--to", "hf", "--hf-config", str(bad))
    assert "no config.json" in line


def test_dry_run_checks_and_plans_without_torch(cli, tmp_path, src):
    env = _no_torch_env(tmp_path)
    before = _snapshot(tmp_path)
    proc = cli("convert", str(src), str(tmp_path / "dst"), "--to", "fsdp_dtensor", "--dry-run", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "optimizer state" in proc.stdout and "dropped" in proc.stdout and "nothing written" in proc.stdout
    assert "torch_dist -> fsdp_dtensor" in proc.stdout
    assert _snapshot(tmp_path) == before


def test_without_torch_a_valid_request_says_what_is_missing(cli, tmp_path, src):
    line = _refuse(cli, tmp_path, str(src), str(tmp_path / "dst"), "--to", "fsdp_dtensor")
    assert "convert needs torch and Megatron-Bridge" in line and "--dry-run" in line
    assert not list(tmp_path.glob(".mfsdp-convert-*"))


def test_empty_destination_folder_is_accepted(cli, tmp_path, src):
    dst = tmp_path / "dst"
    dst.mkdir()
    proc = cli("convert", str(src), str(dst), "--to", "fsdp_dtensor", "--dry-run")
    assert proc.returncode == 0, proc.stderr


def test_an_import_from_hugging_face_may_hold_a_zero_tracker_and_nothing_else_may(tmp_path):
    # What an hf -> fsdp_dtensor import writes: iteration 0 (a starting point for
    # checkpoint.pretrained_checkpoint); the same tracker on a resume target is still refused.
    from mfsdp_lib.cli import convert
    from mfsdp_lib.runs import checkpoints

    ck = copy_tree(CKPT / "fsdp_dtensor_ok", tmp_path / "imported")
    (ck / checkpoints.TRACKER_TXT).write_text("0\n")
    for extra in ck.glob(checkpoints.TRACKER_TRAIN_STATE):
        extra.unlink()
    resume = convert._check_written(str(ck), "fsdp_dtensor")
    assert any(p.startswith("MFSDP-CKPT-TRACKER-BAD") for p in resume)
    start = convert._check_written(str(ck), "fsdp_dtensor", starting_point=True)
    assert not any(p.startswith("MFSDP-CKPT-TRACKER-BAD") for p in start)
    (ck / checkpoints.TRACKER_TXT).write_text("garbage\n")  # only the import's 0 is excused
    assert any(p.startswith("MFSDP-CKPT-TRACKER-BAD") for p in convert._check_written(str(ck), "fsdp_dtensor", True))
