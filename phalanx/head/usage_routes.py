"""REST routes of idle-GPU policy and flags, and of usage reports (head/usage.py)."""

from __future__ import annotations

import csv
import datetime as dt
import io
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic_core import to_json

from phalanx.api import usage as u
from phalanx.api.models import ErrorBody
from phalanx.core.idle import IdleAction, IdlePolicy
from phalanx.head.accounting import Scope, total
from phalanx.head.auth import Principal
from phalanx.head.control import HeadError
from phalanx.head.idle import IdleFlag
from phalanx.head.service import Head

_bearer = HTTPBearer(auto_error=False)
MAX_REPORT_DAYS = 3700  # ten years and a bit
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "no such team or job"}
}
CSV_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the report; `format=csv`: text/csv, one row per period and group",
        "content": {"text/csv": {"schema": {"type": "string"}}},
    }
}


def _head(request: Request) -> Head:
    head: Head = request.app.state.head
    return head


async def _user(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    head = _head(request)
    return Head.require_user(head.authenticate(creds.credentials if creds else None))


async def _admin(who: Annotated[Principal, Depends(_user)]) -> Principal:
    return Head.require_admin(who)


User = Annotated[Principal, Depends(_user)]
Admin = Annotated[Principal, Depends(_admin)]
TeamName = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@+-]+$")]
Day = Annotated[
    str | None,
    Query(
        min_length=10,
        max_length=10,
        pattern=r"^\d{4}-\d{2}-\d{2}$",
        description="a UTC day, YYYY-MM-DD",
    ),
]

router = APIRouter()


# ---------------------------------------------------------------------------- reports
@router.get("/v1/reports/usage", response_model=u.UsageReport, responses=CSV_ANSWER)
def usage_report(
    request: Request,
    who: User,
    by: Annotated[u.GroupBy, Query(description="group rows by user, team or QOS")] = "team",
    per: Annotated[u.Period, Query(description="one row per day or per month (UTC)")] = "day",
    since: Day = None,
    until: Day = None,
    format: Annotated[str, Query(pattern="^(json|csv)$")] = "json",
) -> Any:
    """Allocated, utilisation-weighted and idle GPU-hours, jobs, failures and preemptions
    over days [since, until): users see their own usage, team admins their teams', admins
    everyone's. Defaults: until tomorrow; since 31 days (per day) or 12 months (per
    month) before."""
    head = _head(request)
    first, end = report_range(head.now(), per, since, until)
    scope = None if who.admin else Scope(who.user or "", who.admin_of)
    rows = head.usage.report(by, per, first.isoformat(), end.isoformat(), scope)
    if format == "csv":
        return Response(report_csv(by, rows), media_type="text/csv; charset=utf-8")
    body = report_json(by, per, first.isoformat(), end.isoformat(), rows)
    return Response(body, media_type="application/json")


def report_json(by: str, per: str, since: str, until: str, rows: list[dict[str, Any]]) -> bytes:
    """A UsageReport's JSON, serialised as plain data (a year by user per day is ~200,000
    rows: a model each would cost seconds); tests hold it to UsageReport's schema."""
    body = {
        "by": by,
        "per": per,
        "since": since,
        "until": until,
        "rows": rows,
        "total": total(rows),
    }
    return to_json(body)


