"""`POST /v1/agent/heartbeat` as plain ASGI in front of FastAPI (README.md#heartbeats-at-scale).

Every node sends one every few seconds: at 10,000 nodes that is thousands a second, and
FastAPI's request, routing, dependency and response-validation layers would cost the head
more than the heartbeat itself (bench/heartbeat.py). Same checks, limits and error bodies
as the FastAPI route (app.py), which declares it (OpenAPI) and serves it if this is
bypassed.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError
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
from phalanx.head.plainasgi import read_body
from phalanx.head.service import Head

log = logging.getLogger("phalanx.head")

PATH = "/v1/agent/heartbeat"


class FastHeartbeat:
    def __init__(self, app: ASGIApp, head: Head) -> None:
        self.app = app
        self.head = head

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            body = await _answer(self.head, scope, receive)
        except HeadError as e:
            await json_error(e.status, e.detail)(scope, receive, send)
            return
        except AuthError as e:
            await json_error(401, str(e), {"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        except Forbidden as e:
            await json_error(403, str(e))(scope, receive, send)
            return
        except Exception:  # a bug: logged, answered as FastAPI answers one
            log.exception("POST %s failed", PATH)
            await json_error(500, "internal server error (logged by the head)")(
                scope, receive, send
            )
            return
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


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
