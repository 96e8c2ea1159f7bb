"""The dashboard's usage pages: `/ui/accounting` (the usage report of head/usage.py, as
`/v1/reports/usage` answers it, with its CSV) and `/ui/idle` (the GPUs idle-GPU detection
flagged, and each team's idle policy). Who sees what is the REST API's rule: users their
own usage and jobs, team admins their teams', admins everyone's."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from phalanx.api import usage as u
from phalanx.head import usage_routes
from phalanx.head.accounting import Scope, total
from phalanx.head.control import HeadError
from phalanx.head.dashboard.pages import base, stream
from phalanx.head.dashboard.render import HEADERS, page, render
from phalanx.head.dashboard.session import Seen, Viewer, head_of
from phalanx.head.service import Head

MAX_SHOWN_ROWS = 2000  # a page shows at most this many rows; the CSV has them all
MAX_SHOWN_FLAGS = 1000  # the idle page lists at most this many (oldest idle first)
Day = Annotated[str, Query(max_length=10, pattern=r"^(\d{4}-\d{2}-\d{2})?$")]
COLUMNS = (
    ("alloc_gpu_hours", "Allocated GPU·h"),
    ("util_gpu_hours", "Used GPU·h (utilisation-weighted)"),
    ("idle_gpu_hours", "Idle GPU·h (flagged)"),
    ("utilization_pct", "Utilisation"),
    ("jobs", "Jobs ended"),
    ("failures", "Failures"),
    ("preemptions", "Preemptions"),
)

router = APIRouter(include_in_schema=False)  # a browser's pages, not the REST API


# ----------------------------------------------------------------------- accounting
def _this_month(head: Head) -> tuple[str, str]:
    """The first day of this month (UTC) and of the next."""
    today = dt.datetime.fromtimestamp(head.now(), dt.UTC).date()
    first = today.replace(day=1)
    month = first.year * 12 + first.month  # the next month's, 0-based months
    return first.isoformat(), dt.date(month // 12, month % 12 + 1, 1).isoformat()


def _scope(seen: Viewer) -> Scope | None:
    """The report rows `seen` may see (as /v1/reports/usage decides)."""
    who = seen.who
    return None if who.admin else Scope(who.user or "", who.admin_of)


def _report(
    head: Head, seen: Viewer, by: u.GroupBy, per: u.Period, since: str, until: str
) -> tuple[str, str, list[dict[str, Any]]]:
    """The report's first day, end (exclusive) and rows; HeadError 422 for a bad range."""
    first, end = usage_routes.report_range(head.now(), per, since or None, until or None)
    rows = head.usage.report(by, per, first.isoformat(), end.isoformat(), _scope(seen))
    return first.isoformat(), end.isoformat(), rows


@router.get("/ui/accounting", response_class=HTMLResponse)
def accounting(
    request: Request,
    seen: Seen,
    by: u.GroupBy = "team",
    per: u.Period = "month",
    since: Day = "",
    until: Day = "",
) -> HTMLResponse:
    """The usage report over [since, until) (default: this month) by user, team or QOS,
    per day or month."""
    head = head_of(request)
    if not since and not until:
        since, until = _this_month(head)
    form = {"by": by, "per": per, "since": since, "until": until}
    context: dict[str, Any] = {**base(request, seen, "accounting"), "form": form}
    context.update(columns=COLUMNS, shown=MAX_SHOWN_ROWS, scope=_scope(seen))
    try:
        first, end, rows = _report(head, seen, by, per, since, until)
    except HeadError as e:  # a bad range: the form again, with what is wrong
        return page("accounting.html", e.status, **context, problem=e.detail, rows=None)
    csv = "/ui/accounting.csv?" + "&".join(f"{k}={v}" for k, v in form.items() if v)
    return page(
        "accounting.html",
        request=request,
        **context,
        problem=None,
        rows=rows[:MAX_SHOWN_ROWS],
        count=len(rows),
        total=total(rows),
        first=first,
        end=end,
        csv=csv,
    )


@router.get("/ui/accounting.csv")
def accounting_csv(
    request: Request,
    seen: Seen,
    by: u.GroupBy = "team",
    per: u.Period = "month",
    since: Day = "",
    until: Day = "",
) -> Response:
    """The same report as `/v1/reports/usage?format=csv` (all rows), for the signed-in
    viewer (the browser's session is not an API token)."""
    head = head_of(request)
    if not since and not until:
        since, until = _this_month(head)
    first, end, rows = _report(head, seen, by, per, since, until)
    name = f"phalanx-usage-{by}-{per}-{first}-{end}.csv"
    headers = {**HEADERS, "Content-Disposition": f'attachment; filename="{name}"'}
    return Response(
        usage_routes.report_csv(by, rows), media_type="text/csv; charset=utf-8", headers=headers
    )


# ----------------------------------------------------------------------- idle GPUs
def _idle(head: Head, seen: Viewer) -> str:
    who = seen.who
    flags = head.usage.idle.flags(None if who.admin else who.may_see_job)
    mine = who.teams | who.admin_of
    policies = {team: p for team, p in head.usage.policies().items() if who.admin or team in mine}
    shown = sorted(flags, key=lambda f: (f.idle_since, f.node, f.index))[:MAX_SHOWN_FLAGS]
    return render("_idle.html", flags=shown, count=len(flags), policies=policies, viewer=seen)


@router.get("/ui/idle", response_class=HTMLResponse)
def idle(request: Request, seen: Seen) -> HTMLResponse:
    """The GPUs flagged idle that the viewer may see, and their teams' idle policies."""
    head = head_of(request)
    return page(
        "idle.html",
        request=request,
        **base(request, seen, "idle"),
        body=_idle(head, seen),
        live="/ui/live/idle",
    )


@router.get("/ui/live/idle")
def idle_live(request: Request, seen: Seen) -> StreamingResponse:
    head = head_of(request)
    return stream(request, "fragment", lambda: _idle(head, seen))
