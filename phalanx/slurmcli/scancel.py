"""`scancel`: cancel (or signal) jobs, array tasks and whole arrays, chosen by id and/or by
user, name, state, partition, account or QOS; silent on success, as Slurm."""

from __future__ import annotations

import re
import sys
from typing import Literal

from phalanx.api.models import JobInfo
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.jobspec import JobSpecError
from phalanx.jobspec.jobflags import signal_name
from phalanx.slurmcli.common import connect, die
from phalanx.slurmcli.getopts import Opt, Parsed, parse, run_tool
from phalanx.slurmcli.slurmjson import VERSION_LINE

OPTIONS = [
    Opt("signal", "s", True),
    Opt("user", "u", True),
    Opt("name", "n", True),
    Opt("jobname", None, True),
    Opt("state", "t", True),
    Opt("partition", "p", True),
    Opt("account", "A", True),
    Opt("qos", "q", True),
    Opt("me"),
    Opt("batch", "b"),
    Opt("full", "f"),
    Opt("hurry", "H"),
    Opt("ctld"),
    Opt("quiet", "Q"),
    Opt("verbose", "v"),
    Opt("interactive", "i"),
    Opt("nodelist", "w", True),
    Opt("wckey", None, True),
    Opt("reservation", "R", True),
    Opt("cluster", "M", True),
    Opt("clusters", None, True),
    Opt("version", "V"),
    Opt("help", "h"),
    Opt("usage"),
]
USAGE = """\
Usage: scancel [-A account] [--batch] [--full] [--hurry] [--interactive] [-n job_name]
               [-p partition] [-Q] [-q qos] [-s signal | integer] [-t PENDING | RUNNING]
               [-u user_name] [--me] [-V] [-v] [job_id[_array_id][.step_id]]
(Phalanx's scancel, Slurm 22.05 compatible; --interactive, -w and --reservation are
not supported.)
"""
_ID = re.compile(r"([1-9][0-9]{0,9})(?:_([0-9]{1,7}|\[[0-9,\-]{1,200}\]))?(?:\.([0-9a-z]+))?")
# Slurm's state names (and short forms) as scancel -t takes them → Phalanx's codes.
_STATES = {
    "PENDING": "PD", "PD": "PD", "RUNNING": "R", "R": "R", "SUSPENDED": "S", "S": "S",
    "COMPLETING": "CG", "CG": "CG",
}  # fmt: skip
MAX_TASKS = 10_000
Scope = Literal["all", "steps", "batch"]


def main(argv: list[str]) -> int:
    return run_tool("scancel", _scancel, argv)


def _scancel(argv: list[str]) -> int:
    args = parse("scancel", argv, OPTIONS)
    if args.has("help") or args.has("usage"):
        sys.stdout.write(USAGE)
        return 0
    if args.has("version"):
        print(VERSION_LINE)
        return 0
    for unsupported in ("interactive", "nodelist", "reservation"):
        if args.has(unsupported):
            die(f"--{unsupported} is not supported by Phalanx's scancel")
    sig = args.last("signal")
    if sig is not None:
        try:
            sig = signal_name(f"--signal={sig}", sig)
        except JobSpecError as exc:
            die(f"Invalid job signal: {sig} ({exc})")
    refs = [ref for value in args.arguments for ref in _refs(value)]
    filters = _filters(args)
    if not refs and not filters and not args.has("me"):
        die("No job identification provided")
    failed = False
    with connect() as client:
        if args.has("me") and "user" not in filters:
            filters["user"] = client.whoami().user
        if refs:
            targets = [ref for ref in refs if not filters or _matches(client, ref, filters)]
        else:
            targets = [_label(job) for job in _listed(client, filters)]
        # As Slurm: a signal goes to the job's steps (srun's tasks), to the batch script
        # only with -b, to both with -f.
        scope: Scope = "batch" if args.has("batch") else "all" if args.has("full") else "steps"
        for ref in targets:
            failed |= not _cancel(client, ref, sig, scope, verbose=args.has("verbose"))
    return 1 if failed else 0


def _refs(value: str) -> list[str]:
    """`123`, `123_4`, `123_[1-3,7]` → what the head takes; a step (`123.0`) is refused."""
    match = _ID.fullmatch(value.strip())
    if match is None:
        die(f"Invalid job id {value}")
    job, tasks, step = match.groups()
    if step is not None:
        die(f"Kill job error on job id {value}: job steps are not supported by Phalanx's scancel")
    if tasks is None:
        return [job]
    if not tasks.startswith("["):
        return [f"{job}_{int(tasks)}"]
    out: list[str] = []
    for piece in tasks[1:-1].split(","):
        first, dash, last = piece.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            die(f"Invalid job id {value}")
        low, high = int(first), int(last) if dash else int(first)
        if high < low or len(out) + high - low + 1 > MAX_TASKS:
            die(f"Invalid job id {value}")
        out.extend(f"{job}_{task}" for task in range(low, high + 1))
    return list(dict.fromkeys(out))


def _filters(args: Parsed) -> dict[str, str]:
    filters = {}
    for option, key in (
        ("user", "user"),
        ("name", "name"),
        ("jobname", "name"),
        ("partition", "team"),
        ("account", "account"),
        ("qos", "qos"),
        ("state", "state"),
    ):
        value = args.last(option)
        if value is not None:
            filters[key] = value
    if "state" in filters:
        state = _STATES.get(filters["state"].upper())
        if state is None:
            die(f"Invalid job state specified: {filters['state']}")
        filters["state"] = state
    return filters


def _listed(client: PhalanxClient, filters: dict[str, str]) -> list[JobInfo]:
    jobs = client.jobs(active=True, user=filters.get("user"), team=filters.get("team")).jobs
    return [job for job in jobs if _keep(job, filters)]


def _keep(job: JobInfo, filters: dict[str, str]) -> bool:
    checks = {
        "user": job.user,
        "name": job.name,
        "team": job.team,
        "account": job.account or "",
        "qos": job.qos,
        "state": job.state,
    }
    return all(checks[key] == value for key, value in filters.items())


def _matches(client: PhalanxClient, ref: str, filters: dict[str, str]) -> bool:
    """Slurm cancels a named job only if it also passes the filters given with it."""
    try:
        return _keep(client.job(ref).job, filters)
    except ApiError:
        return True  # let the cancel report it as Slurm would


def _label(job: JobInfo) -> str:
    if job.array_job_id is not None and job.array_task_id is not None:
        return f"{job.array_job_id}_{job.array_task_id}"
    return str(job.id)


def _cancel(
    client: PhalanxClient, ref: str, sig: str | None, scope: Scope, *, verbose: bool
) -> bool:
    """Cancel (or signal) one job; False, with Slurm's error line, when the head refuses."""
    try:
        client.cancel(ref, signal=sig, scope=scope if sig is not None else None)
    except ApiError as exc:
        print(f"scancel: error: Kill job error on job id {ref}: {_why(exc)}", file=sys.stderr)
        return False
    if verbose:
        what = f"Signal {sig} to" if sig else "Terminating"
        print(f"scancel: {what} job {ref}", file=sys.stderr)
    return True


def _why(exc: ApiError) -> str:
    """The head's refusal in Slurm's words where Slurm has them."""
    detail = exc.detail.lower()
    if exc.status == 404:
        return "Invalid job id specified"
    if exc.status == 403:
        return "Access/permission denied"
    if "already ended" in detail or "ended" in detail or "completed" in detail:
        return "Job/step already completing or completed"
    if "pending" in detail or "not running" in detail:
        return "Job is pending execution"
    return exc.detail
