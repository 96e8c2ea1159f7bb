"""The dashboard's pages and their live fragments (GET): overview, nodes and the GPU grid,
jobs, queue, teams and health events (accounting and idle GPUs: usage_pages.py). Each
page's live part is a fragment template that its SSE stream re-renders."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, StreamingResponse

from phalanx.head.dashboard import cluster, listings, live
from phalanx.head.dashboard.render import page, render
from phalanx.head.dashboard.session import Seen, Viewer, head_of
from phalanx.head.service import Head

# Filters as query parameters: bounded, and limited to the characters names may have.
NamePattern = r"^[A-Za-z0-9_.@+-]*$"
Filter = Annotated[str, Query(max_length=128, pattern=NamePattern)]
Text = Annotated[str, Query(max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$")]
States = Annotated[str, Query(max_length=64, pattern=r"^[A-Z,]*$")]
PageNo = Annotated[int, Query(ge=1, le=1_000_000)]
Before = Annotated[int | None, Query(ge=1, le=2**31 - 1)]
NodeState = Literal["", "up", "drain", "down"]
JOB_STATES = ("PD", "R", "CG", "PR", "CD", "F", "CA", "TO", "NF", "OOM")
NAV = (
    ("overview", "/ui/", "Overview"),
    ("nodes", "/ui/nodes", "Nodes"),
    ("jobs", "/ui/jobs", "Jobs"),
    ("queue", "/ui/queue", "Queue"),
    ("teams", "/ui/teams", "Teams"),
    ("serving", "/ui/serving", "Serving"),
    ("health", "/ui/health", "Health"),
    ("accounting", "/ui/accounting", "Accounting"),
    ("idle", "/ui/idle", "Idle GPUs"),
)

router = APIRouter(include_in_schema=False)  # a browser's pages, not the REST API


def base(request: Request, seen: Viewer, current: str) -> dict[str, Any]:
    """What every page's layout needs."""
    return {"viewer": seen, "nav": NAV, "current": current, "path": request.url.path}


def stream(request: Request, event: str, build: Callable[[], str]) -> StreamingResponse:
    """The SSE stream that pushes `build()`'s fragment whenever it changes."""
    feed: live.ChangeFeed = request.app.state.dashboard_feed

    async def rendered() -> str:
        return await asyncio.to_thread(build)

    feed.admit()
    return StreamingResponse(
        live.fragments(request, feed, event, rendered),
        media_type="text/event-stream",
        headers=live.SSE_HEADERS,
    )


def _states(value: str) -> set[str] | None:
    states = {s for s in value.split(",") if s}
    unknown = states - set(JOB_STATES)
    if unknown:
        raise HTTPException(422, f"unknown job state(s): {', '.join(sorted(unknown))}")
    return states or None


# ----------------------------------------------------------------------- overview
OVERVIEW_HOURS = 6  # how far back the overview's utilisation chart opens


def _overview(head: Head) -> str:
    now = head.now()
    latest = head.util_history.series(now - 180, now)  # the last complete minutes, live
    return render("_overview.html", o=cluster.overview(head), latest=json.dumps(latest))


@router.get("/ui/", response_class=HTMLResponse)
def overview(request: Request, seen: Seen) -> HTMLResponse:
    head = head_of(request)
    now = head.now()
    past = head.util_history.series(now - OVERVIEW_HOURS * 3600, now)
    return page(
        "overview.html",
        **base(request, seen, "overview"),
        body=_overview(head),
        history=json.dumps({"cluster": past}),
        hours=OVERVIEW_HOURS,
    )


@router.get("/ui/live/overview")
def overview_live(request: Request, seen: Seen) -> StreamingResponse:
    head = head_of(request)
    return stream(request, "fragment", lambda: _overview(head))


# ----------------------------------------------------------------------- nodes
def _nodes(head: Head, seen: Viewer, state: str, q: str, page_no: int, per: int) -> str:
    found = cluster.node_page(head, seen.who, state or None, q or None, page_no, per)
    query = {"state": state, "q": q, "per": per}
    return render("_nodes.html", p=found, viewer=seen, query=query)


