"""benchmarks/bench_suite.py: timing the whole `dev.sh test` against an older tree, interleaved, and the result
file BENCHMARK.md is built from. The figures come from a quiet 2-CPU machine, not from this test: here the
script's reading of a run's output, its pairing and verdict, and its refusals are checked, and one real timed
run of a small `dev.sh` shows what a run records."""

from __future__ import annotations

import json
import subprocess

import pytest

import bench_suite as BS
import make_report as MR

# What dev.sh test prints, in its order (marker lines and pytest's closing lines), with seconds since the start.
DEV_SH_OUTPUT = [
    (0.5, "[dev.sh] installing into .venv: ..."),
    (3.0, "[dev.sh] ruff check, ruff format --check, mypy"),
    (40.0, "[dev.sh] the test suite on Python 3.12.1"),
    (270.0, "========== 1 failed, 3602 passed, 8 skipped, 2 warnings in 229.50s (0:03:49) =========="),
    (280.0, "[dev.sh] the scripts' tests on Python 3.10.13"),
    (335.0, "1899 passed in 53.61s"),
]


def test_phases_and_counts_are_read_from_dev_sh_and_pytest_lines():
    out = BS.parse_lines(DEV_SH_OUTPUT, wall=340.0)
    assert out["phases_s"] == {"setup": 3.0, "lint": 37.0, "suite_312": 240.0, "suite_310": 60.0}
    first, second = out["pytest"]
    assert first["counts"] == {"failed": 1, "passed": 3602, "skipped": 8, "warnings": 2}
    assert first["pytest_s"] == 229.5 and second["counts"] == {"passed": 1899}


def test_a_missing_marker_leaves_its_phase_unknown_not_zero():
    out = BS.parse_lines([(2.0, "[dev.sh] ruff check, ..."), (9.0, "mypy: error")], wall=10.0)
    assert out["phases_s"] == {"setup": 2.0, "lint": 8.0, "suite_312": None, "suite_310": None}
    assert out["pytest"] == []


def _run(label, pair, wall, exit_code=0, busy=0.02):  # made-up records, only to check the arithmetic
    return {
        "label": label,
        "pair": pair,
        "commit": ("a" if label == "baseline" else "b") * 40,
        "wall_s": wall,
        "cpu_s": wall * 1.6,
        "exit": exit_code,
        "phases_s": {"setup": 1.0, "lint": 30.0, "suite_312": wall - 100, "suite_310": 69.0},
        "pytest": [{"counts": {"passed": 10, "skipped": 1}}, {"counts": {"passed": 5}}],
        "quiet_before": {"busy": busy, "loadavg": [0.1, 0.2, 0.3]},
        "date": f"2026-01-0{pair + 1}T00:00:00+00:00",
        "machine": "test machine",
    }


RUNS = [_run("baseline", 0, 660), _run("candidate", 0, 300), _run("candidate", 1, 330), _run("baseline", 1, 600)]
COV = {
    "baseline": {
        "commit": "a" * 40,
        "statements": 100,
        "covered": 90,
        "percent": 90.0,
        "files": {"scripts/x.py": {"statements": 50, "covered": 50}, "scripts/y.py": {"statements": 50, "covered": 40}},
    },
    "candidate": {
        "commit": "b" * 40,
        "statements": 160,
        "covered": 118,
        "percent": 73.75,
        "files": {
            "scripts/x.py": {"statements": 50, "covered": 45},
            "scripts/y.py": {"statements": 50, "covered": 45},
            "scripts/z.py": {"statements": 20, "covered": 18},
            "scripts/mfsdp_gpu/steps.py": {"statements": 40, "covered": 10},
        },
    },
}


def test_summary_pairs_the_runs_and_states_the_verdict():
    doc = BS.summarize(RUNS, COV, "python3 benchmarks/bench_suite.py run ...", "raw")
    base, cand = doc["rows"]
    cols = doc["columns"]
    assert base[0] == "baseline" and cand[0] == "candidate"
    assert cand[cols.index("wall s (median)")] == 315.0 and cand[cols.index("wall s range")] == "300-330"
    assert base[cols.index("wall s (median)")] == 630.0
    assert cand[cols.index("tests on 3.12")] == "10 passed, 1 skipped"
    assert doc["raw"]["pair_ratios"] == [round(300 / 660, 3), round(330 / 600, 3)]
    assert doc["raw"]["met"] is True and "met (median 315.0 s" in doc["notes"][-1]
    # a file whose coverage fell is named, one that rose is not
    cov_note = next(n for n in doc["notes"] if n.startswith("Coverage ("))
    assert "scripts/x.py 100.0 % -> 90.0 %" in cov_note and "y.py" not in cov_note
    assert all(len(r) == len(cols) for r in doc["rows"])
    # the GPU-side code (its tests need a GPU) is reported apart from the rest, not mixed into one total
    assert cand[cols.index("line coverage (rest / GPU-side)")] == "90.0 % / 25.0 %"
    assert base[cols.index("line coverage (rest / GPU-side)")] == "90.0 % / 0.0 %"
    assert doc["raw"]["coverage"]["candidate"]["gpu_side"] == {"statements": 40, "covered": 10, "percent": 25.0}


