"""Simulated agents that speak the real agent protocol, many per process, for scale benchmarks.

A real agent is a process with threads, an HTTP server and job processes; a thousand of them
do not fit on a 2-core machine. A `SimNode` is only the part the head sees: it registers with
a join token (`POST /v1/agent/register`), long-polls `POST /v1/agent/heartbeat`, reports the
ranks of every job the head assigns it as running (the rank-0 node picks a master port, as a
real agent does), stops reporting a job the head takes away, and ends a job's ranks with an
exit code when told (`finish`). Its heartbeats carry GPU readings: busy GPUs (held by a job)
at the job's utilisation, free ones at 0%.

A `Fleet` runs many SimNodes on one asyncio loop with one HTTP connection pool; benchmarks
start one Fleet per process (bench/dashboard.py, bench/fleet.py). Nothing here is used by
the head or the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import ssl
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import httpx

from phalanx.agent.env import global_rank, local_ranks
from phalanx.agent.reportdelta import ReportStream
from phalanx.api.models import (
    Assignment,
    DesiredState,
    GpuInfo,
    GpuTelemetry,
    Heartbeat,
    NodeHealth,
    ProcessStatus,
    RegisterRequest,
    RegisterResponse,
)

# A job's utilisation on its GPUs, by job id (default: busy).
Utilisation = Callable[[int], float]
# "delta": numbered reports, only changes since the acknowledged one (as agents send them,
# agent/reportdelta.py); "full": every rank and reading every time (agents before deltas).
Protocol = Literal["full", "delta"]


def _busy(_job_id: int) -> float:
    return 95.0


@dataclass
class SimNode:
    """One simulated agent: its name, address, credential and what it runs."""

    name: str
    address: str
    gpus: int
    gpu_memory_mb: int = 81559
    token: str = ""
    version: int = 0
    heartbeat_s: float = 10.0
    # job id → (epoch, this node's ProcessStatus list)
    running: dict[int, tuple[int, list[ProcessStatus]]] = field(default_factory=dict)
    # job id → GPU indices it holds here
    holds: dict[int, list[int]] = field(default_factory=dict)
    master_ports: dict[str, int] = field(default_factory=dict)
    heartbeats: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, heartbeats with wait 0
    protocol: Protocol = "delta"
    reports: ReportStream = field(default_factory=ReportStream)

    def inventory(self) -> list[GpuInfo]:
        return [
            GpuInfo(
                index=i,
                uuid=f"GPU-sim-{zlib.crc32(f'{self.name}/{i}'.encode()):08x}-{i}",
                model="H100",
                memory_mb=self.gpu_memory_mb,
            )
            for i in range(self.gpus)
        ]

    def apply(self, desired: DesiredState, now: float) -> None:
        """Run what the head assigns, stop what it no longer does."""
        self.version = desired.version
        self.heartbeat_s = desired.heartbeat_s
        self.reports.answered(desired.report_ack, desired.full_report)
        wanted = {a.job_id: a for a in desired.jobs}
        for job_id in list(self.running):
            epoch, _ = self.running[job_id]
            a = wanted.get(job_id)
            if a is None or a.epoch != epoch:
                del self.running[job_id]
                self.holds.pop(job_id, None)
                self.master_ports.pop(str(job_id), None)
        for a in desired.jobs:
            if a.job_id not in self.running:
                self._launch(a, now)

    def _launch(self, a: Assignment, now: float) -> None:
        procs = [
            ProcessStatus(
                job_id=a.job_id,
                epoch=a.epoch,
                rank=global_rank(a, local),
                local_rank=local,
                pid=None,
                running=True,
                started_at=now,
            )
            for local in local_ranks(a)
        ]
        self.running[a.job_id] = (a.epoch, procs)
        self.holds[a.job_id] = list(a.gpus)
        if a.node_rank == 0 and a.master_port is None:
            self.master_ports[str(a.job_id)] = 29500 + a.job_id % 20000

    def finish(self, job_id: int, exit_code: int, now: float) -> bool:
        """End this node's ranks of `job_id` with `exit_code` (False: it runs nothing here)."""
        entry = self.running.get(job_id)
        if entry is None:
            return False
        epoch, procs = entry
        ended = [
            p.model_copy(update={"running": False, "exit_code": exit_code, "ended_at": now})
            for p in procs
        ]
        self.running[job_id] = (epoch, ended)
        return True

    def readings(self, utilisation: Utilisation) -> list[GpuTelemetry]:
        util = [0.0] * self.gpus
        for job_id, gpus in self.holds.items():
            _, procs = self.running.get(job_id, (0, []))
            if any(p.running for p in procs):
                for g in gpus:
                    if 0 <= g < self.gpus:
                        util[g] = utilisation(job_id)
        return [
            GpuTelemetry(
                index=i,
                utilization_pct=u,
                memory_used_mb=int(self.gpu_memory_mb * 0.6 * u / 100.0),
                temperature_c=35.0 + 0.4 * u,
                power_w=70.0 + 6.3 * u,
            )
            for i, u in enumerate(util)
        ]

    def heartbeat(self, wait_s: float, utilisation: Utilisation) -> Heartbeat:
        procs = [p for _, ps in self.running.values() for p in ps]
        if self.protocol == "delta":
            return self.reports.report(
                name=self.name,
                version=self.version,
                wait_s=wait_s,
                processes=procs,
                ports=dict(self.master_ports),
                gpus=self.readings(utilisation),
                health=NodeHealth(),
            )
        return Heartbeat(
            name=self.name,
            version=self.version,
            wait_s=wait_s,
            processes=procs,
            master_ports=dict(self.master_ports),
            gpus=self.readings(utilisation),
        )


