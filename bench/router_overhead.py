"""Router overhead and throughput against a stub engine (issue 15's targets: ≤ 1 ms p50
added per request, ≥ 5,000 req/s through the router).

A stub engine (its own process: a minimal OpenAI-shaped HTTP/1.1 server on raw asyncio
that answers at once — a whole completion, or a stream of `--events` SSE events) is called
directly (the baseline) and through `phalanx serve router --replica STUB --no-auth` (its
own process, the production hot path): latency p50/p99 at concurrency 1, non-streaming
and streaming, then throughput at concurrency `--concurrency` (split over `--clients`
load-generating processes, each with keep-alive connections). The load generators, the
stub and the router share this machine's cores: on a 2-core VM the router gets at most
one, so throughput here is a floor of what it does on a real host.

    .venv/bin/python bench/router_overhead.py [--requests 2000] [--seconds 5]

Prints one JSON object: both sides, ratios (router / direct), the host's CPU steal over
the run and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from phalanx.serve.router.upstream import Upstream

COMPLETION = json.dumps(
    {
        "id": "cmpl-stub",
        "object": "text_completion",
        "created": 0,
        "model": "stub",
        "choices": [{"index": 0, "text": " hello world", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
).encode()
BODY = json.dumps({"model": "stub", "prompt": "Hello, my name is", "max_tokens": 2}).encode()
STREAM_BODY = json.dumps(
    {"model": "stub", "prompt": "Hello, my name is", "max_tokens": 8, "stream": True}
).encode()


# ---------------------------------------------------------------------- the stub engine
class _Stub(asyncio.Protocol):
    """Answers each request on a connection at once (no body parsing beyond framing)."""

    def __init__(self, events: int) -> None:
        self.buffer = b""
        self.events = events
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                length = int(head[at + 15 :].split(b"\r\n", 1)[0])
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            self.answer(head.split(b" ", 2)[1], body)

    def answer(self, path: bytes, body: bytes) -> None:
        assert self.transport is not None
        if path == b"/v1/models":
            data = b'{"object":"list","data":[{"id":"stub","object":"model"}]}'
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(data)).encode()
                + b"\r\n\r\n"
                + data
            )
        elif b'"stream": true' in body:
            out = [
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            ]
            for i in range(self.events):
                event = b'data: {"choices":[{"index":0,"text":"t%d"}]}\n\n' % i
                out.append(b"%x\r\n%s\r\n" % (len(event), event))
            done = b"data: [DONE]\n\n"
            out.append(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            self.transport.write(b"".join(out))
        else:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(COMPLETION)).encode()
                + b"\r\n\r\n"
                + COMPLETION
            )


def run_stub(port: int, events: int) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Stub(events), "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# ---------------------------------------------------------------------- the load
async def _one(up: Upstream, stream: bool) -> float:
    started = time.perf_counter()
    response = await up.request("POST", "/v1/completions", STREAM_BODY if stream else BODY)
    data = await response.read()
    if response.status != 200 or not data:
        raise RuntimeError(f"answer {response.status}: {data[:200]!r}")
    return time.perf_counter() - started


async def latency(url: str, n: int, stream: bool) -> dict[str, float]:
    up = Upstream(url, "bench")
    for _ in range(50):  # warm up the connection and both processes
        await _one(up, stream)
    times = sorted([await _one(up, stream) for _ in range(n)])
    up.close()
    return {
        "p50_ms": round(statistics.median(times) * 1000, 3),
        "p99_ms": round(times[int(0.99 * (len(times) - 1))] * 1000, 3),
        "mean_ms": round(statistics.fmean(times) * 1000, 3),
    }


async def _load(url: str, concurrency: int, seconds: float, stream: bool) -> tuple[int, float]:
    """(requests answered, seconds) with `concurrency` requests outstanding."""
    up = Upstream(url, "bench")
    await _one(up, stream)
    done = 0
    started = time.perf_counter()
    stop = started + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await _one(up, stream)
            done += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    up.close()
    return done, elapsed


def _load_process(url: str, concurrency: int, seconds: float, stream: bool, out: Any) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    out.put(asyncio.run(_load(url, concurrency, seconds, stream)))


def throughput(
    url: str, concurrency: int, clients: int, seconds: float, stream: bool
) -> tuple[float, int]:
    """(requests per second, requests) over `clients` processes."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_load_process, args=(url, concurrency // clients, seconds, stream, out))
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    # Each process's rate over its own run (they start within a fraction of a second).
    runs = [out.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    return round(sum(done / elapsed for done, elapsed in runs), 1), sum(d for d, _ in runs)


# ---------------------------------------------------------------------- the run
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_times() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return sum(values), values[7]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout_s} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="per latency measurement")
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput run")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--clients", type=int, default=2, help="load-generating processes")
    parser.add_argument("--events", type=int, default=8, help="SSE events per streamed answer")
    parser.add_argument("--policy", default="round-robin")
    parser.add_argument("--stub", type=int, help=argparse.SUPPRESS)  # run as the stub engine
    args = parser.parse_args()
    if args.stub:
        run_stub(args.stub, args.events)
        return
    stub_port, router_port = free_port(), free_port()
    stub = subprocess.Popen(
        [sys.executable, __file__, "--stub", str(stub_port), "--events", str(args.events)]
    )
    router = subprocess.Popen(
        [
            sys.executable, "-m", "phalanx.cli.main", "serve", "router",
            "--listen", f"127.0.0.1:{router_port}", "--replica", f"http://127.0.0.1:{stub_port}",
            "--engine-key", "bench", "--no-auth", "--policy", args.policy,
            "--served-model-name", "stub",
        ],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_port(stub_port)
        wait_port(router_port)
        direct, routed = f"http://127.0.0.1:{stub_port}", f"http://127.0.0.1:{router_port}"
        t0, s0 = cpu_times()
        result: dict[str, Any] = {"direct": {}, "router": {}}
        for name, url in (("direct", direct), ("router", routed)):
            side = result[name]
            side["latency_c1"] = asyncio.run(latency(url, args.requests, False))
            side["latency_c1_stream"] = asyncio.run(latency(url, args.requests, True))
        for name, url in (("direct", direct), ("router", routed)):
            side = result[name]
            for key, stream in (("", False), ("_stream", True)):
                cpu = process_cpu_s(router.pid)
                rps, done = throughput(url, args.concurrency, args.clients, args.seconds, stream)
                side["throughput_rps" + key] = rps
                if name == "router":
                    # The router's own CPU per request: what it costs whatever the others
                    # sharing the machine do (1e6 / this = requests/s one core can route).
                    side["router_cpu_us_per_request" + key] = round(
                        (process_cpu_s(router.pid) - cpu) / done * 1e6, 1
                    )
        t1, s1 = cpu_times()
        d, r = result["direct"], result["router"]
        result["overhead_p50_ms"] = round(r["latency_c1"]["p50_ms"] - d["latency_c1"]["p50_ms"], 3)
        result["overhead_p50_ms_stream"] = round(
            r["latency_c1_stream"]["p50_ms"] - d["latency_c1_stream"]["p50_ms"], 3
        )
        result["ratios"] = {
            "latency_p50": round(r["latency_c1"]["p50_ms"] / d["latency_c1"]["p50_ms"], 2),
            "latency_p99": round(r["latency_c1"]["p99_ms"] / d["latency_c1"]["p99_ms"], 2),
            "throughput": round(r["throughput_rps"] / d["throughput_rps"], 3),
            "throughput_stream": round(r["throughput_rps_stream"] / d["throughput_rps_stream"], 3),
        }
        result["config"] = {
            "requests": args.requests,
            "seconds": args.seconds,
            "concurrency": args.concurrency,
            "clients": args.clients,
            "events": args.events,
            "cpus": os.cpu_count(),
        }
        result["host_steal_pct"] = round(100.0 * (s1 - s0) / max(1, t1 - t0), 1)
        result["load_avg"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(result, indent=1))
    finally:
        for p in (router, stub):
            p.terminate()
        for p in (router, stub):
            p.wait(timeout=10)


if __name__ == "__main__":
    main()
