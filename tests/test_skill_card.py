"""skill-card.md's Results section copies figures from BENCHMARK.md and invents none.

Mechanism: every number in the Results section (a date as one token, thousands separators and
trailing commas dropped) must occur as a number in BENCHMARK.md, tokenised the same way. Whole
lines are not compared, because BENCHMARK.md is regenerated (e.g. when eval results arrive) and
its layout may change while the figures stay; a figure that BENCHMARK.md no longer shows fails.
"""

from __future__ import annotations

import re

from _helpers_skill import read

# A date (kept whole so "2026-12-02" cannot pass on a stray "12"), else a number with optional
# thousands separators and dotted parts ("1,102", "0.6.2", "137.77"). Not preceded by a letter,
# digit or dot, so "H200" and "sha256" yield nothing and "0.6.2" is one token.
NUMBER_RE = re.compile(r"(?<![\w.])(\d{4}-\d{2}-\d{2}|\d[\d,]*(?:\.\d+)*)")


def numbers(text: str) -> set[str]:
    return {m.rstrip(",").replace(",", "") for m in NUMBER_RE.findall(text)}


def results_section() -> str:
    return read("skill-card.md").split("\n## Results\n", 1)[1].split("\n## ", 1)[0]


def unbacked(section: str, benchmark: str) -> set[str]:
    return numbers(section) - numbers(benchmark)


def test_every_number_in_results_appears_in_benchmark_md():
    missing = unbacked(results_section(), read("BENCHMARK.md"))
    assert not missing, f"skill-card.md Results has figures BENCHMARK.md does not show: {sorted(missing)}"


def test_results_copy_the_key_figures_with_their_dates():
    """The section is not empty prose: it carries the check-speed ratio, the differential counts,
    the smoke's loss and round trip, and a strategy table, each with the date of its run."""
    res = results_section()
    assert "BENCHMARK.md" in res
    for result_file in (
        "check_speed.json",
        "differential_agreement.json",
        "gpu_smoke_1xh200.json",
        "gpu_strategies_1xh200.json",
    ):
        assert result_file in res, result_file
    assert re.search(r"\d{4}-\d{2}-\d{2}", res), "results need their dates"
    assert "`1 passed`" in res and "fsdp_dtensor" in res
    assert re.search(r"^\| optim_grads_params \|", res, re.M), "the strategy table"
    assert len(numbers(res)) >= 20


def test_an_invented_figure_is_caught():
    bench = read("BENCHMARK.md")
    res = results_section()
    assert unbacked(res + "\n- DDP ran at 987.65 ms.\n", bench) == {"987.65"}
    assert unbacked("released 2031-01-07", bench) == {"2031-01-07"}
    # separators and trailing commas do not matter, the digits do
    assert numbers("26,845 and 1,102, then 0.6.2") == {"26845", "1102", "0.6.2"}
