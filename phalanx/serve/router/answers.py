"""The router's own answers: OpenAI's error shape, and a whole JSON answer."""

from __future__ import annotations

import json

from starlette.types import Send

JSON_TYPE = b"application/json"


class ApiError(Exception):
    """An answer in OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        self.param = param
        self.headers = headers

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return json.dumps({"error": error}).encode()


async def answer(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = JSON_TYPE,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
