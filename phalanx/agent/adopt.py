"""Adopting the job processes an earlier run of the agent left running (an upgrade, or a
crash within the lease) instead of killing them (see "Agent restarts and upgrades" in
docs/fault-tolerance.md).

At each launch the agent writes, next to the process's exit status file (shim.py), a record
of it in `<launch dir>/procs/` (a directory of the agent's, 0700, files 0600). An agent that
starts while the previous one's lease still runs keeps the recorded processes alive and lets
the head decide: with the first desired state it adopts those of the job epochs the head
still wants here and kills the rest (`Survivors`); past that lease it kills them all, as
the head may already run their epochs elsewhere (never twice).

A record is acted on only if the agent could have written it (a regular file, the agent's
own, writable by nobody else, in a directory like that), and only for the very process it
names: same boot, pid and start time (a reused pid has a later one), running as the uid the
record says — and, to be adopted, the uid the head's assignment resolves to now. So a
record planted by a job's user makes the agent neither adopt nor kill anyone's process.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import select
import shutil
import signal
import stat
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from phalanx.api.models import Assignment

from . import cgroups, guard, leftovers, logfiles, spawn
from .env import global_rank, local_ranks
from .processes import Exit, ProcessManager, ProcState

log = logging.getLogger(__name__)

JobKey = tuple[int, int]  # (job_id, epoch)
RECORDS_DIR = "procs"  # in each launch dir: NAME.json records, NAME.status exit statuses
DISOWNED_NAME = "disowned"  # in a launch dir: the agent ended it itself; never adopted
_SHIM_GRACE_S = 5.0  # a shim writes the status right after its process ended
_MAX_RECORD = 64 * 1024


class ProcRecord(BaseModel):
    """One job process an agent started: what it is and how to recognise it."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    kind: Literal["rank", "task"]  # a rank (or batch script), or an srun step task
    job_id: int
    epoch: int
    rank: int  # the global rank, or the step task's id
    local_rank: int = 0
    step_id: int | None = None  # a task's step
    pid: int  # the job process, leader of its process group
    start: int | None  # its start time (clock ticks after boot); None: it ended at once
    shim_pid: int | None  # its shim, the agent's child, which writes the status file
    shim_start: int | None
    boot: str  # the kernel's boot id: pids and start times mean nothing across a reboot
    uid: int  # the uid it runs as
    as_user: bool  # whether that is another user than the agent's
    started_at: float  # unix seconds
    stdout: str
    stderr: str
    outputs: tuple[str, str] | None = None  # the -o/-e files it opened itself
    master_port: int | None = None  # the MASTER_PORT it was given

    @property
    def name(self) -> str:
        """Its file names in the launch's records dir."""
        return rank_name(self.rank) if self.kind == "rank" else task_name(self.step_id, self.rank)


def rank_name(rank: int) -> str:
    return f"rank-{rank}"


def task_name(step_id: int | None, task_id: int) -> str:
    return f"step-{step_id}-task-{task_id}"


def status_path(job_dir: Path, name: str) -> Path:
    """Where the shim of process `name` of a launch writes its exit status."""
    return job_dir / RECORDS_DIR / f"{name}.status"


def remember(
    job_dir: Path,
    state: ProcState,
    *,
    kind: Literal["rank", "task"],
    job_id: int,
    epoch: int,
    rank: int,
    uid: int,
    local_rank: int = 0,
    step_id: int | None = None,
    master_port: int | None = None,
) -> None:
    """Record a process this agent just started under a shim (`state` from the process
    manager), so a restarted agent can adopt it."""
    if state.pid is None:
        return  # never started
    record = ProcRecord(
        kind=kind,
        job_id=job_id,
        epoch=epoch,
        rank=rank,
        local_rank=local_rank,
        step_id=step_id,
        pid=state.pid,
        start=leftovers.start_time(state.pid),
        shim_pid=state.shim,
        shim_start=leftovers.start_time(state.shim) if state.shim is not None else None,
        boot=boot_id(),
        uid=uid,
        as_user=state.uid is not None,
        started_at=state.started_at,
        stdout=str(state.stdout),
        stderr=str(state.stderr),
        outputs=(str(state.outputs[0]), str(state.outputs[1])) if state.outputs else None,
        master_port=master_port,
    )
    d = job_dir / RECORDS_DIR
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = d / f".{record.name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(record.model_dump_json())
    tmp.replace(d / f"{record.name}.json")


