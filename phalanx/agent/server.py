"""The agent's own HTTP API: health, rank logs, srun steps, execs, fault injection
(control-plane.md)."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from phalanx import __version__
from phalanx.api.asgi import ApiVersion, BearerGate, BodyLimit, bearer_token
from phalanx.api.models import (
    MAX_INT32,
    MAX_INT64,
    ErrorBody,
    ExecLaunch,
    FaultInjection,
    Health,
    LogChunk,
    PeerHeadView,
    StepLaunch,
    StepStatus,
    validation_detail,
)

from . import logfiles
from .execrun import ExecManager, ExecRefused
from .gpus import FaultRejected
from .headlink import HeadSeen
from .logfiles import Stream
from .reconcile import Reconciler
from .steps import StepExists, StepManager

_COMMON: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "the body is not valid JSON"},
    401: {"model": ErrorBody, "description": "no token this agent knows (before any body)"},
    413: {"model": ErrorBody, "description": "a body over the agent's limit, refused unread"},
    422: {"model": ErrorBody, "description": "invalid request (the fields at fault named)"},
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "missing or wrong token"},
    403: {"model": ErrorBody, "description": "a valid token of another job"},
    404: {"model": ErrorBody, "description": "no such job, rank or step on this node"},
}

Authorization = Annotated[str | None, Header()]
Offset = Annotated[int, Query(ge=0, le=MAX_INT64)]  # a file offset (seek takes 64 bits)
# The largest request body the agent reads (an srun step launch with its environment is
# the largest, a few KiB per task); larger ones get 413 unread.
MAX_BODY_BYTES = 4 * 1024 * 1024
# /metrics checks its own tokens (agent/metrics.py: the agent secret or the scrape token).
OPEN_PATHS = frozenset({"/healthz", "/metrics"})


def create_app(
    *,
    secret: str,
    reconciler: Reconciler,
    steps: StepManager,
    inject: Callable[[FaultInjection], None] | None = None,
    head_seen: HeadSeen | None = None,
    execs: ExecManager | None = None,
) -> FastAPI:
    """The agent API. `secret` is the agent secret the head holds (log proxy, execs, fault
    injection); srun inside a job uses that job's step token, which only opens that job.
    `inject` records a fault on fake GPUs (FakeProvider.inject); None: real GPUs.
    `execs` runs `phalanx exec` commands (None: this agent serves none)."""
    app = FastAPI(title="Phalanx agent", version=__version__, responses=_COMMON)

    @app.exception_handler(RequestValidationError)
    async def invalid(_r: Request, e: RequestValidationError) -> JSONResponse:
        """422 with a `detail` sentence naming the fields at fault, as the head answers."""
        return JSONResponse(status_code=422, content={"detail": validation_detail(e.errors())})

    def known(token: str) -> bool:
        """Whether `token` is the agent secret, the step token of a job it runs, or the
        head's peer secret (other agents asking during a head outage)."""
        desired = reconciler.desired()
        found = hmac.compare_digest(token.encode(), secret.encode())
        for a in desired.jobs if desired else []:
            found |= hmac.compare_digest(token.encode(), a.step_token.encode())
        return found or (head_seen is not None and head_seen.accepts(token))

    # In front of the routes, outermost last: the version check, then the token (401
    # before any body is read: an unauthenticated flood costs the agent no memory, so it
    # cannot starve the heartbeat), then the body limit (413 unread, or once past it).
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    app.add_middleware(BearerGate, known=known, open_paths=OPEN_PATHS)
    app.add_middleware(ApiVersion, me="agent")

    def check(authorization: str | None, job_id: int, *, secret_ok: bool = True) -> None:
        """401 for no/unknown token, 403 for another job's step token."""
        token = bearer_token(authorization)
        if token is None:
            raise HTTPException(401, "missing Authorization: Bearer token")
        if secret_ok and hmac.compare_digest(token, secret):
            return
        desired = reconciler.desired()
        for a in desired.jobs if desired else []:
            if hmac.compare_digest(token, a.step_token):
                if a.job_id == job_id:
                    return
                raise HTTPException(403, f"this token belongs to another job, not job {job_id}")
        raise HTTPException(401, "invalid token")

    @app.get("/healthz", response_model=Health)
    def healthz() -> Health:
        errors = reconciler.survivals.total()
        return Health(status="ok", version=__version__, loop_errors=errors)

    @app.get("/v1/logs/{job_id}", response_model=LogChunk, responses=_ERRORS)
    def rank_logs(
        job_id: int,
        authorization: Authorization = None,
        rank: Annotated[int, Query(ge=0, le=MAX_INT32)] = 0,
        stream: Stream = "stdout",
        offset: Offset = 0,
    ) -> LogChunk:
        check(authorization, job_id)
        found = reconciler.rank_log_files(job_id, rank)
        if found is None:
            raise HTTPException(404, f"no logs for job {job_id} rank {rank} on this node")
        out, err, ended, owners = found
        return _chunk(job_id, rank, stream, offset, (out, err, ended), owners)

    @app.post(
        "/v1/steps",
        response_model=StepStatus,
        responses={**_ERRORS, 409: {"model": ErrorBody, "description": "step id taken"}},
    )
    def launch_step(req: StepLaunch, authorization: Authorization = None) -> StepStatus:
        check(authorization, req.job_id, secret_ok=False)
        a = reconciler.assignment(req.job_id)
        if a is None:
            raise HTTPException(404, f"job {req.job_id} is not running on this node")
        try:
            return steps.launch(a, req)
        except StepExists as e:
            raise HTTPException(409, str(e)) from e

    @app.get("/v1/steps/{job_id}/{step_id}", response_model=StepStatus, responses=_ERRORS)
    def step_status(job_id: int, step_id: int, authorization: Authorization = None) -> StepStatus:
        check(authorization, job_id)
        status = steps.status(job_id, step_id)
        if status is None:
            raise HTTPException(404, f"no step {job_id}.{step_id} on this node")
        return status

    @app.get("/v1/steps/{job_id}/{step_id}/logs", response_model=LogChunk, responses=_ERRORS)
    def step_logs(
        job_id: int,
        step_id: int,
        authorization: Authorization = None,
        task: Annotated[int, Query(ge=0, le=MAX_INT32)] = 0,
        stream: Stream = "stdout",
        offset: Offset = 0,
    ) -> LogChunk:
        check(authorization, job_id)
        found = steps.task_log(job_id, step_id, task)
        if found is None:
            raise HTTPException(404, f"no task {task} of step {job_id}.{step_id} on this node")
        return _chunk(job_id, task, stream, offset, found)

    @app.delete("/v1/steps/{job_id}/{step_id}", response_model=StepStatus, responses=_ERRORS)
    def kill_step(job_id: int, step_id: int, authorization: Authorization = None) -> StepStatus:
        check(authorization, job_id)
        if not steps.kill(job_id, step_id, reconciler.kill_grace_s()):
            raise HTTPException(404, f"no step {job_id}.{step_id} on this node")
        status = steps.status(job_id, step_id)
        assert status is not None
        return status

    @app.post(
        "/v1/exec",
        response_class=StreamingResponse,
        responses={
            200: {
                "content": {"application/x-ndjson": {}},
                "description": "one ExecFrame per line: output, keepalives, then the exit",
            },
            401: _ERRORS[401],
            409: {"model": ErrorBody, "description": "the rank does not run on this node"},
            429: {"model": ErrorBody, "description": "this node runs as many execs as it may"},
        },
    )
    async def run_exec(req: ExecLaunch, authorization: Authorization = None) -> StreamingResponse:
        """Run a command beside a running rank (`phalanx exec`, through the head only)."""
        token = bearer_token(authorization)
        if token is None or not hmac.compare_digest(token.encode(), secret.encode()):
            raise HTTPException(401, "execs are started by the head, with the agent secret")
        if execs is None:
            raise HTTPException(409, "this agent runs no execs")
        try:
            run = await asyncio.to_thread(execs.start, req)  # forks: off the event loop
        except ExecRefused as e:
            raise HTTPException(e.status, e.detail) from None
        return StreamingResponse(execs.frames(run), media_type="application/x-ndjson")

    @app.post(
        "/v1/faults",
        status_code=204,
        responses={
            401: _ERRORS[401],
            409: {"model": ErrorBody, "description": "this node has real GPUs"},
            422: {"model": ErrorBody, "description": "no such GPU, or an inconsistent fault"},
        },
    )
    def inject_fault(fault: FaultInjection, authorization: Authorization = None) -> Response:
        token = bearer_token(authorization)
        if token is None or not hmac.compare_digest(token.encode(), secret.encode()):
            raise HTTPException(401, "faults are injected by the head, with the agent secret")
        if inject is None:
            raise HTTPException(
                409,
                "this node has real GPUs: faults can only be injected on a node whose agent "
                "runs with --fake-gpus",
            )
        try:
            inject(fault)
        except FaultRejected as e:
            raise HTTPException(422, str(e)) from None
        return Response(status_code=204)

    @app.get(
        "/v1/peer/head",
        response_model=PeerHeadView,
        responses={401: {"model": ErrorBody, "description": "missing or wrong peer secret"}},
    )
    def peer_head(authorization: Authorization = None) -> PeerHeadView:
        """Another node's agent asks, its lease running out, how long ago the head answered
        this one (docs/fault-tolerance.md#head-outages). Only with the head's peer secret."""
        token = bearer_token(authorization)
        if token is None or head_seen is None or not head_seen.accepts(token):
            raise HTTPException(401, "peers ask with the head's peer secret")
        return head_seen.view()

    return app


def _chunk(
    job_id: int,
    rank: int,
    stream: Stream,
    offset: int,
    found: tuple[Path, Path, bool],
    owners: tuple[int | None, int | None] = (None, None),
) -> LogChunk:
    out, err, ended = found
    path = out if stream == "stdout" else err
    if stream == "stderr" and err == out:
        # stderr was merged into the stdout file (`-o` without `-e`): nothing separate.
        return LogChunk(
            job_id=job_id, rank=rank, stream=stream, offset=0, next_offset=0, data="", eof=ended
        )
    owner = owners[0] if stream == "stdout" else owners[1]
    c = logfiles.read_chunk(path, offset, ended=ended, owner=owner)
    return LogChunk(
        job_id=job_id,
        rank=rank,
        stream=stream,
        offset=c.offset,
        next_offset=c.next_offset,
        data=c.data,
        eof=c.eof,
    )
