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
from phalanx.cli.jobctl import JobsArg, job_refs
from phalanx.cli.jobctl import label as _label
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


JOB_HELP = "Job id: 123, or 123_4 for task 4 of array 123."


def job_id_label(job: JobInfo) -> str:
    """`123`, or `120_3` for task 3 of array job 120 (as squeue prints it)."""
    return _label(job.id, job.array_job_id, job.array_task_id)


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
    job_ids: JobsArg,
    signal: Annotated[
        str | None,
        typer.Option("--signal", "-s", help="Only send this signal (e.g. SIGUSR1), as scancel -s."),
    ] = None,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Cancel jobs (like scancel). An array's id cancels every task of the array."""
    from phalanx.client.api import ApiError

    if signal is not None:
        signal = signal.upper() if signal.upper().startswith("SIG") else f"SIG{signal.upper()}"
    failed = []
    with connect(head, token) as client:
        for ref in job_refs(job_ids):
            try:
                info = client.cancel(ref, signal=signal)
            except ApiError as exc:
                said = str(exc)  # the head's words often name the job ("no job N") already
                named = re.search(rf"\bjob {re.escape(str(ref))}\b", said) is not None
                where = "" if named else f"job {ref}: "
                typer.echo(f"error: {where}{said}", err=True)
                failed.append(ref)
                continue
            what = f"job {ref}"
            if "_" not in ref and info.array_job_id == int(ref):
                what = f"array {ref} (every task)"
            if json_out:
                print_json(info)
            elif signal:
                typer.echo(f"{what}: sent {signal}")
            else:
                typer.echo(f"{what}: {info.state}")
    if failed:
        raise typer.Exit(2)


def show(
    job_id: Annotated[str, typer.Argument(help=JOB_HELP, show_default=False)],
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Everything about one job: state, spec, placement, events and exit (like scontrol).

    An array's id lists the array's tasks; `ID_TASK` shows one task."""
    from rich.markup import escape
    from rich.table import Table

    [ref] = job_refs([job_id]) if "[" not in job_id else [""]
    if not ref:
        fail(f"{job_id!r}: show takes one job (123 or 123_4), not a range")
    with connect(head, token) as client:
        detail = client.job(ref)
        tasks = None
        if "_" not in ref and detail.job.array_job_id == detail.job.id:
            tasks = client.jobs(active=True, ended=True, array=detail.job.id, limit=100_000)
    if tasks is not None:
        _show_array(ref, tasks, json_out)
        return
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


def _show_array(ref: str, tasks: JobList, json_out: bool) -> None:
    """`show ARRAY_ID`: the array's tasks, one line each (as `scontrol show job` lists
    every task of an array)."""
    if json_out:
        print_json(tasks)
        return
    typer.echo(f"Job {ref} is an array of {len(tasks.jobs)} tasks; `phalanx show {ref}_N`")
    typer.echo("shows one.")
    columns = [("JOBID", False), ("ST", False), ("RESTARTS", True), ("EXITCODE", False)]
    columns += [("NODELIST(REASON)", False)]
    rows = [
        [
            job_id_label(job),
            job.state,
            str(job.restart_count),
            job.exit_code or "",
            nodelist(job) or f"({job.reason or 'None'})",
        ]
        for job in tasks.jobs
    ]
    print_table(columns, rows, {1: STATE_STYLE})


def logs(
    job_id: Annotated[str, typer.Argument(help=JOB_HELP, show_default=False)],
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
    [ref] = job_refs([job_id]) if "[" not in job_id else [""]
    if not ref:
        fail(f"{job_id!r}: logs takes one job (123 or 123_4), not a range")
    with connect(head, token) as client:
        while True:
            try:
                chunk = client.logs(ref, rank=rank, stream=stream, offset=offset)
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
