"""mfsdp_lib.runs.checkpoints: safe metadata reading and the judgement of checkpoint folders.

Facts are checked against the real run's files and against the pinned Bridge / Megatron-Core sources.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _helpers_ckptlog import (
    CKPT,
    CKPT_STORED,
    FIXTURES,
    REAL_CKPT,
    copy_tree,
    real_checkpoint_roots,
)
from mfsdp_lib import shell
from mfsdp_lib.findings import InputError
from mfsdp_lib.runs import checkpoint_files as F
from mfsdp_lib.runs import checkpoints as C
from mfsdp_lib.runs import pickle_reader as P

REAL_ITER = REAL_CKPT / "iter_0000010"


def rules(report, severity=None):
    return {f.rule for f in report.findings if severity is None or f.severity == severity}


# --- the safe pickle reader ------------------------------------------------------------------------------


def test_real_dcp_metadata_is_read_without_unpickling():
    summary, err = F.read_dcp_metadata(str(REAL_ITER / ".metadata"))
    assert err is None
    # The run's README: one 214 MB __0_0.distcp held every tensor; .metadata must say the same.
    assert list(summary["files"]) == ["__0_0.distcp"]
    assert 200e6 < summary["files"]["__0_0.distcp"] < 230e6
    assert summary["tensor_bytes"] <= summary["files"]["__0_0.distcp"]
    # Megatron FSDP's fsdp_dtensor keys (checkpoint_inspector's defaults: "model.module", "optimizer.state...").
    assert {"model.module", "optimizer.state"} <= set(summary["key_groups"])
    assert summary["tensors"] + summary["objects"] == summary["entries"]


def test_real_train_state_scalars():
    ts, err = F.read_train_state(str(REAL_ITER / "train_state.pt"))
    assert err is None
    # 10 iterations of global batch 8 (README): step 10, 80 samples consumed.
    assert ts["step"] == 10 and ts["consumed_train_samples"] == 80
    assert ts["do_train"] is True and ts["do_valid"] is False


def test_pickle_reader_never_executes(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    data = pickle.dumps({"x": Evil()}, protocol=2)
    tree = P.read_pickle_tree(data)
    call = tree["x"]
    assert isinstance(call, P.Call) and call.func.name == "system"
    assert call.args == (f"touch {marker}",)
    assert not marker.exists()


@pytest.mark.parametrize("proto", [0, 2, 4, 5])
def test_pickle_reader_plain_data_round_trip(proto):
    value = {"a": [1, 2.5, "x", None, True], "b": (1, (2, 3)), "c": {"n": -(2**70)}}
    if proto >= 3:  # protocols 0-2 pickle bytes as a _codecs.encode call, which stays an inert Call record
        value["d"] = b"\0\1"
    assert P.read_pickle_tree(pickle.dumps(value, protocol=proto)) == value


def test_pickle_reader_rejects_truncated_and_garbage():
    data = (REAL_ITER / ".metadata").read_bytes()
    with pytest.raises(P.PickleUnreadable):
        P.read_pickle_tree(data[: len(data) // 2])
    with pytest.raises(P.PickleUnreadable):
        P.read_pickle_tree(b"not a pickle at all")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_pickle_reader_only_ever_raises_pickleunreadable(data):
    try:
        P.read_pickle_tree(data)
    except P.PickleUnreadable:
        pass


def test_train_state_unreadable_cases(tmp_path):
    bad = tmp_path / "train_state.pt"
    bad.write_bytes(b"\x80\x02}q\x00.")  # a legacy (non-zip) torch.save: refused, not unpickled
    ts, err = F.read_train_state(str(bad))
    assert ts is None and "not a zip" in err
    z = tmp_path / "z.pt"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("archive/version", b"3\n")
    ts, err = F.read_train_state(str(z))
    assert ts is None and "data.pkl" in err


# --- facts against the pinned sources -----------------------------------------------------------------------


def test_file_names_match_bridge(bridge_src):
    text = (bridge_src / "megatron/bridge/training/utils/checkpoint_utils.py").read_text()
    assert f'TRAIN_STATE_FILE = "{F.TRAIN_STATE}"' in text
    assert f'CONFIG_FILE = "{F.RUN_CONFIG}"' in text
    assert 'TRACKER_PREFIX = "latest"' in text and F.TRACKER_TRAIN_STATE == "latest_" + F.TRAIN_STATE
    assert f'"{F.TRACKER_TXT}"' in text
    assert '"iter_{:07d}"' in text
    markers = re.search(r"_ITERATION_DIR_MARKERS = \((.*?)\n\)", text, re.S).group(1)
    assert "CONFIG_FILE" in markers and "TRAIN_STATE_FILE" in markers
    assert f'"{F.MCORE_DIST_CONFIG}"' in markers and f'"{F.DCP_METADATA}"' in markers
    for name in F.HF_WEIGHT_FILES:
        assert f'"{name}"' in text


def test_format_detection_order_matches_bridge(bridge_src):
    text = (bridge_src / "megatron/bridge/training/checkpointing.py").read_text()
    body = text[text.index("def _get_checkpoint_format") : text.index("def find_checkpoint_rank_0")]
    # torch_dist (metadata.json) first, then DCP .metadata -> fsdp_dtensor, then hf, else Unknown.
    order = [
        body.index(s)
        for s in ("check_is_distributed_checkpoint", '".metadata"', "is_hf_checkpoint_dir", "Unknown checkpoint format")
    ]
    assert order == sorted(order)


def test_mcore_dist_config_name(mcore_src):
    text = (mcore_src / "megatron/core/dist_checkpointing/core.py").read_text()
    assert f"CONFIG_FNAME = '{F.MCORE_DIST_CONFIG}'" in text
    assert "sharded_backend: str" in text


def test_quoted_assertions_exist_in_bridge(bridge_src):
    """The Bridge messages the findings quote are the real ones (so users can grep their logs for them)."""
    cfg = (bridge_src / "megatron/bridge/training/config.py").read_text()
    ckpt = (bridge_src / "megatron/bridge/training/checkpointing.py").read_text()
    quoted = {
        "config_torch_dist_dcp_on_disk": ("from config differs from inferred format", ckpt),
        "dtensor_without_mfsdp": ("fsdp_dtensor checkpoint format only supports Megatron FSDP", cfg),
    }
    for name, (quote, source) in quoted.items():
        messages = " ".join(f.message for f in C.inspect(str(CKPT / name)).findings)
        assert quote in messages and quote in source
    assert "Megatron-FSDP requires the fsdp_dtensor checkpointing format!" in cfg


# --- judging folders ----------------------------------------------------------------------------------------

CASES = {
    # folder: (format, error rules expected)
    "fsdp_dtensor_ok": ("fsdp_dtensor", set()),
    "torch_dist_ddp": ("torch_dist", set()),
    "tracker_missing": ("fsdp_dtensor", {"MFSDP-CKPT-TRACKER-MISSING"}),
    "no_payload": (None, {"MFSDP-CKPT-NO-PAYLOAD"}),
    "config_torch_dist_dcp_on_disk": ("fsdp_dtensor", {"MFSDP-CKPT-FORMAT-MISMATCH"}),
    "dtensor_without_mfsdp": ("fsdp_dtensor", {"MFSDP-CKPT-DTENSOR-WITHOUT-MFSDP"}),
    "hf_llama": ("hf", set()),
    "legacy_torch": ("torch", {"MFSDP-CKPT-CONVERT"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_cases(name):
    fmt, errors = CASES[name]
    report = C.inspect(str(CKPT / name))
    assert report.format == fmt
    assert rules(report, "error") == errors


def _table(tmp_path, monkeypatch, *paths):
    """A synthetic passing table (the real one is written from the GPU result by ckpt_migration_result.py)."""
    t = tmp_path / "passing.json"
    t.write_text(json.dumps({"schema": "x", "passing": [{"from": a, "to": b, "models": ["dense"]} for a, b in paths]}))
    monkeypatch.setenv("MFSDP_MIGRATION_TABLE", str(t))
    return t


def test_torch_dist_offers_convert_only_when_recorded_passing(tmp_path, monkeypatch):
    _table(tmp_path, monkeypatch)  # nothing recorded as passing
    report = C.inspect(str(CKPT / "torch_dist_ddp"))
    assert report.inspected.backend == "torch_dist"
    conv = [f for f in report.findings if f.rule == "MFSDP-CKPT-CONVERT"]
    assert conv and "mfsdp.py convert" not in conv[0].fix and "recorded" in conv[0].fix
    assert "references/checkpoints.md" in conv[0].fix and conv[0].extra["recorded_passing"] is False
    _table(tmp_path, monkeypatch, ("torch_dist", "fsdp_dtensor"))
    report = C.inspect(str(CKPT / "torch_dist_ddp"))
    conv = [f for f in report.findings if f.rule == "MFSDP-CKPT-CONVERT"]
    src = report.inspected.path
    assert conv[0].fix == f"python3 {shell.SCRIPT} convert {src} <output_dir> --to fsdp_dtensor"


def test_expect_not_met_gives_the_conversion(tmp_path, monkeypatch):
    _table(tmp_path, monkeypatch, ("torch_dist", "fsdp_dtensor"))
    report = C.inspect(str(CKPT / "torch_dist_ddp"), expect="fsdp_dtensor")
    exp = [f for f in report.findings if f.rule == "MFSDP-CKPT-EXPECT"]
    assert exp and exp[0].severity == "error" and "mfsdp.py convert" in exp[0].fix and "--to fsdp_dtensor" in exp[0].fix
    assert "MFSDP-CKPT-EXPECT" not in rules(C.inspect(str(CKPT / "fsdp_dtensor_ok"), expect="fsdp_dtensor"))


def test_export_to_hf_names_the_architecture(tmp_path, monkeypatch):
    _table(tmp_path, monkeypatch, ("fsdp_dtensor", "hf"))
    report = C.inspect(str(CKPT / "fsdp_dtensor_ok"))
    fix = next(f.fix for f in report.findings if f.rule == "MFSDP-CKPT-CONVERT")
    assert "--to hf --hf-config " in fix


def test_committed_table_matches_the_committed_result():
    """ckpt's commands come from scripts/data/ckpt_migration_passing.json; it must be what the GPU result says."""
    from mfsdp_lib.runs import migration

    table = migration.load_table(migration.TABLE_PATH)
    result = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "ckpt_migration_1xh200.json"
    if result.is_file():
        rows = json.loads(result.read_text())["rows"]
        assert table["passing"] == migration.passing_from_rows(rows)
    else:  # no GPU evidence yet: nothing may be recorded as passing
        assert table["passing"] == [] and table["source"] is None