def report_range(
    now: float, per: str, since: str | None, until: str | None
) -> tuple[dt.date, dt.date]:
    end = _day("until", until) if until else _today(now) + dt.timedelta(days=1)
    if since:
        first = _day("since", since)
    elif per == "day":
        first = end - dt.timedelta(days=31)
    else:
        month = end.year * 12 + end.month - 1 - 12
        first = dt.date(month // 12, month % 12 + 1, 1)
    if first >= end:
        raise HeadError(422, f"since ({first}) must be before until ({end}; exclusive)")
    if (end - first).days > MAX_REPORT_DAYS:
        raise HeadError(422, f"at most {MAX_REPORT_DAYS} days in one report")
    return first, end


def _today(now: float) -> dt.date:
    return dt.datetime.fromtimestamp(now, dt.UTC).date()


def _day(name: str, text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise HeadError(422, f"{name}: {text!r} is not a day (YYYY-MM-DD)") from None


def report_csv(by: str, rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    columns = [
        "alloc_gpu_hours",
        "util_gpu_hours",
        "idle_gpu_hours",
        "utilization_pct",
        "jobs",
        "failures",
        "preemptions",
    ]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["period", by, *columns])
    for r in rows:
        values = [_cell(r[c]) for c in columns]
        writer.writerow([r["period"], _safe(r["key"]), *values])
    return out.getvalue()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".")
    return str(value)


def _safe(text: str) -> str:
    """A name a spreadsheet would take for a formula (`+x`, `-x`, `@x`) as text."""
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


# ---------------------------------------------------------------------------- idle GPUs
@router.get("/v1/idle-gpus", response_model=u.IdleGpuList)
def idle_gpus(request: Request, who: User) -> u.IdleGpuList:
    """GPUs flagged idle: of the caller's jobs, their teams' for team admins, all for
    admins."""
    head = _head(request)
    visible = None if who.admin else who.may_see_job
    return u.IdleGpuList(gpus=[_flag(f) for f in head.usage.idle.flags(visible)])


@router.get("/v1/jobs/{job_id}/idle-gpus", response_model=u.IdleGpuList, responses=NOT_FOUND)
def job_idle_gpus(
    request: Request, who: User, job_id: Annotated[int, Path(ge=1, le=2**31 - 1)]
) -> u.IdleGpuList:
    """The job's GPUs flagged idle (its owner, team admins and admins)."""
    head = _head(request)
    rec = head.private_job_record(who, job_id)
    flags = [f for f in head.usage.idle.flags() if f.job_id == rec.id]
    return u.IdleGpuList(gpus=[_flag(f) for f in flags])


def _flag(f: IdleFlag) -> u.IdleGpu:
    p = f.policy
    notify = p.action is IdleAction.NOTIFY
    return u.IdleGpu(
        job_id=f.job_id,
        epoch=f.epoch,
        node=f.node,
        index=f.index,
        user=f.user,
        team=f.team,
        idle_since=f.idle_since,
        flagged_at=f.flagged_at,
        last_sample=f.last_sample,
        idle_s=max(0.0, f.last_sample - f.idle_since),
        action=p.action.value,
        action_at=None if notify else f.flagged_at + p.grace_s,
        acted=f.acted,
    )


# ---------------------------------------------------------------------------- policies
@router.get("/v1/idle-policies", response_model=u.IdlePolicyList)
def idle_policies(request: Request, who: User) -> u.IdlePolicyList:
    """Every team's idle-GPU policy."""
    head = _head(request)
    return u.IdlePolicyList(
        policies=[_policy(head, t, p) for t, p in head.usage.policies().items()]
    )


@router.get("/v1/teams/{name}/idle-policy", response_model=u.IdlePolicyInfo, responses=NOT_FOUND)
def idle_policy(request: Request, who: User, name: TeamName) -> u.IdlePolicyInfo:
    head = _head(request)
    policies = head.usage.policies()
    if name not in policies:
        raise HeadError(404, f"no team {name!r}")
    return _policy(head, name, policies[name])


@router.put("/v1/teams/{name}/idle-policy", response_model=u.IdlePolicyInfo, responses=NOT_FOUND)
def put_idle_policy(
    request: Request, who: Admin, name: TeamName, body: u.IdlePolicySpec
) -> u.IdlePolicyInfo:
    """Set a team's idle-GPU policy (admin)."""
    head = _head(request)
    policy = IdlePolicy(IdleAction(body.action), body.window_s, body.grace_s, body.threshold_pct)
    head.usage.set_policy(name, policy)
    return _policy(head, name, policy)


@router.delete("/v1/teams/{name}/idle-policy", response_model=u.IdlePolicyInfo, responses=NOT_FOUND)
def delete_idle_policy(request: Request, who: Admin, name: TeamName) -> u.IdlePolicyInfo:
    """Put a team back on the default idle-GPU policy (admin)."""
    head = _head(request)
    head.usage.set_policy(name, None)
    return _policy(head, name, head.usage.idle.policy(name))


def _policy(head: Head, team: str, p: IdlePolicy) -> u.IdlePolicyInfo:
    return u.IdlePolicyInfo(
        team=team,
        action=p.action.value,
        window_s=p.window_s,
        grace_s=p.grace_s,
        threshold_pct=p.threshold_pct,
        default=head.usage.is_default(team),
    )
