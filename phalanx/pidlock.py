"""One process per state directory: an fcntl lock on a file that holds the owner's pid."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


class AlreadyRunning(Exception):
    """Another process holds this state directory's lock; the message names its pid."""


def lock(state_dir: Path, file_name: str, what: str) -> IO[str]:
    """Take `state_dir/file_name` (exclusive, non-blocking) and write our pid in it.

    The lock lasts as long as the returned file stays open: the process's life, even after
    a SIGKILL (the kernel drops it then, so a crash leaves no stale lock). Raises
    AlreadyRunning naming the holder (`what`: "head", "agent") and its pid.
    """
    path = state_dir / file_name
    f = path.open("a+", encoding="utf-8")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read().strip() or "unknown"
        f.close()
        raise AlreadyRunning(
            f"another {what} is running on this state directory (pid {pid}): {state_dir}"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f
