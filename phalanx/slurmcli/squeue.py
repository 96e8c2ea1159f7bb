"""`squeue`: the queue as Slurm 22.05 prints it (default and `-l` columns, `-o/--format`,
`-O/--Format`, `--json` with openapi v0.0.38's field names), from the head's job list."""

from __future__ import annotations

import json
import os
import pwd
import sys
import time
from typing import Any

from phalanx.slurmcli import slurmjson
from phalanx.slurmcli.common import connect, die, options, run
from phalanx.slurmcli.fields import (
    LIVE_CODES,
    FormatError,
    Job,
    Selection,
    collapse_arrays,
    date,
    emit,
    parse_states,
    squeue_secs,
    words,
)
from phalanx.slurmcli.formats import Column, parse_format, parse_long_format, render
from phalanx.slurmcli.jobsource import fetch

DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
LONG_FORMAT = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
START_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R"  # `--start`
VALID_STATES = (
    "Valid job states include: PENDING,RUNNING,SUSPENDED,COMPLETED,CANCELLED,FAILED,"
    "TIMEOUT,NODE_FAIL,PREEMPTED,BOOT_FAIL,DEADLINE,OUT_OF_MEMORY,COMPLETING,CONFIGURING,"
    "RESIZING,RESV_DEL_HOLD,REQUEUED,REQUEUE_FED,REQUEUE_HOLD,REVOKED,SIGNALING,"
    "SPECIAL_EXIT,STAGE_OUT,STOPPED"
)
MIN_JOB_AGE_S = 300  # slurmctld's MinJobAge default: ended jobs stay listed this long
NO_USER = "\x00"  # what an unknown uid stands for: no user is named so
MAX_IDS = 4000
SHORT = "A:ahj:ln:o:O:p:q:rS:st:u:vVw:M:i:"
LONG = [
    "accounts=", "all", "array", "Format=", "format=", "help", "hide", "iterate=",
    "jobs=", "long", "me", "name=", "noheader", "partition=", "qos=", "sort=",
    "states=", "steps", "user=", "usage", "verbose", "version", "json", "yaml",
    "nodelist=", "clusters=", "cluster=", "local", "federation", "sibling",
    "noconvert", "array-unique", "start",
]  # fmt: skip
# `-O` names → the `%` letter printing the same field.
LONG_NAMES = {
    "account": "a", "arrayjobid": "F", "arraytaskid": "K", "command": "o",
    "cpus-per-task": "c", "dependency": "E", "endtime": "e", "jobarrayid": "i",
    "jobid": "A", "minmemory": "m", "name": "j", "nodelist": "N", "numcpus": "C",
    "numnodes": "D", "numtasks": "numtasks", "partition": "P", "priority": "p",
    "prioritylong": "Q", "qos": "q", "reason": "r", "reasonlist": "R", "starttime": "S",
    "state": "T", "statecompact": "t", "submittime": "V", "timeleft": "L",
    "timelimit": "l", "timeused": "M", "tres-per-node": "b", "userid": "U",
    "username": "u", "workdir": "Z", "exit_code": "X", "exitcode": "X",
}  # fmt: skip


def main(argv: list[str]) -> int:
    return run("squeue", _squeue, argv)


def _squeue(argv: list[str]) -> int:
    opts = options("squeue", argv, SHORT, LONG)
    o = _Options()
    try:
        for flag, value in opts:
            if o.apply(flag, value):
                return 0
    except FormatError as exc:
        die(str(exc))
    now = time.time()
    with connect() as client:
        if o.me:
            o.users.add(client.whoami().user)
        jobs = _select(client, o, now)
    if o.single_id is not None and not jobs:
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        return 1
    if not o.expand_arrays:
        jobs = collapse_arrays(jobs)
    # Slurm's default sort "P,t,-p": partition, compact state (as strings), priority down.
    jobs.sort(key=lambda j: (j.partition, j.state, -j.priority, j.id))
    if o.json:
        emit([json.dumps(slurmjson.squeue(jobs, now), indent=2)])
        return 0
    if o.long_format is not None:
        specs, errors = parse_long_format(o.long_format, LONG_NAMES)
    else:
        default = START_FORMAT if o.start else LONG_FORMAT if o.long else DEFAULT_FORMAT
        specs = parse_format(o.format or default)
        errors = [
            f"Invalid job format specification: {spec.letter}"
            for spec in specs
            if spec.letter and spec.letter not in COLUMNS
        ]
    for message in errors:  # squeue goes on without the field, as Slurm's
        print(f"squeue: error: {message}", file=sys.stderr)
    columns = _columns(now)
    out = [] if o.noheader else [render(specs, columns, None)]
    if o.long and not o.noheader:  # squeue -l starts with the date, as print_date()
        out.insert(0, time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now)))
    out.extend(render(specs, columns, job) for job in jobs)
    emit(out)
    return 0


