"""`scontrol`: show jobs, nodes, partitions, the configuration and hostlists in Slurm's
key=value layout; requeue, hold, release and update jobs; drain and resume nodes."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from phalanx.api.models import JobList, JobUpdate
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.jobspec import JobSpecError, hostlist, parse_time
from phalanx.jobspec.jobflags import parse_dependency
from phalanx.slurmcli.common import connect, die
from phalanx.slurmcli.getopts import Opt, parse, run_tool
from phalanx.slurmcli.scontrol_show import (
    config,
    job_records,
    layout,
    node_records,
    partition_records,
)
from phalanx.slurmcli.slurmjson import VERSION_LINE

OPTIONS = [
    Opt("oneliner", "o"),
    Opt("details", "d"),
    Opt("quiet", "Q"),
    Opt("verbose", "v"),
    Opt("all", "a"),
    Opt("version", "V"),
    Opt("help", "h"),
    Opt("usage"),
]
USAGE = """\
Usage: scontrol [-o] [-d] [-Q] COMMAND   (Phalanx's scontrol, Slurm 22.05 compatible)
  show job [ID]            show node [NAME]        show partition [NAME]
  show config              show hostnames [LIST]   show hostlist LIST
  requeue ID[,ID...]       hold ID...              release ID...
  update JobId=ID [TimeLimit=T] [Dependency=D] [QOS=Q] [Priority=N]
  update NodeName=NAME State=DRAIN Reason=TEXT | State=RESUME
  ping                     version
"""


def main(argv: list[str]) -> int:
    return run_tool("scontrol", _scontrol, argv)


def _scontrol(argv: list[str]) -> int:
    args = parse("scontrol", argv, OPTIONS)
    if args.has("help") or args.has("usage"):
        sys.stdout.write(USAGE)
        return 0
    words = args.arguments
    if args.has("version") or words[:1] in (["version"], ["-V"]):
        print(VERSION_LINE)
        return 0
    if not words:
        die("no command given; Phalanx's scontrol runs one command (see scontrol --help)")
    command, rest = words[0].lower(), words[1:]
    oneliner = args.has("oneliner")
    if command == "show":
        return _show(rest, oneliner)
    if command in ("requeue", "hold", "release", "uhold"):
        return _control(command, rest)
    if command == "update":
        return _update(rest)
    if command == "ping":
        with connect() as client:
            health = client.health()
            print(
                f"Slurmctld(primary) at {client.url} is {'UP' if health.status == 'ok' else 'DOWN'}"
            )
        return 0
    die(f"invalid keyword: {words[0]} (Phalanx's scontrol: see scontrol --help)")


# ----------------------------------------------------------------------------- show
def _show(rest: list[str], oneliner: bool) -> int:
    if not rest:
        die("show: which entity? job, node, partition, config, hostnames or hostlist")
    entity, name = rest[0].lower(), (rest[1] if len(rest) > 1 else None)
    if entity in ("hostnames", "hostname"):
        return _hostnames(name)
    if entity in ("hostlist", "hostlistsorted"):
        if name is None:
            die("show hostlist needs a list of host names")
        try:
            print(hostlist.compress(hostlist.expand(name)))
        except JobSpecError as exc:
            die(str(exc))
        return 0
    with connect() as client:
        if entity in ("job", "jobs", "jobid"):
            records = job_records(client, name)
        elif entity in ("node", "nodes"):
            records = node_records(client, name)
        elif entity in ("partition", "partitions"):
            records = partition_records(client, name)
        elif entity == "config":
            print(config(client))
            return 0
        else:
            die(f"invalid entity: {rest[0]} for keyword: show")
    if records is None:
        return 1
    for record in records:
        print(layout(record, oneliner))
        if not oneliner:
            print()
    return 0


def _hostnames(expr: str | None) -> int:
    expr = expr or os.environ.get("SLURM_JOB_NODELIST")
    if not expr:
        die("No hostlist specified and SLURM_JOB_NODELIST is not set")
    try:
        for host in hostlist.expand(expr):
            print(host)
    except JobSpecError as exc:
        die(str(exc))
    return 0


# ----------------------------------------------------------------------------- control
def _control(command: str, rest: list[str]) -> int:
    refs = [ref for word in rest for ref in word.split(",") if ref]
    if not refs:
        die(f"{command}: give a job id")
    act: dict[str, Callable[[PhalanxClient, str], JobList]] = {
        "requeue": lambda c, r: c.requeue(r),
        "hold": lambda c, r: c.hold(r),
        "uhold": lambda c, r: c.hold(r),
        "release": lambda c, r: c.release(r),
    }
    failed = False
    with connect() as client:
        for ref in refs:
            try:
                act[command](client, ref)
            except ApiError as exc:
                print(f"{_why(exc)} for job {ref}", file=sys.stderr)
                failed = True
    return 1 if failed else 0


def _why(exc: ApiError) -> str:
    if exc.status in (404, 422):
        return "Invalid job id specified"
    if exc.status == 403:
        return "Access/permission denied"
    detail = exc.detail
    if "already ended" in detail:
        return "Job/step already completing or completed"
    if "not pending" in detail:
        return "Job is no longer pending execution"
    return detail


def _update(rest: list[str]) -> int:
    pairs: dict[str, str] = {}
    for word in rest:
        key, eq, value = word.partition("=")
        if not eq:
            die(f"Invalid input: {word}  Request aborted")
        pairs[key.lower()] = value
    if "nodename" in pairs:
        return _update_node(pairs)
    ref = pairs.pop("jobid", None) or pairs.pop("job", None)
    if ref is None:
        die("update: give JobId=ID (or NodeName=NAME)")
    fields: dict[str, object] = {}
    try:
        for key, value in pairs.items():
            if key == "timelimit":
                if value.upper() in ("UNLIMITED", "INFINITE") or value[:1] in "+-":
                    die(
                        f"TimeLimit={value}: give a time limit (Phalanx does not take "
                        "UNLIMITED or +/- changes)"
                    )
                fields["time_limit_s"] = parse_time(value)
            elif key == "dependency":
                deps, any_of = parse_dependency(value) if value else ([], False)
                fields["dependencies"], fields["dependency_any"] = deps, any_of
            elif key == "qos":
                fields["qos"] = value
            elif key == "priority":
                if not value.isdigit():
                    die(f"Invalid Priority value: {value}")
                fields["priority"] = int(value)
            else:
                die(
                    f"Update of {key} is not supported by Phalanx (TimeLimit, Dependency, "
                    "QOS, Priority)"
                )
        change = JobUpdate.model_validate(fields)
    except JobSpecError as exc:
        die(str(exc))
    except ValueError as exc:
        die(f"Invalid update: {exc}")
    with connect() as client:
        try:
            client.update(ref, change)
        except ApiError as exc:
            print(f"slurm_update error: {_why(exc)}", file=sys.stderr)
            return 1
    return 0


def _update_node(pairs: dict[str, str]) -> int:
    name, state = pairs["nodename"], pairs.get("state", "").upper()
    with connect() as client:
        try:
            if state in ("DRAIN", "DOWN"):
                client.drain(name, pairs.get("reason") or "drained with scontrol")
            elif state in ("RESUME", "UNDRAIN", "IDLE"):
                client.resume(name)
            else:
                die(f"State={state or '(none)'}: Phalanx's scontrol sets DRAIN or RESUME")
        except ApiError as exc:
            print(f"slurm_update error: {_why(exc)}", file=sys.stderr)
            return 1
    return 0