def test_no_payload_points_at_the_last_complete_iteration():
    report = C.inspect(str(CKPT / "no_payload"))
    f = next(f for f in report.findings if f.rule == "MFSDP-CKPT-NO-PAYLOAD")
    assert f.path.endswith("iter_0000020") and "checkpoint.ckpt_step=10" in f.fix


def test_tracker_missing_names_both_iterations():
    f = next(f for f in C.inspect(str(CKPT / "tracker_missing")).findings if f.rule == "MFSDP-CKPT-TRACKER-MISSING")
    assert "iter_0000030" in f.message and "iter_0000020" in f.message and "ckpt_step=20" in f.fix


def test_iteration_folder_directly():
    report = C.inspect(str(CKPT / "fsdp_dtensor_ok" / "iter_0000020"))
    assert report.kind == "iteration" and report.format == "fsdp_dtensor" and report.iterations == [20]
    assert not rules(report, "error")


def test_real_metadata_only_copy_reports_missing_shards():
    report = C.inspect(str(REAL_CKPT))
    assert report.format == "fsdp_dtensor" and report.latest == 10
    f = next(f for f in report.findings if f.rule == "MFSDP-CKPT-NO-PAYLOAD")
    assert "__0_0.distcp" in f.message


def test_real_run_with_shard_restored_is_consistent(tmp_path):
    root = copy_tree(REAL_CKPT, tmp_path / "ck")
    need = F.read_dcp_metadata(str(root / "iter_0000010/.metadata"))[0]["files"]["__0_0.distcp"]
    shard = root / "iter_0000010/__0_0.distcp"
    with open(shard, "wb") as f:  # sparse: the size .metadata records, no disk used
        f.truncate(need)
    report = C.inspect(str(root))
    assert not rules(report, "error")
    assert report.config["checkpoint.ckpt_format"] == "fsdp_dtensor"
    with open(shard, "r+b") as f:
        f.truncate(need - 1)
    assert "MFSDP-CKPT-SHARDS-INCOMPLETE" in rules(C.inspect(str(root)), "error")


