"""``benchmarks/dtype_stop_result.py`` on the committed H100 raw folder: what the result claims, read back."""

from __future__ import annotations

import json
from pathlib import Path

import dtype_stop_result as res
import raw_store

ROOT = Path(__file__).resolve().parent.parent
RAW = raw_store.path(res.BENCHMARK)


def test_the_string_override_fails_at_wrap_and_the_yaml_form_passes():
    doc = res.build(RAW)
    s, y, _ = doc["rows"]
    assert s["exit_code"] == 1 and s["failure"]["phase"] == "model_wrap"
    assert s["first_error_line"] == "AttributeError: 'str' object has no attribute 'is_floating_point'"
    assert (
        "param_and_grad_buffer.py" in s["failure"]["site"] and "main_grads_dtype='fp32'" in s["mixed_precision_policy"]
    )
    assert y["exit_code"] == 0 and y["result"] == "passed"
    assert "main_grads_dtype=torch.float32" in y["mixed_precision_policy"]


def test_sigterm_left_no_process_of_the_stopped_command_on_the_gpu():
    t = res.build(RAW)["rows"][2]
    assert t["exit_code"] == 143 and t["cli_last_lines"][-1] == "mfsdp.py rehearse: stopped by signal 15"
    assert t["engine_gpu_memory_before"] and t["engine_listed_after"] is False
    # whatever the GPU lists afterwards belongs to other commands of the same call, named by their command line
    listed = {p["pid"] for p in t["gpu_processes_after"]}
    named = {int(line.split()[0]) for line in t["other_processes_after"]}
    assert listed <= named and t["engine_pid"] not in named


def test_the_committed_result_is_the_scripts_output():
    committed = json.loads((ROOT / "benchmarks" / "results" / f"{res.BENCHMARK}.json").read_text())
    assert committed == json.loads(json.dumps(res.build(RAW)))
