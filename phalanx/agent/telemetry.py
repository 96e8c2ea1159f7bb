"""GPU and job telemetry: sampled on its own thread, shipped to the head in batches.

The sampler reads every GPU each `interval_s` (10 s by default, `phalanx agent
--telemetry-interval`), tags each GPU with the job (id, epoch) holding it here, and reads
each running job's CPU and memory use. Samples wait in a bounded buffer: when the head is
unreachable for long the oldest are dropped and counted (the next batch says how many).
The shipper posts them to `POST /v1/telemetry` every `ship_s` (10 s by default), and at
once when a job ended here, so the head's stats of it are final within seconds of its
end. Neither is on the heartbeat's path: a slow head answer delays telemetry, not leases.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from pydantic import ValidationError

from phalanx.api.models import GpuTelemetry
from phalanx.api.telemetry import MAX_BATCH_JOBS, MAX_BATCH_SAMPLES, JobUsage, TelemetryBatch

from . import usage
from .fakeload import Holding
from .gpus import GpuProvider
from .survive import Survivals

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 10.0
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.1, 3600.0
DEFAULT_SHIP_S = 10.0
DEFAULT_BUFFER = 2160  # samples kept while the head is away: 6 hours at 10 s
_BACKOFF_MAX_S = 60.0


def check_interval(value: float, flag: str = "--telemetry-interval") -> float:
    """A sampling or shipping interval in bounds, else ValueError naming the flag."""
    if not (MIN_INTERVAL_S <= value <= MAX_INTERVAL_S):
        raise ValueError(
            f"{flag} must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S:.0f} seconds, got {value}"
        )
    return value


@dataclass(frozen=True, slots=True)
class Sample:
    time: float  # unix seconds, the agent's clock
    gpus: tuple[GpuTelemetry, ...]  # job_id set where a job holds the GPU
    epochs: tuple[int | None, ...]  # the holder's epoch, per GPU
    jobs: tuple[JobUsage, ...]


class Sampler:
    """Samples GPUs and jobs on its own thread into a bounded buffer."""

    def __init__(
        self,
        gpus: GpuProvider,
        holdings: Callable[[], list[Holding]],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        buffer: int = DEFAULT_BUFFER,
        survivals: Survivals | None = None,
        on_job_end: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.gpus = gpus
        self.holdings = holdings
        self.interval_s = interval_s
        self.survivals = survivals
        self.on_job_end = on_job_end
        self.clock = clock
        self._lock = threading.Lock()
        self._buffer: collections.deque[Sample] = collections.deque()
        self._max = max(1, buffer)
        self.dropped = 0  # samples dropped since the last batch that reported them
        self._cpu: dict[tuple[int, int], tuple[float, float]] = {}  # job → (time, cpu s)
        self._running: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample_once()
            except Exception:  # a sampler that dies silently loses every later sample
                log.exception("telemetry sample failed")
                if self.survivals is not None:
                    self.survivals.record("telemetry", "sampling GPUs and jobs")
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def sample_once(self) -> Sample:
        """Take one sample now and buffer it (also what tests call)."""
        holdings = self.holdings()
        readings = self.gpus.telemetry()
        now = self.clock()
        owner: dict[int, Holding] = {g: h for h in holdings for g in h.gpus}
        gpus = []
        epochs: list[int | None] = []
        for r in readings:
            h = owner.get(r.index)
            gpus.append(r.model_copy(update={"job_id": h.job_id if h is not None else None}))
            epochs.append(h.epoch if h is not None else None)
        jobs = tuple(self._job_usage(holdings, now))
        sample = Sample(now, tuple(gpus), tuple(epochs), jobs)
        running = {(h.job_id, h.epoch) for h in holdings}
        with self._lock:
            self._buffer.append(sample)
            while len(self._buffer) > self._max:
                self._buffer.popleft()
                self.dropped += 1
            ended = self._running - running
            self._running = running
        for key in [k for k in self._cpu if k not in running]:
            del self._cpu[key]
        if ended and self.on_job_end is not None:
            self.on_job_end()
        return sample

    def _job_usage(self, holdings: list[Holding], now: float) -> list[JobUsage]:
        out = []
        for h in holdings[:MAX_BATCH_JOBS]:
            cpu_s: float | None
            mem: int | None
            cpu_s = mem = None
            if h.cgroup is not None:  # v1 jobs may have no cpuacct controller: /proc then
                cpu_s, mem = usage.cgroup_cpu_s(h.cgroup), usage.cgroup_memory_mb(h.cgroup)
            if cpu_s is None or mem is None:
                got = usage.proc_usage(h.pids)
                if got is not None:
                    cpu_s = got[0] if cpu_s is None else cpu_s
                    mem = got[1] if mem is None else mem
            key = (h.job_id, h.epoch)
            before = self._cpu.get(key)
            if cpu_s is not None:
                self._cpu[key] = (now, cpu_s)
            if cpu_s is None or before is None or now <= before[0]:
                continue  # a rate needs two readings
            cores = max(0.0, (cpu_s - before[1]) / (now - before[0]))
            try:
                out.append(
                    JobUsage(
                        job_id=h.job_id,
                        epoch=h.epoch,
                        time=now,
                        cpu_cores=round(cores, 3),
                        cpus=h.cpus or usage.cpu_count(),
                        memory_mb=mem or 0,
                    )
                )
            except ValidationError:
                continue
        return out

    def take(self, limit: int = MAX_BATCH_SAMPLES) -> tuple[list[Sample], int]:
        """The oldest `limit` samples (left in the buffer until `done`) and the drop count."""
        with self._lock:
            return list(self._buffer)[:limit], self.dropped

    def done(self, count: int, dropped: int) -> None:
        """The head stored the first `count` samples taken, and learnt of `dropped`."""
        with self._lock:
            for _ in range(min(count, len(self._buffer))):
                self._buffer.popleft()
            self.dropped = max(0, self.dropped - dropped)

    def pending(self) -> int:
        with self._lock:
            return len(self._buffer)


def batch_of(node: str, samples: list[Sample], dropped: int, sent_at: float) -> TelemetryBatch:
    """The columnar batch of `samples` (every sample has the node's GPUs in one order;
    a sample whose GPUs differ from the first's is left for the next batch by the caller)."""
    gpus = [g.index for g in samples[0].gpus] if samples else []
    cols: dict[str, list[object]] = {
        k: []
        for k in (
            "utilization_pct",
            "memory_used_mb",
            "power_w",
            "temperature_c",
            "energy_j",
            "job_id",
            "epoch",
        )
    }
    jobs: list[JobUsage] = []
    for s in samples:
        for g, epoch in zip(s.gpus, s.epochs, strict=True):
            cols["utilization_pct"].append(_clamp(g.utilization_pct, 0.0, 100.0))
            cols["memory_used_mb"].append(g.memory_used_mb)
            cols["power_w"].append(_clamp(g.power_w, 0.0, 100_000.0))
            cols["temperature_c"].append(_clamp(g.temperature_c, -100.0, 300.0))
            cols["energy_j"].append(g.energy_j)
            cols["job_id"].append(g.job_id)
            cols["epoch"].append(epoch)
        jobs.extend(s.jobs)
    return TelemetryBatch.model_validate(
        {
            "node": node,
            "sent_at": sent_at,
            "dropped": dropped,
            "gpus": gpus,
            "times": [s.time for s in samples],
            "jobs": jobs[:MAX_BATCH_JOBS],
            **cols,
        }
    )


def _clamp(value: float | None, lo: float, hi: float) -> float | None:
    return None if value is None else min(hi, max(lo, value))


def same_shape(samples: list[Sample]) -> list[Sample]:
    """The leading samples that list the same GPUs as the first (a batch has one shape)."""
    if not samples:
        return []
    shape = [g.index for g in samples[0].gpus]
    out = []
    for s in samples:
        if [g.index for g in s.gpus] != shape:
            break
        out.append(s)
    return out


class Shipper:
    """Posts the sampler's buffer to the head; runs as a task in the agent's event loop.

    `target()` gives the head URL and the node credential to use now (None: not registered
    yet). A batch the head refuses as invalid (4xx but 401/403/404/429) is dropped and
    counted, so one bad sample cannot block the rest; anything else is retried with backoff.
    """

    def __init__(
        self,
        sampler: Sampler,
        node: str,
        target: Callable[[], tuple[str, str] | None],
        headers: Callable[[str], dict[str, str]],
        *,
        ship_s: float = DEFAULT_SHIP_S,
        verify: ssl.SSLContext | bool = True,
        survivals: Survivals | None = None,
    ) -> None:
        self.sampler = sampler
        self.node = node
        self.target = target
        self.headers = headers
        self.ship_s = ship_s
        self.verify = verify
        self.survivals = survivals
        self.now = asyncio.Event()  # set: ship at once (a job ended)
        self.shipped = 0  # samples the head stored
        self.refused = 0  # samples dropped because the head refused their batch
        self._warned = False

    def wake(self) -> None:
        """Ship soon (thread-safe through the loop's call_soon_threadsafe by the caller)."""
        self.now.set()

    async def run(self, stop: asyncio.Event) -> None:
        backoff = self.ship_s
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0), verify=self.verify) as client:
            while not stop.is_set():
                waiter = asyncio.ensure_future(self.now.wait())
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait(
                    {waiter, stopper}, timeout=backoff, return_when=asyncio.FIRST_COMPLETED
                )
                for t in (waiter, stopper):
                    t.cancel()
                self.now.clear()
                try:
                    ok = await self.ship(client)
                except Exception:  # never let the shipper die: telemetry would stop for good
                    log.exception("shipping telemetry failed")
                    if self.survivals is not None:
                        self.survivals.record("telemetry", "shipping telemetry to the head")
                    ok = False
                backoff = self.ship_s if ok else min(_BACKOFF_MAX_S, max(backoff * 2, 1.0))

    async def ship(self, client: httpx.AsyncClient) -> bool:
        """Post everything buffered, one batch at a time; False when the head did not take
        a batch (unreachable, not registered yet)."""
        while True:
            target = self.target()
            if target is None:
                return True  # not registered yet: try again at the usual pace
            url, token = target
            samples, dropped = self.sampler.take()
            samples = same_shape(samples)
            if not samples:
                return True
            try:
                body = batch_of(self.node, samples, dropped, time.time()).model_dump_json()
            except ValidationError as e:  # a reading out of bounds: drop it, keep the rest
                log.warning("dropping %d telemetry samples out of bounds: %s", len(samples), e)
                self.sampler.done(len(samples), 0)
                self.refused += len(samples)
                continue
            try:
                r = await client.post(
                    f"{url}/v1/telemetry", content=body, headers=self.headers(token)
                )
            except httpx.HTTPError as e:
                log.debug("telemetry not shipped: %s", e)
                return False
            if r.status_code == 200:
                self.sampler.done(len(samples), dropped)
                self.shipped += len(samples)
                continue
            if r.status_code in (400, 413, 422):
                if not self._warned:
                    self._warned = True
                    why = r.text[:200]
                    log.warning("the head refused a telemetry batch (%d): %s", r.status_code, why)
                self.sampler.done(len(samples), 0)
                self.refused += len(samples)
                continue
            return False  # 401/403 (a credential renewing), 404 (an older head), 5xx, 503
