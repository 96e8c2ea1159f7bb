"""Job process groups an agent left behind when it was killed: record them, kill them at start."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from . import cgroups

log = logging.getLogger(__name__)

RECORD_NAME = "pgids"  # in each launch dir: "PGID STARTTIME" per started process group
_WAIT_S = 5.0  # how long start-up waits for killed groups to be gone (GPUs freed)


@dataclass(frozen=True)
class _Proc:
    pid: int
    pgid: int
    start: int  # clock ticks after boot (/proc/PID/stat field 22)
    zombie: bool


def start_time(pid: int) -> int | None:
    """When `pid` started, in clock ticks after boot; None if it is gone. With the pid it
    names one process for good: a reused pid has a later start time."""
    proc = _read(pid)
    return proc.start if proc is not None else None


def record(job_dir: Path, pid: int) -> None:
    """Remember a process group this agent started (its leader `pid`) in the launch dir, so
    an agent that was SIGKILLed can find it when it starts again."""
    start = start_time(pid)
    if start is None:
        return  # already gone: nothing can be left over
    job_dir.mkdir(parents=True, exist_ok=True)
    with open(job_dir / RECORD_NAME, "a") as f:
        f.write(f"{pid} {start}\n")


@dataclass(frozen=True)
class Group:
    """A recorded process group that is still alive and still the one recorded."""

    pgid: int
    job: str
    epoch: str


def live_recorded(state_dir: Path) -> list[Group]:
    """Every process group recorded under `state_dir` that still has a live member and is
    still ours: its leader is the recorded process (same pid and start time), or, once the
    leader is gone, a live member carries the launch's PHALANX_JOB_ID and PHALANX_EPOCH (a
    pid is not reused while a live process holds it as its group id, but a new group of
    that id may exist once the old one ended)."""
    records = sorted((state_dir / "jobs").glob(f"*/e*/{RECORD_NAME}"))
    if not records:
        return []
    procs = _scan()
    members: dict[int, list[_Proc]] = {}
    for p in procs.values():
        if not p.zombie:
            members.setdefault(p.pgid, []).append(p)
    found: dict[int, Group] = {}
    for path in records:
        job, epoch = path.parent.parent.name, path.parent.name.removeprefix("e")
        for pgid, start in _entries(path):
            live = members.get(pgid, [])
            if not live or pgid in found:
                continue
            leader = procs.get(pgid)
            same_leader = leader is not None and leader.pgid == pgid and leader.start == start
            if same_leader or any(_job_of(p.pid) == (job, epoch) for p in live):
                found[pgid] = Group(pgid, job, epoch)
    return list(found.values())


def group_of_job(pgid: int, job: int, epoch: int) -> bool:
    """Whether process group `pgid` has a live member of launch (job, epoch), by the
    PHALANX_JOB_ID and PHALANX_EPOCH in its environment."""
    want = (str(job), str(epoch))
    return any(p.pgid == pgid and not p.zombie and _job_of(p.pid) == want for p in _scan().values())


def kill(group: Group) -> None:
    """SIGKILL a group found by live_recorded()."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or only zombies
        os.killpg(group.pgid, signal.SIGKILL)


def kill_orphans(state_dir: Path, keep: Collection[Path] = ()) -> int:
    """SIGKILL every recorded process group still alive and ours (live_recorded), wait a
    little for them to be gone, and forget the records. Called when the agent starts,
    before it registers: nothing of its own runs yet. Job cgroups recorded there are
    emptied (everything in them: escaped process groups too) and deleted first. The launch
    dirs in `keep` are spared (jobs this agent may adopt: adopt.py). Returns the groups
    killed."""
    cgroups.kill_leftovers(state_dir, remove=True, keep=keep)
    groups = [g for g in live_recorded(state_dir) if launch_dir(state_dir, g) not in keep]
    for g in groups:
        kill(g)
        log.warning(
            "killed leftover process group %d of job %s epoch %s (the agent had been "
            "killed while it ran)",
            g.pgid,
            g.job,
            g.epoch,
        )
    for path in (state_dir / "jobs").glob(f"*/e*/{RECORD_NAME}"):
        if path.parent not in keep:
            path.unlink(missing_ok=True)
    wait_gone({g.pgid for g in groups})
    return len(groups)


def launch_dir(state_dir: Path, group: Group) -> Path:
    """The launch dir a group was recorded in."""
    return state_dir / "jobs" / group.job / f"e{group.epoch}"


def _entries(path: Path) -> list[tuple[int, int]]:
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            out.append((int(parts[0]), int(parts[1])))
    return out


def _read(pid: int) -> _Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp … starttime(22) …"; comm may hold spaces and parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20:
        return None
    return _Proc(pid, int(fields[2]), int(fields[19]), fields[0] in ("Z", "X"))


def _scan() -> dict[int, _Proc]:
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            proc = _read(int(entry.name))
            if proc is not None:
                out[proc.pid] = proc
    return out


def _job_of(pid: int) -> tuple[str, str] | None:
    """(PHALANX_JOB_ID, PHALANX_EPOCH) from a process's environment, if readable."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env = dict(v.split(b"=", 1) for v in raw.split(b"\0") if b"=" in v)
    job, epoch = env.get(b"PHALANX_JOB_ID"), env.get(b"PHALANX_EPOCH")
    if job is None or epoch is None:
        return None
    return job.decode(errors="replace"), epoch.decode(errors="replace")


def wait_gone(groups: set[int]) -> None:
    """Wait (a few seconds at most) until no live process is left in `groups`."""
    deadline = time.monotonic() + _WAIT_S
    while groups and time.monotonic() < deadline:
        alive = {p.pgid for p in _scan().values() if not p.zombie}
        groups = groups & alive
        if groups:
            time.sleep(0.05)
    if groups:
        log.warning("leftover process group(s) %s still alive after SIGKILL", sorted(groups))
