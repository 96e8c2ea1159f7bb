"""A minimal stand-in head speaking the agent protocol, served from a thread (tests of the
whole agent that need to see exactly what it sends and choose what it is told)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Header, HTTPException
from fastapi.responses import JSONResponse

from phalanx.api.models import DesiredState, Heartbeat, RegisterRequest, RegisterResponse

from .helpers import wait_for

JOIN = "join-token-abcdefghijklmnop"
NODE = "node-token-qrstuvwxyz012345"


@dataclass
class StubHead:
    """Records what the agent sends; answers `desired` (replace it to change the answer;
    the long poll is held while the agent already has its version). `raw`, when set, is
    answered instead, as JSON, unvalidated: what a broken or hostile head might send."""

    desired: DesiredState
    raw: dict[str, Any] | None = None
    registered: list[RegisterRequest] = field(default_factory=list)
    beats: list[Heartbeat] = field(default_factory=list)
    url: str = ""

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/agent/register")
        def register(req: RegisterRequest, authorization: str = Header("")) -> RegisterResponse:
            if authorization != f"Bearer {JOIN}":
                raise HTTPException(401, "invalid join token")
            self.registered.append(req)
            d = self.desired
            return RegisterResponse(node_token=NODE, heartbeat_s=d.heartbeat_s, lease_s=d.lease_s)

        @app.post("/v1/agent/heartbeat", response_model=None)
        async def heartbeat(
            beat: Heartbeat, authorization: str = Header("")
        ) -> DesiredState | JSONResponse:
            if authorization != f"Bearer {NODE}":
                raise HTTPException(401, "invalid node token")
            self.beats.append(beat)
            if beat.version == self.desired.version:
                await asyncio.sleep(beat.wait_s)  # nothing will change: hold the long poll
            if self.raw is not None:
                return JSONResponse(self.raw)
            return self.desired

        return app


@contextmanager
def serve(stub: StubHead) -> Iterator[StubHead]:
    """Serve `stub` on a free 127.0.0.1 port (sets `stub.url`) until the block ends."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(stub.app(), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for("the stand-in head", lambda: server.started)
    stub.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield stub
    finally:
        server.should_exit = True
        thread.join(timeout=10)