def test_trackers_disagree(tmp_path):
    root = copy_tree(CKPT / "fsdp_dtensor_ok", tmp_path / "ck")
    (root / "latest_checkpointed_iteration.txt").write_text("19")
    assert "MFSDP-CKPT-TRACKER-DISAGREE" in rules(C.inspect(str(root)), "warning")
    (root / "latest_checkpointed_iteration.txt").write_text("banana")
    # Bridge reads latest_train_state.pt first and never parses the text file beside it: only Megatron-LM's
    # tools would exit on it, so a warning; without the train-state tracker Bridge parses it, so an error.
    assert (root / "latest_train_state.pt").is_file()
    assert "MFSDP-CKPT-TRACKER-BAD" in rules(C.inspect(str(root)), "warning")
    assert "MFSDP-CKPT-TRACKER-BAD" not in rules(C.inspect(str(root)), "error")
    (root / "latest_train_state.pt").unlink()
    assert "MFSDP-CKPT-TRACKER-BAD" in rules(C.inspect(str(root)), "error")


def test_run_config_enables_mfsdp_but_torch_dist_on_disk(tmp_path):
    root = copy_tree(CKPT / "torch_dist_ddp", tmp_path / "ck")
    cfg = root / "iter_0000020/run_config.yaml"
    cfg.write_text(cfg.read_text().replace("  use_megatron_fsdp: false", "  use_megatron_fsdp: true"))
    assert "MFSDP-CKPT-MFSDP-NOT-DTENSOR" in rules(C.inspect(str(root)), "error")


