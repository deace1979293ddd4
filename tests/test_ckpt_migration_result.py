"""``benchmarks/ckpt_migration_result.py`` on a synthetic raw folder (the GPU driver's output shape).

The raw rows below are made here, labelled synthetic: they stand for what bench_ckpt_migration.py writes on
the H200 and exist only to test the restating logic, the passing table and the report section.
"""

from __future__ import annotations

import json
from pathlib import Path

import ckpt_migration_result as R
import make_report
from mfsdp_lib.runs import migration


def _row(raw: Path, name: str, model: str, src: str, dst: str, passed: bool, **kw) -> None:
    row = {
        "row": name,
        "model": model,
        "from": src,
        "to": dst,
        "via": kw.pop("via", "convert"),
        "command": f"python3 scripts/mfsdp.py convert A B --to {dst}",
        "exit": kw.pop("exit", 0),
        "check": "synthetic",
        "difference": 0.001,
        "tolerance": 0.05,
        "passed": passed,
        **kw,
    }
    (raw / f"{name}.json").write_text(json.dumps(row))


def _raw(tmp_path: Path, moe_b_passed: bool = True, drop: str | None = None) -> Path:
    raw = tmp_path / "raw"
    raw.mkdir()
    for name, (model, src, dst) in R.EXPECTED_ROWS.items():
        if name == drop:
            continue
        _row(raw, name, model, src, dst, passed=moe_b_passed if name == "moe_b_fsdp_dtensor_to_hf" else True)
    _row(raw, "dense_U_distopt", "dense", "-", "-", True, role="reference")
    _row(
        raw,
        "dense_upstream_export_ckpt_fsdp_dtensor_to_hf",
        "dense",
        "fsdp_dtensor",
        "hf",
        False,
        via="upstream",
        exit=None,
        error="synthetic failure",
    )
    (raw / "workers.json").write_text(
        json.dumps({"workers": {"dense": {"exit": 0}, "moe": {"exit": -9, "killed_at_budget_s": 470}}})
    )
    (raw / "meta_dense.json").write_text(
        json.dumps(
            {"date": "2026-12-04T00:00:00+00:00", "device": "NVIDIA H200", "versions": {"megatron-bridge": "0.6.2"}}
        )
    )
    return raw


def test_rows_have_the_issue_fields_and_the_passing_table(tmp_path):
    out, table = tmp_path / "ckpt_migration_1xh200.json", tmp_path / "passing.json"
    assert R.main([str(_raw(tmp_path, moe_b_passed=False)), "--out", str(out), "--table", str(table)]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "ckpt_migration_1xh200"
    for row in doc["rows"]:
        assert set(R.REQUIRED_ROW_KEYS) <= set(row)
        assert row["model"] in ("dense", "moe")
    assert not any(r.get("role") == "reference" for r in doc["rows"])  # the uninterrupted run is not a path
    up = [r for r in doc["rows"] if r["via"] == "upstream"]
    assert up and up[0]["passed"] is False and up[0]["error"] == "synthetic failure"
    passing = {(p["from"], p["to"]) for p in json.loads(table.read_text())["passing"]}
    # fsdp_dtensor -> hf failed for MoE, so the path is not passing even though dense passed; upstream rows never count
    assert passing == {("torch_dist", "fsdp_dtensor"), ("fsdp_dtensor", "torch_dist"), ("hf", "fsdp_dtensor")}
    assert migration.passing_paths(migration.load_table(str(table))) == passing


def test_a_missing_row_is_a_failing_row(tmp_path):
    out = tmp_path / "r.json"
    R.main(
        [
            str(_raw(tmp_path, drop="moe_a_torch_dist_to_fsdp_dtensor")),
            "--out",
            str(out),
            "--table",
            str(tmp_path / "t.json"),
        ]
    )
    row = next(r for r in json.loads(out.read_text())["rows"] if r["model"] == "moe" and r["to"] == "fsdp_dtensor")
    assert row["passed"] is False and row["exit"] is None and "killed at the time budget" in row["error"]
    passing = {(p["from"], p["to"]) for p in json.loads((tmp_path / "t.json").read_text())["passing"]}
    assert ("torch_dist", "fsdp_dtensor") not in passing


def test_a_convert_row_that_exited_non_zero_never_passes(tmp_path):
    raw = _raw(tmp_path)
    _row(raw, "dense_c_fsdp_dtensor_to_torch_dist", "dense", "fsdp_dtensor", "torch_dist", True, exit=1)
    rows, _ = R.collect(raw)
    assert next(r for r in rows if r["row"] == "dense_c_fsdp_dtensor_to_torch_dist")["passed"] is False


def test_report_renders_the_rows(tmp_path):
    out = tmp_path / "ckpt_migration_1xh200.json"
    R.main([str(_raw(tmp_path)), "--out", str(out), "--table", str(tmp_path / "t.json")])
    data = make_report._load_one(out, out.name)
    text = make_report.render([(out.name, data)])
    assert "Checkpoint migration run and weights checked" in text
    assert "| model | from | to | via | command | exit | check | difference | tolerance | passed |" in text
    assert "| moe | fsdp_dtensor | hf | convert |" in text