@dataclass
class Fleet:
    """Many SimNodes against one head, on one asyncio loop.

    `run(seconds)` registers every node (`concurrency` at a time), then heartbeats each
    every `heartbeat_s` (the head's own interval unless given) until the time is up: a plain
    heartbeat (wait 0, its round trip measured) and, between them, nothing — the long poll
    is not used, so `finish` reaches the head at the next beat.
    """

    head_url: str
    join_token: str
    nodes: list[SimNode]
    verify: ssl.SSLContext | bool = True
    utilisation: Utilisation = _busy
    heartbeat_s: float | None = None
    concurrency: int = 64
    errors: list[str] = field(default_factory=list)

    @staticmethod
    def make(
        head_url: str,
        join_token: str,
        count: int,
        gpus: int = 8,
        *,
        prefix: str = "sim",
        first_address: int = 0,
        verify: ssl.SSLContext | bool = True,
        utilisation: Utilisation = _busy,
        protocol: Protocol = "delta",
    ) -> Fleet:
        """`count` nodes named PREFIX-00001…, addresses 127.1.x.y from `first_address`,
        heartbeating with `protocol`."""
        nodes = []
        for i in range(count):
            n = first_address + i
            address = f"127.1.{n // 250}.{n % 250 + 1}"
            name = f"{prefix}-{n + 1:05d}"
            nodes.append(SimNode(name=name, address=address, gpus=gpus, protocol=protocol))
        return Fleet(head_url, join_token, nodes, verify=verify, utilisation=utilisation)

    async def register_all(self, client: httpx.AsyncClient) -> None:
        gate = asyncio.Semaphore(self.concurrency)

        async def one(node: SimNode) -> None:
            async with gate:
                body = RegisterRequest(
                    name=node.name,
                    address=node.address,
                    agent_url=f"https://{node.address}:9",
                    agent_secret=secrets.token_hex(16),
                    cpus=64,
                    memory_mb=1024 * 1024,
                    gpus=node.inventory(),
                )
                r = await client.post(
                    "/v1/agent/register",
                    content=body.model_dump_json(),
                    headers={
                        "Authorization": f"Bearer {self.join_token}",
                        "Content-Type": "application/json",
                    },
                )
                if r.status_code != 200:
                    raise RuntimeError(f"{node.name} could not register: {r.status_code} {r.text}")
                answer = RegisterResponse.model_validate_json(r.content)
                node.token = answer.node_token
                node.heartbeat_s = answer.heartbeat_s

        await asyncio.gather(*(one(n) for n in self.nodes))

    async def beat(self, client: httpx.AsyncClient, node: SimNode) -> None:
        """One heartbeat of `node` (wait 0), its answer applied, its round trip recorded;
        again at once (a full report) if the head asks for one."""
        for _ in range(2):
            if not await self._beat_once(client, node):
                return

    async def _beat_once(self, client: httpx.AsyncClient, node: SimNode) -> bool:
        """One heartbeat; True if the head asked for a full report."""
        beat = node.heartbeat(0.0, self.utilisation)
        body = beat.model_dump_json()
        start = time.perf_counter()
        r = await client.post(
            "/v1/agent/heartbeat",
            content=body,
            headers={"Authorization": f"Bearer {node.token}", "Content-Type": "application/json"},
        )
        node.latencies.append(time.perf_counter() - start)
        node.heartbeats += 1
        if r.status_code != 200:
            if r.status_code == 422 and beat.delta is not None:
                node.reports.reset()  # a head that predates deltas: full reports
                return True
            if len(self.errors) < 100:
                self.errors.append(f"{node.name}: heartbeat {r.status_code} {r.text[:200]}")
            return False
        desired = DesiredState.model_validate_json(r.content)
        node.apply(desired, time.time())
        return desired.full_report

    async def _node_loop(
        self, client: httpx.AsyncClient, node: SimNode, until: float, offset: float
    ) -> None:
        await asyncio.sleep(offset)
        while time.monotonic() < until:
            began = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):
                await self.beat(client, node)
            interval = self.heartbeat_s or node.heartbeat_s
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)))

    def client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(
            max_connections=self.concurrency, max_keepalive_connections=self.concurrency
        )
        return httpx.AsyncClient(
            base_url=self.head_url, verify=self.verify, limits=limits, timeout=httpx.Timeout(60.0)
        )

    async def run(self, seconds: float, *, register: bool = True) -> None:
        async with self.client() as client:
            if register:
                await self.register_all(client)
            until = time.monotonic() + seconds
            interval = self.heartbeat_s or (self.nodes[0].heartbeat_s if self.nodes else 1.0)
            spread = [interval * i / max(1, len(self.nodes)) for i in range(len(self.nodes))]
            await asyncio.gather(
                *(
                    self._node_loop(client, n, until, o)
                    for n, o in zip(self.nodes, spread, strict=True)
                )
            )

    def finish(self, job_id: int, exit_code: int = 0) -> int:
        """End `job_id`'s ranks on every node that runs it; how many nodes did."""
        now = time.time()
        return sum(n.finish(job_id, exit_code, now) for n in self.nodes)

    def running_jobs(self) -> set[int]:
        return {
            j for n in self.nodes for j, (_, ps) in n.running.items() if any(p.running for p in ps)
        }


