"""`POST /v1/agent/heartbeat` as plain ASGI in front of FastAPI (README.md#heartbeats-at-scale).

Every node sends one every few seconds: at 10,000 nodes that is thousands a second, and
FastAPI's request, routing, dependency and response-validation layers would cost the head
more than the heartbeat itself (bench/heartbeat.py). Same checks, limits and error bodies
as the FastAPI route (app.py), which declares it (OpenAPI) and serves it if this is
bypassed.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope

from phalanx.api import models as m
from phalanx.head.plainasgi import PlainPost, credentials, read_model
from phalanx.head.service import Head

PATH = "/v1/agent/heartbeat"


class FastHeartbeat(PlainPost):
    def __init__(self, app: ASGIApp, head: Head) -> None:
        async def answer(scope: Scope, receive: Receive) -> tuple[int, bytes]:
            return 200, await _answer(head, scope, receive)

        super().__init__(app, PATH, answer)


async def _answer(head: Head, scope: Scope, receive: Receive) -> bytes:
    token, length = credentials(scope)
    who = head.authenticate(token)
    hb = await read_model(receive, length, m.Heartbeat)
    return await head.heartbeat(who, hb)
