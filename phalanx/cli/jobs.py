"""`phalanx queue`, `show`, `cancel`, `history` and `logs`: looking at and stopping jobs."""

from __future__ import annotations

import re
import shlex
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from phalanx.api.states import JOB_STATES
from phalanx.cli.connect import HeadOpt, JsonOpt, TokenOpt, connect
from phalanx.cli.output import (
    STATE_STYLE,
    console,
    duration,
    elapsed,
    fail,
    parse_since,
    print_json,
    print_table,
    timestamp,
)

if TYPE_CHECKING:
    from phalanx.api.models import JobInfo, JobList

STATES = JOB_STATES


def job_id_label(job: JobInfo) -> str:
    """`123`, or `120_3` for task 3 of array job 120 (as squeue prints it)."""
    return _label(job.id, job.array_job_id, job.array_task_id)


def _label(job_id: int, array_job_id: int | None, array_task_id: int | None) -> str:
    if array_job_id is not None and array_task_id is not None:
        return f"{array_job_id}_{array_task_id}"
    return str(job_id)


def nodelist(job: JobInfo) -> str:
    """The job's nodes in placement order, each once."""
    return ",".join(dict.fromkeys(p.node for p in job.placement))


def _states(value: str | None) -> list[str]:
    if not value:
        return []
    states = [s.strip().upper() for s in value.split(",") if s.strip()]
    unknown = [s for s in states if s not in STATES]
    if unknown:
        fail(f"unknown state {', '.join(unknown)}; known: {', '.join(STATES)}")
    return states


def _styled(state: str) -> str:
    style = STATE_STYLE.get(state, "red")
    return f"[{style}]{state}[/{style}]"