class HeadConnection:
    """One node's keep-alive HTTP/1.1 connection to the head, from the node's own loopback
    address: what a real agent holds, without a general HTTP client's per-request cost
    (httpx spends milliseconds per request, and its pool's bookkeeping grows with the
    number of connections; a fleet process must send thousands of heartbeats a second).
    Plain HTTP only; a request cut short (cancelled, or the head gone) closes it, and the
    next request connects again."""

    def __init__(self, head_url: str, local_address: str) -> None:
        url = httpx.URL(head_url)
        if url.scheme != "http":
            raise ValueError("HeadConnection speaks plain HTTP (a head started --plain-http)")
        self.host = url.host
        self.port = url.port or 80
        self.local_address = local_address
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(
        self, path: str, token: str, body: bytes, timeout_s: float = 30.0
    ) -> tuple[int, bytes]:
        """(status, body) of one POST; OSError (TimeoutError after `timeout_s`, as the
        agent's own limit) or asyncio.IncompleteReadError when the head cannot be reached,
        does not answer or closes the connection."""
        async with asyncio.timeout(timeout_s):
            return await self._post(path, token, body)

    async def _post(self, path: str, token: str, body: bytes) -> tuple[int, bytes]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        ok = False
        try:
            if self._writer is None:
                self._reader, self._writer = await asyncio.open_connection(
                    self.host, self.port, local_addr=(self.local_address, 0)
                )
            reader, writer = self._reader, self._writer
            assert reader is not None
            writer.write(head + body)
            status, content, keep = await _response(reader)
            ok = keep
            return status, content
        finally:
            if not ok:
                self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, keep-alive) of one HTTP/1.1 response."""
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        if key:
            headers[key.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            parts.append(chunk[:-2])
        content = b"".join(parts)
    else:
        content = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, content, headers.get("connection", "").lower() != "close"


GAP_S = 5.0  # LiveFleet.gaps: silences longer than this (a long poll is answered sooner)
MAX_GAPS = 200_000


@dataclass
class LiveFleet(Fleet):
    """A Fleet whose nodes long-poll as a real agent does, for the fleet benchmark.

    Each node keeps one heartbeat outstanding (`wait_s` = its heartbeat interval, so the
    head answers at once when its desired state changes and a job's assignment arrives
    without waiting for the next beat); a node with news (a job it ended) drops its long
    poll and reports at once, as agent/headlink.py does. The first `probes` nodes instead
    send plain heartbeats (wait 0) every interval and record their round trips, the
    head's answer to a node with no change pending. On top of that, what a benchmark
    drives: nodes die (`kill`: they stop heartbeating), new nodes join (`start` with more
    nodes), jobs end on command (`finish`, `end_some`), and what it measures: when each
    node first saw each assignment (`seen`), each node's last answered heartbeat
    (`ok_at`), and jobs the head took away while they still ran (`killed`).

    Each node heartbeats over its own connection (`HeadConnection`) from its own loopback
    address (127.1.x.y); registration goes through httpx, `group` nodes per client.
    Plain HTTP only.
    """

    probes: int = 0
    group: int = 50
    retry_s: float = 1.0
    register_tries: int = 30
    seen: list[tuple[int, str, float]] = field(default_factory=list)  # (job, node, at)
    ok_at: dict[str, float] = field(default_factory=dict)
    killed: list[tuple[int, str, float]] = field(default_factory=list)  # (job, node, at)
    dead: dict[str, float] = field(default_factory=dict)  # node → its last heartbeat sent
    ended: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # heartbeats that failed, by error
    # Long silences: (node, its answer before, the answer that ended it), for gaps between
    # two answers of over GAP_S (a head restart: when each node was heard back).
    gaps: list[tuple[str, float, float]] = field(default_factory=list)
    _sent: dict[str, float] = field(default_factory=dict)
    _news: dict[str, asyncio.Event] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stop: bool = False

    async def start(self, nodes: list[SimNode] | None = None) -> None:
        """Register `nodes` (default: all of this fleet's) and start their heartbeats."""
        fresh = self.nodes if nodes is None else nodes
        if nodes is not None:
            self.nodes.extend(nodes)
        probes = {n.name for n in self.nodes[: self.probes]}
        for k in range(0, len(fresh), self.group):
            part = fresh[k : k + self.group]
            gate = Fleet(self.head_url, self.join_token, part, verify=self.verify)
            gate.concurrency = self.concurrency
            for attempt in range(self.register_tries):
                # As an agent does, a node whose registration failed (a head too busy to
                # take the connection, or answering 5xx) tries again after a pause.
                left = [n for n in part if not n.token]
                if not left:
                    break
                gate.nodes = left
                try:
                    async with gate.client() as client:
                        await gate.register_all(client)
                except (httpx.HTTPError, RuntimeError):
                    if attempt + 1 == self.register_tries:
                        raise
                    self.failures["register"] = self.failures.get("register", 0) + 1
                    await asyncio.sleep(self.retry_s)
            for node in part:
                loop = self._probe_loop if node.name in probes else self._poll_loop
                conn = HeadConnection(self.head_url, node.address)
                task = asyncio.create_task(loop(conn, node))
                task.add_done_callback(self._ended)
                self._tasks.append(task)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A node's loop ended: by `stop`, by `kill`, or by a bug (recorded, not lost)."""
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(f"a node's heartbeat loop failed: {task.exception()!r}")

    async def stop(self) -> None:
        self._stop = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _answered(self, node: SimNode, status: int, content: bytes) -> None:
        if status != 200:
            if len(self.errors) < 100:
                text = content[:200].decode(errors="replace")
                self.errors.append(f"{node.name}: heartbeat {status} {text}")
            return
        now = time.time()
        before_s = self.ok_at.get(node.name)
        if before_s is not None and now - before_s > GAP_S and len(self.gaps) < MAX_GAPS:
            self.gaps.append((node.name, before_s, now))
        self.ok_at[node.name] = now
        before = {j: (e, any(p.running for p in ps)) for j, (e, ps) in node.running.items()}
        node.apply(DesiredState.model_validate_json(content), now)
        for job_id, (epoch, was_running) in before.items():
            # Taken away, or requeued and placed here again (a new epoch) between answers.
            now_epoch = node.running[job_id][0] if job_id in node.running else None
            if was_running and now_epoch != epoch:
                self.killed.append((job_id, node.name, now))
        for job_id in node.running:
            if job_id not in before:
                self.seen.append((job_id, node.name, now))

    async def _post(self, conn: HeadConnection, node: SimNode, wait_s: float) -> tuple[int, bytes]:
        body = node.heartbeat(wait_s, self.utilisation).model_dump_json().encode()
        self._sent[node.name] = time.time()
        node.heartbeats += 1
        # As agent/headlink.py: a long poll is given up 10 s after the head should answer.
        return await conn.post("/v1/agent/heartbeat", node.token, body, wait_s + 10.0)

    async def _poll_loop(self, conn: HeadConnection, node: SimNode) -> None:
        news = self._news.setdefault(node.name, asyncio.Event())
        try:
            while not self._stop and node.name not in self.dead:
                news.clear()
                wait_s = self.heartbeat_s or node.heartbeat_s
                post = asyncio.ensure_future(self._post(conn, node, wait_s))
                post.add_done_callback(_retrieved)  # one cut off by `stop` is no error
                told = asyncio.ensure_future(news.wait())
                try:
                    await asyncio.wait({post, told}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    told.cancel()
                    if not post.done():
                        post.cancel()  # news to tell: drop the long poll, report at once
                if post.cancelled() or not post.done():
                    with contextlib.suppress(
                        asyncio.CancelledError, OSError, asyncio.IncompleteReadError, ValueError
                    ):
                        await post  # its cancellation done (`stop` is seen at the loop's top)
                    continue
                try:
                    status, content = post.result()
                except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                    self.failures[type(e).__name__] = self.failures.get(type(e).__name__, 0) + 1
                    # The head is away: try again shortly, jittered as agent/headlink.py does.
                    await asyncio.sleep(self.retry_s * random.uniform(0.5, 1.0))
                    continue
                if node.name in self.dead:
                    return  # died while its last heartbeat was out
                self._answered(node, status, content)
                if status != 200:
                    await asyncio.sleep(self.retry_s)
        finally:
            conn.close()

    async def _probe_loop(self, conn: HeadConnection, node: SimNode) -> None:
        try:
            while not self._stop and node.name not in self.dead:
                began = time.monotonic()
                try:
                    status, content = await self._post(conn, node, 0.0)
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    await asyncio.sleep(self.retry_s)
                    continue
                node.latencies.append(time.monotonic() - began)
                self._answered(node, status, content)
                interval = self.heartbeat_s or node.heartbeat_s
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)))
        finally:
            conn.close()

    def finish(self, job_id: int, exit_code: int = 0) -> int:
        """End `job_id`'s ranks on every node that runs it; they report it at once."""
        now = time.time()
        done = 0
        for n in self.nodes:
            if n.finish(job_id, exit_code, now):
                done += 1
                event = self._news.get(n.name)
                if event is not None:
                    event.set()
        self.ended += done > 0
        return done

    def end_some(self, count: int, rng: random.Random) -> int:
        """End `count` of the jobs running on live nodes, chosen at random; how many."""
        alive = [n for n in self.nodes if n.name not in self.dead]
        running = sorted(
            {j for n in alive for j, (_, ps) in n.running.items() if any(p.running for p in ps)}
        )
        return sum(self.finish(j) > 0 for j in rng.sample(running, min(count, len(running))))

    def kill(self, names: list[str]) -> None:
        """These nodes die: they never heartbeat again (their last one, if out, is dropped)."""
        for name in names:
            if name not in self.dead:
                self.dead[name] = self._sent.get(name, time.time())
                event = self._news.get(name)
                if event is not None:
                    event.set()  # drop the outstanding long poll


def _retrieved(future: asyncio.Future[tuple[int, bytes]]) -> None:
    if not future.cancelled():
        future.exception()
