"""Where job output lives on the node, and reading it back in bounded, UTF-8-safe chunks."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Stream = Literal["stdout", "stderr"]

MAX_CHUNK = 1024 * 1024  # bytes per log read: the agent never holds more in one answer


def epoch_dir(state_dir: Path, job_id: int, epoch: int) -> Path:
    """`<state_dir>/logs/<job_id>/e<epoch>`: one directory per launch of a job."""
    return state_dir / "logs" / str(job_id) / f"e{epoch}"


def rank_paths(state_dir: Path, job_id: int, epoch: int, rank: int) -> tuple[Path, Path]:
    """Default (stdout, stderr) files of one rank: `…/e<epoch>/rank-<R>.out|.err`."""
    d = epoch_dir(state_dir, job_id, epoch)
    return d / f"rank-{rank}.out", d / f"rank-{rank}.err"


def task_paths(
    state_dir: Path, job_id: int, epoch: int, step_id: int, task_id: int
) -> tuple[Path, Path]:
    """(stdout, stderr) files of one srun task: `…/e<epoch>/step-<S>/task-<T>.out|.err`."""
    d = epoch_dir(state_dir, job_id, epoch) / f"step-{step_id}"
    return d / f"task-{task_id}.out", d / f"task-{task_id}.err"


def exec_paths(state_dir: Path, job_id: int, epoch: int, exec_id: int) -> tuple[Path, Path]:
    """(stdout, stderr) files of one `phalanx exec` while it runs (deleted once streamed):
    `…/e<epoch>/exec-<N>.out|.err`."""
    d = epoch_dir(state_dir, job_id, epoch)
    return d / f"exec-{exec_id}.out", d / f"exec-{exec_id}.err"


def latest_rank_paths(state_dir: Path, job_id: int, rank: int) -> tuple[Path, Path] | None:
    """The default files of a rank from the newest epoch on disk (after an agent restart)."""
    root = state_dir / "logs" / str(job_id)
    epochs = sorted(
        (int(m.group(1)) for p in root.glob("e*") if (m := re.fullmatch(r"e(\d+)", p.name))),
        reverse=True,
    )
    for epoch in epochs:
        out, err = rank_paths(state_dir, job_id, epoch, rank)
        if out.exists() or err.exists():
            return out, err
    return None


def record_outputs(default_out: Path, uid: int, outputs: tuple[Path, Path]) -> None:
    """Remember, next to a rank's default files (in the agent's own log dir), the -o/-e
    files its process opened as user `uid`: its logs are found there after the agent
    forgets the launch."""
    record = {"uid": uid, "stdout": str(outputs[0]), "stderr": str(outputs[1])}
    default_out.with_suffix(".outputs").write_text(json.dumps(record))


def recorded_outputs(default_out: Path) -> tuple[int, tuple[Path, Path]] | None:
    """What `record_outputs` wrote for this rank, if anything."""
    try:
        record = json.loads(default_out.with_suffix(".outputs").read_text())
        return int(record["uid"]), (Path(record["stdout"]), Path(record["stderr"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Chunk:
    """Bytes [offset, next_offset) of a file, decoded; `eof` when the writer has ended and
    nothing is left."""

    offset: int
    next_offset: int
    data: str
    eof: bool


def open_owned(path: Path, owner: int) -> int:
    """Open `path` for reading as a job's file: no symbolic link anywhere on the way (each
    component is opened relative to the last, O_NOFOLLOW), a regular file, owned by uid
    `owner`. A job cannot point the agent, reading as root, at another user's file, a
    device or the agent's own state. Raises OSError otherwise."""
    if not path.is_absolute():
        raise OSError(errno.EINVAL, f"{path} is not absolute")
    parts = [p for p in path.parts[1:] if p not in ("", ".")]
    if not parts or ".." in parts:
        raise OSError(errno.EINVAL, f"{path}: not a plain path")
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", dir_flags)
    try:
        for name in parts[:-1]:
            nxt = os.open(name, dir_flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        file_fd = os.open(parts[-1], flags, dir_fd=fd)
    finally:
        os.close(fd)
    st = os.fstat(file_fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != owner:
        os.close(file_fd)
        raise OSError(errno.EPERM, f"{path} is not a regular file of uid {owner}")
    return file_fd


def readable_by_owner(path: Path, owner: int) -> bool:
    """Whether `open_owned(path, owner)` succeeds now."""
    try:
        os.close(open_owned(path, owner))
    except OSError:
        return False
    return True


def read_chunk(
    path: Path, offset: int, *, ended: bool, limit: int = MAX_CHUNK, owner: int | None = None
) -> Chunk:
    """Read at most `limit` bytes of `path` from `offset`.

    A UTF-8 character cut by the end of the read is left for the next call (unless the
    writer has ended), so a reader that follows `next_offset` never sees a broken
    character. A missing file reads as empty. With `owner` (a job running as another
    user), the file is opened as `open_owned` does; one that is not reads as empty.
    """
    offset = max(offset, 0)
    try:
        fd = open_owned(path, owner) if owner is not None else os.open(path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            size = f.seek(0, 2)
            f.seek(min(offset, size))
            raw = f.read(limit)
    except FileNotFoundError:
        size, raw = 0, b""
    except OSError:
        if owner is None:
            raise
        size, raw = 0, b""
    start = min(offset, size)
    at_end = start + len(raw) >= size
    if not (ended and at_end):
        raw = raw[: _complete_utf8_len(raw)]
    nxt = start + len(raw)
    return Chunk(
        offset=start,
        next_offset=nxt,
        data=raw.decode("utf-8", errors="replace"),
        eof=ended and nxt >= size,
    )


def _complete_utf8_len(b: bytes) -> int:
    """Length of `b` without a trailing, incomplete UTF-8 sequence."""
    n = len(b)
    for back in range(1, min(4, n) + 1):
        c = b[n - back]
        if c < 0x80:
            return n
        if c >= 0xC0:  # lead byte: how long its sequence must be
            need = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            return n if back >= need else n - back
    return n
