"""`sacct`: job accounting as Slurm 22.05 prints it (fixed-width columns with `Name%N`
widths, `-p/--parsable`, `-P/--parsable2`, `--json`), pending, running and ended jobs
alike, one row per job allocation (Phalanx keeps no per-step accounting: no `N.batch`)."""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from phalanx.slurmcli import slurmjson
from phalanx.slurmcli.common import connect, die, options, run
from phalanx.slurmcli.fields import (
    FormatError,
    Job,
    Selection,
    collapse_arrays,
    date,
    emit,
    parse_states,
    sacct_secs,
    words,
)
from phalanx.slurmcli.jobsource import fetch
from phalanx.slurmcli.slurmtime import parse_time

DEFAULT_FIELDS = "jobid,jobname,partition,account,alloccpus,state,exitcode"
BRIEF_FIELDS = "jobid,state,exitcode"
LONG_FIELDS = (
    "jobid,jobidraw,jobname,partition,ntasks,alloccpus,elapsed,state,exitcode,reqmem,"
    "reqtres,alloctres"
)
MAX_IDS = 4000
CLUSTER = "phalanx"
SHORT = "aA:bDE:ehj:lLM:nN:o:pPq:r:s:S:Tu:VvXx:"
LONG = [
    "allusers", "accounts=", "brief", "duplicates", "endtime=", "helpformat", "help",
    "jobs=", "long", "allclusters", "clusters=", "noheader", "nodelist=", "format=",
    "parsable", "parsable2", "qos=", "partition=", "state=", "starttime=", "truncate",
    "user=", "uid=", "version", "verbose", "allocations", "name=", "json", "yaml",
    "delimiter=", "units=", "noconvert", "array", "usage", "local", "federation",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    width: int  # negative: left-aligned (JobID), as sacct's table
    value: Callable[[Job, float], str] | None  # None: a Slurm field Phalanx has no data for


def main(argv: list[str]) -> int:
    return run("sacct", _sacct, argv)


def _sacct(argv: list[str]) -> int:
    opts = options("sacct", argv, SHORT, LONG)
    o = _Options()
    now = time.time()
    try:
        for flag, value in opts:
            if o.apply(flag, value, now):
                return 0
        columns = _columns(o.field_list())
    except FormatError as exc:
        die(str(exc))
    with connect() as client:
        if not o.all_users and not o.users:
            me = client.whoami()
            if me.role != "admin":
                o.users.add(me.user)
        jobs = _select(client, o, now)
    jobs = collapse_arrays(jobs)
    if o.json:
        emit([json.dumps(slurmjson.sacct(jobs, now), indent=2)])
        return 0
    lines = [] if o.noheader else _header(columns, o)
    lines.extend(_row(columns, o, job, now) for job in jobs)
    emit(lines)
    return 0


class _Options(Selection):
    def __init__(self) -> None:
        super().__init__()
        self.fields: list[str] = []
        self.brief = self.long = self.noheader = self.json = self.all_users = False
        self.parsable = 0  # 1: `-p` (trailing delimiter), 2: `-P`
        self.delimiter = "|"
        self.states: set[str] | None = None
        self.whole: set[int] = set()
        self.tasks: set[tuple[int, int]] = set()
        self.start: float | None = None
        self.end: float | None = None

    def apply(self, flag: str, value: str, now: float) -> bool:
        if flag in ("-a", "--allusers"):
            self.all_users = True
        elif flag in ("-A", "--accounts"):
            self.accounts |= words(value, "account")
        elif flag in ("-b", "--brief"):
            self.brief = True
        elif flag in ("-E", "--endtime"):
            self.end = parse_time(value, now)
        elif flag in ("-e", "--helpformat"):
            print(_helpformat())
            return True
        elif flag in ("-h", "--help", "--usage"):
            print(USAGE)
            return True
        elif flag in ("-j", "--jobs"):
            self._jobs(value)
        elif flag in ("-l", "--long"):
            self.long = True
        elif flag in ("-n", "--noheader"):
            self.noheader = True
        elif flag in ("-N", "--nodelist"):
            self.nodes |= words(value, "node")
        elif flag in ("-o", "--format"):
            self.fields.append(value)
        elif flag in ("-p", "--parsable"):
            self.parsable = 1
        elif flag in ("-P", "--parsable2"):
            self.parsable = 2
        elif flag == "--delimiter":
            self.delimiter = value[:16]
        elif flag in ("-q", "--qos"):
            self.qos |= words(value, "qos")
        elif flag in ("-r", "--partition"):
            self.partitions |= words(value, "partition")
        elif flag in ("-s", "--state"):
            self.states = parse_states(value, allow_all=False)
        elif flag in ("-S", "--starttime"):
            self.start = parse_time(value, now)
        elif flag in ("-u", "--user", "--uid"):
            self.users |= {_user(u) for u in words(value, "user")}
        elif flag in ("-V", "--version"):
            print(slurmjson.VERSION_LINE)
            return True
        elif flag == "--name":
            self.names |= words(value, "job name")
        elif flag == "--json":
            self.json = True
        elif flag == "--yaml":
            raise FormatError("--yaml is not supported by Phalanx's sacct; use --json")
        elif flag == "-x":
            raise FormatError("-x (--associations) is not supported by Phalanx's sacct")
        # -X/--allocations (always: no steps), -D, -L, -M, -T, -v, --units, --array,
        # --noconvert, --local, --federation: accepted, nothing to change.
        return False

    def _jobs(self, value: str) -> None:
        refs = [r.strip() for r in value.split(",") if r.strip()]
        if len(refs) + len(self.whole) + len(self.tasks) > MAX_IDS:
            raise FormatError(f"too many job ids (at most {MAX_IDS})")
        for ref in refs:
            job, dot, step = ref.partition(".")  # `N.batch`, `N.0`: its job (no steps)
            head, sep, task = job.partition("_")
            if (
                not head.isdigit()
                or not 0 < int(head) < 2**31
                or (sep and (not task.isdigit() or int(task) > 4_000_000))
                or (dot and not step)
            ):
                raise FormatError(f"Invalid job id: {ref[:64]}")
            if sep:
                self.tasks.add((int(head), int(task)))
            else:
                self.whole.add(int(head))

    def field_list(self) -> str:
        parts = []
        if self.brief:
            parts.append(BRIEF_FIELDS)
        if self.long:
            parts.append(LONG_FIELDS)
        parts.extend(self.fields)
        if not parts:
            parts.append(os.environ.get("SACCT_FORMAT") or DEFAULT_FIELDS)
        return ",".join(parts)


def _user(name: str) -> str:
    if name.isdigit():
        try:
            return pwd.getpwuid(int(name)).pw_name
        except (KeyError, OverflowError):
            raise FormatError(f"Invalid user id: {name}") from None
    return name


def _select(client: Any, o: _Options, now: float) -> list[Job]:
    ids = o.whole | {a for a, _ in o.tasks}
    start = o.start
    if start is None and not ids:
        midnight = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
        start = now if o.states is not None else midnight.timestamp()
    end = o.end if o.end is not None else now
    if o.states is not None and not o.states:
        return []
    jobs = fetch(
        client,
        active=True,
        ended=True,
        user=next(iter(o.users)) if len(o.users) == 1 else None,
        team=next(iter(o.partitions)) if len(o.partitions) == 1 else None,
        states=o.states,
        since=start,
        ids=ids or None,
    )
    out = []
    for job in jobs:
        if ids and not (
            job.id in o.whole
            or (job.array_job_id is not None and job.array_job_id in o.whole)
            or (job.array_job_id, job.array_task_id) in o.tasks
        ):
            continue
        if job.submit_time > end:
            continue
        if start is not None and job.end_time is not None and job.end_time < start:
            continue
        if o.states is not None and job.state not in o.states:
            continue
        if o.passes(job):
            out.append(job)
    return out


# ----------------------------------------------------------------------------- fields
def _state(job: Job, _now: float) -> str:
    if job.state == "CA" and job.cancelled_by:
        who = job.cancelled_by
        # A user's name; else the head itself (its idle-GPU policy, an admin token with
        # no user): uid 0, as sacct names slurmctld's own cancels.
        return f"CANCELLED by {'0' if ' ' in who else _uid(who)}"
    return job.word


def _exit(job: Job, _now: float) -> str:
    code, sig = job.exit_pair
    return f"{code}:{sig}"


def _alloc_tres(job: Job, _now: float) -> str:
    return slurmjson.tres(job) if job.nodelist else ""


def _uid(user: str) -> str:
    try:
        return str(pwd.getpwnam(user).pw_uid)
    except KeyError:
        return user  # not a local account: its name (Slurm would print a uid)


def _gid(user: str) -> tuple[str, str]:
    try:
        gid = pwd.getpwnam(user).pw_gid
    except KeyError:
        return "", ""
    try:
        return str(gid), grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid), str(gid)


