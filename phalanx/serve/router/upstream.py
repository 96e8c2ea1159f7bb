"""The router's HTTP/1.1 client to the replicas: keep-alive connections pooled per replica,
bodies read whole or streamed as they arrive.

A general client (httpx) spends about a millisecond per request and its pool's bookkeeping
grows with the number of connections; the router's budget is well under a millisecond per
request, so this speaks the small part of HTTP/1.1 the engines answer with (Content-Length,
chunked, or until close) over asyncio streams, plain HTTP only (the engines listen on the
nodes' network and are reached with their API key).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024  # an answer's status line and headers
MAX_BODY_BYTES = 64 * 1024 * 1024  # a whole (non-streamed) answer
MAX_IDLE = 256  # idle keep-alive connections kept per replica


class UpstreamError(Exception):
    """The replica could not be reached, or broke off or garbled its answer."""


class Response:
    """One answer being read: status and headers at once, the body with `read()` or
    `chunks()`. Reading it to its end gives the connection back to the pool; `close()`
    (always safe) drops it when the body is abandoned."""

    def __init__(
        self,
        pool: Upstream,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        status: int,
        headers: dict[bytes, bytes],
        read_timeout_s: float,
    ) -> None:
        self.status = status
        self.headers = headers
        self._pool = pool
        self._reader = reader
        self._writer: asyncio.StreamWriter | None = writer
        self._timeout = read_timeout_s
        self._keep = headers.get(b"connection", b"").lower() != b"close"

    @property
    def content_type(self) -> bytes:
        return self.headers.get(b"content-type", b"application/octet-stream")

    async def read(self, limit: int = MAX_BODY_BYTES) -> bytes:
        """The whole body (UpstreamError past `limit` bytes or when cut short)."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.chunks():
            size += len(chunk)
            if size > limit:
                self.close()
                raise UpstreamError(f"the replica's answer is larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The body's bytes as they arrive (chunked framing removed)."""
        reader, t = self._reader, self._timeout
        # Each read has its own deadline (none runs while the caller holds a chunk: a
        # timeout around the yields would cancel the caller's own awaits).
        try:
            if self.headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                # Decode every whole chunk already received, hand them over as one piece
                # (a stream's events that arrived together cost one send), then read on.
                buffer = b""
                while True:
                    pieces, buffer, done = _dechunk(buffer)
                    if pieces:
                        yield pieces
                    if done:
                        if buffer:  # bytes past the answer's end: do not reuse
                            self._keep = False
                        break
                    async with asyncio.timeout(t):
                        data = await reader.read(256 * 1024)
                    if not data:
                        raise asyncio.IncompleteReadError(buffer, None)
                    buffer += data
            elif b"content-length" in self.headers:
                left = int(self.headers[b"content-length"])
                while left > 0:
                    async with asyncio.timeout(t):
                        data = await reader.read(min(left, 256 * 1024))
                    if not data:
                        raise asyncio.IncompleteReadError(b"", left)
                    left -= len(data)
                    yield data
            else:
                self._keep = False
                while True:
                    async with asyncio.timeout(t):
                        data = await reader.read(256 * 1024)
                    if not data:
                        break
                    yield data
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            self.close()
            raise UpstreamError(f"the replica broke off its answer: {e!r}") from None
        except TimeoutError:
            self.close()
            raise UpstreamError(f"the replica sent nothing for {self._timeout:g} s") from None
        except BaseException:
            self.close()  # the caller gave up (cancelled, or closed the generator)
            raise
        self._release()

    def _release(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            if self._keep:
                self._pool._give_back(self._reader, writer)
            else:
                writer.close()

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()


def _dechunk(buffer: bytes) -> tuple[bytes, bytes, bool]:
    """(the payload of the whole chunks at the start of `buffer`, what is left, whether the
    last chunk and the trailers were among them). ValueError on bad framing."""
    out: list[bytes] = []
    at = 0
    n = len(buffer)
    while True:
        eol = buffer.find(b"\r\n", at)
        if eol < 0:
            if n - at > MAX_HEAD_BYTES:
                raise ValueError("a chunk size line without an end")
            break
        size = int(buffer[at:eol].split(b";", 1)[0], 16)
        if size < 0 or size > MAX_BODY_BYTES:
            raise ValueError(f"a chunk of {size} bytes")
        if size == 0:
            # The last chunk, then trailers (if any) up to an empty line.
            end = buffer.find(b"\r\n\r\n", eol)
            if end < 0:
                break
            return b"".join(out), buffer[end + 4 :], True
        start = eol + 2
        if n < start + size + 2:
            break
        if buffer[start + size : start + size + 2] != b"\r\n":
            raise ValueError("a chunk not followed by CRLF")
        out.append(buffer[start : start + size])
        at = start + size + 2
    return b"".join(out), buffer[at:], False


class Upstream:
    """Keep-alive connections to one replica (`http://host:port`), sending every request
    with its API key."""

    def __init__(
        self,
        url: str,
        key: str | None,
        *,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 600.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"a replica URL must be http://HOST:PORT (got {url!r})")
        self.url = url
        self.host = parts.hostname
        self.port = parts.port or 80
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        host = f"{self.host}:{self.port}" if ":" not in self.host else f"[{self.host}]:{self.port}"
        auth = f"Authorization: Bearer {key}\r\n" if key else ""
        self._fixed = f"Host: {host}\r\n{auth}".encode("latin-1")
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.closed = False

    async def request(
        self, method: str, path: str, body: bytes = b"", *, accept: bytes = b"*/*"
    ) -> Response:
        """Send one request and read the answer's head. UpstreamError when the replica
        cannot be reached or answers nothing sensible (nothing of the answer was read)."""
        head = (
            f"{method} {path} HTTP/1.1\r\n".encode("latin-1")
            + self._fixed
            + b"Accept: "
            + accept
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
        )
        # A pooled connection the replica closed while idle fails at once with nothing
        # read: such a request never reached it, so it goes again on a fresh connection.
        while self._idle:
            reader, writer = self._idle.pop()
            if reader.at_eof() or writer.is_closing():
                writer.close()
                continue
            try:
                return await self._exchange(reader, writer, head + body)
            except _Stale:
                continue
        reader, writer = await self._connect()
        try:
            return await self._exchange(reader, writer, head + body)
        except _Stale:
            raise UpstreamError(f"{self.url} closed the connection without answering") from None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                return await asyncio.open_connection(self.host, self.port, limit=MAX_HEAD_BYTES)
        except TimeoutError:
            raise UpstreamError(f"connecting to {self.url} timed out") from None
        except OSError as e:
            raise UpstreamError(f"cannot connect to {self.url}: {e.strerror or e}") from None

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
    ) -> Response:
        try:
            writer.write(data)
            async with asyncio.timeout(self.read_timeout_s):
                try:
                    raw = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError as e:
                    if not e.partial:
                        raise _Stale from None
                    raise
        except _Stale:
            writer.close()
            raise
        except BaseException as e:
            writer.close()
            if isinstance(e, TimeoutError):
                raise UpstreamError(
                    f"{self.url} did not answer in {self.read_timeout_s:g} s"
                ) from None
            if isinstance(e, OSError | asyncio.IncompleteReadError | asyncio.LimitOverrunError):
                raise UpstreamError(f"{self.url} broke off: {e!r}") from None
            raise
        lines = raw.split(b"\r\n")
        try:
            status = int(lines[0].split(b" ", 2)[1])
        except (IndexError, ValueError):
            writer.close()
            raise UpstreamError(f"{self.url} answered something that is not HTTP") from None
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name:
                headers[name.strip().lower()] = value.strip()
        return Response(self, reader, writer, status, headers, self.read_timeout_s)

    def _give_back(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.closed or len(self._idle) >= MAX_IDLE:
            writer.close()
        else:
            self._idle.append((reader, writer))

    def close(self) -> None:
        """Drop the idle connections (answers being read finish on their own)."""
        self.closed = True
        while self._idle:
            self._idle.pop()[1].close()


class _Stale(Exception):
    """A pooled connection turned out closed before any of the answer was read."""
