"""evals/fill.py: scripted answers quote the memory tool's figures from the run they answer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evals import scripted_model as sm  # noqa: E402
from evals.fill import fill, memory_table  # noqa: E402


def _memory_output() -> str:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "mfsdp.py"),
            "memory",
            "--model",
            "llama3-70b",
            "--dp",
            "4",
            "--tp",
            "4",
            "--gpu-mem-gib",
            "80",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.stdout


def test_fill_reads_the_real_memory_table():
    out = _memory_output()
    table = memory_table(out)
    assert {"ddp", "distopt", "optim_grads_params"} <= set(table)
    row = next(line for line in out.splitlines() if line.startswith("optim_grads_params"))
    text = fill("total {mem:optim_grads_params:total} GiB, fits {mem:optim_grads_params:fits}", ["noise", out])
    assert text == f"total {row.split()[6]} GiB, fits {row.split()[7]}"
    # nothing to read from: the placeholder stays, and the grader fails such an answer
    assert fill("{mem:optim_grads_params:total}", ["no table"]) == "{mem:optim_grads_params:total}"


def test_scripted_model_fills_the_final_text_from_the_tool_result_it_was_sent():
    out = _memory_output()
    script = {"scripted": True, "turns": [{"run": "x"}, {"final": "{mem:optim_grads_params:total} GiB"}]}
    model = sm.ScriptedModel(script, "s", ".claude/skills/s")
    body = {
        "tools": [{"name": "Bash"}],
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_scripted_0", "name": "Bash"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_scripted_0", "content": out}]},
        ],
    }
    message, index = model.anthropic_message(body, 100)
    total = memory_table(out)["optim_grads_params"]["total"]
    assert index == 1 and message["content"][-1]["text"] == sm.labelled(f"{total} GiB")


def test_round_form_gives_the_whole_number_people_write():
    out = _memory_output()
    total = memory_table(out)["optim_grads_params"]["total"]
    assert fill("about {mem:optim_grads_params:total:round} GiB", [out]) == f"about {round(float(total))} GiB"
    # a cell that is not a number ("-" for no DP that fits, YES/NO) keeps the placeholder, which the grader fails
    row = memory_table(out)["ddp"]
    assert row["min_dp"] == "-" or row["min_dp"].isdigit()
    assert fill("{mem:ddp:fits:round}", [out]) == "{mem:ddp:fits:round}"
