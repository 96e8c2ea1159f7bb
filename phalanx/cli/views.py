"""`phalanx queue` and `history` (like squeue and sacct: chosen fields, sorting, a watch
mode), `priority` (like sprio) and `share` (like sshare)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from phalanx.api.states import JOB_STATES
from phalanx.cli.connect import HeadOpt, JsonOpt, TokenOpt, connect
from phalanx.cli.output import (
    STATE_STYLE,
    cell,
    clip,
    duration,
    fail,
    parse_since,
    print_json,
    print_table,
    timestamp,
)

Job = dict[str, Any]  # one job as JobInfo's JSON (a JobTable row zipped with its columns)


@dataclass(frozen=True, slots=True)
class Field:
    """A column `--format` may name: its title, alignment, default width (0: never cut),
    how a job shows in it, and what `--sort` compares."""

    title: str
    right: bool
    width: int
    show: Callable[[Job], str]
    key: Callable[[Job], Any]


def label(job: Job) -> str:
    """`123`, or `120_3` for task 3 of array job 120 (as squeue prints it)."""
    if job["array_job_id"] is not None and job["array_task_id"] is not None:
        return f"{job['array_job_id']}_{job['array_task_id']}"
    return str(job["id"])


def nodelist(job: Job) -> str:
    """The job's nodes as one compressed host list (`127.0.0.[2-3]`), as squeue and the
    job's own SLURM_JOB_NODELIST write them."""
    if not job["placement"]:
        return ""
    from phalanx.jobspec.hostlist import compress

    return compress(list(dict.fromkeys(p["node"] for p in job["placement"])))


def _num(value: Any) -> tuple[int, Any]:
    """A sort key that puts missing values first and compares the rest as they are."""
    return (0, 0) if value is None else (1, value)


def _text(name: str, title: str, width: int = 0) -> Field:
    return Field(title, False, width, lambda j: str(j[name] or ""), lambda j: j[name] or "")


def _time(name: str, title: str) -> Field:
    return Field(title, False, 0, lambda j: timestamp(j[name]) or "N/A", lambda j: _num(j[name]))


FIELDS: dict[str, Field] = {
    "jobid": Field(
        "JOBID",
        False,
        0,
        label,
        lambda j: (j["array_job_id"] or j["id"], _num(j["array_task_id"]), j["id"]),
    ),
    "name": _text("name", "NAME", 24),
    "user": _text("user", "USER", 12),
    "team": _text("team", "TEAM", 12),
    "account": _text("account", "ACCOUNT", 12),
    "qos": _text("qos", "QOS"),
    "priority": Field("PRIORITY", True, 0, lambda j: str(j["priority"]), lambda j: j["priority"]),
    "st": Field("ST", False, 0, lambda j: j["state"], lambda j: j["state"]),
    "state": Field("STATE", False, 0, lambda j: j["state"], lambda j: j["state"]),
    # Over every run of a requeued job, not only its latest (JobInfo.run_time_s).
    "time": Field(
        "TIME", True, 0, lambda j: duration(j["run_time_s"] or 0), lambda j: j["run_time_s"] or 0
    ),
    "elapsed": Field(
        "ELAPSED", True, 0, lambda j: duration(j["run_time_s"] or 0), lambda j: j["run_time_s"] or 0
    ),
    "timelimit": Field(
        "TIME_LIMIT",
        True,
        0,
        lambda j: duration(j["time_limit_s"]) if j["time_limit_s"] else "UNLIMITED",
        lambda j: j["time_limit_s"] or float("inf"),
    ),
    "nodes": Field("NODES", True, 0, lambda j: str(j["nodes"]), lambda j: j["nodes"]),
    "gpus": Field(
        "GPUS",
        True,
        0,
        lambda j: str(j["nodes"] * j["gpus_per_node"]),
        lambda j: j["nodes"] * j["gpus_per_node"],
    ),
    "nodelist": Field("NODELIST", False, 0, nodelist, nodelist),
    "reason": _text("reason", "REASON", 24),
    "nodelist(reason)": Field(
        "NODELIST(REASON)",
        False,
        0,
        lambda j: nodelist(j) or f"({j['reason'] or 'None'})",
        lambda j: nodelist(j) or f"({j['reason'] or 'None'})",
    ),
    "exitcode": _text("exit_code", "EXITCODE"),
    "restarts": Field(
        "RESTARTS", True, 0, lambda j: str(j["restart_count"]), lambda j: j["restart_count"]
    ),
    "submit": _time("submit_time", "SUBMIT"),
    # A requeued job's first start: when it began to run at all.
    "start": _time("first_start_time", "START"),
    "end": _time("end_time", "END"),
}
QUEUE_FORMAT = "jobid,name,user,team,st,time,nodes,gpus,nodelist(reason)"
QUEUE_LONG = (
    "jobid,name:0,user:0,team:0,qos,priority,st,time,timelimit,nodes,gpus,restarts,start,"
    "nodelist(reason)"
)
HISTORY_FORMAT = "jobid,name,user,team,state,exitcode,elapsed,start,end"
HISTORY_LONG = (
    "jobid,name:0,user:0,team:0,account:0,qos,state,exitcode,restarts,elapsed,submit,start,end,"
    "nodelist"
)
FIELD_HELP = "Fields: " + ", ".join(FIELDS) + "."


