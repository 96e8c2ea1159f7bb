"""REST routes of the telemetry pipeline: agents' sample batches in, a job's stats out.

- `POST /v1/telemetry`: a node's agent posts its samples (node credential only, its own
  node only); queued for the store's thread (head/tsdb.py), answered at once.
- `GET /v1/jobs/{ref}/stats`: a job's efficiency (head/jobstats.py), with the same access
  rules as the job's detail; live while it runs, final (from its kept summary) once it
  ended and its last samples are in.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.types import ASGIApp, Receive, Scope

from phalanx.api import models as m
from phalanx.api import telemetry as t
from phalanx.head.auth import AuthError, Forbidden, Principal
from phalanx.head.control import HeadError
from phalanx.head.jobstats import progress_series
from phalanx.head.plainasgi import PlainPost, credentials, read_model
from phalanx.head.service import Head
from phalanx.head.tsdb import Overloaded

JobRef = Annotated[
    str,
    Path(max_length=18, pattern=m.JOB_REF_PATTERN, description="`123`, or `123_4` (array task)"),
]


def _err(description: str) -> dict[str, Any]:
    return {"model": m.ErrorBody, "description": description}


async def _principal(request: Request) -> Principal:
    head: Head = request.app.state.head
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("missing token: send `Authorization: Bearer TOKEN`")
    return head.authenticate(token.strip())


Who = Annotated[Principal, Depends(_principal)]


class FastTelemetry(PlainPost):
    """`POST /v1/telemetry` as plain ASGI in front of FastAPI (as FastSubmit does for
    submits): a thousand nodes post every 10 s, and FastAPI's request, routing and
    dependency layers would cost the head more than storing the samples does
    (bench/telemetry.py). Same checks, limits and error bodies; the FastAPI route below
    declares it (OpenAPI) and serves it if this is bypassed."""

    def __init__(self, app: ASGIApp, head: Head) -> None:
        async def answer(scope: Scope, receive: Receive) -> tuple[int, bytes]:
            return 200, await _answer(head, scope, receive)

        super().__init__(app, "/v1/telemetry", answer)


async def _answer(head: Head, scope: Scope, receive: Receive) -> bytes:
    token, length = credentials(scope)
    who = head.authenticate(token)
    if who.kind != "node":
        raise Forbidden("telemetry needs a node credential")
    batch = await read_model(receive, length, t.TelemetryBatch)
    return _accept(head, who, batch).model_dump_json().encode()


def _accept(head: Head, who: Principal, batch: t.TelemetryBatch) -> t.TelemetryAck:
    if who.kind != "node":
        raise Forbidden("telemetry needs a node credential")
    if who.node != batch.node:
        raise Forbidden(f"this node credential is node {who.node!r}'s, not {batch.node!r}")
    try:
        head.tsdb.submit(batch)
    except Overloaded as e:
        raise HeadError(503, str(e)) from None
    return t.TelemetryAck(
        samples=len(batch.times),
        dropped_total=head.tsdb.counters.by_node_dropped.get(batch.node, 0),
    )


def router(head: Head) -> APIRouter:
    r = APIRouter()

    @r.post(
        "/v1/telemetry",
        response_model=t.TelemetryAck,
        responses={503: _err("the head's telemetry ingest is behind: retry shortly")},
    )
    def telemetry(who: Who, batch: t.TelemetryBatch) -> t.TelemetryAck:
        """A node's GPU and job samples (its agent's sampler; node credential only).
        Served by FastTelemetry in front of the app; this declaration documents it."""
        return _accept(head, who, batch)

    @r.get("/v1/jobs/{job_id}/stats", response_model=t.JobStats, responses={404: _err("no job")})
    def stats(
        job_id: JobRef,
        who: Who,
        resolution: Annotated[
            t.Resolution | None,
            Query(
                description="of the utilisation series: raw, minute or hour (default: by "
                "the job's length)"
            ),
        ] = None,
        series: Annotated[bool, Query(description="include the time series")] = True,
    ) -> t.JobStats:
        """A job's GPU efficiency: per-GPU utilisation, memory and energy, idle GPUs, CPU
        and memory use, MFU and tokens/s, and notes (`phalanx jobstats`)."""
        who = Head.require_user(who)
        rec = head.job_record(who, head.job_id(job_id))
        return job_stats(head, rec.id, resolution, series)

    return r


def job_stats(head: Head, job_id: int, resolution: t.Resolution | None, series: bool) -> t.JobStats:
    """The stats of a job: its kept summary once final, its samples while live; per-GPU
    figures and series from whatever retention still holds."""
    store = head.tsdb
    now = head.now()
    facts = store.facts(job_id, now)
    if facts is None:
        raise HeadError(404, f"no job {job_id}")
    live = store.stats(facts)
    # Final once the store kept its summary (`settle_s` after the end, when the agent's
    # last samples are in); until then the live figures, not yet final.
    summary = store.summary(job_id) if facts.final else None
    if summary is None:
        out = live.model_copy(update={"final": False})
    else:
        out = summary.model_copy(update={"per_gpu": live.per_gpu})
    if not series:
        return out
    res, util = store.series(job_id, resolution)
    mfu, tps = progress_series(store.progress_rows(job_id))
    return out.model_copy(
        update={
            "resolution": res,
            "util_series": util,
            "mfu_series": mfu,
            "tokens_per_s_series": tps,
        }
    )