def forget(job_dir: Path) -> None:
    """Drop a launch's records and statuses (it ended here, or another job reuses its id)."""
    shutil.rmtree(job_dir / RECORDS_DIR, ignore_errors=True)


def disown(job_dir: Path) -> None:
    """The agent ends this launch itself (fenced, or stopping its jobs): a later agent must
    never adopt what is left of it. Its processes' status files will say they were killed
    by a signal, but the job did not fail: they were lost, and are reported so."""
    with contextlib.suppress(OSError):
        if job_dir.is_dir():
            (job_dir / DISOWNED_NAME).touch()


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


# ----------------------------------------------------------------------------- at start
def previous_lease(state_dir: Path) -> float | None:
    """The deadline (time.monotonic()) of the lease the previous agent on this state dir
    published, while it still runs; None when there is none, it ran out, or it dates from
    before this boot (the monotonic clock started again)."""
    path = state_dir / guard.LEASE_NAME
    lease = guard.read_lease(path)
    try:
        written = path.stat().st_mtime
    except OSError:
        return None
    if lease is None or written < _boot_time() or lease[1] <= time.monotonic():
        return None
    return lease[1]


def inherit(state_dir: Path) -> Survivors:
    """What an agent starting on `state_dir` finds of its predecessor's jobs, before it
    registers. Within the predecessor's lease, the launches it recorded stay as they are
    for the head's first desired state to decide on (Reconciler.apply); everything else
    recorded is killed, and so is all of it past the lease (the head may already run those
    epochs elsewhere)."""
    deadline = previous_lease(state_dir)
    launches = _read_records(state_dir) if deadline is not None else {}
    keep = {_job_dir(state_dir, key) for key in launches}
    leftovers.kill_orphans(state_dir, keep=keep)
    if deadline is None:
        for d in (state_dir / "jobs").glob(f"*/e*/{RECORDS_DIR}"):
            forget(d.parent)
    return Survivors(state_dir, deadline, launches)


class Survivors:
    """The launches an earlier agent run left, held until the head's first desired state
    says which to adopt (`take`) and which to kill (`kill`). Thread-safe: a fence may kill
    them all while a desired state is being applied."""

    def __init__(
        self, state_dir: Path, deadline: float | None, launches: dict[JobKey, list[ProcRecord]]
    ) -> None:
        self.state_dir = state_dir
        self.deadline = deadline  # the predecessor's lease deadline; None: none held
        self._lock = threading.Lock()
        self._launches = dict(launches)

    def launches(self) -> list[JobKey]:
        with self._lock:
            return sorted(self._launches)

    def take(self, key: JobKey) -> list[ProcRecord] | None:
        """The records of a launch to adopt (None: already killed, by a fence)."""
        with self._lock:
            return self._launches.pop(key, None)

    def kill(self, key: JobKey, taken: list[ProcRecord] | None = None) -> None:
        """SIGKILL what is left of a launch the head no longer wants here (or that may not
        be adopted; `taken`: its records, taken already) and forget it: its recorded
        processes, its recorded process groups, its cgroup."""
        with self._lock:
            records = self._launches.pop(key, taken)
        if records is not None:
            self._kill(key, records)

    def kill_all(self) -> None:
        """Kill every launch not adopted yet (fenced, or the agent stops its jobs)."""
        with self._lock:
            launches, self._launches = self._launches, {}
        for key, records in sorted(launches.items()):
            self._kill(key, records)

    def _kill(self, key: JobKey, records: list[ProcRecord]) -> None:
        job_dir = _job_dir(self.state_dir, key)
        killed: set[int] = set()
        for r in records:
            if r.start is not None and r.boot == boot_id() and _is(r.pid, r.start, r.uid):
                # The very process recorded, alive: its group is the job's.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(r.pid, signal.SIGKILL)
                killed.add(r.pid)
        for g in leftovers.live_recorded(self.state_dir):
            if leftovers.launch_dir(self.state_dir, g) == job_dir:
                leftovers.kill(g)
                killed.add(g.pgid)
        cgroups.kill_leftovers(self.state_dir, remove=True, only={job_dir})
        leftovers.wait_gone(killed)
        forget(job_dir)
        (job_dir / leftovers.RECORD_NAME).unlink(missing_ok=True)
        if killed:
            log.warning(
                "job %d.%d: killed %d process group(s) an earlier agent run left (not "
                "adopted: the head no longer wants that epoch here, or the agent ended it)",
                *key,
                len(killed),
            )