def parse_format(spec: str) -> list[tuple[str, int]]:
    """`--format FIELD[:WIDTH],…` (as squeue's --Format): the fields and their widths
    (`:0` never cuts; no width: the field's default)."""
    out = []
    for item in spec.split(","):
        name, _, width = item.strip().lower().partition(":")
        if name not in FIELDS:
            fail(f"--format: unknown field {name!r}; known: {', '.join(FIELDS)}")
        if width and not width.isdigit():
            fail(f"--format: {item.strip()!r}: the width after ':' must be a number")
        out.append((name, int(width) if width else FIELDS[name].width))
    return out


def parse_sort(spec: str) -> list[tuple[str, bool]]:
    """`--sort FIELD,-FIELD` (as squeue -S): the fields, each ascending unless `-`."""
    out = []
    for item in spec.split(","):
        name = item.strip().lower()
        descending = name.startswith("-")
        name = name.lstrip("+-")
        if name not in FIELDS:
            fail(f"--sort: unknown field {name!r}; known: {', '.join(FIELDS)}")
        out.append((name, descending))
    return out


def sort_jobs(jobs: list[Job], order: list[tuple[str, bool]]) -> list[Job]:
    """Stable sorts from the last key to the first: the first key decides most."""
    for name, descending in reversed(order):
        jobs = sorted(jobs, key=FIELDS[name].key, reverse=descending)
    return jobs


def print_jobs(jobs: list[Job], fields: list[tuple[str, int]]) -> None:
    columns = [(FIELDS[name].title, FIELDS[name].right) for name, _ in fields]
    # Escaped before cut, so a cut never splits an escape and widths count what is shown.
    rows = [[clip(cell(FIELDS[name].show(job)), width) for name, width in fields] for job in jobs]
    styled = {i: STATE_STYLE for i, (name, _) in enumerate(fields) if name in ("st", "state")}
    print_table(columns, rows, styled)


def _states(value: str | None) -> list[str]:
    if not value:
        return []
    states = [s.strip().upper() for s in value.split(",") if s.strip()]
    unknown = [s for s in states if s not in JOB_STATES]
    if unknown:
        fail(f"unknown state {', '.join(unknown)}; known: {', '.join(JOB_STATES)}")
    return states


FormatOpt = Annotated[
    str | None,
    typer.Option(
        "--format",
        "-o",
        help="Columns as FIELD[:WIDTH],… (`:0` never cuts a long value). " + FIELD_HELP,
        show_default=False,
    ),
]
SortOpt = Annotated[
    str | None,
    typer.Option(
        "--sort",
        "-S",
        help="Sort by FIELD,… (`-FIELD`: descending), e.g. `-time,jobid`.",
        show_default=False,
    ),
]
LongOpt = Annotated[
    bool,
    typer.Option("--long", "-l", help="More columns, and names never cut."),
]