def _mem(job: Job, _now: float) -> str:
    if not job.mem_mb:
        return "0"
    for unit, size in (("T", 1024 * 1024), ("G", 1024)):
        if job.mem_mb % size == 0:
            return f"{job.mem_mb // size}{unit}"
    return f"{job.mem_mb}M"


def _limit_raw(job: Job, _now: float) -> str:
    return "UNLIMITED" if job.time_limit_s is None else str(-(-job.time_limit_s // 60))


def _started(job: Job) -> bool:
    return bool(job.nodelist) and job.start_time is not None


_VALUES: dict[str, Callable[[Job, float], str]] = {
    "Account": lambda j, n: j.account or "",
    "AllocCPUS": lambda j, n: str(j.cpus if _started(j) else 0),
    "AllocNodes": lambda j, n: str(len(j.nodelist) if _started(j) else 0),
    "AllocTRES": _alloc_tres,
    "Cluster": lambda j, n: CLUSTER,
    "CPUTime": lambda j, n: sacct_secs(j.elapsed(n) * (j.cpus if _started(j) else 0)),
    "CPUTimeRAW": lambda j, n: str(j.elapsed(n) * (j.cpus if _started(j) else 0)),
    "DerivedExitCode": _exit,
    "Elapsed": lambda j, n: sacct_secs(j.elapsed(n)),
    "ElapsedRaw": lambda j, n: str(j.elapsed(n)),
    "Eligible": lambda j, n: date(j.submit_time),
    "End": lambda j, n: date(j.end_time),
    "ExitCode": _exit,
    "GID": lambda j, n: _gid(j.user)[0],
    "Group": lambda j, n: _gid(j.user)[1],
    "JobID": lambda j, n: j.job_id,
    "JobIDRaw": lambda j, n: str(j.id),
    "JobName": lambda j, n: j.name,
    "NCPUS": lambda j, n: str(j.cpus if _started(j) else 0),
    "NNodes": lambda j, n: str(j.nodes),
    "NodeList": lambda j, n: j.hostlist or "None assigned",
    "Partition": lambda j, n: j.partition,
    "Priority": lambda j, n: str(j.priority),
    "QOS": lambda j, n: j.qos,
    "Reason": lambda j, n: j.slurm_reason(),
    "ReqCPUS": lambda j, n: str(j.cpus),
    "ReqMem": _mem,
    "ReqNodes": lambda j, n: str(j.nodes),
    "ReqTRES": lambda j, n: slurmjson.tres(j),
    "Restarts": lambda j, n: str(j.restart_count),  # Phalanx's: Slurm's sacct has none
    "Start": lambda j, n: date(j.start_time),
    "State": _state,
    "Submit": lambda j, n: date(j.submit_time),
    "Suspended": lambda j, n: "00:00:00",
    "Timelimit": lambda j, n: sacct_secs(j.time_limit_s),
    "TimelimitRaw": _limit_raw,
    "UID": lambda j, n: _uid(j.user),
    "User": lambda j, n: j.user,
    "WorkDir": lambda j, n: j.workdir,
}
# Slurm 22.05's sacct fields in its order (names match by prefix, first wins) and widths.
_SLURM_FIELDS = (
    "10 Account,15 AdminComment,10 AllocCPUS,10 AllocNodes,10 AllocTRES,7 AssocID,10 AveCPU,"
    "10 AveCPUFreq,14 AveDiskRead,14 AveDiskWrite,10 AvePages,10 AveRSS,10 AveVMSize,"
    "16 BlockID,10 Cluster,14 Comment,19 Constraints,14 ConsumedEnergy,17 ConsumedEnergyRaw,"
    "19 Container,10 CPUTime,10 CPUTimeRAW,-10 DBIndex,15 DerivedExitCode,10 Elapsed,"
    "10 ElapsedRaw,19 Eligible,19 End,8 ExitCode,19 Flags,6 GID,9 Group,-12 JobID,"
    "-12 JobIDRaw,10 JobName,9 Layout,12 MaxDiskRead,15 MaxDiskReadNode,15 MaxDiskReadTask,"
    "12 MaxDiskWrite,16 MaxDiskWriteNode,16 MaxDiskWriteTask,8 MaxPages,12 MaxPagesNode,"
    "14 MaxPagesTask,10 MaxRSS,10 MaxRSSNode,10 MaxRSSTask,10 MaxVMSize,14 MaxVMSizeNode,"
    "14 MaxVMSizeTask,12 McsLabel,10 MinCPU,10 MinCPUNode,10 MinCPUTask,10 NCPUS,8 NNodes,"
    "15 NodeList,8 NTasks,10 Partition,10 Priority,10 QOS,6 QOSRAW,22 Reason,10 ReqCPUFreq,"
    "13 ReqCPUFreqGov,13 ReqCPUFreqMax,13 ReqCPUFreqMin,8 ReqCPUS,10 ReqMem,8 ReqNodes,"
    "10 ReqTRES,20 Reservation,8 ReservationId,10 Reserved,10 ResvCPU,10 ResvCPURAW,"
    "8 Restarts,19 Start,10 State,19 Submit,20 SubmitLine,10 Suspended,15 SystemComment,"
    "10 SystemCPU,10 Timelimit,10 TimelimitRaw,10 TotalCPU,14 TRESUsageInAve,"
    "14 TRESUsageInMax,18 TRESUsageInMaxNode,18 TRESUsageInMaxTask,14 TRESUsageInMin,"
    "18 TRESUsageInMinNode,18 TRESUsageInMinTask,14 TRESUsageInTot,15 TRESUsageOutAve,"
    "15 TRESUsageOutMax,19 TRESUsageOutMaxNode,19 TRESUsageOutMaxTask,15 TRESUsageOutMin,"
    "19 TRESUsageOutMinNode,19 TRESUsageOutMinTask,15 TRESUsageOutTot,6 UID,9 User,"
    "10 UserCPU,10 WCKey,10 WCKeyID,20 WorkDir"
)
FIELDS: tuple[Field, ...] = tuple(
    Field(name, int(width), _VALUES.get(name))
    for width, name in (item.split(" ") for item in _SLURM_FIELDS.split(","))
)
MAX_WIDTH = 1024


def _columns(text: str) -> list[Field]:
    """`-o` items (`Name`, `name%30`, a prefix of a name; `ALL`) as fields, as sacct
    matches them; FormatError for a name that is no field."""
    out: list[Field] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, pct, size = item.partition("%")
        width: int | None = None
        if pct:  # atoi, as sacct: `%30`, `%-30`; junk reads as 0
            m = re.match(r"-?[0-9]{1,6}", size)
            width = max(-MAX_WIDTH, min(MAX_WIDTH, int(m.group()))) if m else 0
        if name.upper() == "ALL":
            out.extend(_sized(f, width) for f in FIELDS)
            continue
        found = next((f for f in FIELDS if name and f.name.lower().startswith(name.lower())), None)
        if found is None:
            raise FormatError(f'Invalid field requested: "{name[:64]}"')
        out.append(_sized(found, width))
    return out


def _sized(field: Field, width: int | None) -> Field:
    return field if width is None else Field(field.name, width, field.value)


def _header(columns: list[Field], o: _Options) -> list[str]:
    if o.parsable:
        names = [c.name for c in columns]
        return [o.delimiter.join(names) + (o.delimiter if o.parsable == 1 else "")]
    top = "".join(_fixed(c.name, c.width) for c in columns)
    rule = "".join("-" * abs(c.width) + " " for c in columns)
    return [top, rule]


def _row(columns: list[Field], o: _Options, job: Job, now: float) -> str:
    values = [c.value(job, now) if c.value is not None else "" for c in columns]
    if o.parsable:
        return o.delimiter.join(values) + (o.delimiter if o.parsable == 1 else "")
    cells = zip(columns, values, strict=True)
    return "".join(_fixed(_cut(v, abs(c.width)) if v else " ", c.width) for c, v in cells)


def _cut(value: str, width: int) -> str:
    """sacct's cut of a long value: its first width-1 characters and `+`."""
    if width and len(value) > width:
        return value[: width - 1] + "+"
    return value


def _fixed(text: str, width: int) -> str:
    size = abs(width)
    text = text[:size]  # `%0`: nothing, as sacct
    return (text.rjust(size) if width >= 0 else text.ljust(size)) + " "


def _helpformat() -> str:
    names = [f.name for f in FIELDS]
    rows = [names[i : i + 4] for i in range(0, len(names), 4)]
    return "\n".join("".join(f"{n:<20}" for n in row).rstrip() for row in rows)


USAGE = """Usage: sacct [OPTIONS]
  -a, --allusers          every user's jobs you may see (admins: the default)
  -b, --brief             jobid,state,exitcode
  -E, --endtime=TIME      jobs before TIME (default: now)
  -e, --helpformat        the fields -o takes
  -j, --jobs=LIST         job ids (N, N_i)
  -l, --long              more fields
  -n, --noheader          no header
      --name=LIST         job names
  -N, --nodelist=LIST     jobs that ran on these nodes
  -o, --format=LIST       fields (Name or Name%WIDTH; see --helpformat)
  -p, --parsable          `|` after every field
  -P, --parsable2         `|` between fields
  -r, --partition=LIST    partitions (Phalanx teams)
  -s, --state=LIST        states (CD, F, CA, TO, NF, OOM, PR, PD, R, CG)
  -S, --starttime=TIME    jobs after TIME (default: today 00:00, or all with -j)
  -u, --user=LIST         users
  -X, --allocations       (always: Phalanx records no job steps)
      --json              dbv0.0.38 JSON (see docs/slurm.md)
  -V, --version           version"""
