"""benchmarks/host.py: the machine line of a CPU benchmark's result file."""

from __future__ import annotations

import os

import host


def test_the_machine_line_names_system_cpu_and_count_then_the_extras():
    line = host.describe("Python 3.12.1", "load average at the start 0.10")
    parts = line.split(", ")
    assert parts[1] == host.cpu_model() and parts[2] == f"{os.cpu_count()} CPUs"
    assert parts[-2:] == ["Python 3.12.1", "load average at the start 0.10"]
    memory = host.memory_gib()
    assert memory is None or memory.endswith(" GiB") and int(memory.split()[0]) > 0
