"""The bench client's stream parsing against a misbehaving engine (a raw HTTP server)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from phalanx.serve.bench import BenchConfig, WorkloadSpec
from phalanx.serve.bench.client import run_async

OK_CHUNK = b'data: {"choices": [{"text": "a"}]}\n\n'


async def serve(body: bytes, check: Callable[[str], Awaitable[None]]) -> None:
    """Answer every request with `body` as an SSE stream, then run `check(url)`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        await check(f"http://127.0.0.1:{port}")


def config(url: str) -> BenchConfig:
    return BenchConfig(url=url, model="m", workload=WorkloadSpec(num=1, input_len=2, output_len=2))


def test_an_error_event_mid_stream_fails_the_request() -> None:
    async def check(url: str) -> None:
        result = await run_async(config(url))
        assert (result.metrics.completed, result.metrics.failed) == (0, 1)
        assert result.metrics.errors[0].startswith("ValueError: the engine sent an error: boom")

    asyncio.run(serve(OK_CHUNK + b'data: {"error": "boom"}\n\n', check))


def test_no_usage_counts_chunks_and_garbage_fails() -> None:
    async def counted(url: str) -> None:
        result = await run_async(config(url))
        assert (result.metrics.completed, result.metrics.total_output) == (1, 3)
        assert result.records[0].output_tokens is None

    asyncio.run(serve(OK_CHUNK * 3 + b"data: [DONE]\n\n", counted))

    async def garbage(url: str) -> None:
        result = await run_async(config(url))
        assert result.metrics.failed == 1 and result.metrics.errors[0].startswith("JSONDecodeError")

    asyncio.run(serve(OK_CHUNK + b"data: {not json\n\n", garbage))