def queue(
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user's jobs.")] = None,
    team: Annotated[str | None, typer.Option("--team", help="Only this team's jobs.")] = None,
    state: Annotated[
        str | None, typer.Option("--state", "-t", help="Only these states, e.g. PD,R.")
    ] = None,
    me: Annotated[bool, typer.Option("--me", help="Only my jobs.")] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many jobs.")] = 1000,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """List pending and running jobs (like squeue)."""

    states = _states(state)
    if me and user:
        fail("give --me or --user, not both")
    with connect(head, token) as client:
        if me:
            user = client.whoami().user
        if json_out:
            print_json(client.jobs(active=True, user=user, team=team, states=states, limit=limit))
            return
        # Rows of values, not 10,000 models: what keeps a big queue fast.
        table = client.job_table(active=True, user=user, team=team, states=states, limit=limit)
    now = time.time()
    columns = [("JOBID", False), ("NAME", False), ("USER", False), ("TEAM", False)]
    columns += [("ST", False), ("TIME", True), ("NODES", True), ("GPUS", True)]
    columns += [("NODELIST(REASON)", False)]
    rows = []
    for values in table.rows:
        job: dict[str, Any] = dict(zip(table.columns, values, strict=True))
        nodes = ",".join(dict.fromkeys(p["node"] for p in job["placement"]))
        rows.append(
            [
                _label(job["id"], job["array_job_id"], job["array_task_id"]),
                job["name"],
                job["user"],
                job["team"],
                job["state"],
                duration(elapsed(job["start_time"], job["end_time"], now) or 0),
                str(job["nodes"]),
                str(job["nodes"] * job["gpus_per_node"]),
                nodes or f"({job['reason'] or 'None'})",
            ]
        )
    print_table(columns, rows, {4: STATE_STYLE})


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
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """List jobs that ended (like sacct)."""

    states = _states(state)
    since_unix = parse_since(since) if since else None
    with connect(head, token) as client:
        jobs: JobList = client.jobs(
            ended=True, since=since_unix, user=user, team=team, states=states, limit=limit
        )
    if json_out:
        print_json(jobs)
        return
    columns = [("JOBID", False), ("NAME", False), ("USER", False), ("TEAM", False)]
    columns += [("STATE", False), ("EXITCODE", False), ("ELAPSED", True)]
    columns += [("START", False), ("END", False)]
    rows = [
        [
            job_id_label(job),
            job.name,
            job.user,
            job.team,
            job.state,
            job.exit_code or "",
            duration(elapsed(job.start_time, job.end_time)),
            timestamp(job.start_time) or "Unknown",
            timestamp(job.end_time) or "Unknown",
        ]
        for job in jobs.jobs
    ]
    print_table(columns, rows, {4: STATE_STYLE})


def cancel(
    job_ids: Annotated[list[int], typer.Argument(help="Job ids to cancel.", show_default=False)],
    signal: Annotated[
        str | None,
        typer.Option("--signal", "-s", help="Only send this signal (e.g. SIGUSR1), as scancel -s."),
    ] = None,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Cancel jobs (like scancel)."""
    from phalanx.client.api import ApiError

    if signal is not None:
        signal = signal.upper() if signal.upper().startswith("SIG") else f"SIG{signal.upper()}"
    failed = []
    with connect(head, token) as client:
        for job_id in job_ids:
            try:
                info = client.cancel(job_id, signal=signal)
            except ApiError as exc:
                said = str(exc)  # the head's words often name the job ("no job N") already
                named = re.search(rf"\bjob {job_id}\b", said) is not None
                where = "" if named else f"job {job_id}: "
                typer.echo(f"error: {where}{said}", err=True)
                failed.append(job_id)
                continue
            if json_out:
                print_json(info)
            elif signal:
                typer.echo(f"job {job_id}: sent {signal}")
            else:
                typer.echo(f"job {job_id}: {info.state}")
    if failed:
        raise typer.Exit(2)


def show(
    job_id: Annotated[int, typer.Argument(help="Job id.", show_default=False)],
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Everything about one job: state, spec, placement, events and exit (like scontrol)."""
    from rich.markup import escape
    from rich.table import Table

    with connect(head, token) as client:
        detail = client.job(job_id)
    if json_out:
        print_json(detail)
        return
    job, spec = detail.job, detail.spec
    out = console()
    facts = {
        "JobId": job_id_label(job),
        "JobName": job.name,
        "User": job.user,
        "Team": job.team,
        "Account": job.account or "",
        "QOS": job.qos,
        "Priority": str(job.priority),
        "JobState": job.state,
        "Reason": " — ".join(r for r in (job.reason, job.reason_message) if r) or "None",
        "Launcher": job.launcher,
        "Nodes": f"{job.nodes} × {job.gpus_per_node} GPUs",
        "TimeLimit": duration(job.time_limit_s) if job.time_limit_s else "UNLIMITED",
        "SubmitTime": timestamp(job.submit_time),
        "StartTime": timestamp(job.start_time) or "Unknown",
        "EndTime": timestamp(job.end_time) or "Unknown",
        "RunTime": duration(elapsed(job.start_time, job.end_time)) or "0:00",
        "ExitCode": job.exit_code or "",
        "Restarts": str(job.restart_count),
        "Epoch": str(job.epoch),
        "WorkDir": job.workdir,
        "Command": shlex.join(spec.command) if spec.command else "(batch script)",
    }
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in facts.items():
        grid.add_row(key, escape(value))
    out.print(grid)
    if job.placement:
        out.print("\n[bold]Placement[/bold]")
        table = Table(box=None, pad_edge=False, header_style="bold")
        for column in ("RANK", "NODE", "ADDRESS", "GPUS"):
            table.add_column(column)
        for rank, p in enumerate(job.placement):
            table.add_row(str(rank), p.node, p.address, ",".join(map(str, p.gpus)))
        out.print(table)
    if detail.events:
        out.print("\n[bold]Events[/bold]")
        table = Table(box=None, pad_edge=False, header_style="bold")
        for column in ("TIME", "EVENT", "STATE", "NODE", "MESSAGE"):
            table.add_column(column)
        for event in detail.events:
            move = f"{event.from_state}→{event.to_state}" if event.to_state else ""
            table.add_row(
                timestamp(event.time), event.kind, move, event.node or "", escape(event.message)
            )
        out.print(table)


def logs(
    job_id: Annotated[int, typer.Argument(help="Job id.", show_default=False)],
    rank: Annotated[int, typer.Option("--rank", "-r", min=0, help="Which rank's log.")] = 0,
    stderr: Annotated[bool, typer.Option("--stderr", help="Show stderr, not stdout.")] = False,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the rank ends.")
    ] = False,
    poll_s: Annotated[float, typer.Option(min=0.05, help="Seconds between polls with -f.")] = 0.5,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print a rank's log (stdout by default); with -f, follow it until the rank ends."""
    from phalanx.client.api import ApiError

    stream: Literal["stdout", "stderr"] = "stderr" if stderr else "stdout"
    offset = 0
    with connect(head, token) as client:
        while True:
            try:
                chunk = client.logs(job_id, rank=rank, stream=stream, offset=offset)
            except ApiError as exc:
                if follow and exc.status == 409:  # not started yet: wait for it with -f
                    time.sleep(poll_s)
                    continue
                raise
            if chunk.data:
                sys.stdout.write(chunk.data)
                sys.stdout.flush()
            advanced = chunk.next_offset > offset
            offset = chunk.next_offset
            if chunk.eof:
                return
            if not advanced:
                if not follow:
                    return
                time.sleep(poll_s)
