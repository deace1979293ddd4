"""How a CPU benchmark's result file names the machine it ran on: system, CPU model, CPU count, and what else the
benchmark adds (the Python, the load average, the memory). Standard library only; /proc is read where present."""

from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> str | None:
    """The machine's memory, e.g. "24 GiB", from /proc/meminfo; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as fh:
            kb = int(fh.readline().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return f"{kb / 2**20:.0f} GiB"


def describe(*extra: str) -> str:
    """ "Linux 6.1, AMD EPYC, 2 CPUs" followed by each of EXTRA, comma-separated."""
    return ", ".join([f"{platform.system()} {platform.release()}", cpu_model(), f"{os.cpu_count()} CPUs", *extra])
