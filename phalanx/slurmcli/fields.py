"""What squeue, sacct and sinfo share: a job as the head lists it (`Job`), Slurm's words for
Phalanx's job states and reasons, Slurm's time and date forms and array ids (`N_i`,
`N_[1-5%2]`), all as Slurm 22.05 prints them (the `%` formats: phalanx.slurmcli.formats)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from phalanx.jobspec.errors import JobSpecError
from phalanx.jobspec.hostlist import compress
from phalanx.jobspec.units import elapsed

# Phalanx's state codes (api.states) → Slurm's words; the codes are Slurm's compact ones.
STATE_WORDS: dict[str, str] = {
    "PD": "PENDING",
    "R": "RUNNING",
    "CG": "COMPLETING",
    "CD": "COMPLETED",
    "F": "FAILED",
    "CA": "CANCELLED",
    "TO": "TIMEOUT",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
    "PR": "PREEMPTED",
}
# Slurm's other job states: accepted by `-t/--states` and `-s/--state`, never a Phalanx
# job's (Phalanx has no suspend, boot, deadline or federation states).
OTHER_STATES: dict[str, str] = {
    "BF": "BOOT_FAIL",
    "CF": "CONFIGURING",
    "DL": "DEADLINE",
    "RD": "RESV_DEL_HOLD",
    "RF": "REQUEUE_FED",
    "RH": "REQUEUE_HOLD",
    "RQ": "REQUEUED",
    "RS": "RESIZING",
    "RV": "REVOKED",
    "SE": "SPECIAL_EXIT",
    "SI": "SIGNALING",
    "SO": "STAGE_OUT",
    "ST": "STOPPED",
    "S": "SUSPENDED",
}
LIVE_CODES = ("PD", "R", "CG", "PR")  # what squeue lists without `-t`
ENDED_REASONS = {  # the head's words for why a job ended → Slurm's reason names
    "fail": "NonZeroExitCode",
    "timeout": "TimeLimit",
    "oom": "OutOfMemory",
    "node_fail": "NodeDown",
    "cancel": "None",
    "cancelled": "None",
    "complete": "None",
}
MAX_SECONDS = 365 * 86400  # squeue prints longer spans as INVALID (YEAR_SECONDS)


class FormatError(Exception):
    """A bad `-o/--format`, state or time: the tool prints it as Slurm would."""


def parse_states(text: str, *, allow_all: bool = True) -> set[str] | None:
    """`-t/--states` (squeue) or `-s/--state` (sacct): comma-separated words or compact
    codes, any case; `all` (None: every state). The Phalanx codes they name; a Slurm state
    Phalanx never has names none. FormatError for a word Slurm does not know."""
    wanted: set[str] = set()
    for raw in text.split(","):
        word = raw.strip().upper()
        if not word:
            continue
        if word == "ALL" and allow_all:
            return None
        if word in STATE_WORDS:
            wanted.add(word)
            continue
        code = next((c for c, w in STATE_WORDS.items() if w == word), None)
        if code is not None:
            wanted.add(code)
        elif word not in OTHER_STATES and word not in OTHER_STATES.values():
            raise FormatError(f"Invalid job state specified: {raw.strip()[:64]}")
    return wanted


@dataclass(frozen=True, slots=True)
class Job:
    """One job (or a pending array's untouched tasks, `tasks`) as the head lists it."""

    id: int
    name: str
    user: str
    partition: str  # the Phalanx team
    account: str | None
    qos: str
    priority: int
    state: str  # Phalanx's (= Slurm's compact) code
    reason: str | None
    reason_message: str | None
    nodes: int
    gpus_per_node: int
    time_limit_s: int | None
    submit_time: float
    start_time: float | None
    end_time: float | None
    exit_code: str | None  # "code:signal"
    restart_count: int
    array_job_id: int | None
    array_task_id: int | None
    nodelist: tuple[str, ...]
    workdir: str
    hold: str | None
    ntasks_per_node: int | None
    cpus_per_task: int | None
    mem_mb: int | None
    array_max_parallel: int | None
    cancelled_by: str | None
    begin_time: float | None = None  # `--begin`: a pending job's earliest start
    tasks: tuple[int, ...] = field(default=())  # a collapsed pending array's task ids

    @classmethod
    def from_wire(cls, row: dict[str, Any]) -> Job:
        """From one JobInfo (a dict, or a JobTable row zipped with its columns)."""
        return cls(
            id=row["id"],
            name=row["name"],
            user=row["user"],
            partition=row["team"],
            account=row.get("account"),
            qos=row.get("qos") or "normal",
            priority=row.get("priority") or 0,
            state=row["state"],
            reason=row.get("reason"),
            reason_message=row.get("reason_message"),
            nodes=row["nodes"],
            gpus_per_node=row["gpus_per_node"],
            time_limit_s=row.get("time_limit_s"),
            submit_time=row["submit_time"],
            start_time=row.get("start_time"),
            end_time=row.get("end_time"),
            exit_code=row.get("exit_code"),
            restart_count=row.get("restart_count") or 0,
            array_job_id=row.get("array_job_id"),
            array_task_id=row.get("array_task_id"),
            nodelist=tuple(p["node"] for p in row.get("placement") or ()),
            workdir=row.get("workdir") or "",
            hold=row.get("hold"),
            ntasks_per_node=row.get("ntasks_per_node"),
            cpus_per_task=row.get("cpus_per_task"),
            mem_mb=row.get("mem_mb"),
            array_max_parallel=row.get("array_max_parallel"),
            cancelled_by=row.get("cancelled_by"),
            begin_time=row.get("begin_time"),
        )

    # ------------------------------------------------------------------ derived values
    @property
    def word(self) -> str:
        return STATE_WORDS.get(self.state, self.state)

    @property
    def pending(self) -> bool:
        return self.state == "PD"

    @property
    def ended(self) -> bool:
        return self.state not in LIVE_CODES

    @property
    def job_id(self) -> str:
        """Slurm's JOBID: `N`, an array task `N_i`, pending tasks `N_[1-5%2]`."""
        if self.tasks:
            throttle = f"%{self.array_max_parallel}" if self.array_max_parallel else ""
            return f"{self.array_job_id}_[{ranges(self.tasks)}{throttle}]"
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.id)

    @property
    def task_string(self) -> str | None:
        """squeue's array_task_str (`1-5%2`) for collapsed pending tasks; else None."""
        if not self.tasks:
            return None
        throttle = f"%{self.array_max_parallel}" if self.array_max_parallel else ""
        return ranges(self.tasks) + throttle

    @property
    def ntasks(self) -> int:
        return self.nodes * (self.ntasks_per_node or 1)

    @property
    def cpus(self) -> int:
        """CPUs requested: tasks × CPUs per task (Slurm's default: one per task)."""
        return self.ntasks * (self.cpus_per_task or 1)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def hostlist(self) -> str:
        return host_list(self.nodelist) if self.nodelist else ""

    def elapsed(self, now: float) -> int:
        """Seconds of its latest run (Slurm's Elapsed and squeue's TIME); 0 unstarted."""
        if self.start_time is None or (self.pending and self.end_time is None):
            return 0
        end = self.end_time if self.end_time is not None else now
        return max(0, int(end - self.start_time))

    def slurm_reason(self) -> str:
        """Slurm's reason name: the pending reason, or why it ended; `None` otherwise."""
        reason = self.reason
        if self.state in ("R", "CG", "PR", "CD") and not self.pending:
            return "None" if self.state != "PR" else "Preempted"
        if not reason:
            return "None"
        return ENDED_REASONS.get(reason, reason)

    @property
    def exit_pair(self) -> tuple[int, int]:
        """(exit code, signal) from "code:signal"; (0, 0) before it ends."""
        if not self.exit_code or ":" not in self.exit_code:
            return 0, 0
        code, _, sig = self.exit_code.partition(":")
        try:
            return int(code), int(sig)
        except ValueError:
            return 0, 0


