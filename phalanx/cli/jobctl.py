"""`phalanx hold`, `release`, `requeue` and `update` (Slurm's scontrol job controls), and the
job ids every job command takes: `123`, `123_4` (an array task), `123_[1-3,7]` (tasks)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from phalanx.cli.connect import HeadOpt, JsonOpt, TokenOpt, connect
from phalanx.cli.output import fail, print_json

if TYPE_CHECKING:
    from phalanx.api.models import JobList
    from phalanx.client.api import PhalanxClient

_JOB = re.compile(r"([1-9][0-9]{0,9})(?:_([0-9]{1,7}|\[[0-9,\-]{1,200}\]))?")
MAX_JOB_ID = 2**31 - 1
MAX_TASKS = 10_000  # as many as one array may have

JobsArg = Annotated[
    list[str],
    typer.Argument(
        help="Job ids: 123; 123_4 (task 4 of array 123); 123_[1-3,7] (tasks); an array's id "
        "alone means every task of the array.",
        show_default=False,
    ),
]


def refusal(ref: str, said: str) -> str:
    """The one `error:` line for a job the head refused, naming the job once (the head's
    words often name it already: "no job 9", "job 9 already ended")."""
    named = re.search(rf"\bjob {re.escape(ref)}\b", said) is not None
    return f"error: {'' if named else f'job {ref}: '}{said}"


def job_refs(values: list[str]) -> list[str]:
    """Job ids as the head takes them (`123`, `123_4`), ranges of tasks expanded; exits
    with one `error:` line for anything else (never reads `29_3` as 293)."""
    refs: list[str] = []
    for value in values:
        match = _JOB.fullmatch(value.strip())
        if match is None or int(match[1]) > MAX_JOB_ID:
            fail(f"{value!r} is not a job id: use 123, 123_4 (an array task) or 123_[1-3]")
        job, tasks = match[1], match[2]
        if tasks is None:
            refs.append(job)
        elif not tasks.startswith("["):
            refs.append(f"{job}_{int(tasks)}")
        else:
            refs.extend(f"{job}_{t}" for t in _task_range(value, tasks[1:-1]))
    return refs


def _task_range(value: str, text: str) -> list[int]:
    tasks: list[int] = []
    for piece in text.split(","):
        first, dash, last = piece.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            fail(f"{value!r}: task range {piece!r} is not N or N-M")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            fail(f"{value!r}: task range {piece!r} runs backwards")
        if len(tasks) + high - low + 1 > MAX_TASKS:
            fail(f"{value!r}: more than {MAX_TASKS} tasks")
        tasks.extend(range(low, high + 1))
    return list(dict.fromkeys(tasks))


def label(job_id: int, array_job_id: int | None, array_task_id: int | None) -> str:
    """`123`, or `120_3` for task 3 of array job 120 (as squeue prints it)."""
    if array_job_id is not None and array_task_id is not None:
        return f"{array_job_id}_{array_task_id}"
    return str(job_id)


def _control(
    refs: list[str],
    act: Callable[[PhalanxClient, str], JobList],
    done: str,
    json_out: bool,
    head: str | None,
    token: str | None,
) -> None:
    """Apply `act` to each job; print what changed (or one `error:` line per refusal)."""
    from phalanx.client.api import ApiError

    failed = False
    with connect(head, token) as client:
        for ref in job_refs(refs):
            try:
                answer = act(client, ref)
            except ApiError as exc:
                typer.echo(refusal(ref, str(exc)), err=True)
                failed = True
                continue
            if json_out:
                print_json(answer)
                continue
            for job in answer.jobs:
                name = label(job.id, job.array_job_id, job.array_task_id)
                why = f" ({job.reason})" if job.reason else ""
                typer.echo(f"job {name}: {done}; {job.state}{why}")
    if failed:
        raise typer.Exit(2)


def hold(
    jobs: JobsArg, json_out: JsonOpt = False, head: HeadOpt = None, token: TokenOpt = None
) -> None:
    """Keep pending jobs from starting (like scontrol hold); `release` lets them go.

    The job stays pending with reason JobHeldUser; held by an admin, JobHeldAdmin, and only
    an admin can release it. An array's id holds every pending task."""
    _control(jobs, lambda c, ref: c.hold(ref), "held", json_out, head, token)


def release(
    jobs: JobsArg, json_out: JsonOpt = False, head: HeadOpt = None, token: TokenOpt = None
) -> None:
    """Let held jobs start (like scontrol release)."""
    _control(jobs, lambda c, ref: c.release(ref), "released", json_out, head, token)


def requeue(
    jobs: JobsArg, json_out: JsonOpt = False, head: HeadOpt = None, token: TokenOpt = None
) -> None:
    """Stop running jobs and queue them again (like scontrol requeue).

    The job starts again from the beginning (from its checkpoint, if it keeps one). As in
    Slurm it counts as a restart: SLURM_RESTART_COUNT goes up by one, and so does the count
    that --max-restarts limits. Jobs submitted with --no-requeue are refused."""
    _control(jobs, lambda c, ref: c.requeue(ref), "requeued", json_out, head, token)


def update(
    jobs: JobsArg,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time-limit",
            "-t",
            help="New time limit (as -t: MM, HH:MM:SS, D-HH:MM). Users may only lower it.",
        ),
    ] = None,
    qos: Annotated[
        str | None, typer.Option("--qos", "-q", help="New QOS (pending jobs), within yours.")
    ] = None,
    dependency: Annotated[
        str | None,
        typer.Option(
            "--dependency", "-d", help="New dependencies (pending jobs), e.g. afterok:12; none."
        ),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option("--priority", min=0, max=1_000_000, help="New priority (admins only)."),
    ] = None,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Change submitted jobs (like scontrol update).

    A pending job: its time limit, QOS, priority and dependencies. A running job: its time
    limit only. Users may lower a time limit; only admins raise one or set a priority."""
    from phalanx.api.models import JobUpdate
    from phalanx.jobspec import JobSpecError
    from phalanx.jobspec.jobflags import parse_dependency
    from phalanx.jobspec.units import parse_time

    fields: dict[str, object] = {}
    try:
        if time_limit is not None:
            seconds = parse_time(time_limit)
            if seconds is None:
                fail("--time-limit: give a limit (a job cannot be made UNLIMITED by update)")
            fields["time_limit_s"] = seconds
        if dependency is not None:
            if dependency.strip().lower() in ("", "none"):
                fields["dependencies"], fields["dependency_any"] = [], False
            else:
                fields["dependencies"], fields["dependency_any"] = parse_dependency(dependency)
    except JobSpecError as exc:
        fail(str(exc))
    if qos is not None:
        fields["qos"] = qos
    if priority is not None:
        fields["priority"] = priority
    if not fields:
        fail("nothing to update: give --time-limit, --qos, --dependency or --priority")
    try:
        change = JobUpdate.model_validate(fields)
    except ValueError as exc:
        fail(f"bad update: {exc}".splitlines()[0])
    _control(jobs, lambda c, ref: c.update(ref, change), "updated", json_out, head, token)
