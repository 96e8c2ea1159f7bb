"""A running job's CPU and memory use on this node: from its cgroup, or /proc without one.

CPU is read as a cumulative counter (cgroup `cpu.stat` usage_usec / v1 `cpuacct.usage`,
or the summed utime+stime of the job's processes in /proc) and turned into cores busy
between two readings; memory is the cgroup's current charge, or the processes' summed RSS.
Every read is best effort: a value the kernel will not give is None, never an exception.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from .cgroups import JobCgroup

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PROC = Path("/proc")


def cgroup_cpu_s(cg: JobCgroup) -> float | None:
    """CPU seconds the cgroup's processes used since it was made."""
    with contextlib.suppress(OSError, ValueError):
        if cg.version == 2:
            for line in (cg.dirs[0] / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            return None
        for d in cg.dirs:
            f = d / "cpuacct.usage"
            if f.exists():
                return int(f.read_text()) / 1e9
    return None


def cgroup_memory_mb(cg: JobCgroup) -> int | None:
    """The cgroup's memory charge now (MiB)."""
    with contextlib.suppress(OSError, ValueError):
        if cg.version == 2:
            return int((cg.dirs[0] / "memory.current").read_text()) // (1024 * 1024)
        for d in cg.dirs:
            f = d / "memory.usage_in_bytes"
            if f.exists():
                return int(f.read_text()) // (1024 * 1024)
    return None


def proc_usage(leaders: Iterable[int], proc: Path = PROC) -> tuple[float, int] | None:
    """(CPU seconds, RSS MiB) of the job's processes: each rank leader's process group
    (a rank starts its own session: its children share its group). None: none alive."""
    groups = set(leaders)
    if not groups:
        return None
    cpu = 0.0
    rss = 0
    found = False
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = Path(entry.path, "stat").read_text()
            # The command name may hold spaces and parentheses: fields follow the last ')'.
            fields = text[text.rindex(")") + 2 :].split()
            pgid = int(fields[2])
            if pgid not in groups:
                continue
            cpu += (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
            rss += int(fields[21]) * _PAGE
            found = True
    return (cpu, rss // (1024 * 1024)) if found else None


def cpu_count() -> int:
    return os.cpu_count() or 0
