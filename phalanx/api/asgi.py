"""Plain-ASGI guards the head and the agent put in front of FastAPI: a body limit, the API
version check, a bearer-token gate. Plain ASGI, not Starlette's BaseHTTPMiddleware, which
costs too much per request; each answers its refusal without reading the body."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from phalanx.api import version

MAX_BODY_BYTES = 2 * 1024 * 1024  # the head's limit; the agent's is smaller


def json_error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The API's error answer: `{"detail": ...}`."""
    return JSONResponse(status_code=status, content={"detail": detail}, headers=headers)


def too_large_detail(max_bytes: int) -> str:
    return f"request body larger than {max_bytes} bytes"


def declared_too_large(length: bytes | None, max_bytes: int) -> bool:
    """Whether a Content-Length header's value is malformed or over `max_bytes`."""
    return length is not None and (not length.isdigit() or int(length) > max_bytes)


class BodyLimit:
    """Refuse bodies over `max_bytes` with 413: at once by Content-Length, or while the
    body streams in (chunked), before the app has more than the limit in memory."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and declared_too_large(value, limit):
                await json_error(413, too_large_detail(limit))(scope, receive, send)
                return
        seen = 0
        too_large = False

        async def limited() -> Message:
            nonlocal seen, too_large
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    too_large = True
                    raise _BodyTooLarge
            return message

        async def guarded(message: Message) -> None:
            if not too_large:  # past the limit, the app's own answer (400) is replaced
                await send(message)

        with suppress(_BodyTooLarge):
            await self.app(scope, limited, guarded)
        if too_large:
            await json_error(413, too_large_detail(limit))(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


class ApiVersion:
    """Put `Phalanx-Api-Version` on every answer, and refuse (400, naming both versions) a
    request whose header has another major version (phalanx.api.version)."""

    def __init__(self, app: ASGIApp, me: str) -> None:
        self.app = app
        self.me = me  # "head" or "agent", for the message
        self.stamp = (_NAME, version.API_VERSION.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), self.stamp]
            await send(message)

        for name, value in scope.get("headers", ()):
            if name == _NAME:
                problem = version.mismatch(value.decode("latin-1"), me=self.me, them="caller")
                if problem is not None:
                    await json_error(400, problem)(scope, receive, stamped)
                    return
                break
        await self.app(scope, receive, stamped)


_NAME = version.HEADER.lower().encode()


class BearerGate:
    """401 at once, before any body is read, for a request without `Authorization: Bearer
    TOKEN` or with a token `known` does not accept; `open_paths` need none. The app still
    decides what a known token may do (403)."""

    def __init__(
        self, app: ASGIApp, known: Callable[[str], bool], open_paths: frozenset[str]
    ) -> None:
        self.app = app
        self.known = known
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        token = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                token = bearer_token(value.decode("latin-1"))
                break
        if token is None:
            problem = "missing Authorization: Bearer token"
        elif not self.known(token):
            problem = "invalid token"
        else:
            await self.app(scope, receive, send)
            return
        await json_error(401, problem, {"WWW-Authenticate": "Bearer"})(scope, receive, send)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header's value (None: not one)."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
