"""`phalanx show` and `cancel`: one job in full, and stopping jobs (queue, history and logs:
cli/views.py, cli/logs.py)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Annotated

import typer

from phalanx.cli.connect import HeadOpt, JsonOpt, TokenOpt, connect
from phalanx.cli.jobctl import JobsArg, job_refs, refusal
from phalanx.cli.jobctl import label as _label
from phalanx.cli.output import (
    STATE_STYLE,
    cell,
    console,
    duration,
    fail,
    print_json,
    print_table,
    timestamp,
)

if TYPE_CHECKING:
    from phalanx.api.models import JobDetail, JobInfo, JobList


JOB_HELP = "Job id: 123, or 123_4 for task 4 of array 123."


def job_id_label(job: JobInfo) -> str:
    """`123`, or `120_3` for task 3 of array job 120 (as squeue prints it)."""
    return _label(job.id, job.array_job_id, job.array_task_id)


def nodelist(job: JobInfo) -> str:
    """The job's nodes in placement order, each once."""
    return ",".join(dict.fromkeys(p.node for p in job.placement))


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
                typer.echo(refusal(ref, str(exc)), err=True)
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
        # A requeued job's first start, and its time over all runs (LastStartTime: this run).
        "StartTime": timestamp(job.first_start_time) or "Unknown",
        "LastStartTime": timestamp(job.start_time) or "Unknown",
        "EndTime": timestamp(job.end_time) or "Unknown",
        "RunTime": duration(job.run_time_s) or "0:00",
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
        grid.add_row(key, escape(cell(value)))
    out.print(grid)
    if job.placement:
        _placement(detail)
    if detail.events:
        out.print("\n[bold]Events[/bold]")
        table = Table(box=None, pad_edge=False, header_style="bold")
        for column in ("TIME", "EVENT", "STATE", "NODE", "MESSAGE"):
            table.add_column(column)
        for event in detail.events:
            move = f"{event.from_state}→{event.to_state}" if event.to_state else ""
            table.add_row(
                timestamp(event.time),
                event.kind,
                move,
                event.node or "",
                escape(cell(event.message)),
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


def node_ranks(job: JobInfo, node_rank: int) -> str:
    """The process ranks (`logs --rank`) the `node_rank`-th node of `job` runs, as a
    range: one per GPU with torchrun, one per node with the node launcher, the batch
    script (rank 0) on the first node."""
    if job.launcher == "batch":
        return "0 (batch script)" if node_rank == 0 else "-"
    if job.launcher == "node":
        return str(node_rank)
    g = job.gpus_per_node
    return f"{node_rank * g}-{node_rank * g + g - 1}" if g > 1 else str(node_rank * g)


def _placement(detail: JobDetail) -> None:
    """The Placement table: each node's NODE_RANK (GROUP_RANK, SLURM_NODEID), its process
    ranks and GPUs, and each GPU's latest utilisation and memory while the job runs."""
    from rich.table import Table

    job = detail.job
    readings = {(g.node, g.index): g for g in detail.gpus}
    out = console()
    out.print("\n[bold]Placement[/bold]")
    table = Table(box=None, pad_edge=False, header_style="bold")
    columns = ["NODE_RANK", "NODE", "ADDRESS", "RANKS", "GPUS"]
    if readings:
        columns += ["GPU-UTIL", "GPU-MEM"]
    for column in columns:
        table.add_column(column, no_wrap=True)
    for node_rank, p in enumerate(job.placement):
        row = [str(node_rank), p.node, p.address, node_ranks(job, node_rank)]
        row.append(",".join(map(str, p.gpus)))
        if readings:
            seen = [readings.get((p.node, i)) for i in p.gpus]
            row.append(",".join(_pct(g.utilization_pct if g else None) for g in seen))
            row.append(",".join(_mib(g.memory_used_mb if g else None) for g in seen))
        table.add_row(*row)
    out.print(table)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 1024:.1f}G"
