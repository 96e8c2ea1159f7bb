"""`phalanx report` (GPU-hours by user, team or QOS, like sreport), `phalanx idle` (GPUs
flagged idle) and `phalanx admin team idle-policy` (a team's idle-GPU policy)."""

from __future__ import annotations

import datetime as dt
import re
import sys
from typing import Annotated

import typer

from phalanx.cli.connect import HeadOpt, JsonOpt, TokenOpt, connect
from phalanx.cli.output import duration, fail, print_json, print_table, timestamp

GROUPS = ("user", "team", "qos")
PERIODS = ("day", "month")
ACTIONS = ("notify", "preempt", "cancel")
_DAY = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")
_SPAN = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?$")
_OPTION = {"window_s": "--window", "grace_s": "--grace", "threshold_pct": "--threshold"}
_PLAIN = [
    ("Input should be greater than or equal to", "must be at least"),
    ("Input should be less than or equal to", "must be at most"),
    ("Input should be", "must be"),
]
_UNIT_S = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def day_option(name: str, text: str | None) -> str | None:
    """`YYYY-MM-DD`, or `YYYY-MM` for the first day of that month (UTC)."""
    if text is None:
        return None
    value = text.strip()
    if not _DAY.match(value):
        fail(f"{name}: {text!r} is not a day (YYYY-MM-DD, or YYYY-MM for the month's first)")
    if len(value) == 7:
        value += "-01"
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        fail(f"{name}: {text!r} is not a day of the calendar")
    return value


def report(
    by: Annotated[
        str, typer.Option("--by", help="Group rows by: user, team or qos.", show_default=True)
    ] = "team",
    per: Annotated[
        str, typer.Option("--per", help="One row per: day or month (UTC).", show_default=True)
    ] = "day",
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="First day, YYYY-MM-DD or YYYY-MM (default: 31 days, or 12 months with "
            "--per month, before --until).",
            show_default=False,
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            "--until",
            help="End day, exclusive, YYYY-MM-DD or YYYY-MM (default: tomorrow).",
            show_default=False,
        ),
    ] = None,
    csv_out: Annotated[bool, typer.Option("--csv", help="Print CSV (for spreadsheets).")] = False,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """GPU usage (like sreport): allocated GPU-hours, utilisation-weighted GPU-hours (what
    the GPUs did), idle GPU-hours (flagged idle), jobs ended, failures and preemptions, by
    user, team or QOS, per day or month. Users see their own usage, team admins their
    teams', admins everyone's."""
    if by not in GROUPS:
        fail(f"--by: {by!r} is not one of {', '.join(GROUPS)}")
    if per not in PERIODS:
        fail(f"--per: {per!r} is not one of {', '.join(PERIODS)}")
    params: dict[str, str] = {"by": by, "per": per}
    first, end = day_option("--since", since), day_option("--until", until)
    if first is not None:
        params["since"] = first
    if end is not None:
        params["until"] = end
    with connect(head, token) as client:
        answer = client.usage_report(params, csv=csv_out)
    if isinstance(answer, str):
        sys.stdout.write(answer)
        return
    if json_out:
        print_json(answer)
        return
    typer.echo(f"usage from {answer.since} until {answer.until} (exclusive), UTC", err=True)
    columns = [("PERIOD", False), (by.upper(), False), ("ALLOC-GPU-H", True)]
    columns += [("UTIL-GPU-H", True), ("UTIL%", True), ("IDLE-GPU-H", True), ("JOBS", True)]
    columns += [("FAILED", True), ("PREEMPTED", True)]
    rows = []
    for r in [*answer.rows, answer.total]:
        pct = "-" if r.utilization_pct is None else f"{r.utilization_pct:.1f}"
        rows.append(
            [
                r.period,
                "" if r.key == "total" else r.key,
                f"{r.alloc_gpu_hours:.2f}",
                f"{r.util_gpu_hours:.2f}",
                pct,
                f"{r.idle_gpu_hours:.2f}",
                str(r.jobs),
                str(r.failures),
                str(r.preemptions),
            ]
        )
    print_table(columns, rows)