class _Options(Selection):
    def __init__(self) -> None:
        super().__init__()
        self.states: set[str] | None = set(LIVE_CODES)
        self.states_given = False
        self.ids: set[int] = set()
        self.whole: set[int] = set()  # `N` asked for (a job, or every task of array N)
        self.tasks: set[tuple[int, int]] = set()  # `N_i` asked for
        self.single_id: str | None = None
        self.format: str | None = os.environ.get("SQUEUE_FORMAT") or None
        self.long_format: str | None = os.environ.get("SQUEUE_FORMAT2") or None
        self.long = self.noheader = self.me = self.json = self.expand_arrays = False
        self.start = False

    def apply(self, flag: str, value: str) -> bool:
        """Take one option; True when it printed something and squeue is done."""
        if flag in ("-A", "--accounts"):
            self.accounts |= words(value, "account")
        elif flag in ("-j", "--jobs"):
            self._jobs(value)
        elif flag in ("-h", "--noheader"):
            self.noheader = True
        elif flag in ("-l", "--long"):
            self.long = True
        elif flag in ("-n", "--name"):
            self.names |= words(value, "job name")
        elif flag in ("-o", "--format"):
            self.format, self.long_format = value, None
        elif flag in ("-O", "--Format"):
            self.long_format, self.format = value, None
        elif flag in ("-p", "--partition"):
            self.partitions |= words(value, "partition")
        elif flag in ("-q", "--qos"):
            self.qos |= words(value, "qos")
        elif flag in ("-r", "--array"):
            self.expand_arrays = True
        elif flag in ("-t", "--states"):
            try:
                self.states, self.states_given = parse_states(value), True
            except FormatError as exc:
                raise FormatError(f"{exc}\nsqueue: error: {VALID_STATES}") from None
        elif flag in ("-u", "--user"):
            for word in words(value, "user"):
                self.users.add(_user(word))
        elif flag in ("-w", "--nodelist"):
            self.nodes |= words(value, "node")
        elif flag == "--me":
            self.me = True
        elif flag == "--start":  # pending jobs and when they may start (`--begin`)
            self.start = True
            if not self.states_given:
                self.states = {"PD"}
        elif flag == "--json":
            self.json = True
        elif flag == "--yaml":
            raise FormatError("--yaml is not supported by Phalanx's squeue; use --json")
        elif flag in ("-s", "--steps"):
            raise FormatError("job steps are not listed by Phalanx's squeue (see docs/slurm.md)")
        elif flag in ("-i", "--iterate"):
            raise FormatError("--iterate is not supported; run squeue in a loop (watch squeue)")
        elif flag in ("-V", "--version"):
            print(slurmjson.VERSION_LINE)
            return True
        elif flag in ("--help", "--usage"):
            print(USAGE)
            return True
        # -a/--all, -S/--sort, -M, -v, --local, --federation, …: accepted; one cluster,
        # one listing order (Slurm's default "P,t,-p"), nothing hidden to show.
        return False

    def _jobs(self, value: str) -> None:
        refs = [r.strip() for r in value.split(",") if r.strip()]
        if len(refs) + len(self.ids) > MAX_IDS:
            raise FormatError(f"too many job ids (at most {MAX_IDS})")
        for ref in refs:
            head, sep, task = ref.partition("_")
            if (
                not head.isdigit()
                or not 0 < int(head) < 2**31
                or (sep and (not task.isdigit() or int(task) > 4_000_000))
            ):
                raise FormatError(f"Invalid job id: {ref[:64]}")
            self.ids.add(int(head))
            if sep:
                self.tasks.add((int(head), int(task)))
            else:
                self.whole.add(int(head))
        self.single_id = refs[0] if len(self.ids) == 1 and len(refs) == 1 else None


def _user(name: str) -> str:
    """A user name, or a numeric uid as the local account's name (as Slurm reads `-u`);
    an unknown uid is Slurm's error and matches no job (squeue goes on)."""
    if name.isdigit():
        try:
            return pwd.getpwuid(int(name)).pw_name
        except (KeyError, OverflowError):
            print(f"squeue: error: Invalid user: {name}", file=sys.stderr)
            return NO_USER
    return name


def _select(client: Any, o: _Options, now: float) -> list[Job]:
    states = o.states
    if o.ids and not o.states_given:
        states = None  # `-j`: its jobs in any state (ended ones while slurmctld keeps them)
    if (states is not None and not states) or o.users == {NO_USER}:
        return []
    wants_ended = states is None or any(s not in LIVE_CODES for s in states)
    jobs = fetch(
        client,
        active=True,
        ended=wants_ended,
        user=next(iter(o.users)) if len(o.users) == 1 and NO_USER not in o.users else None,
        team=next(iter(o.partitions)) if len(o.partitions) == 1 else None,
        states=states,
        since=now - MIN_JOB_AGE_S if wants_ended else None,
        ids=o.ids or None,
    )
    out = []
    for job in jobs:
        if states is not None and job.state not in states:
            continue
        if job.ended and (job.end_time is None or job.end_time < now - MIN_JOB_AGE_S):
            continue
        if o.ids and not _named(o, job):
            continue
        if o.passes(job):
            out.append(job)
    return out


