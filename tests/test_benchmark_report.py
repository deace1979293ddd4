"""benchmarks/make_report.py: BENCHMARK.md is generated from result files only, and is current."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "make_report.py"


def _load():
    spec = importlib.util.spec_from_file_location("make_report", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


mr = _load()


def _result(bid, title, rows, **extra):
    return {
        "benchmark": bid,
        "title": title,
        "date": "2026-12-02T18:30:00+00:00",
        "machine": "1x NVIDIA H200 141GB, 16 cores",
        "command": f"python3 benchmarks/{bid}.py --iters 20",
        "columns": ["strategy", "step time (s)", "peak GiB"],
        "rows": rows,
        "notes": [f"note for {bid}"],
        "raw": extra.pop("raw", {}),
        **extra,
    }


def _write(folder: Path, name: str, data) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data) if not isinstance(data, str) else data)


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_one_section_per_result_with_date_machine_command_table_notes(tmp_path):
    res = tmp_path / "results"
    _write(
        res,
        "gpu_strategies_1xh200.json",
        _result("gpu_strategies_1xh200", "DDP vs FSDP (1 GPU)", [["ddp", 0.51234, 40.5], ["fsdp", 0.6, None]]),
    )
    _write(res, "check_speed.json", _result("check_speed", "check speed", [["check", 0.0421, 1.0]]))
    out = tmp_path / "BENCHMARK.md"
    proc = run("--results", res, "--output", out)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    for title in ("DDP vs FSDP (1 GPU)", "check speed"):
        assert f"\n## {title}\n" in text
    assert text.count("- Date: 2026-12-02T18:30:00+00:00") == 2
    assert text.count("- Machine: 1x NVIDIA H200 141GB, 16 cores") == 2
    assert "python3 benchmarks/gpu_strategies_1xh200.py --iters 20" in text
    assert "| strategy | step time (s) | peak GiB |" in text
    assert "| ddp | 0.512 | 40.5 |" in text and "| fsdp | 0.6 | — |" in text
    assert "| check | 0.0421 | 1.0 |" in text  # small values keep their digits
    assert "- note for check_speed" in text
    # Expected order: check speed before the GPU table.
    assert text.index("## check speed") < text.index("## DDP vs FSDP (1 GPU)")


def test_missing_measurements_are_stated_plainly(tmp_path):
    res = tmp_path / "results"
    _write(res, "gpu_strategies_1xh200.json", _result("gpu_strategies_1xh200", "one gpu", [["ddp", 1.0, 2.0]]))
    # A scripted-model eval run is shown but is not a real model's eval.
    _write(
        res,
        "evals_claude-code.json",
        _result("evals_claude-code", "evals, scripted model", [["x", 1.0, 1.0]], raw={"scripted_model": True}),
    )
    text = mr.render(mr.load_results(res))
    not_measured = text.split("## Not measured yet", 1)[1]
    assert "**DDP vs distributed optimizer vs Megatron FSDP on 2 GPUs" in not_measured
    assert "**Skill evals with a real model in Claude Code" in not_measured
    assert "**Skill evals with a real model in Codex" in not_measured
    assert "on 1 GPU**" not in not_measured
    assert "## evals, scripted model" in text


def test_real_model_eval_counts_as_measured(tmp_path):
    res = tmp_path / "results"
    _write(
        res,
        "evals_codex.json",
        _result("evals_codex", "codex evals", [["all", 0.8, 0.4]], raw={"scripted_model": False}),
    )
    not_measured = mr.render(mr.load_results(res)).split("## Not measured yet", 1)[1]
    assert "real model in Codex" not in not_measured
    assert "real model in Claude Code" in not_measured


def test_no_results_says_nothing_was_measured(tmp_path):
    text = mr.render(mr.load_results(tmp_path / "absent"))
    assert "- No result files yet." in text
    assert all(f"**{e.title}**: not measured" in text for e in mr.EXPECTED)


@pytest.mark.parametrize(
    "name,data,needle",
    [
        ("bad.json", "{oops", "bad.json: not readable JSON"),
        ("list.json", [], "list.json: the top level is not an object"),
        ("short.json", {"benchmark": "x", "title": "t"}, "short.json: missing date, machine, command, columns, rows"),
        ("rows.json", dict(_result("x", "t", [["a", 1]])), "rows.json: row 1 has 2 cells, columns has 3"),
    ],
)
def test_unusable_result_file_is_named_exit_2(tmp_path, name, data, needle):
    _write(tmp_path / "r", name, data)
    proc = run("--results", tmp_path / "r", "--output", tmp_path / "B.md")
    assert proc.returncode == 2
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "B.md").exists()


def test_cells_are_escaped_and_output_is_deterministic(tmp_path):
    res = tmp_path / "results"
    _write(res, "a.json", _result("a", "pipes", [["a|b", 12345.678, 123456], ["multi\nline", True, float("nan")]]))
    one = mr.render(mr.load_results(res))
    assert one == mr.render(mr.load_results(res))
    assert "| a\\|b | 12,345.7 | 123,456 |" in one
    assert "| multi line | yes | nan |" in one


def _adversarial(command: str, fp: str, ff: str, raw: dict) -> dict:
    return {
        "benchmark": "evals_adversarial",
        "title": "Eval grader rates",
        "date": "2026-12-03T15:00:00+00:00",
        "machine": "laptop",
        "command": command,
        "columns": ["Transcripts", "Count", "Good", "Bad", "False passes", "False fails"],
        "rows": [["both formats", 10, 5, 5, fp, ff]],
        "notes": [],
        "raw": raw,
    }


def test_first_measurement_on_unseen_items_is_stated_from_its_raw_file(tmp_path):
    res = tmp_path / "results"
    now = "python3 -m evals adversarial --set a.json --set b.json --out benchmarks/results/evals_adversarial.json"
    _write(res, "evals_adversarial.json", _adversarial(now, "0/5 = 0.0%", "0/5 = 0.0%", {}))
    first = "python3 -m evals adversarial --set b.json --out benchmarks/results/raw/adversarial_batch2_unseen.json"
    raw = {"items": 5, "transcripts": 10, "false_pass_rate": 0.2, "false_fail_rate": 0.4, "max_rate": 0.05}
    _write(res / "raw", "adversarial_batch2_unseen.json", _adversarial(first, "1/5 = 20.0%", "2/5 = 40.0%", raw))
    text = mr.render(mr.load_results(res), mr.load_first_unseen(res))
    section = text.split("## Eval grader on adversarial items it had never seen", 1)[1].split("\n## ", 1)[0]
    assert first in section and "false passes 1/5 = 20.0% and false fails 2/5 = 40.0% (limit 5%)" in section
    assert text.index("## Eval grader rates") < text.index("items it had never seen")  # right after the current rates
    # no raw file, no section; a raw file without the rates is refused by name
    assert "never seen" not in mr.render(mr.load_results(res), None)
    _write(res / "raw", "adversarial_batch2_unseen.json", _adversarial(first, "x", "y", {}))
    proc = run("--results", res, "--output", tmp_path / "B.md")
    assert proc.returncode == 2 and "adversarial_batch2_unseen.json" in proc.stderr


def test_check_flag_detects_a_stale_report(tmp_path):
    res = tmp_path / "results"
    _write(res, "a.json", _result("a", "first", [["x", 1.0, 2.0]]))
    out = tmp_path / "B.md"
    assert run("--results", res, "--output", out).returncode == 0
    assert run("--results", res, "--output", out, "--check").returncode == 0
    _write(res, "b.json", _result("b", "second", [["y", 1.0, 2.0]]))
    proc = run("--results", res, "--output", out, "--check")
    assert proc.returncode == 1 and "bash scripts/dev.sh benchmark-md" in proc.stderr


def test_committed_benchmark_md_is_generated_from_the_committed_results():
    committed = (ROOT / "BENCHMARK.md").read_text(encoding="utf-8")
    results = ROOT / "benchmarks" / "results"
    expected = mr.render(mr.load_results(results), mr.load_first_unseen(results))
    assert committed == expected, "BENCHMARK.md is stale or was edited by hand; run: bash scripts/dev.sh benchmark-md"
