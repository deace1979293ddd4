"""``runs.resume``: what check says about the checkpoint a config resumes from."""

from __future__ import annotations

from _helpers_ckptlog import FIXTURES, materialise
from mfsdp_lib.runs import resume


def _ckpt(tmp_path, name="torch_dist_ddp"):
    return str(materialise(FIXTURES / "ckpt" / name, tmp_path / name))


def test_format_mismatch_names_both_formats_and_bridges_assert(tmp_path):
    ckpt = _ckpt(tmp_path)
    (f,) = resume.findings([("checkpoint.load", ckpt)], "fsdp_dtensor")
    assert f.rule == resume.RULE and f.severity == "error" and f.path == "checkpoint.load"
    assert "holds a torch_dist checkpoint" in f.message and "differs from inferred format 'torch_dist'" in f.message
    assert resume.findings([("checkpoint.load", ckpt)], "torch_dist") == []


def test_pretrained_checkpoint_is_not_read_when_load_holds_a_checkpoint(tmp_path):
    """Bridge's load_checkpoint falls back to pretrained_checkpoint only when load holds none."""
    load = _ckpt(tmp_path, "fsdp_dtensor_ok")
    pretrained = _ckpt(tmp_path)
    folders = [("checkpoint.load", load), ("checkpoint.pretrained_checkpoint", pretrained)]
    assert resume.findings(folders, "fsdp_dtensor") == []
    empty = tmp_path / "fresh"
    empty.mkdir()
    folders = [("checkpoint.load", str(empty)), ("checkpoint.pretrained_checkpoint", pretrained)]
    (f,) = resume.findings(folders, "fsdp_dtensor")
    assert f.path == "checkpoint.pretrained_checkpoint"


def test_a_folder_that_is_not_a_checkpoint_is_not_judged(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    assert resume.findings([("checkpoint.load", str(tmp_path))], "fsdp_dtensor") == []