@router.get("/ui/nodes", response_class=HTMLResponse)
def nodes(
    request: Request,
    seen: Seen,
    state: NodeState = "",
    q: Filter = "",
    page_no: Annotated[int, Query(alias="page", ge=1, le=1_000_000)] = 1,
    per: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> HTMLResponse:
    head = head_of(request)
    body = _nodes(head, seen, state, q, page_no, per)
    return page(
        "nodes.html",
        request=request,
        **base(request, seen, "nodes"),
        body=body,
        live=f"/ui/live/nodes?{request.url.query}",
        state=state,
        q=q,
        per=per,
    )


@router.get("/ui/live/nodes")
def nodes_live(
    request: Request,
    seen: Seen,
    state: NodeState = "",
    q: Filter = "",
    page_no: Annotated[int, Query(alias="page", ge=1, le=1_000_000)] = 1,
    per: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> StreamingResponse:
    head = head_of(request)
    return stream(request, "fragment", lambda: _nodes(head, seen, state, q, page_no, per))


# ----------------------------------------------------------------------- jobs
JobScope = Literal["active", "ended"]


@dataclass(frozen=True)
class JobsQuery:
    """The jobs page's filters and page, as its URL gives them (the page and its live
    stream take the same)."""

    scope: str
    state: str
    user: str
    team: str
    name: str
    page_no: int
    before: int | None
    per: int


def jobs_query(
    scope: JobScope = "active",
    state: States = "",
    user: Filter = "",
    team: Filter = "",
    name: Text = "",
    page_no: Annotated[int, Query(alias="page", ge=1, le=1_000_000)] = 1,
    before: Before = None,
    per: Annotated[int, Query(ge=1, le=200)] = 50,
) -> JobsQuery:
    return JobsQuery(scope, state, user, team, name, page_no, before, per)


Jobs = Annotated[JobsQuery, Depends(jobs_query)]


def _jobs(head: Head, seen: Viewer, q: JobsQuery) -> str:
    found = listings.job_page(
        head,
        seen.who,
        q.scope,
        _states(q.state),
        q.user or None,
        q.team or None,
        q.name or None,
        q.page_no,
        q.before,
        q.per,
    )
    query = {
        "scope": q.scope,
        "state": q.state,
        "user": q.user,
        "team": q.team,
        "name": q.name,
        "per": q.per,
    }
    return render("_jobs.html", p=found, query=query)


@router.get("/ui/jobs", response_class=HTMLResponse)
def jobs(request: Request, seen: Seen, q: Jobs) -> HTMLResponse:
    head = head_of(request)
    return page(
        "jobs.html",
        request=request,
        **base(request, seen, "jobs"),
        body=_jobs(head, seen, q),
        live=f"/ui/live/jobs?{request.url.query}",
        scope=q.scope,
        state=q.state,
        user=q.user,
        team=q.team,
        name=q.name,
        states=JOB_STATES,
        per=q.per,
    )


@router.get("/ui/live/jobs")
def jobs_live(request: Request, seen: Seen, q: Jobs) -> StreamingResponse:
    head = head_of(request)
    _states(q.state)  # 422 before the stream starts
    return stream(request, "fragment", lambda: _jobs(head, seen, q))


# ----------------------------------------------------------------------- queue
def _queue(head: Head, seen: Viewer, page_no: int, per: int) -> str:
    found = listings.queue_page(head, seen.who, page_no, per)
    return render("_queue.html", p=found, query={"per": per})


@router.get("/ui/queue", response_class=HTMLResponse)
def queue(
    request: Request,
    seen: Seen,
    page_no: Annotated[int, Query(alias="page", ge=1, le=1_000_000)] = 1,
    per: Annotated[int, Query(ge=1, le=200)] = 50,
) -> HTMLResponse:
    head = head_of(request)
    return page(
        "queue.html",
        **base(request, seen, "queue"),
        body=_queue(head, seen, page_no, per),
        live=f"/ui/live/queue?{request.url.query}",
    )


@router.get("/ui/live/queue")
def queue_live(
    request: Request,
    seen: Seen,
    page_no: Annotated[int, Query(alias="page", ge=1, le=1_000_000)] = 1,
    per: Annotated[int, Query(ge=1, le=200)] = 50,
) -> StreamingResponse:
    head = head_of(request)
    return stream(request, "fragment", lambda: _queue(head, seen, page_no, per))


# ----------------------------------------------------------------------- teams
def _teams(head: Head) -> str:
    """Every team (head.teams: quotas, members) with its fair-share standing where the
    scheduler has one (head.shares: none before a node joins)."""
    shares = head.shares()
    standing = {t.team: t for t in shares.teams}
    return render("_teams.html", s=shares, teams=head.teams().teams, standing=standing)


@router.get("/ui/teams", response_class=HTMLResponse)
def teams(request: Request, seen: Seen) -> HTMLResponse:
    head = head_of(request)
    return page(
        "teams.html", **base(request, seen, "teams"), body=_teams(head), live="/ui/live/teams"
    )


@router.get("/ui/live/teams")
def teams_live(request: Request, seen: Seen) -> StreamingResponse:
    head = head_of(request)
    return stream(request, "fragment", lambda: _teams(head))


# ----------------------------------------------------------------------- health
def _health(head: Head, kind: str, node: str, before: int | None, per: int) -> str:
    found = listings.event_page(head, {kind} if kind else None, node or None, before, per)
    return render("_health.html", p=found, query={"kind": kind, "node": node, "per": per})


EventKind = Annotated[str, Query(max_length=32, pattern=r"^[a-z_]*$")]


@router.get("/ui/health", response_class=HTMLResponse)
def health(
    request: Request,
    seen: Seen,
    kind: EventKind = "",
    node: Filter = "",
    before: Before = None,
    per: Annotated[int, Query(ge=1, le=500)] = 100,
) -> HTMLResponse:
    head = head_of(request)
    return page(
        "health.html",
        **base(request, seen, "health"),
        body=_health(head, kind, node, before, per),
        live=f"/ui/live/health?{request.url.query}",
        kinds=listings.event_kinds(head),
        kind=kind,
        node=node,
    )


@router.get("/ui/live/health")
def health_live(
    request: Request,
    seen: Seen,
    kind: EventKind = "",
    node: Filter = "",
    before: Before = None,
    per: Annotated[int, Query(ge=1, le=500)] = 100,
) -> StreamingResponse:
    head = head_of(request)
    return stream(request, "fragment", lambda: _health(head, kind, node, before, per))
