"""The head's HTTP protocol joins an answer's writes into one send, and changes nothing else:
the same bytes, in order, nothing held back past the event loop's pass, close after them."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from phalanx.head.http import JOIN_LIMIT, JoinedWritesProtocol
from phalanx.local.cluster import free_port


class Recorder(asyncio.Transport):
    """A transport that records what the protocol does with it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, bytes]] = []

    def write(self, data: Any) -> None:
        self.calls.append(("write", bytes(data)))

    def close(self) -> None:
        self.calls.append(("close", b""))

    def is_closing(self) -> bool:
        return any(kind == "close" for kind, _ in self.calls)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


BIG_CHUNK = 40 * 1024


async def app(scope: Any, receive: Any, send: Any) -> None:
    """/ answers `ok` in two messages; /stream sends three chunks a few ms apart; /big
    sends five 40 KiB chunks without yielding to the event loop."""
    await receive()
    if scope["path"] == "/big":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for k in range(5):
            part = bytes([65 + k]) * BIG_CHUNK
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"a", b"b", b"c"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b""})
        return
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


def connect(request: bytes) -> tuple[JoinedWritesProtocol, Recorder]:
    """A protocol on a recording transport that has just received `request` (call from a
    running event loop)."""
    config = uvicorn.Config(app, http=JoinedWritesProtocol, lifespan="off")
    config.load()
    protocol = JoinedWritesProtocol(config, ServerState(), {}, asyncio.get_running_loop())
    transport = Recorder()
    protocol.connection_made(transport)
    protocol.data_received(request)
    return protocol, transport


async def exchange(request: bytes, settle_s: float = 0.0) -> list[tuple[str, bytes]]:
    protocol, transport = connect(request)
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.sleep(settle_s)
    calls = list(transport.calls)
    protocol.connection_lost(None)
    return calls


def test_header_and_body_go_out_in_one_write() -> None:
    calls = asyncio.run(exchange(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"))
    assert [kind for kind, _ in calls] == ["write"]
    data = calls[0][1]
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-length: 2\r\n" in data and data.endswith(b"\r\n\r\nok")


def test_close_comes_after_the_answer() -> None:
    calls = asyncio.run(exchange(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"))
    assert calls[0][0] == "write" and {kind for kind, _ in calls[1:]} == {"close"}
    assert calls[0][1].endswith(b"ok")


def test_pipelined_requests_get_their_answers_in_order() -> None:
    calls = asyncio.run(exchange(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n" * 3, settle_s=0.05))
    data = b"".join(d for kind, d in calls if kind == "write")
    assert data.count(b"HTTP/1.1 200 OK\r\n") == 3 and data.count(b"\r\n\r\nok") == 3
    assert data.endswith(b"ok")


def test_a_malformed_request_gets_its_400_before_the_close() -> None:
    calls = asyncio.run(exchange(b"NOT HTTP AT ALL\r\n\r\n"))
    assert calls[0][0] == "write" and calls[0][1].startswith(b"HTTP/1.1 400 ")
    assert {kind for kind, _ in calls[1:]} == {"close"}


def test_a_streamed_answer_is_not_held_back() -> None:
    """Chunks sent in different passes of the loop go out as they come."""
    calls = asyncio.run(exchange(b"GET /stream HTTP/1.1\r\nHost: h\r\n\r\n", settle_s=0.1))
    writes = [data for kind, data in calls if kind == "write"]
    assert len(writes) == 4  # header + chunk a; chunk b; chunk c; the last chunk
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(b"1\r\na\r\n")
    assert writes[1:] == [b"1\r\nb\r\n", b"1\r\nc\r\n", b"0\r\n\r\n"]


def test_a_large_answer_goes_out_as_it_is_written() -> None:
    """Past JOIN_LIMIT the writes are not held back to the end of the pass: a large answer
    keeps the transport's flow control and is never joined whole."""
    calls = asyncio.run(exchange(b"GET /big HTTP/1.1\r\nHost: h\r\n\r\n"))
    writes = [data for kind, data in calls if kind == "write"]
    assert len(writes) >= 3
    assert all(len(w) < JOIN_LIMIT + BIG_CHUNK + 100 for w in writes)
    body = b"".join(writes).partition(b"\r\n\r\n")[2]
    expected = b"".join(
        b"%x\r\n" % BIG_CHUNK + bytes([65 + k]) * BIG_CHUNK + b"\r\n" for k in range(5)
    )
    assert body == expected + b"0\r\n\r\n"


def test_an_answer_written_as_the_client_half_closes_still_goes_out() -> None:
    """The client sends its request and shuts its side (`nc -N`): the event loop closes the
    transport right after eof_received, so the answer written in that pass goes out first."""

    async def run() -> list[tuple[str, bytes]]:
        protocol, transport = connect(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        for _ in range(20):  # until the answer is written, and not yet flushed
            if protocol.transport.get_write_buffer_size():
                break
            await asyncio.sleep(0)
        assert protocol.transport.get_write_buffer_size(), "no answer held in this pass"
        protocol.eof_received()  # it returns None: the event loop then closes the transport
        transport.close()
        await asyncio.sleep(0.01)
        protocol.connection_lost(None)
        return transport.calls

    calls = asyncio.run(run())
    assert calls[0][0] == "write" and calls[0][1].endswith(b"\r\n\r\nok")
    assert calls[1][0] == "close"


def test_keep_alive_over_a_real_socket() -> None:
    """Several requests on one connection of a real server get whole, ordered answers."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, http=JoinedWritesProtocol, lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            answers = b""
            for n in range(1, 4):
                conn.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
                while answers.count(b"\r\n\r\nok") < n:
                    chunk = conn.recv(4096)
                    assert chunk, "the server closed the connection"
                    answers += chunk
        assert answers.count(b"HTTP/1.1 200 OK\r\n") == 3
        assert answers.count(b"\r\n\r\nok") == 3
    finally:
        server.should_exit = True
        thread.join(timeout=10)
