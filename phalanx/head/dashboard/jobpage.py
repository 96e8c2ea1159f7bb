"""A job's page: its spec, placement, events, GPUs and charts (a live fragment), a live
tail of one rank's log, and cancel. Who sees what is the REST API's rule: a job of another
team is 403 (none at all: 404); its logs only for its owner, team admins and admins."""

from __future__ import annotations

import asyncio
import html
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import httpx
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from phalanx.api import models as m
from phalanx.api import telemetry as t
from phalanx.core import JobState
from phalanx.head import jobcontrol, telemetry_api
from phalanx.head.control import HeadError
from phalanx.head.dashboard import live, series
from phalanx.head.dashboard.pages import base, stream
from phalanx.head.dashboard.render import HEADERS, page, render
from phalanx.head.dashboard.session import Acting, Seen, Viewer, head_of, still_signed_in
from phalanx.head.records import JobRecord, NodeRecord
from phalanx.head.service import Head

JobId = Annotated[int, Path(ge=1, le=2**31 - 1)]
Rank = Annotated[int, Query(ge=0, le=1_000_000)]
Stream = Literal["stdout", "stderr"]
TAIL_BYTES = 64 * 1024  # what a newly opened log view shows of the past
LOG_POLL_S = 0.5
WAIT_START_S = 2.0  # how often a stream for a job not yet running looks again

router = APIRouter(include_in_schema=False)  # a browser's pages, not the REST API


def _detail(head: Head, seen: Viewer, job_id: int) -> dict[str, Any]:
    rec = head.job_record(seen.who, job_id)
    detail = head.job_detail(seen.who, job_id)
    job = detail.job
    private = seen.who.may_see_job(job.user, job.team)
    # Its GPUs flagged idle: for those who may see its private parts (as /v1/jobs/ID/idle-gpus).
    idle = [f for f in head.usage.idle.flags() if f.job_id == rec.id] if private else []
    return {
        "idle": idle,
        "idle_at": {(f.node, f.index): f for f in idle},
        "d": detail,
        "job": job,
        "private": private,
        "can_cancel": private and not JobState(job.state).terminal,
        "ranks": _ranks(detail),
        "series": json.dumps(_series(head, rec, detail)),
        "spec_json": detail.spec.model_dump_json(indent=2, exclude_defaults=True),
    }


def _series(head: Head, rec: JobRecord, detail: m.JobDetail) -> dict[str, Any]:
    """The charts' data: the GPU utilisation series and the loss/MFU series."""
    return {
        "gpu": series.gpu_series(head, rec),
        "progress": series.progress_series(detail.progress),
    }


def _ranks(detail: m.JobDetail) -> int:
    spec = detail.spec
    if spec.launcher == "batch":
        return 1
    if spec.launcher == "node":
        return spec.nodes
    return spec.nodes * spec.gpus_per_node


def _fragment(head: Head, seen: Viewer, job_id: int) -> str:
    return render("_job.html", **_detail(head, seen, job_id), viewer=seen)


def _refused(request: Request, seen: Viewer, e: HeadError) -> HTMLResponse:
    return page(
        "error.html", e.status, **base(request, seen, "jobs"), code=e.status, message=e.detail
    )


MAX_GPU_ROWS = 64  # the efficiency card's per-GPU table (the rest: `phalanx jobstats`)


def _stats(head: Head, job_id: int) -> t.JobStats | None:
    """The job's efficiency and chart history from the telemetry store (None: none)."""
    try:
        return telemetry_api.job_stats(head, job_id, None, True)
    except HeadError:
        return None


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
def job(
    request: Request, job_id: JobId, seen: Seen, rank: Rank = 0, log: Stream = "stdout"
) -> HTMLResponse:
    head = head_of(request)
    try:
        context = _detail(head, seen, job_id)
    except HeadError as e:
        return _refused(request, seen, e)
    stats = _stats(head, job_id)
    past = series.history(stats, head.tsdb.progress_rows(job_id))
    return page(
        "job.html",
        **base(request, seen, "jobs"),
        **context,
        body=render("_job.html", **context, viewer=seen),
        rank=min(rank, max(0, context["ranks"] - 1)),
        log=log,
        stats=stats,
        gpu_rows=(stats.per_gpu[:MAX_GPU_ROWS] if stats is not None else []),
        history=json.dumps(past),
    )