def _torch_dist_without_marker(tmp_path, common_pt=True) -> Path:
    """What an interrupted torch_dist save leaves, and a copy that drops files named metadata.json: the tracker,
    .metadata with torch_dist's tensor names, the shards, common.pt and a torch_dist run_config.yaml."""
    root = copy_tree(CKPT / "torch_dist_ddp", tmp_path / "ck")
    (root / "iter_0000020" / F.MCORE_DIST_CONFIG).unlink()
    if common_pt:
        (root / "iter_0000020" / F.LEGACY_COMMON).write_bytes(b"PK\x05\x06" + bytes(18))
    return root


@pytest.mark.parametrize("common_pt", [True, False], ids=["with-common.pt", "tensor-names-only"])
def test_torch_dist_save_without_its_marker_is_an_incomplete_torch_dist_save(tmp_path, common_pt):
    """It was called fsdp_dtensor with the fix "load with checkpoint.ckpt_format=fsdp_dtensor", a load that finds
    none of its tensor names. The tensor names (and common.pt) say torch_dist; the missing marker says incomplete."""
    root = _torch_dist_without_marker(tmp_path, common_pt)
    report = C.inspect(str(root))
    assert report.format == "torch_dist", report.format
    assert rules(report, "error") == {"MFSDP-CKPT-INCOMPLETE-SAVE"}, report.findings
    f = next(f for f in report.findings if f.rule == "MFSDP-CKPT-INCOMPLETE-SAVE")
    assert "incomplete torch_dist save" in f.message and "decoder.*" in f.message
    assert ("common.pt" in f.message) is common_pt
    # never a load that fails: no fsdp_dtensor advice, no conversion (convert reads what a load reads)
    for g in report.findings:
        assert "ckpt_format=fsdp_dtensor" not in g.fix, g
    assert "MFSDP-CKPT-CONVERT" not in rules(report)
    assert report.to_dict()["inspected"]["incomplete_save"]["missing"] == "metadata.json"
    # following the fix (the marker Megatron-Core writes) gives a complete, consistent torch_dist checkpoint
    assert "echo '" in f.fix
    marker = f.fix.split("echo ", 1)[1].split(" > ", 1)[0].strip("'")
    (root / "iter_0000020" / F.MCORE_DIST_CONFIG).write_text(marker)
    fixed = C.inspect(str(root))
    assert fixed.format == "torch_dist" and not rules(fixed, "error"), fixed.findings
    assert (CKPT / "torch_dist_ddp/iter_0000020/metadata.json").read_text().strip() == marker