def ranges(numbers: Iterable[int]) -> str:
    """`1,2,3,5` → `1-3,5` (Slurm's array task strings)."""
    out: list[str] = []
    ordered = sorted(set(numbers))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def collapse_arrays(jobs: Sequence[Job]) -> list[Job]:
    """As slurmctld shows an array: its tasks that have not started yet (pending, never
    run, not held on their own) are one record `N_[a-b%p]` (listed where the first of
    them was); started ones are `N_i` each."""
    groups: dict[int, list[Job]] = {}
    for job in jobs:
        if _untouched(job):
            assert job.array_job_id is not None
            groups.setdefault(job.array_job_id, []).append(job)
    out: list[Job] = []
    done: set[int] = set()
    for job in jobs:
        if not _untouched(job):
            out.append(job)
            continue
        assert job.array_job_id is not None
        if job.array_job_id in done:
            continue
        done.add(job.array_job_id)
        members = groups[job.array_job_id]
        if len(members) == 1:
            out.append(job)
        else:
            ids = tuple(m.array_task_id for m in members if m.array_task_id is not None)
            first = min(members, key=lambda m: m.array_task_id or 0)
            out.append(_replace_tasks(first, ids))
    return out


def _untouched(job: Job) -> bool:
    return (
        job.pending
        and job.array_job_id is not None
        and job.array_task_id is not None
        and job.start_time is None
        and job.restart_count == 0
        and job.hold is None
    )


