"""`POST /v1/agent/heartbeat` as plain ASGI in front of FastAPI (README.md#heartbeats-at-scale).

Every node sends one every few seconds: at 10,000 nodes that is thousands a second, and
FastAPI's request, routing, dependency and response-validation layers would cost the head
more than the heartbeat itself (bench/heartbeat.py). Same checks, limits and error bodies
as the FastAPI route (app.py), which declares it (OpenAPI) and serves it if this is
bypassed.
"""

from __future__ import annotations

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope

from phalanx.api import models as m
from phalanx.api.asgi import (
    MAX_BODY_BYTES,
    bearer_token,
    declared_too_large,
    too_large_detail,
)
from phalanx.head.control import HeadError
from phalanx.head.plainasgi import PlainPost, read_body
from phalanx.head.service import Head

PATH = "/v1/agent/heartbeat"


class FastHeartbeat(PlainPost):
    def __init__(self, app: ASGIApp, head: Head) -> None:
        async def answer(scope: Scope, receive: Receive) -> tuple[int, bytes]:
            return 200, await _answer(head, scope, receive)

        super().__init__(app, PATH, answer)


async def _answer(head: Head, scope: Scope, receive: Receive) -> bytes:
    token = length = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            token = bearer_token(value.decode("latin-1"))
        elif name == b"content-length":
            length = value
    who = head.authenticate(token)
    if declared_too_large(length, MAX_BODY_BYTES):
        raise HeadError(413, too_large_detail(MAX_BODY_BYTES))
    raw = await read_body(receive)
    try:
        hb = m.Heartbeat.model_validate_json(raw)
    except ValidationError as e:
        raise HeadError(422, m.validation_detail(e.errors())) from None
    return await head.heartbeat(who, hb)
