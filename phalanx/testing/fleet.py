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
