"""benchmarks/bench_check.py: interleaved rounds of a bare start, a cold check and a warm check, and the result
file BENCHMARK.md is built from. The figures themselves come from a quiet machine, not from this test: it runs
the real script for a few rounds and checks what it measured and how it reports it."""

from __future__ import annotations

import json
import sys

import pytest

import bench_check as BC

ROUNDS = [  # seconds: bare, cold, warm per round (made up only to check the arithmetic)
    {"bare": 0.010, "cold": 0.200, "warm": 0.040},
    {"bare": 0.020, "cold": 0.300, "warm": 0.060},
    {"bare": 0.010, "cold": 0.150, "warm": 0.050},
    {"bare": 0.012, "cold": 0.180, "warm": 0.048},
    {"bare": 0.011, "cold": 0.220, "warm": 0.044},
]


def test_summary_is_per_round_ratios_and_medians():
    s = BC.summarize(ROUNDS)
    assert s["bare"]["ms"]["median"] == 11.0 and s["warm"]["ms"]["median"] == 48.0
    assert s["warm"]["ratio"]["median"] == 4.0  # per-round ratios 4, 3, 5, 4, 4
    assert s["warm"]["ratio"]["p10"] == 3.0 and s["warm"]["ratio"]["p90"] == 5.0
    assert s["cold"]["ratio"]["median"] == 15.0  # 20, 15, 15, 15, 20
    assert "ratio" not in s["bare"]


def test_document_reports_cold_and_warm_against_bare_and_the_target():
    doc = BC.document(ROUNDS, 5, str(BC.RESULT), "test machine")
    labels = [r[0] for r in doc["rows"]]
    assert labels == [
        "python3 -c pass",
        "mfsdp.py check, first call (empty cache)",
        "mfsdp.py check, second call (cached)",
    ]
    assert all(len(r) == len(doc["columns"]) for r in doc["rows"])
    warm = doc["rows"][2]
    assert warm[4] == 4.0 and warm[5] == "3.0-5.0" and warm[6] == "<= 5"
    assert doc["command"] == "python3 benchmarks/bench_check.py --reps 5"
    assert "met." in doc["notes"][-1] and "NOT" not in doc["notes"][-1]
    assert not any("PYTHONPYCACHEPREFIX" in r[0] for r in doc["rows"])
    slow = [dict(r, warm=r["bare"] * 6) for r in ROUNDS]
    assert "NOT met" in BC.document(slow, 5, str(BC.RESULT), "m")["notes"][-1]


def test_user_env_has_no_bytecode_switches(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path))
    env = BC.user_env(str(tmp_path / "c"))
    assert "PYTHONDONTWRITEBYTECODE" not in env and "PYTHONPYCACHEPREFIX" not in env
    assert env["XDG_CACHE_HOME"] == str(tmp_path / "c")


def test_a_round_whose_check_writes_no_cache_is_refused(tmp_path):
    """A warm figure without a cache would be a cold one twice: the script stops instead of reporting it."""
    cmds = BC.commands(sys.executable)
    cmds["cold"] = cmds["warm"] = [sys.executable, "-c", "pass"]
    with pytest.raises(SystemExit, match="wrote no bytecode"):
        BC.one_round(cmds, str(tmp_path), 0)


def test_real_run_writes_the_result_file(tmp_path):
    out = tmp_path / "check_speed.json"
    assert BC.main(["--reps", str(BC.MIN_REPS), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "check_speed" and doc["raw"]["order"] == ["bare", "cold", "warm"]
    assert len(doc["raw"]["rounds_s"]) == BC.MIN_REPS
    s = doc["raw"]["stats"]
    # the cache works: the first call (compiling everything) costs more than the second
    assert s["cold"]["ms"]["median"] > s["warm"]["ms"]["median"] > s["bare"]["ms"]["median"]
    assert doc["command"].endswith(f"--out {out}")
    with pytest.raises(SystemExit):
        BC.main(["--reps", "2", "--out", str(out)])
