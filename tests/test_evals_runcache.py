"""runcache: a tool run is replayed only when nothing it sees differs, and its output names the new folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evals import adversarial, outcomes  # noqa: E402
from evals.runcache import FOLDER_MARK, RunCache, tree_digests  # noqa: E402


def _project(base: Path, name: str, text: str = "a: 1\n") -> Path:
    p = base / name / "project"
    (p / "configs").mkdir(parents=True)
    (p / "configs" / "run.yaml").write_text(text)
    os.utime(p / "configs" / "run.yaml", ns=(10**18, 10**18))
    return p


def _counting(folder: Path, calls: list, write: str | None = None):
    def fn():
        calls.append(folder)
        if write:
            (folder / write).write_text("new\n")
        return 0, f"checked {folder}/configs/run.yaml", ""

    return fn


def test_the_same_run_on_a_copy_elsewhere_is_replayed_naming_the_copy(tmp_path):
    cache, calls = RunCache(), []
    one, two = _project(tmp_path, "one"), _project(tmp_path, "two")
    assert cache.run(("check",), one, _counting(one, calls)) == (0, f"checked {one}/configs/run.yaml", "")
    assert cache.run(("check",), two, _counting(two, calls)) == (0, f"checked {two}/configs/run.yaml", "")
    assert calls == [one] and (cache.hits, cache.misses) == (1, 1)


def test_anything_the_run_could_see_that_differs_runs_it_again(tmp_path):
    cache, calls = RunCache(), []
    base = _project(tmp_path, "base")
    cache.run(("check",), base, _counting(base, calls))
    other_text = _project(tmp_path, "text", "a: 2\n")
    cache.run(("check",), other_text, _counting(other_text, calls))
    other_key = _project(tmp_path, "key")
    cache.run(("check", "--gpus", "8"), other_key, _counting(other_key, calls))
    other_mode = _project(tmp_path, "mode")
    (other_mode / "configs" / "run.yaml").chmod(0o600)
    cache.run(("check",), other_mode, _counting(other_mode, calls))
    extra = _project(tmp_path, "extra")
    (extra / "notes.txt").write_text("")
    cache.run(("check",), extra, _counting(extra, calls))
    link = _project(tmp_path, "link")
    (link / "ln").symlink_to("configs")
    cache.run(("check",), link, _counting(link, calls))
    assert calls == [base, other_text, other_key, other_mode, extra, link]


def test_file_times_count_unless_the_run_reads_none(tmp_path):
    cache, calls = RunCache(), []
    one, two = _project(tmp_path, "one"), _project(tmp_path, "two")
    os.utime(two / "configs" / "run.yaml", ns=(2 * 10**18, 2 * 10**18))
    cache.run(("ls -l",), one, _counting(one, calls))
    cache.run(("ls -l",), two, _counting(two, calls))
    assert calls == [one, two]
    cache.run(("check",), one, _counting(one, calls), mtimes=False)
    cache.run(("check",), two, _counting(two, calls), mtimes=False)
    assert calls == [one, two, one]
    assert tree_digests(one)[0] == tree_digests(two)[0] and tree_digests(one)[1] != tree_digests(two)[1]


def test_a_run_that_changes_its_folder_or_names_its_parent_is_never_replayed(tmp_path):
    cache, calls = RunCache(), []
    one, two = _project(tmp_path, "one"), _project(tmp_path, "two")
    cache.run(("enable -o",), one, _counting(one, calls, write="out.yaml"))
    cache.run(("enable -o",), two, _counting(two, calls, write="out.yaml"))
    assert calls == [one, two]

    def names_parent(folder):
        def fn():
            calls.append(folder)
            return 0, f"wrote {folder.parent}/elsewhere"

        return fn

    three, four = _project(tmp_path, "three"), _project(tmp_path, "four")
    cache.run(("x",), three, names_parent(three))
    cache.run(("x",), four, names_parent(four))
    assert calls[-2:] == [three, four]


def test_a_run_that_raises_is_not_stored(tmp_path):
    cache = RunCache()
    one = _project(tmp_path, "one")

    def timeout():
        raise subprocess.TimeoutExpired("x", 1)

    with pytest.raises(subprocess.TimeoutExpired):
        cache.run(("x",), one, timeout)
    assert cache.run(("x",), one, lambda: (0, "ok")) == (0, "ok")


def test_the_marker_never_leaks_into_an_output(tmp_path):
    cache = RunCache()
    one, two = _project(tmp_path, "one"), _project(tmp_path, "two")
    cache.run(("x",), one, lambda: (1, f"{one}", f"{one}/e"))
    out = cache.run(("x",), two, lambda: (9, "", ""))
    assert out == (1, f"{two}", f"{two}/e") and not any(FOLDER_MARK in str(x) for x in out)


@pytest.mark.parametrize(
    "command, blind",
    [
        ("python3 .claude/skills/s/scripts/mfsdp.py check configs/run.yaml --gpus 8", True),
        ("cd p && python3 {skill_dir}/scripts/mfsdp.py log a.log 2>&1 | tail -5", True),
        ("cat a > b; sed -i s/x/y/ b && cp b c", True),
        ("MFSDP_DEBUG=1 python3 scripts/mfsdp.py check a.yaml", True),
        ("python3 -c \"import json; json.dump({}, open('v.json', 'w'))\"", True),
        ("python3 -m json.tool log_verdict.json", True),
        ("ls -l ckpts", False),
        ("python3 mfsdp.py check a.yaml > out.txt && ls", False),
        ("python3 -c 'import os; print(os.stat(\"a\").st_mtime)'", False),
        ("python3 -c 'import os; print(os.path.getmtime(\"a\"))'", False),
        ("python3 helper.py", False),
        ("echo $(ls -t)", False),
        ("echo `date`", False),
        ("find . -newer a", False),
        ("cat 'unclosed", False),
    ],
)
def test_which_command_lines_read_no_file_time(command, blind):
    assert adversarial.reads_no_mtime(command) is blind


def test_the_harness_and_the_outcome_checks_replay_real_runs(tmp_path):
    """Two fresh copies of a case's project: the second `check` is replayed and names its own folder, as the real
    run would; the outcome check's own run of the tool likewise."""
    case = "mfsdp-ckpt-which-format"
    one, two = tmp_path / "a" / "project", tmp_path / "b" / "project"
    for p in (one, two):
        adversarial.copy_fixture(case, p)
        assert any(p.iterdir())
    cmd = f"python3 {ROOT}/scripts/mfsdp.py ckpt $PWD/checkpoints"
    hits = adversarial.RUNS.hits
    first = adversarial.run_tool(cmd, case, one)
    second = adversarial.run_tool(cmd, case, two)
    assert first[0] == 0 and f"checkpoint: {one}/checkpoints" in first[1]
    assert second == (0, first[1].replace(str(one), str(two))) and adversarial.RUNS.hits == hits + 1
    assert str(one) not in second[1]  # nothing of the first copy's folder in the replay
    argv = [sys.executable, "-B", str(outcomes.MFSDP), "ckpt", "checkpoints", "--format", "json"]
    hits = outcomes.RUNS.hits
    a, b = outcomes._run(argv, one, None), outcomes._run(argv, two, None)
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr) and outcomes.RUNS.hits == hits + 1
