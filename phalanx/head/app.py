"""The head's REST API (FastAPI): every route but /healthz needs a bearer token."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import httpx
from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError
from pydantic_core import to_json
from starlette.types import ASGIApp, Receive, Scope, Send

from phalanx import __version__
from phalanx.api import models as m
from phalanx.api import version
from phalanx.api.asgi import (
    MAX_BODY_BYTES,
    ApiVersion,
    BodyLimit,
    declared_too_large,
    too_large_detail,
)
from phalanx.api.asgi import bearer_token as _bearer_of
from phalanx.api.asgi import json_error as _json
from phalanx.head import (
    admin,
    dashboard,
    execproxy,
    heartbeat_api,
    jobcontrol,
    jobs,
    leaving,
    metricsapi,
    selfcontrol,
    serving_routes,
    serving_stats,
    shedding,
    telemetry_api,
    usage_routes,
)
from phalanx.head.auth import AuthError, Forbidden, Principal
from phalanx.head.control import HeadError
from phalanx.head.leader import Role
from phalanx.head.notify import Notifier
from phalanx.head.plainasgi import PlainPost, error_answer, read_body
from phalanx.head.service import Head

_bearer = HTTPBearer(auto_error=False)
JOBSPEC_REF = "#/components/schemas/JobSpec"


def _err(description: str) -> dict[str, Any]:
    return {"model": m.ErrorBody, "description": description}


COMMON: dict[int | str, dict[str, Any]] = {
    400: _err(f"the body is not valid JSON, or {version.HEADER} has another major version"),
    401: _err("missing, unknown or revoked token"),
    403: _err("the token may not do this"),
    413: _err("request body (or job spec) too large"),
    422: _err("invalid request"),
    503: _err("the head is restarting, or is a standby (docs/high-availability.md)"),
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: _err("no such object")}
CONFLICT: dict[int | str, dict[str, Any]] = {409: _err("conflicts with the current state")}
REPEATED: dict[int | str, dict[str, Any]] = {
    200: {
        "model": m.SubmitResponse,
        "description": "this Idempotency-Key was submitted before: the jobs it created",
    }
}
IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_PARAMETER: dict[str, Any] = {
    "name": IDEMPOTENCY_HEADER,
    "in": "header",
    "required": False,
    "description": "Makes a retried submit safe: the same user sending the same key again "
    "gets the same job ids (200) instead of a new job.",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"},
}
LAST_ADMIN: dict[int | str, dict[str, Any]] = {
    409: _err("it would leave no working admin token (send force=true to do it anyway)")
}
Force = Annotated[bool, Query(description="do it even if no working admin token would be left")]
STANDBY_DETAIL = "standby head: the leader is elsewhere"
BAD_GATEWAY: dict[int | str, dict[str, Any]] = {
    502: _err("the node holding the logs is unreachable")
}


async def principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    head: Head = request.app.state.head
    return head.authenticate(creds.credentials if creds else None)


Who = Annotated[Principal, Depends(principal)]
# Ids are 32-bit in every database the head supports; larger ones cannot exist.
JobId = Annotated[int, Path(ge=1, le=2**31 - 1)]
# A job as users name it: `123`, or `123_4` for task 4 of array 123 (an array's id names
# the whole array where Slurm's commands do: cancel, hold, release, requeue, update).
JobRef = Annotated[
    str,
    Path(max_length=18, pattern=m.JOB_REF_PATTERN, description="`123`, or `123_4` (array task)"),
]
RowId = Annotated[int, Path(ge=1, le=2**31 - 1)]


async def step_token(
    job_id: JobId,
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """A running job's own credential (PHALANX_STEP_TOKEN), checked before the body."""
    head: Head = request.app.state.head
    token = creds.credentials if creds else None
    head.check_step_token(job_id, token)
    assert token is not None
    return token


async def _user(who: Who) -> Principal:
    return Head.require_user(who)


async def _admin(who: Who) -> Principal:
    return Head.require_admin(who)


User = Annotated[Principal, Depends(_user)]
Admin = Annotated[Principal, Depends(_admin)]


TOO_LARGE = too_large_detail(MAX_BODY_BYTES)


def _declared_too_large(length: bytes | None) -> bool:
    """Whether a Content-Length header's value is malformed or over MAX_BODY_BYTES."""
    return declared_too_large(length, MAX_BODY_BYTES)