def test_torch_dist_marker_text_is_what_mcore_writes(mcore_src):
    core = (mcore_src / "megatron/core/dist_checkpointing/core.py").read_text()
    torch_py = (mcore_src / "megatron/core/dist_checkpointing/strategies/torch.py").read_text()
    ser = (mcore_src / "megatron/core/dist_checkpointing/serialization.py").read_text()
    assert "json.dump(asdict(config), f)" in core and "sharded_backend_version: int = 1" in core
    assert 'backend: str = "torch_dist",\n        version: int = 1,' in torch_py
    assert json.loads(F.MCORE_DIST_CONFIG_TEXT) == {"sharded_backend": "torch_dist", "sharded_backend_version": 1}
    # the marker is written after the shards (metadata_finalize_fn after sharded_strategy.save), and the common
    # state is one ShardedObject "common_state" of shape (1,) at offset (0,): unique key common_state/shard_0_1
    body = ser[ser.index("def save(") :]
    assert body.index("sharded_strategy.save(sharded_state_dict, checkpoint_dir)") < body.index(
        "metadata_finalize_fn()\n"
    )
    assert 'key="common_state"' in body and "global_shape=(1,)" in body and "global_offset=(0,)" in body
    assert F.MCORE_COMMON_STATE_KEY == "common_state/shard_0_1"
    assert (
        "COMMON_STATE_FNAME = 'common.pt'"
        in (mcore_src / "megatron/core/dist_checkpointing/strategies/common.py").read_text()
    )


def test_dcp_folder_with_fsdp_dtensor_names_stays_fsdp_dtensor_whatever_run_config_says():
    """Tensor names outvote the run config: torch_dist recorded, model.* names on disk is a mismatch."""
    report = C.inspect(str(CKPT / "config_torch_dist_dcp_on_disk"))
    assert report.format == "fsdp_dtensor" and "MFSDP-CKPT-FORMAT-MISMATCH" in rules(report, "error")
    assert "MFSDP-CKPT-INCOMPLETE-SAVE" not in rules(report)


def test_damaged_metadata_is_a_warning_not_a_crash(tmp_path):
    root = copy_tree(CKPT / "fsdp_dtensor_ok", tmp_path / "ck")
    (root / "iter_0000020/.metadata").write_bytes(b"\x80\x04garbage")
    (root / "iter_0000020/run_config.yaml").write_text("checkpoint: [unclosed")
    report = C.inspect(str(root))
    assert report.format == "fsdp_dtensor"
    assert "MFSDP-CKPT-METADATA-UNREADABLE" in rules(report, "warning")


@pytest.mark.parametrize("bad", ["missing", "file", "loop", "empty_dir"])
def test_unusable_paths_raise_inputerror(tmp_path, bad):
    p = tmp_path / "x"
    if bad == "file":
        p.write_text("hi")
    elif bad == "loop":
        os.symlink(tmp_path / "y", p)
        os.symlink(p, tmp_path / "y")
    elif bad == "empty_dir":
        p.mkdir()
    with pytest.raises(InputError):
        C.inspect(str(p))


def test_marker_file_given_suggests_folder():
    with pytest.raises(InputError, match="give its folder instead"):
        C.inspect(str(REAL_ITER / "run_config.yaml"))


# --- real runs (the recorded H200 run, plus any GPU runs recorded under tests/fixtures/gpu-run/) ---------------

TENSOR_FILES_LEFT_OUT = {"MFSDP-CKPT-NO-PAYLOAD", "MFSDP-CKPT-SHARDS-INCOMPLETE"}


