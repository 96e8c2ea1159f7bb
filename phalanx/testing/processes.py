"""Process checks for tests: is a pid a live process?"""

from __future__ import annotations

from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (an exited child nobody reaped yet).

    Any error reading /proc/PID/stat means it is gone: it may vanish between the open and
    the read (ProcessLookupError), not only before the open.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
