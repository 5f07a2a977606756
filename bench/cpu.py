"""Machine-wide CPU time from /proc/stat, for benchmarks on a shared machine."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[int, int, int]:
    """(busy, stolen, total) jiffies of all cores since boot; zeros without /proc.

    Busy is every state but idle, iowait and steal. Steal is time the hypervisor ran
    another guest on these vCPUs: not ours to spend, so it is counted apart.
    """
    try:
        line = Path("/proc/stat").read_text(encoding="ascii").split("\n", 1)[0]
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        values = [int(v) for v in line.split()[1:9]]
    except (OSError, ValueError):
        return 0, 0, 0
    idle = values[3] + values[4]
    steal = values[7] if len(values) > 7 else 0
    total = sum(values)
    return total - idle - steal, steal, total


def process_ticks(pid: int) -> int:
    """User + system jiffies of one process (not its children); 0 once it has exited."""
    try:
        # Fields after the parenthesised command name; utime and stime are 14 and 15.
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(rest[11]) + int(rest[12])
    except (OSError, IndexError, ValueError):
        return 0  # exited in between


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (a decoder child, a backend)."""
    return process_ticks(pid) / TICK


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, as captions and JSONs cite it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def machine() -> dict[str, Any]:
    """What every benchmark's result records of the machine it ran on; the load average
    at the start, since this machine is shared (the result adds the one at the end)."""
    return {"nproc": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
            "kernel": platform.release(), "loadavg_at_start": list(os.getloadavg())}