@pytest.mark.parametrize("root", real_checkpoint_roots(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_real_runs_are_self_consistent(root: Path):
    report = C.inspect(str(root))
    assert report.format in F.FORMATS
    # A real Bridge save always agrees with the run_config it wrote next to it; the only errors allowed are the
    # tensor files fixtures leave out.
    assert rules(report, "error") <= TENSOR_FILES_LEFT_OUT
    recorded = report.config.get("checkpoint.ckpt_format")
    if recorded:
        assert recorded == report.format
    if report.inspected and report.inspected.train_state:
        assert report.inspected.train_state["step"] == report.latest


def test_permission_denied_is_inputerror_even_as_root(monkeypatch):
    """Root can read everything, so simulate the kernel's answer for an unreadable folder."""

    def deny(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(C.os, "listdir", deny)
    with pytest.raises(InputError, match="permission denied"):
        C.inspect(str(CKPT / "fsdp_dtensor_ok"))


def test_root_without_tracker_would_start_from_random(tmp_path):
    root = copy_tree(CKPT / "fsdp_dtensor_ok", tmp_path / "ck")
    for t in ("latest_train_state.pt", "latest_checkpointed_iteration.txt"):
        (root / t).unlink()
    report = C.inspect(str(root))
    f = next(f for f in report.findings if f.rule == "MFSDP-CKPT-NO-TRACKER")
    assert f.severity == "error" and "iter_0000020" in f.fix and report.format == "fsdp_dtensor"


def test_release_tracker(tmp_path):
    root = copy_tree(CKPT / "fsdp_dtensor_ok", tmp_path / "ck")
    (root / "iter_0000020").rename(root / "release")
    (root / "latest_train_state.pt").unlink()
    (root / "latest_checkpointed_iteration.txt").write_text("release\n")
    report = C.inspect(str(root))
    assert report.latest == "release" and report.format == "fsdp_dtensor"
    assert not rules(report, "error")


def test_bridge_tracker_messages(bridge_src):
    text = (bridge_src / "megatron/bridge/training/checkpointing.py").read_text()
    assert "could not find the metadata file" in text and "exit_on_missing_checkpoint" in text
    assert 'release = metastring == "release"' in text


def test_big_metadata_is_scanned_for_shard_names(monkeypatch, tmp_path):
    """Past the full-parse limit only the shard names are read (byte scan), still never unpickled."""
    monkeypatch.setattr(F, "MAX_DCP_FULL_PARSE", 1000)
    monkeypatch.setattr(F, "SCAN_CHUNK", 997)  # names straddling chunk borders must still be found
    fast, err = F.read_dcp_metadata(str(REAL_ITER / ".metadata"))
    assert err is None and fast["mode"].startswith("names only")
    assert set(fast["files"]) == {"__0_0.distcp"}
    report = C.inspect(str(REAL_CKPT))
    assert "MFSDP-CKPT-NO-PAYLOAD" in rules(report, "error")
    root = copy_tree(REAL_CKPT, tmp_path / "ck")
    (root / "iter_0000010" / "__0_0.distcp").write_bytes(b"")
    # sizes are unknown in this mode (presence only), and so is what the pickle imports: never consistent
    report = C.inspect(str(root))
    assert rules(report, "error") == {"MFSDP-CKPT-METADATA-UNCHECKED"}
    f = next(f for f in report.findings if f.rule == "MFSDP-CKPT-METADATA-UNCHECKED")
    assert "past the" in f.message and "do not load" in f.fix
    (tmp_path / "not_dcp").write_bytes(b"x" * 5000)
    assert F.read_dcp_metadata(str(tmp_path / "not_dcp"))[0] is None


def test_train_state_zip_bomb_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(F, "MAX_SMALL_FILE", 10_000)
    bomb = tmp_path / "train_state.pt"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("train_state/data.pkl", b"\x80\x02}q\x00.")
        zf.writestr("train_state/data/0", b"\0" * 1_000_000)  # deflates to ~1 kB
    assert bomb.stat().st_size < 10_000
    ts, err = F.read_train_state(str(bomb))
    assert ts is None and "too large" in err


# --- fixture names survive `npx skills add` -------------------------------------------------------------------


def test_no_committed_file_has_a_name_the_installer_drops():
    """The skills CLI never copies metadata.json: such a fixture would be missing (and unsigned) once installed."""
    from mfsdp_lib.integrity.signature import (
        BUILD_PRODUCT_DIRS,
        INSTALLER_SKIPS_DIRS,
        INSTALLER_SKIPS_FILES,
    )

    root = FIXTURES.parent.parent
    dropped = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in INSTALLER_SKIPS_DIRS | BUILD_PRODUCT_DIRS]
        dropped += [os.path.relpath(os.path.join(dirpath, n), root) for n in files if n in INSTALLER_SKIPS_FILES]
    assert not dropped, f"store these as NAME.fixture (see tests/fixtures/ckpt/make_fixtures.py): {dropped}"


def test_materialised_copy_restores_the_real_names():
    stored = CKPT_STORED / "torch_dist_ddp" / "iter_0000020"
    assert (stored / "metadata.json.fixture").is_file() and not (stored / "metadata.json").exists()
    real = CKPT / "torch_dist_ddp" / "iter_0000020" / "metadata.json"
    assert json.loads(real.read_text())["sharded_backend"] == "torch_dist"
    assert not list(CKPT.rglob("*.fixture"))