def test_a_slow_or_failing_candidate_run_is_not_met():
    slow = RUNS[:2] + [_run("candidate", 1, 421)]
    assert BS.summarize(slow, {}, "c", "raw")["raw"]["met"] is False
    failing = RUNS[:2] + [_run("candidate", 1, 300, exit_code=1)]
    doc = BS.summarize(failing, {}, "c", "raw")
    assert doc["raw"]["met"] is False and any("candidate pair 1 (exit 1)" in n for n in doc["notes"])
    assert "Coverage: not measured" in " ".join(doc["notes"])


def test_result_file_is_in_the_report_shape_and_expected(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for r in RUNS:
        (raw / f"pair{r['pair']}_{r['label']}.json").write_text(json.dumps(r))
    for label, c in COV.items():
        (raw / f"coverage_{label}.json").write_text(json.dumps(c))
    out = tmp_path / "results" / "suite_speed.json"
    assert BS.main(["summarize", str(raw), "--out", str(out), "--note", "Why the baseline failed."]) == 0
    ((name, doc),) = MR.load_results(out.parent)
    assert doc["notes"][-2] == "Why the baseline failed." and doc["notes"][-1].startswith("Candidate:")
    assert doc["command"].endswith("summarize " + str(raw) + " --note 'Why the baseline failed.'")
    assert any(e.matches(doc) for e in MR.EXPECTED if e.key == "suite-speed")
    assert "| candidate |" in MR.render([(name, doc)])


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert BS.main(["summarize", str(tmp_path / "nope")]) == 2
    assert BS.main(["summarize", str(tmp_path)]) == 2
    assert "no timed runs" in capsys.readouterr().err
    args = ["run", "--baseline", "no-such-rev", "--raw", str(tmp_path / "r"), "--workdir", str(tmp_path / "w")]
    assert BS.main(args) == 2
    assert "is not a commit" in capsys.readouterr().err
    assert BS.main(["run", "--baseline", "HEAD", "--raw", str(tmp_path / "r"), "--workdir", str(tmp_path / "w")]) == 2
    assert "same commit" in capsys.readouterr().err


def test_coverage_pin_is_read_from_pyproject():
    assert BS.coverage_pin().startswith("coverage==")


def test_waiting_for_a_quiet_machine_gives_up_with_a_message():
    seen = BS.wait_quiet(settle_s=10, max_busy=1.0, sample_s=0.05)
    assert 0.0 <= seen["busy"] <= 1.0 and len(seen["loadavg"]) == 3
    with pytest.raises(BS.BenchError, match="never quiet"):
        BS.wait_quiet(settle_s=0, max_busy=-1.0, sample_s=0.05)


def test_a_timed_run_keeps_each_line_with_its_time(tmp_path):
    """A real run through the harness: a small dev.sh in a throw-away tree prints the markers and a summary."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    (tree / "scripts" / "dev.sh").write_text(
        'echo "[dev.sh] ruff check, ruff format --check, mypy" >&2\nsleep 0.2\n'
        'echo "[dev.sh] the test suite on Python 3.12.1" >&2\necho "3 passed in 0.10s"\n'
        'test "$CI" = true && test "$EVALS_E2E_REQUIRE" = 1 && test -n "$XDG_CACHE_HOME"\n'
    )
    log = tmp_path / "run.log"
    rec = BS.timed_run(tree, log)
    assert rec["exit"] == 0 and rec["pytest"][0]["counts"] == {"passed": 3}
    assert rec["phases_s"]["suite_312"] is not None and rec["phases_s"]["lint"] >= 0.2
    assert rec["wall_s"] >= 0.2 and "[dev.sh] ruff check" in log.read_text()
    subprocess.run(["bash", "-n", str(tree / "scripts" / "dev.sh")], check=True)


def test_the_failing_tests_of_a_run_are_named_from_its_log(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for r in RUNS:
        (raw / f"pair{r['pair']}_{r['label']}.json").write_text(json.dumps(dict(r, exit=1 if r is RUNS[0] else 0)))
    (raw / "pair0_baseline.log").write_text(
        "   537.91 FAILED tests/integrity/test_signature.py::test_committed - Failed: stale\n"
        "   537.91 ============ 1 failed, 3782 passed in 533.08s ============\n"
    )
    runs, _ = BS.load_raw(raw)
    doc = BS.summarize(runs, {}, "c", "raw")
    assert "baseline pair 0 (exit 1: tests/integrity/test_signature.py::test_committed)" in " ".join(doc["notes"])
    assert [r["failed_tests"] for r in doc["raw"]["runs"] if r["label"] == "candidate"] == [[], []]


def test_each_subcommand_keeps_its_latest_command_line(tmp_path):
    BS.record_command(tmp_path, "run", ["run", "--baseline", "A", "--raw", "R"])
    BS.record_command(tmp_path, "coverage", ["coverage", "--baseline", "A", "--raw", "R"])
    BS.record_command(tmp_path, "run", ["run", "--baseline", "B", "--raw", "R"])
    assert (tmp_path / "command.txt").read_text().splitlines() == [
        "python3 benchmarks/bench_suite.py coverage --baseline A --raw R",
        "python3 benchmarks/bench_suite.py run --baseline B --raw R",
    ]