class FastSubmit(PlainPost):
    """`POST /v1/jobs`, the hottest route, as plain ASGI in front of FastAPI (Starlette's
    Request, routing, dependency solving and middleware were together ~half the head's CPU
    per submit)."""

    def __init__(self, app: ASGIApp, head: Head, keys: jobs.SubmitKeys) -> None:
        async def answer(scope: Scope, receive: Receive) -> tuple[int, bytes]:
            return await submit_answer(head, keys, scope, receive)

        super().__init__(app, "/v1/jobs", answer)


class StandbyGate:
    """A standby head answers /healthz only; every other request gets 503 (and Retry-After)
    until it becomes the leader (plain ASGI, like BodyLimit)."""

    def __init__(self, app: ASGIApp, role: Role) -> None:
        self.app = app
        self.role = role

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.role.leader and scope["path"] != "/healthz":
            await _json(503, STANDBY_DETAIL, {"Retry-After": "1"})(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def submit_answer(
    head: Head, keys: jobs.SubmitKeys, scope: Scope, receive: Receive
) -> tuple[int, bytes]:
    """`POST /v1/jobs`: authenticate, validate, submit; the status and JSON body."""
    token = key = length = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            token = _bearer_of(value.decode("latin-1"))
        elif name == b"idempotency-key":
            key = value.decode("latin-1")
        elif name == b"content-length":
            length = value
    who = head.require_user(head.authenticate(token))
    key = _check_idempotency_key(key)
    if _declared_too_large(length):
        raise HeadError(413, TOO_LARGE)
    raw = await read_body(receive)
    limit = head.mirror.settings.max_spec_bytes
    if limit and len(raw) > limit:
        raise HeadError(
            413,
            f"job spec of {len(raw)} bytes is larger than the head's limit of {limit} bytes "
            "(`phalanx head --max-spec-bytes`): put large data in files under the workdir",
        )
    try:
        spec = m.JobSpec.model_validate_json(raw)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None
    if key is None:
        result = await head.control.run_async(lambda tx: _submit(head, tx, who, spec))
        return 201, result.model_dump_json().encode()
    result, created = await head.control.run_async(
        lambda tx: jobs.submit_once(head.mirror, keys, tx, who, spec, key)
    )
    return (201 if created else 200), result.model_dump_json().encode()


def _check_idempotency_key(key: str | None) -> str | None:
    """An `Idempotency-Key` header's value as is (None without one); 422 if malformed."""
    if key is None or jobs.IDEMPOTENCY_KEY.fullmatch(key):
        return key
    raise HeadError(
        422,
        f"{IDEMPOTENCY_HEADER} must be 1 to 128 characters from A-Z a-z 0-9 _ . : - "
        f"(got {key[:40]!r}{'…' if len(key) > 40 else ''})",
    )


def create_app(head: Head, role: Role | None = None) -> ASGIApp:
    """The API of `head`: FastAPI behind the submit fast path (FastSubmit), the standby
    gate (StandbyGate; a standby reads no body) and, outermost, the API version check
    (ApiVersion, which stamps every answer). All sit in front of FastAPI
    rather than among its middleware: FastAPI wraps those in its own per-request layers
    (error and telemetry middleware, a body limit), which cost a submit more than its
    validation does."""

    # Job notifications: queued by the control thread after each commit, posted by the
    # notifier's own threads (head/notify.py).
    notifier = Notifier(head.mirror.settings.notify_allow)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        head.loop = asyncio.get_running_loop()
        notifier.start()
        head.tsdb.leader = lambda: role is None or role.leader  # a standby stores nothing
        head.tsdb.start()
        head.control.on_moves = notifier.collect
        probe = asyncio.create_task(head.control.backlog.probe())  # head/overload.py
        try:
            async with httpx.AsyncClient(
                timeout=10.0, headers=version.headers(), verify=head.agent_verify
            ) as client:
                _app.state.http = client
                yield
        finally:
            probe.cancel()
            head.control.on_moves = None
            await asyncio.to_thread(notifier.stop)
            await asyncio.to_thread(head.tsdb.stop)

    app = FastAPI(
        title="Phalanx head",
        version=__version__,
        lifespan=lifespan,
        responses=COMMON,
        description="Control plane of a Phalanx GPU cluster. Send `Authorization: Bearer TOKEN`.",
    )
    app.state.head = head
    app.include_router(usage_routes.router)  # idle GPUs, idle policies, usage reports
    app.include_router(leaving.router)  # a node leaving on purpose (Slurm allocation end)
    app.include_router(serving_routes.router)  # serving deployments (`phalanx serve`)
    app.include_router(serving_stats.router)  # the routers' summaries (serving metrics)

    keys = jobs.SubmitKeys()  # idempotency keys of live jobs (the control thread's)
    app.add_middleware(BodyLimit)
    role = role or Role(leader=True)

    async def _answer(_r: Request, e: Exception) -> JSONResponse:
        answer = error_answer(e)
        assert answer is not None  # registered only for the kinds error_answer knows
        return _json(*answer)

    for kind in (HeadError, AuthError, Forbidden, RequestValidationError):
        app.add_exception_handler(kind, _answer)

    @app.get("/healthz", response_model=m.Health, responses={})
    def healthz() -> m.Health:
        errors = head.control.loop_errors
        return m.Health(
            status="ok",
            version=__version__,
            role=role.name,
            loop_errors=errors,
            notifications=notifier.counts(),
        )

    app.include_router(telemetry_api.router(head))  # telemetry in, job stats out
    app.include_router(selfcontrol.router(head))  # a job requeueing itself (step token)

    @app.get("/v1/whoami", response_model=m.WhoAmI)
    def whoami(who: User) -> m.WhoAmI:
        return head.whoami(who)

    # ----------------------------------------------------------------- jobs
    # The hot path: parsed by hand rather than through FastAPI's dependency machinery;
    # the body's schema is declared for OpenAPI.
    @app.post(
        "/v1/jobs",
        status_code=201,
        response_model=m.SubmitResponse,
        responses={
            **NOT_FOUND,
            **REPEATED,
            429: _err("the user has as many queued and running jobs as the head allows"),
        },
        openapi_extra={
            "parameters": [IDEMPOTENCY_PARAMETER],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": JOBSPEC_REF}}},
            },
            "security": [{"HTTPBearer": []}],
        },
    )
    async def submit(request: Request) -> Response:
        # Served by FastSubmit in front of the app; this declaration documents it.
        status, body = await submit_answer(head, keys, request.scope, request.receive)
        return Response(body, status_code=status, media_type="application/json")

    @app.get("/v1/jobs", response_model=m.JobList | m.JobTable)
    def list_jobs(
        who: User,
        active: bool = False,
        ended: bool = False,
        user: Annotated[str | None, Query(max_length=128)] = None,
        team: Annotated[str | None, Query(max_length=128)] = None,
        state: Annotated[str | None, Query(max_length=64, pattern=r"^[A-Z,]*$")] = None,
        since: float | None = None,
        limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
        array: Annotated[
            int | None, Query(ge=1, le=2**31 - 1, description="only the tasks of this array")
        ] = None,
        ids: Annotated[
            str | None,
            Query(
                max_length=11 * 400,
                pattern=r"^[0-9]{1,10}(,[0-9]{1,10}){0,399}$",
                description="only these jobs (up to 400 ids; an array's id: all its tasks)",
            ),
        ] = None,
        format: Annotated[
            Literal["objects", "table"],
            Query(description="objects: a JobList; table: a JobTable (rows of values)"),
        ] = "objects",
    ) -> Response:
        states = {s for s in state.split(",") if s} if state else None
        wanted = {int(i) for i in ids.split(",")} if ids else None
        jobs = head.list_jobs(who, active, ended, user, team, states, since, limit, array, wanted)
        # Plain dicts through pydantic-core's JSON writer: building and validating 10,000
        # JobInfo models costs more than the rest of the request.
        if format == "objects":
            return Response(to_json({"jobs": jobs}), media_type="application/json")
        columns = list(jobs[0]) if jobs else list(m.JobInfo.model_fields)
        rows = [list(job.values()) for job in jobs]  # every dict has JobRecord.wire's keys
        return Response(to_json({"columns": columns, "rows": rows}), media_type="application/json")

    @app.get("/v1/jobs/{job_id}", response_model=m.JobDetail, responses=NOT_FOUND)
    def job(job_id: JobRef, who: User) -> m.JobDetail:
        """One job (an array's id: its first task; `GET /v1/jobs?array=ID` lists them all)."""
        return head.job_detail(who, head.job_id(job_id))

    @app.post(
        "/v1/jobs/{job_id}/cancel", response_model=m.JobInfo, responses={**NOT_FOUND, **CONFLICT}
    )
    def cancel(job_id: JobRef, who: User, body: m.CancelRequest | None = None) -> m.JobInfo:
        """Cancel a job, an array task, or every live task of an array (its id); with a
        `signal`, deliver it instead (scancel -s). The answer is the job named (for an
        array, its first task still live)."""
        if body is not None and body.signal is not None:
            sig, scope = body.signal, body.scope
            done = head.control_jobs(
                lambda tx: jobcontrol.signal(head.mirror, tx, who, job_id, sig, scope)
            )
        else:
            done = head.control_jobs(lambda tx: jobcontrol.cancel(head.mirror, tx, who, job_id))
        named = jobcontrol.parse_ref(job_id)[0]
        return next((j for j in done.jobs if j.id == named), done.jobs[0])

    @app.post(
        "/v1/jobs/{job_id}/hold", response_model=m.JobList, responses={**NOT_FOUND, **CONFLICT}
    )
    def hold(job_id: JobRef, who: User) -> m.JobList:
        """Keep pending jobs from starting (scontrol hold): reason JobHeldUser, or
        JobHeldAdmin when an admin holds it (then only an admin releases it)."""
        return head.control_jobs(lambda tx: jobcontrol.hold(head.mirror, tx, who, job_id))

    @app.post(
        "/v1/jobs/{job_id}/release", response_model=m.JobList, responses={**NOT_FOUND, **CONFLICT}
    )
    def release(job_id: JobRef, who: User) -> m.JobList:
        """Let held jobs start (scontrol release)."""
        return head.control_jobs(lambda tx: jobcontrol.release(head.mirror, tx, who, job_id))

    @app.post(
        "/v1/jobs/{job_id}/requeue", response_model=m.JobList, responses={**NOT_FOUND, **CONFLICT}
    )
    def requeue(job_id: JobRef, who: User) -> m.JobList:
        """Stop running jobs and queue them again (scontrol requeue); counts as a restart."""
        return head.control_jobs(lambda tx: jobcontrol.requeue(head.mirror, tx, who, job_id))

    @app.patch("/v1/jobs/{job_id}", response_model=m.JobList, responses={**NOT_FOUND, **CONFLICT})
    def update(job_id: JobRef, body: m.JobUpdate, who: User) -> m.JobList:
        """Change a pending job's time limit, QOS, priority or dependencies, or a running
        job's time limit (scontrol update); see JobUpdate for who may change what."""
        return head.control_jobs(lambda tx: jobcontrol.update(head.mirror, tx, who, job_id, body))

    @app.get(
        "/v1/jobs/{job_id}/logs",
        response_model=m.LogChunk,
        responses={**NOT_FOUND, **CONFLICT, **BAD_GATEWAY},
    )
    async def logs(
        request: Request,
        job_id: JobRef,
        who: User,
        rank: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
        stream: Literal["stdout", "stderr"] = "stdout",
        offset: Annotated[int, Query(ge=0, le=m.MAX_INT64)] = 0,
    ) -> m.LogChunk:
        rec = head.private_job_record(who, head.job_id(job_id))
        if rec.spec.array is not None and rec.array_job_id == rec.id and "_" not in job_id:
            raise HeadError(
                409,
                f"job {job_id} is an array: name one task, e.g. {job_id}_{rec.array_task_id}",
            )
        node = head.log_source(rec, rank)
        client: httpx.AsyncClient = request.app.state.http
        try:
            r = await client.get(
                f"{node.agent_url}/v1/logs/{rec.id}",
                params={"rank": rank, "stream": stream, "offset": offset},
                headers={"Authorization": f"Bearer {node.agent_secret}"},
            )
        except httpx.HTTPError as e:
            raise HeadError(502, f"node {node.name} is unreachable: {e}") from None
        if r.status_code == 404:
            raise HeadError(404, f"no logs for job {job_id} rank {rank} on {node.name}")
        if r.status_code != 200:
            raise HeadError(502, f"node {node.name} answered {r.status_code}: {_agent_detail(r)}")
        return m.LogChunk.model_validate_json(r.content)

    @app.post(
        "/v1/jobs/{job_id}/exec",
        response_class=StreamingResponse,
        responses={
            200: {
                "content": {"application/x-ndjson": {}},
                "description": "one ExecFrame per line: output as it comes, keepalives, "
                "then the exit",
            },
            **NOT_FOUND,
            **CONFLICT,
            429: _err("the rank's node runs as many execs as it may"),
            502: _err("the rank's node is down or unreachable"),
        },
    )
    async def exec_into(
        request: Request, job_id: JobId, body: m.ExecRequest, who: User
    ) -> StreamingResponse:
        """Run a command beside a running rank (`phalanx exec`): as the job's user, in its
        cgroup, with the rank's environment; its owner, team admins and admins only."""
        return await execproxy.open_exec(head, request.app.state.http, who, job_id, body)

    @app.post("/v1/jobs/{job_id}/progress", status_code=204)
    async def progress(
        job_id: JobId, body: m.JobProgress, token: Annotated[str, Depends(step_token)]
    ) -> Response:
        head.record_progress(job_id, token, body)
        return Response(status_code=204)

    @app.get("/v1/priority", response_model=m.PriorityList)
    def priority(who: User) -> m.PriorityList:
        """Queued jobs in the order the scheduler considers them, with the numbers that
        order them (QOS priority, the team's fair share, age): those the caller may see."""
        return head.priorities(who)

    @app.get("/v1/shares", response_model=m.ShareList)
    def shares(who: User) -> m.ShareList:
        """Every team's quota, GPUs in use and borrowed, decayed usage and fair share."""
        return head.shares()

    # ----------------------------------------------------------------- nodes
    @app.get("/v1/nodes", response_model=m.NodeList)
    def nodes(who: User) -> Response:
        # Plain dicts through pydantic-core's JSON writer, as GET /v1/jobs does.
        return Response(to_json({"nodes": head.node_rows()}), media_type="application/json")

    @app.post("/v1/nodes/{name}/drain", response_model=m.NodeInfo, responses=NOT_FOUND)
    def drain(name: str, body: m.DrainRequest, who: Admin) -> m.NodeInfo:
        return head.set_drain(name, body.reason)

    @app.post("/v1/nodes/{name}/resume", response_model=m.NodeInfo, responses=NOT_FOUND)
    def resume(name: str, who: Admin) -> m.NodeInfo:
        return head.set_drain(name, None)

    @app.post("/v1/nodes/{name}/replace", response_model=m.NodeInfo, responses=NOT_FOUND)
    def replace_node(name: str, who: Admin) -> m.NodeInfo:
        """Revoke a node's credential and free its name for a new node (its jobs are
        requeued as for a node that died)."""
        return head.replace_node(name)

    @app.delete("/v1/nodes/{name}", status_code=204, responses={**NOT_FOUND, **CONFLICT})
    def remove_node(name: str, who: Admin) -> Response:
        """Forget a node that is down and holds no job (409 otherwise)."""
        admin.remove_node(head, name)
        return Response(status_code=204)

    @app.post(
        "/v1/nodes/{name}/faults",
        status_code=204,
        responses={
            **NOT_FOUND,
            409: _err("the node has real GPUs: faults are injected only on fake ones"),
            502: _err("the node's agent is unreachable"),
        },
    )
    async def inject_fault(
        request: Request, name: str, body: m.FaultInjection, who: Admin
    ) -> Response:
        """Make a node with fake GPUs report a GPU fault, as if NVML had seen it."""
        node = head.fault_target(name)
        client: httpx.AsyncClient = request.app.state.http
        try:
            r = await client.post(
                f"{node.agent_url}/v1/faults",
                content=body.model_dump_json(),
                headers={
                    "Authorization": f"Bearer {node.agent_secret}",
                    "Content-Type": "application/json",
                },
            )
        except httpx.HTTPError as e:
            raise HeadError(502, f"node {name} is unreachable: {e}") from None
        if r.status_code in (409, 422):
            raise HeadError(r.status_code, f"node {name}: {_agent_detail(r)}")
        if r.status_code != 204:
            raise HeadError(502, f"node {name} answered {r.status_code}: {_agent_detail(r)}")
        return Response(status_code=204)

    # ----------------------------------------------------------------- admin
    @app.get("/v1/users", response_model=m.UserList)
    def users(who: Admin) -> m.UserList:
        return m.UserList(users=list(head.users_by_name().values()))

    @app.post("/v1/users", status_code=201, response_model=m.UserInfo, responses=CONFLICT)
    def add_user(body: m.UserCreate, who: Admin) -> m.UserInfo:
        return head.add_user(body)

    @app.patch("/v1/users/{name}", response_model=m.UserInfo, responses=NOT_FOUND)
    def set_user(name: str, body: m.UserUpdate, who: Admin) -> m.UserInfo:
        return head.set_user(name, body)

    @app.post(
        "/v1/users/{name}/disable",
        response_model=m.UserInfo,
        responses={**NOT_FOUND, **LAST_ADMIN},
    )
    def disable_user(name: str, who: Admin, force: Force = False) -> m.UserInfo:
        """Disable a user: their tokens are refused at once (their running jobs go on)."""
        return admin.set_disabled(head, name, True, force)

    @app.post("/v1/users/{name}/enable", response_model=m.UserInfo, responses=NOT_FOUND)
    def enable_user(name: str, who: Admin) -> m.UserInfo:
        """Enable a disabled user again: their unrevoked tokens work again."""
        return admin.set_disabled(head, name, False, False)

    @app.delete("/v1/users/{name}", status_code=204, responses={**NOT_FOUND, **LAST_ADMIN})
    def delete_user(name: str, who: Admin, force: Force = False) -> Response:
        """Delete a user without live jobs (409 if it has some): its tokens are revoked."""
        admin.delete_user(head, name, force)
        return Response(status_code=204)

    @app.post("/v1/tokens", status_code=201, response_model=m.TokenIssued, responses=NOT_FOUND)
    def create_token(body: m.TokenCreate, who: User) -> m.TokenIssued:
        if not who.admin and body.user != who.user:
            raise Forbidden("only admins create tokens for other users")
        return head.issue_token(who, body.user, body.description, body.expires_s)

    @app.get("/v1/tokens", response_model=m.TokenList)
    def list_tokens(
        who: User,
        everyone: Annotated[
            bool, Query(alias="all", description="every token (admins; the default for them)")
        ] = True,
    ) -> m.TokenList:
        """An admin's answer: every token (`all=false`: their own); a user's: their own."""
        return head.tokens(who, everyone=who.admin and everyone)

    @app.delete("/v1/tokens/{token_id}", status_code=204, responses={**NOT_FOUND, **LAST_ADMIN})
    def revoke(token_id: RowId, who: User, force: Force = False) -> Response:
        """Revoke a token and those minted from it: admins any, users their own. Refused
        (409) if no working admin token would be left, unless `force`."""
        admin.revoke_token(head, who, token_id, force)
        return Response(status_code=204)

    @app.post("/v1/join-tokens", status_code=201, response_model=m.TokenIssued)
    def join_token(who: Admin, body: m.JoinTokenCreate | None = None) -> m.TokenIssued:
        return head.issue_join_token(who, body or m.JoinTokenCreate())

    @app.get("/v1/teams", response_model=m.TeamList)
    def teams(who: User) -> m.TeamList:
        return head.teams()

    @app.put("/v1/teams/{name}", response_model=m.TeamInfo)
    def put_team(name: str, body: m.TeamSpec, who: Admin) -> m.TeamInfo:
        if body.name != name:
            raise HeadError(422, f"the body names team {body.name!r} but the path {name!r}")
        return head.put_team(body)

    @app.delete("/v1/teams/{name}", status_code=204, responses={**NOT_FOUND, **CONFLICT})
    def delete_team(name: str, who: Admin) -> Response:
        """Delete a team without live jobs (409 if it has some)."""
        admin.delete_team(head, name)
        return Response(status_code=204)

    dashboard.install(app, head)  # the web dashboard at /ui/ (head/dashboard)

    # ----------------------------------------------------------------- agents
    @app.post("/v1/agent/register", response_model=m.RegisterResponse, responses=CONFLICT)
    def register(request: Request, body: m.RegisterRequest, who: Who) -> m.RegisterResponse:
        peer = request.client.host if request.client else None
        return head.register(who, body, peer)

    # Served by heartbeat_api.FastHeartbeat in front of the app; declared (and served if
    # that is bypassed) here.
    @app.post("/v1/agent/heartbeat", response_model=m.DesiredState, responses=NOT_FOUND)
    async def heartbeat(body: m.Heartbeat, who: Who) -> Response:
        return Response(await head.heartbeat(who, body), media_type="application/json")

    app.include_router(metricsapi.router())  # /metrics, /v1/metrics/*
    fast = telemetry_api.FastTelemetry(FastSubmit(app, head, keys), head)
    shed = shedding.ShedGate(fast, head)  # heartbeats first while the head is behind
    fast_beats = heartbeat_api.FastHeartbeat(shed, head)  # the agents' heartbeats
    return ApiVersion(StandbyGate(fast_beats, role), "head")


def _submit(head: Head, tx: Any, who: Principal, spec: m.JobSpec) -> m.SubmitResponse:
    return jobs.submit(head.mirror, tx, who, spec)


def _agent_detail(r: httpx.Response) -> str:
    """An agent's error `detail` (its text if it is not the usual JSON), one line."""
    try:
        detail = r.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return detail if isinstance(detail, str) else r.text[:200]