def idle(
    job: Annotated[
        int | None,
        typer.Argument(help="Only this job's GPUs.", min=1, max=2**31 - 1, show_default=False),
    ] = None,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """GPUs flagged idle: allocated and at (about) 0% utilisation for their team's window;
    what the team's policy does next, and when."""
    with connect(head, token) as client:
        listed = client.idle_gpus(job)
    if json_out:
        print_json(listed)
        return
    if not listed.gpus:
        typer.echo("no idle GPUs", err=True)
        return
    columns = [("JOBID", True), ("USER", False), ("TEAM", False), ("GPU", False)]
    columns += [("IDLE", True), ("SINCE", False), ("ACTION", False), ("AT", False)]
    rows = [
        [
            str(g.job_id),
            g.user,
            g.team,
            f"{g.node}:{g.index}",
            duration(g.idle_s),
            timestamp(g.idle_since),
            g.action + (" (done)" if g.acted else ""),
            "-" if g.action_at is None else timestamp(g.action_at),
        ]
        for g in listed.gpus
    ]
    print_table(columns, rows)


def span_option(name: str, text: str | None) -> float | None:
    """`90`, `90s`, `30m`, `2h`, `1d` → seconds."""
    if text is None:
        return None
    match = _SPAN.match(text.strip())
    if match is None:
        fail(f"{name}: {text!r} is not a duration (e.g. 30m, 2h, 90s)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def idle_policy(
    team: Annotated[str, typer.Argument(help="Team name.", show_default=False)],
    action: Annotated[
        str | None,
        typer.Option(
            "--action",
            help="notify (an event only), preempt (the preemption notice: checkpoint and "
            "requeue) or cancel.",
            show_default=False,
        ),
    ] = None,
    window: Annotated[
        str | None,
        typer.Option(
            "--window",
            help="Idle this long to be flagged (e.g. 30m; default 30m).",
            show_default=False,
        ),
    ] = None,
    grace: Annotated[
        str | None,
        typer.Option(
            "--grace",
            help="Flagged this long before the action (e.g. 10m; default 10m).",
            show_default=False,
        ),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold",
            min=0,
            max=100,
            help="Utilisation % counted as idle (default 1).",
            show_default=False,
        ),
    ] = None,
    reset: Annotated[
        bool, typer.Option("--reset", help="Back to the default policy (notify after 30m).")
    ] = False,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show a team's idle-GPU policy, or set it (admin): what happens to a job holding a
    GPU idle for the window, once the grace is over. Options not given keep their value."""
    from pydantic import ValidationError

    from phalanx.api.usage import IdlePolicySpec

    if action is not None and action not in ACTIONS:
        fail(f"--action: {action!r} is not one of {', '.join(ACTIONS)}")
    window_s, grace_s = span_option("--window", window), span_option("--grace", grace)
    changes = {
        k: v
        for k, v in {
            "action": action,
            "window_s": window_s,
            "grace_s": grace_s,
            "threshold_pct": threshold,
        }.items()
        if v is not None
    }
    if reset and changes:
        fail("--reset goes back to the default: give it alone")
    with connect(head, token) as client:
        current = next((p for p in client.idle_policies().policies if p.team == team), None)
        if current is None:
            fail(f"no team {team!r}")
        if reset:
            current = client.set_idle_policy(team, None)
        elif changes:
            base = {
                "action": current.action,
                "window_s": current.window_s,
                "grace_s": current.grace_s,
                "threshold_pct": current.threshold_pct,
            }
            try:
                spec = IdlePolicySpec.model_validate({**base, **changes})
            except ValidationError as exc:
                first = exc.errors()[0]
                field = str(first.get("loc", ("policy",))[0])
                message = str(first.get("msg", "invalid"))
                for said, words in _PLAIN:
                    message = message.replace(said, words)
                unit = "" if field == "threshold_pct" else " seconds"
                fail(f"{_OPTION.get(field, field)}: {message}{unit}")
            current = client.set_idle_policy(team, spec)
    if json_out:
        print_json(current)
        return
    if current.action == "notify":
        then = " (an event in the job's log; no action)"
    else:
        then = f", then {current.action} after {span_text(current.grace_s)}"
    default = " (default)" if current.default else ""
    typer.echo(
        f"team {team}: GPUs at ≤ {current.threshold_pct:g}% for {span_text(current.window_s)} "
        f"are flagged{then}{default}"
    )


def span_text(seconds: float) -> str:
    """`30m`, `2h`, `1d`, `90s`: the largest unit that divides it."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