# ----------------------------------------------------------------------------- adopting
def same_launch(job_dir: Path, a: Assignment) -> bool:
    """Whether the launch recorded in `job_dir` is the job epoch `a` (the hash of its step
    token in the launch marker: job ids repeat when a cluster is recreated on the same
    state dir) and the agent did not end it itself (fenced, stopped)."""
    fingerprint = hashlib.sha256(a.step_token.encode()).hexdigest()
    try:
        marker = (job_dir / "launched").read_text()
    except OSError:
        return False
    return marker == fingerprint and not (job_dir / DISOWNED_NAME).exists()


def take_ranks(
    procs: ProcessManager,
    a: Assignment,
    records: list[ProcRecord],
    state_dir: Path,
    key_of: Callable[[int], Hashable],
) -> tuple[dict[int, int], int | None]:
    """Adopt the recorded ranks of launch `a` into `procs` (`key_of(rank)`: the process key
    of a global rank); a rank without a record (the earlier agent stopped before it
    started it) reads as lost. Returns (global rank → local rank, the master port this node
    picked as rank 0 and the head may not know yet)."""
    by_rank = {r.rank: r for r in records if r.kind == "rank"}
    ranks: dict[int, int] = {}
    port = None
    for local in local_ranks(a):
        rank = global_rank(a, local)
        ranks[rank] = local
        r = by_rank.get(rank)
        if r is None:
            out, err = logfiles.rank_paths(state_dir, a.job_id, a.epoch, rank)
            why = "rank lost: the agent restarted while it launched the job"
            procs.fail(key_of(rank), why, code=None, signal=9, stdout=out, stderr=err, lost=True)
            continue
        take_over(procs, key_of(rank), r, state_dir)
        if a.node_rank == 0 and a.master_port is None and r.master_port is not None:
            port = r.master_port
    log.info("job %d.%d: adopted %s", a.job_id, a.epoch, describe(records))
    return ranks, port


def take_over(procs: ProcessManager, key: Hashable, r: ProcRecord, state_dir: Path) -> ProcState:
    """Put a recorded process in the process manager as if this agent had started it: its
    end and exit status are watched through pidfds and the status file its shim writes.
    One that is gone without a status (killed with its shim), or is not the process
    recorded, reads as lost."""
    owner = (r.job_id, r.epoch)
    job_dir = _job_dir(state_dir, owner)
    status = status_path(job_dir, r.name)
    try:
        job_fd = _pidfd(r.pid, r.start, r.uid, r.boot)
        shim_fd = None
        if r.shim_pid is not None:
            shim_fd = _pidfd(r.shim_pid, r.shim_start, os.geteuid(), r.boot)
    except _Unwatchable:  # no pidfds (Linux < 5.3): it cannot be watched, so it must go
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(r.pid, signal.SIGKILL)
        job_fd = shim_fd = None
    if job_fd is None and shim_fd is None and spawn.read_status(status) is None:
        # Lost. What is left of its group (children of a leader killed with its shim) must
        # not outlive the report: the head may run the job elsewhere now.
        if leftovers.group_of_job(r.pid, r.job_id, r.epoch):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(r.pid, signal.SIGKILL)
        if r.kind == "rank":
            out, err = logfiles.rank_paths(state_dir, r.job_id, r.epoch, r.rank)
        else:
            out, err = logfiles.task_paths(state_dir, r.job_id, r.epoch, r.step_id or 0, r.rank)
        why = "lost: it ended without an exit status while the agent restarted"
        return procs.fail(key, why, code=None, signal=9, stdout=out, stderr=err, lost=True)
    # Once its leader is gone the group id is the job's only while a member is (a pid is
    # not reused while a live process has it as its group id).
    group = job_fd is not None or leftovers.group_of_job(r.pid, r.job_id, r.epoch)
    return procs.adopt(
        key,
        pid=r.pid,
        group=group,
        started_at=r.started_at,
        stdout=Path(r.stdout),
        stderr=Path(r.stderr),
        owner=owner,
        outputs=(Path(r.outputs[0]), Path(r.outputs[1])) if r.outputs else None,
        uid=r.uid if r.as_user else None,
        wait_end=_waiter(job_fd, shim_fd, status),
    )