def _replace_tasks(job: Job, tasks: tuple[int, ...]) -> Job:
    return replace(job, tasks=tuple(sorted(tasks)))


# ----------------------------------------------------------------------------- times
def squeue_secs(seconds: float | None) -> str:
    """squeue's TIME and TIME_LIMIT: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`."""
    if seconds is None:
        return "UNLIMITED"
    s = int(seconds)
    if s < 0 or s > MAX_SECONDS:
        return "INVALID"
    return elapsed(s)


def sacct_secs(seconds: float | None) -> str:
    """sacct's Elapsed and Timelimit: `HH:MM:SS`, `D-HH:MM:SS`; None: UNLIMITED."""
    if seconds is None:
        return "UNLIMITED"
    s = int(seconds)
    if s < 0:
        return "INVALID"
    days, rest = divmod(s, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def date(when: float | None, missing: str = "Unknown") -> str:
    """Slurm's dates: local time `YYYY-MM-DDTHH:MM:SS` (SLURM_TIME_FORMAT is not read)."""
    if not when:
        return missing
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(when))


def check_name(value: str, what: str) -> str:
    """A user, partition or job name from the command line: bounded, no control chars."""
    if len(value) > 128 or any(ord(c) < 32 for c in value):  # the head's bound on a name
        raise FormatError(f"Invalid {what}: {value[:64]!r}")
    return value


def words(value: str, what: str) -> set[str]:
    """A comma-separated option value (`-u a,b`) as checked names."""
    return {check_name(w.strip(), what) for w in value.split(",") if w.strip()}


class Selection:
    """The job filters squeue and sacct share: `-u`, `-A`, `-n`, `-p`, `-q`, `-w` (an empty
    set selects every job)."""

    def __init__(self) -> None:
        self.users: set[str] = set()
        self.accounts: set[str] = set()
        self.names: set[str] = set()
        self.partitions: set[str] = set()
        self.qos: set[str] = set()
        self.nodes: set[str] = set()

    def passes(self, job: Job) -> bool:
        return (
            (not self.users or job.user in self.users)
            and (not self.partitions or job.partition in self.partitions)
            and (not self.names or job.name in self.names)
            and (not self.accounts or (job.account or "") in self.accounts)
            and (not self.qos or job.qos in self.qos)
            and (not self.nodes or bool(self.nodes.intersection(job.nodelist)))
        )


def host_list(names: Sequence[str]) -> str:
    try:
        return compress(names)
    except JobSpecError:  # a name Slurm's hostlists cannot hold: list them plainly
        return ",".join(names)


def emit(lines: Sequence[str]) -> None:
    """Print the lines; a reader that went away (`squeue | head -1`) ends the output
    quietly, as Slurm's tools end on SIGPIPE, instead of a BrokenPipeError traceback."""
    if not lines:
        return
    try:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