@router.get("/ui/live/jobs/{job_id}")
def job_live(request: Request, job_id: JobId, seen: Seen) -> StreamingResponse:
    head = head_of(request)
    head.job_record(seen.who, job_id)  # 403/404 before the stream starts

    def build() -> str:
        try:
            return _fragment(head, seen, job_id)
        except HeadError as e:  # gone or hidden since: say so in place
            return f'<p class="error">{html.escape(e.detail)}</p>'

    return stream(request, "fragment", build)


@router.get("/ui/jobs/{job_id}/series")
def job_series(request: Request, job_id: JobId, seen: Seen) -> dict[str, Any]:
    """The job's chart data (series.gpu_series and series.progress_series) as JSON."""
    head = head_of(request)
    rec = head.job_record(seen.who, job_id)
    return _series(head, rec, head.job_detail(seen.who, job_id))


@router.get("/ui/live/jobs/{job_id}/log")
def job_log(
    request: Request, job_id: JobId, seen: Seen, rank: Rank = 0, log: Stream = "stdout"
) -> StreamingResponse:
    """One rank's log as it grows (SSE `log` events of escaped text; `eof` when it ends).
    Each event's id is the byte offset after it, so a reconnecting browser resumes there."""
    head = head_of(request)
    rec = head.private_job_record(seen.who, job_id)  # 403/404 before the stream starts
    resume = request.headers.get("last-event-id", "")
    start = int(resume) if resume.isdigit() and len(resume) < 19 else None
    feed: live.ChangeFeed = request.app.state.dashboard_feed
    feed.admit()
    return StreamingResponse(
        feed.counted(_follow(request, head, seen, rec.id, rank, log, start)),
        media_type="text/event-stream",
        headers=live.SSE_HEADERS,
    )


async def _follow(
    request: Request,
    head: Head,
    seen: Viewer,
    job_id: int,
    rank: int,
    log: Stream,
    offset: int | None,
) -> AsyncIterator[str]:
    client: httpx.AsyncClient = request.app.state.http
    yield f"retry: {live.RETRY_MS}\n\n"
    waiting_said = False
    node: NodeRecord | None = None
    while not await request.is_disconnected():
        if not still_signed_in(request):
            yield live.message("log", "\n[your session ended: sign in again]\n")
            yield live.message("eof", "")
            return
        try:
            if node is None:
                node = head.log_source(head.job_record(seen.who, job_id), rank)
        except HeadError as e:
            if e.status != 409:  # never will have logs here (ended unstarted, no such rank)
                yield live.message("log", f"[{html.escape(e.detail)}]\n")
                yield live.message("eof", "")
                return
            if not waiting_said:
                yield live.message("log", "[waiting for the job to start]\n")
                waiting_said = True
            await asyncio.sleep(WAIT_START_S)
            continue
        url = f"{node.agent_url}/v1/logs/{job_id}"
        auth = {"Authorization": f"Bearer {node.agent_secret}"}
        try:
            if offset is None:  # where the tail starts: the file's size, less TAIL_BYTES
                r = await client.get(
                    url, params={"rank": rank, "stream": log, "offset": m.MAX_INT64}, headers=auth
                )
                if r.status_code == 200:
                    size = m.LogChunk.model_validate_json(r.content).offset
                    offset = max(0, size - TAIL_BYTES)
            if offset is not None:
                r = await client.get(
                    url, params={"rank": rank, "stream": log, "offset": offset}, headers=auth
                )
        except httpx.HTTPError:
            node = None  # unreachable for now; where the rank runs may change (a requeue)
            await asyncio.sleep(WAIT_START_S)
            continue
        if r.status_code == 404:  # the rank has not written yet
            await asyncio.sleep(LOG_POLL_S)
            continue
        if r.status_code != 200 or offset is None:
            node = None
            await asyncio.sleep(WAIT_START_S)
            continue
        chunk = m.LogChunk.model_validate_json(r.content)
        if chunk.data:
            offset = chunk.next_offset
            yield f"id: {offset}\n" + live.message("log", html.escape(chunk.data))
        if chunk.eof:
            yield live.message("eof", "")
            return
        if not chunk.data:
            await asyncio.sleep(LOG_POLL_S)


@router.post("/ui/jobs/{job_id}/cancel")
def cancel(request: Request, job_id: JobId, seen: Acting) -> Response:
    head = head_of(request)
    try:
        head.control_jobs(lambda tx: jobcontrol.cancel(head.mirror, tx, seen.who, str(job_id)))
    except HeadError as e:
        return _refused(request, seen, e)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303, headers=HEADERS)
