"""The latest GPU readings of each node, as its agent sent them with its heartbeat.

Kept in memory beside the control loop, never in its transaction: a reading changes every
heartbeat, is worthless after a restart, and must cost the writer nothing (DESIGN.md:
telemetry is stored off the writer's path). Readers get copies under a lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from phalanx.api.models import GpuInfo, GpuTelemetry, JobGpu

log = logging.getLogger("phalanx.head")


class GpuReading(Protocol):
    """What a subscriber reads of one GPU's sample: a GpuTelemetry, or the telemetry
    store's lighter Sample (the store hands 800 of them a second to the stream at
    1,000 nodes, and a pydantic model each cost more than the rest of ingest)."""

    @property
    def index(self) -> int: ...
    @property
    def utilization_pct(self) -> float | None: ...
    @property
    def job_id(self) -> int | None: ...


@dataclass(slots=True)
class Sample:
    """One GPU's sample in the stream (the fields of GpuTelemetry; not to be changed)."""

    index: int
    utilization_pct: float | None
    memory_used_mb: int | None
    temperature_c: float | None
    power_w: float | None
    energy_j: float | None
    job_id: int | None


# Called with every sample recorded: (node, its GPUs' readings, the time they were taken).
Subscriber = Callable[[str, Sequence[GpuReading], float], None]


@dataclass(frozen=True, slots=True)
class Reading:
    time: float  # the head's clock when the heartbeat arrived
    gpus: tuple[GpuTelemetry, ...]


class GpuSamples:
    """node → its latest Reading."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, Reading] = {}
        self._subscribers: list[Subscriber] = []

    def subscribe(self, callback: Subscriber) -> None:
        """Have `callback(node, gpus, t)` called with every sample recorded from now on, in
        the recording thread, after the reading is stored; it must be quick, and what it
        raises is logged, never passed to the recorder."""
        self._subscribers.append(callback)

    def record(self, node: str, gpus: list[GpuTelemetry], now: float) -> None:
        """One sample of a node's GPUs taken at `now` (the head's clock). The telemetry
        store (head/tsdb.py) calls this for every sample it ingests, in time order per
        node: the stream idle detection and accounting follow. An empty list (the agent
        failed to read its GPUs) keeps the last reading, which ages."""
        self.observe(node, gpus, now)
        self.stream(node, gpus, now)

    def stream(self, node: str, gpus: Sequence[GpuReading], now: float) -> None:
        """One sample to the subscribers only (the telemetry store: a node's latest reading
        for views and scrapes comes with its heartbeat, `observe`)."""
        if not gpus:
            return
        for callback in self._subscribers:
            try:
                callback(node, gpus, now)
            except Exception:
                log.exception("GPU samples: a subscriber failed on %s's sample", node)

    def observe(self, node: str, gpus: list[GpuTelemetry], now: float) -> None:
        """A node's latest reading as its heartbeat carried it: updates what `latest`
        shows (node and job views), but is not a sample of the stream `record` feeds."""
        if not gpus:
            return
        with self._lock:
            before = self._latest.get(node)
            if before is None or before.time <= now:
                self._latest[node] = Reading(now, tuple(gpus))

    def forget(self, node: str) -> None:
        with self._lock:
            self._latest.pop(node, None)

    def latest(self, node: str) -> Reading | None:
        with self._lock:
            return self._latest.get(node)

    def latest_all(self) -> dict[str, Reading]:
        """Every node's latest Reading (a copy: one lock for a whole scrape)."""
        with self._lock:
            return dict(self._latest)

    def of_job(
        self,
        placement: list[tuple[str, list[int]]],
        inventory: dict[str, list[GpuInfo]],
        now: float,
    ) -> list[JobGpu]:
        """The latest reading of each GPU in `placement` (node → GPU indices), with each
        GPU's total memory from `inventory` (node → its GPUs)."""
        out = []
        for node, indices in placement:
            reading = self.latest(node)
            by_index = {g.index: g for g in reading.gpus} if reading is not None else {}
            memory = {g.index: g.memory_mb for g in inventory.get(node, [])}
            for index in indices:
                sample = by_index.get(index)
                out.append(
                    JobGpu(
                        node=node,
                        index=index,
                        utilization_pct=None if sample is None else sample.utilization_pct,
                        memory_used_mb=None if sample is None else sample.memory_used_mb,
                        memory_mb=memory.get(index),
                        age_s=None if reading is None else max(0.0, now - reading.time),
                    )
                )
        return out