def queue(
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user's jobs.")] = None,
    team: Annotated[str | None, typer.Option("--team", help="Only this team's jobs.")] = None,
    state: Annotated[
        str | None, typer.Option("--state", "-t", help="Only these states, e.g. PD,R.")
    ] = None,
    me: Annotated[bool, typer.Option("--me", help="Only my jobs.")] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many jobs.")] = 1000,
    fmt: FormatOpt = None,
    sort: SortOpt = None,
    long: LongOpt = False,
    watch: Annotated[
        float | None,
        typer.Option(
            "--watch",
            "-i",
            min=0.5,
            help="Print the queue again every this many seconds, until Ctrl-C (or --count).",
            show_default=False,
        ),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option(min=1, help="With --watch: stop after this many tables.", show_default=False),
    ] = None,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """List pending and running jobs (like squeue). TIME is the time a job ran over all
    its runs; NODELIST is compressed (`n[1-4]`); names longer than their column are cut
    with `…` (see --long and --format)."""
    states = _states(state)
    if me and user:
        fail("give --me or --user, not both")
    if count is not None and watch is None:
        fail("--count goes with --watch")
    if watch is not None and json_out:
        fail("--watch prints tables; leave out --json")
    fields = parse_format(fmt or (QUEUE_LONG if long else QUEUE_FORMAT))
    order = parse_sort(sort) if sort else []
    with connect(head, token) as client:
        if me:
            user = client.whoami().user
        if json_out:
            print_json(client.jobs(active=True, user=user, team=team, states=states, limit=limit))
            return
        shown = 0
        try:
            while True:
                # Rows of values, not 10,000 models: what keeps a big queue fast.
                table = client.job_table(
                    active=True, user=user, team=team, states=states, limit=limit
                )
                jobs = [dict(zip(table.columns, row, strict=True)) for row in table.rows]
                if watch is not None:
                    _watch_header(watch, shown)
                print_jobs(sort_jobs(jobs, order), fields)
                shown += 1
                if watch is None or (count is not None and shown >= count):
                    return
                time.sleep(watch)
        except KeyboardInterrupt:
            sys.stdout.write("\n")  # Ctrl-C ends a watch: the way out, not an error
            raise typer.Exit(0) from None


def _watch_header(every: float, shown: int) -> None:
    """squeue -i's header: on a terminal the screen is cleared first; piped, a blank line
    parts one table from the next."""
    if sys.stdout.isatty():
        sys.stdout.write("\x1b[H\x1b[2J")
    elif shown:
        sys.stdout.write("\n")
    sys.stdout.write(f"{time.strftime('%a %b %d %H:%M:%S %Y')}  (every {every:g}s)\n")
    sys.stdout.flush()


def history(
    since: Annotated[
        str | None,
        typer.Option(help="Jobs that ended after this: an age (12h, 7d), a date or unix time."),
    ] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user's jobs.")] = None,
    team: Annotated[str | None, typer.Option("--team", help="Only this team's jobs.")] = None,
    state: Annotated[
        str | None, typer.Option("--state", "-s", help="Only these end states, e.g. F,TO.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many jobs.")] = 1000,
    fmt: FormatOpt = None,
    sort: SortOpt = None,
    long: LongOpt = False,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """List jobs that ended (like sacct). For a requeued job START is its first start and
    ELAPSED the time it ran over all its runs."""
    states = _states(state)
    since_unix = parse_since(since) if since else None
    fields = parse_format(fmt or (HISTORY_LONG if long else HISTORY_FORMAT))
    order = parse_sort(sort) if sort else []
    with connect(head, token) as client:
        if json_out:
            print_json(
                client.jobs(
                    ended=True, since=since_unix, user=user, team=team, states=states, limit=limit
                )
            )
            return
        table = client.job_table(
            ended=True, since=since_unix, user=user, team=team, states=states, limit=limit
        )
    jobs = [dict(zip(table.columns, row, strict=True)) for row in table.rows]
    print_jobs(sort_jobs(jobs, order), fields)


def priority(
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Queued jobs in the order the scheduler considers them, with what orders them (like
    sprio): QOS priority (higher first), then the team's fair share (its decayed GPU-hours
    per unit of share: lower first), then age (older first). RANK counts every queued job,
    also those you may not see."""
    with connect(head, token) as client:
        listed = client.priority()
    if json_out:
        print_json(listed)
        return
    typer.echo(f"policy {listed.policy}: {listed.order}", err=True)
    columns = [("RANK", True), ("JOBID", False), ("USER", False), ("TEAM", False)]
    columns += [("QOS", False), ("PRIORITY", True), ("FAIRSHARE", True), ("AGE", True)]
    rows = [
        [
            str(j.rank),
            str(j.job_id),
            clip(j.user, 12),
            clip(j.team, 12),
            j.qos,
            str(j.qos_priority),
            f"{j.fairshare / 3600:.2f}",
            duration(j.age_s),
        ]
        for j in listed.jobs
    ]
    print_table(columns, rows)


def share(
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Each team's quota, GPUs in use (and borrowed from its cohort), usage decayed with
    the half-life, fair share (usage per unit of share: lower runs first) and what it has
    queued (like sshare)."""
    with connect(head, token) as client:
        listed = client.shares()
    if json_out:
        print_json(listed)
        return
    how = "orders teams by it" if listed.uses_fairshare else "does not use it"
    typer.echo(
        f"fair share: usage halves every {duration(listed.halflife_s)}; policy "
        f"{listed.policy} {how}",
        err=True,
    )
    columns = [("TEAM", False), ("QUOTA", True), ("COHORT", False), ("SHARE", True)]
    columns += [("IN-USE", True), ("BORROWED", True), ("USAGE(GPU-H)", True)]
    columns += [("FAIRSHARE", True), ("PENDING", True), ("PENDING-GPUS", True)]
    rows = [
        [
            clip(t.team, 16),
            "-" if t.quota_gpus is None else str(t.quota_gpus),
            t.cohort or "-",
            f"{t.share:g}",
            str(t.gpus_in_use),
            str(t.borrowed_gpus),
            f"{t.usage_gpu_h:.2f}",
            f"{t.fairshare / 3600:.2f}",
            str(t.pending_jobs),
            str(t.pending_gpus),
        ]
        for t in listed.teams
    ]
    print_table(columns, rows)
