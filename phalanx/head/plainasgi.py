"""What the head's plain-ASGI fast paths share (app.FastSubmit for `POST /v1/jobs`,
telemetry_api.FastTelemetry for `POST /v1/telemetry`): reading a bounded request body."""

from __future__ import annotations

from starlette.types import Receive

from phalanx.api.asgi import MAX_BODY_BYTES, too_large_detail
from phalanx.head.control import HeadError

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