def _waiter(job_fd: int | None, shim_fd: int | None, status: Path) -> Callable[[], Exit | None]:
    def wait_end() -> Exit | None:
        for fd, timeout in ((job_fd, None), (shim_fd, _SHIM_GRACE_S)):
            if fd is not None:
                _wait_readable(fd, timeout)
                os.close(fd)
        got = spawn.read_status(status)
        if got is None:
            return None  # its shim was killed with it (fenced, the node powered off)
        try:
            at = status.stat().st_mtime  # when the shim wrote it: right after the end
        except OSError:
            at = time.time()
        return Exit(got[0], got[1], at)

    return wait_end


def _wait_readable(fd: int, timeout_s: float | None) -> None:
    """Wait until a pidfd is readable (its process ended), at most `timeout_s`."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.poll(None if timeout_s is None else int(timeout_s * 1000))


# ----------------------------------------------------------------------------- helpers
class _Unwatchable(Exception):
    """The process is the one recorded, but this kernel gives no pidfd to watch it."""


def _pidfd(pid: int, start: int | None, uid: int, boot: str) -> int | None:
    """A pidfd of the process recorded as (boot, pid, start time), running as `uid`; None
    when it is gone (or the pid now names another process, or another user's). Raises
    _Unwatchable when it is there but the kernel has no pidfd_open."""
    if start is None or boot != boot_id() or not _is(pid, start, uid):
        return None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except OSError as e:
        raise _Unwatchable from e
    if not _is(pid, start, uid):  # reused between the check and the open
        os.close(fd)
        return None
    return fd


def _is(pid: int, start: int, uid: int) -> bool:
    return leftovers.start_time(pid) == start and _real_uid(pid) == uid


def _real_uid(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def _boot_time() -> float:
    """When this boot began (unix seconds, /proc/stat btime)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


def _job_dir(state_dir: Path, key: JobKey) -> Path:
    return state_dir / "jobs" / str(key[0]) / f"e{key[1]}"


def _read_records(state_dir: Path) -> dict[JobKey, list[ProcRecord]]:
    """Every record under `state_dir` that this agent could have written, by launch."""
    out: dict[JobKey, list[ProcRecord]] = {}
    for d in sorted((state_dir / "jobs").glob(f"*/e*/{RECORDS_DIR}")):
        job, epoch = d.parent.parent.name, d.parent.name.removeprefix("e")
        if not (job.isdigit() and epoch.isdigit() and _trusted(d, directory=True)):
            continue
        key = (int(job), int(epoch))
        for path in sorted(d.glob("*.json")):
            r = _read_record(path)
            if r is not None and (r.job_id, r.epoch) == key and path.stem == r.name:
                out.setdefault(key, []).append(r)
    return out


def _read_record(path: Path) -> ProcRecord | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not _trusted_stat(os.fstat(fd), directory=False):
            log.warning("ignoring %s: not a file only this agent can write", path)
            return None
        try:
            return ProcRecord.model_validate_json(f.read(_MAX_RECORD))
        except ValidationError:
            log.warning("ignoring %s: not a valid process record", path)
            return None


def _trusted(path: Path, *, directory: bool) -> bool:
    try:
        return _trusted_stat(os.lstat(path), directory=directory)
    except OSError:
        return False


def _trusted_stat(st: os.stat_result, *, directory: bool) -> bool:
    """The agent's own, and nobody else may write it (a job's user planted nothing)."""
    kind = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    return kind and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def describe(records: Iterable[ProcRecord]) -> str:
    """'rank 0, rank 1, step 2 task 0' for log lines."""
    names = [
        f"rank {r.rank}" if r.kind == "rank" else f"step {r.step_id} task {r.rank}" for r in records
    ]
    return ", ".join(names) or "nothing"