def _named(o: _Options, job: Job) -> bool:
    """`-j N` names job N or every task of array N; `-j N_i` one task."""
    return (
        job.id in o.whole
        or (job.array_job_id is not None and job.array_job_id in o.whole)
        or (job.array_job_id, job.array_task_id) in o.tasks
    )


def _nodes_or_reason(job: Job) -> str:
    if job.state in ("PD", "TO", "OOM", "F"):
        return f"({job.slurm_reason()})"
    return job.hostlist


def _task_id(job: Job) -> str:
    if job.task_string:
        return job.task_string
    return "N/A" if job.array_task_id is None else str(job.array_task_id)


def _time_left(job: Job, now: float) -> str:
    if job.time_limit_s is None:
        return "UNLIMITED"
    return squeue_secs(max(0, job.time_limit_s - job.elapsed(now)))


def _start_time(job: Job) -> str:
    """The start, or for a pending job the earliest it may start (`--begin`)."""
    if job.pending:
        return date(job.begin_time, "N/A")
    return date(job.start_time, "N/A")


def _end_time(job: Job) -> str:
    """The end, or when a job must end (start + time limit; NONE without a limit)."""
    if job.end_time is not None and not job.pending:
        return date(job.end_time, "N/A")
    start = job.begin_time if job.pending else job.start_time
    if start is None:
        return "N/A"
    if job.time_limit_s is None:
        return "NONE"
    return date(start + job.time_limit_s, "N/A")


def _columns(now: float) -> dict[str, Column]:
    def col(header: str, value: Any, cut: bool = True) -> Column:
        return Column(header, value, cut)

    return {
        "a": col("ACCOUNT", lambda j: j.account or "(null)"),
        "A": col("JOBID", lambda j: str(j.id)),
        "b": col("TRES_PER_NODE", lambda j: f"gres:gpu:{j.gpus_per_node}"),
        "c": col("MIN_CPUS", lambda j: str(j.cpus_per_task or 1)),
        "C": col("CPUS", lambda j: str(j.cpus)),
        "D": col("NODES", lambda j: str(j.nodes)),
        "e": col("END_TIME", _end_time),
        "F": col("ARRAY_JOB_ID", lambda j: str(j.array_job_id or j.id)),
        "i": col("JOBID", lambda j: j.job_id),
        "j": col("NAME", lambda j: j.name),
        "K": col("ARRAY_TASK_ID", _task_id),
        "l": col("TIME_LIMIT", lambda j: squeue_secs(j.time_limit_s), cut=False),
        "L": col("TIME_LEFT", lambda j: _time_left(j, now), cut=False),
        "m": col("MIN_MEMORY", lambda j: f"{j.mem_mb}M" if j.mem_mb else "0"),
        "M": col("TIME", lambda j: squeue_secs(j.elapsed(now)), cut=False),
        "n": col("REQ_NODES", lambda j: ""),  # `-w` nodes: not in Phalanx's listing
        "numtasks": col("TASKS", lambda j: str(j.ntasks)),
        "N": Column("NODELIST", lambda j: j.hostlist, cut=False, header_cut=False),
        "p": col("PRIORITY", lambda j: f"{j.priority / 0xFFFFFFFF:16.14f}"),
        "P": col("PARTITION", lambda j: j.partition),
        "q": col("QOS", lambda j: j.qos),
        "Q": col("PRIORITY", lambda j: str(j.priority)),
        "r": col("REASON", lambda j: j.slurm_reason()),
        "R": Column("NODELIST(REASON)", _nodes_or_reason, cut=False, header_cut=False),
        "S": col("START_TIME", _start_time),
        "t": col("ST", lambda j: j.state),
        "T": col("STATE", lambda j: j.word),
        "u": col("USER", lambda j: j.user),
        "U": col("UID", lambda j: str(_uid(j.user))),
        "V": col("SUBMIT_TIME", lambda j: date(j.submit_time, "N/A")),
        "Y": col("SCHEDNODES", lambda j: "(null)"),  # nodes the scheduler plans: not kept
        "Z": col("WORK_DIR", lambda j: j.workdir),
    }


COLUMNS = frozenset(_columns(0.0))


def _uid(user: str) -> int | str:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return "N/A"


USAGE = """Usage: squeue [OPTIONS]
  -A, --accounts=LIST    accounts to view
  -a, --all              (accepted; Phalanx has no hidden partitions)
  -h, --noheader         no headers on output
  -j, --jobs=LIST        job ids (N, N_i) to view
  -l, --long             long report
  -n, --name=LIST        job names to view
      --me               only your jobs
  -o, --format=FORMAT    %-field format (see man squeue)
  -O, --Format=FORMAT    field:size format (see man squeue)
  -p, --partition=LIST   partitions (Phalanx teams) to view
  -q, --qos=LIST         QOS to view
  -r, --array            one line per array task
  -t, --states=LIST      states to view (default: PD,R,CG; 'all')
  -u, --user=LIST        users to view
  -w, --nodelist=LIST    only jobs on these nodes
      --json             openapi v0.0.38 JSON (see docs/slurm.md)
  -V, --version          version"""
