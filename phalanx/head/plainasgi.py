"""What the head's plain-ASGI fast paths share (app.FastSubmit for `POST /v1/jobs`,
telemetry_api.FastTelemetry for `POST /v1/telemetry`, heartbeat_api.FastHeartbeat for
`POST /v1/agent/heartbeat`): serving one POST route in front of FastAPI with the API's
error answers, and reading a bounded request body."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from phalanx.api import models as m
from phalanx.api.asgi import (
    MAX_BODY_BYTES,
    bearer_token,
    declared_too_large,
    json_error,
    too_large_detail,
)
from phalanx.head.auth import AuthError, Forbidden
from phalanx.head.control import HeadError

log = logging.getLogger("phalanx.head")

M = TypeVar("M", bound=BaseModel)

# A fast path's answer to one request: its status and JSON body.
Answer = Callable[[Scope, Receive], Awaitable[tuple[int, bytes]]]


def error_answer(e: BaseException) -> tuple[int, str, dict[str, str]] | None:
    """The status, `detail` and extra headers of the API's answer to an error (None: not
    one of ours, a server error)."""
    if isinstance(e, HeadError):
        return e.status, e.detail, {}
    if isinstance(e, AuthError):
        return 401, str(e), {"WWW-Authenticate": "Bearer"}
    if isinstance(e, Forbidden):
        return 403, str(e), {}
    if isinstance(e, RequestValidationError):
        return 422, m.validation_detail(e.errors()), {}
    return None


class PlainPost:
    """`POST path` as plain ASGI in front of FastAPI: no Starlette Request, routing,
    dependency solving or middleware for the head's hottest routes. Errors get the same
    status, body and headers as every other route's; a bug is logged and answered as
    FastAPI answers one. Every other request goes on to `app`. FastAPI still declares the
    route (OpenAPI) and serves it if this is bypassed."""

    def __init__(self, app: ASGIApp, path: str, answer: Answer) -> None:
        self.app = app
        self.path = path
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            status, body = await self.answer(scope, receive)
        except Exception as e:
            error = error_answer(e)
            if error is None:
                log.exception("POST %s failed", self.path)
                error = 500, "internal server error (logged by the head)", {}
            await json_error(*error)(scope, receive, send)
            return
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


TOO_LARGE = too_large_detail(MAX_BODY_BYTES)


async def read_body(receive: Receive) -> bytes:
    """A request's whole body; 413 once it grows past MAX_BODY_BYTES."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HeadError(400, "the client went away before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise HeadError(413, TOO_LARGE)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def credentials(scope: Scope) -> tuple[str | None, bytes | None]:
    """A request's bearer token and declared Content-Length (raw), as the fast paths read
    them."""
    token = length = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            token = bearer_token(value.decode("latin-1"))
        elif name == b"content-length":
            length = value
    return token, length


async def read_model(receive: Receive, length: bytes | None, model: type[M]) -> M:
    """The request body as `model`: 413 past MAX_BODY_BYTES (declared or sent), 422 with the
    API's detail when it does not validate."""
    if declared_too_large(length, MAX_BODY_BYTES):
        raise HeadError(413, TOO_LARGE)
    raw = await read_body(receive)
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise HeadError(422, m.validation_detail(e.errors())) from None
