"""The head's per-GPU series: every GPU's latest reading (head/telemetry.py GpuSamples)
with the job, user and team holding it, optionally one shard of the nodes.

A shard is every node whose name hashes (CRC-32) to K modulo N: stable across heads and
restarts, so N Prometheus jobs (or N scrape targets of one job) split a large cluster
evenly, each scraping `/v1/metrics/gpus?shard=K&of=N`.
"""

from __future__ import annotations

import threading
import zlib

from phalanx.api.gpumetrics import GpuRow
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import JobRecord
from phalanx.head.telemetry import GpuSamples

MAX_SHARDS = 1024


def shard_of(node: str, of: int) -> int:
    """The shard (0..of-1) node `node` belongs to."""
    return zlib.crc32(node.encode()) % of


Holder = tuple[int, str, str]  # (job id, user, team)


class GpuHolders:
    """Who holds each GPU: node → {GPU index: (job, user, team)}, for scrapes to read
    without the control lock (a scrape must never wait for a scheduling cycle).

    Kept by the control thread after each commit from the jobs that moved (a job's
    placement changes only with a transition: head/lifecycle.py), published copy-on-write
    so a reader sees one consistent map; rebuilt from the mirror when the mirror was
    (re)loaded."""

    def __init__(self, mirror: Mirror, lock: threading.RLock) -> None:
        self.mirror = mirror
        self.lock = lock
        self._mu = threading.Lock()  # between the control thread and a rebuilding reader
        self._by_node: dict[str, dict[int, Holder]] = {}
        self._nodes_of: dict[int, list[str]] = {}  # job → the nodes it is recorded on
        self._built_for: object = None  # the mirror's jobs dict the map was built from

    def observe(self, tx: Tx) -> None:
        """After a commit (control thread): follow the jobs that moved."""
        if self._built_for is not self.mirror.jobs:
            self._rebuild()
            return
        if not tx.moved_jobs:
            return
        with self._mu:
            by_node = dict(self._by_node)
            for rec in tx.moved_jobs.values():
                for node in self._nodes_of.pop(rec.id, ()):
                    gpus = by_node.get(node, {})
                    by_node[node] = {i: h for i, h in gpus.items() if h[0] != rec.id}
                if rec.state.holds_gpus and rec.id in self.mirror.jobs:
                    self._add(by_node, rec)
            self._by_node = by_node

    def _add(self, by_node: dict[str, dict[int, Holder]], rec: JobRecord) -> None:
        holder = (rec.id, rec.user, rec.team)
        for node, indices in rec.placement:
            gpus = dict(by_node.get(node, {}))
            for i in indices:
                gpus[i] = holder
            by_node[node] = gpus
        self._nodes_of[rec.id] = [n for n, _ in rec.placement]

    def _rebuild(self) -> None:
        with self.lock, self._mu:
            by_node: dict[str, dict[int, Holder]] = {}
            self._nodes_of = {}
            for rec in self.mirror.jobs.values():
                if rec.state.holds_gpus:
                    self._add(by_node, rec)
            self._by_node = by_node
            self._built_for = self.mirror.jobs

    def current(self) -> dict[str, dict[int, Holder]]:
        """The map now (do not change it)."""
        if self._built_for is not self.mirror.jobs:
            self._rebuild()
        return self._by_node


def gpu_rows(
    mirror: Mirror,
    holders: GpuHolders,
    samples: GpuSamples,
    now: float,
    shard: int = 0,
    of: int = 1,
) -> list[GpuRow]:
    """One row per GPU of the nodes in shard `shard` of `of`, in node-name order. Reads
    no lock but the telemetry's (the node list is copied in one step)."""
    held = holders.current()
    nodes = [
        (n.name, n.gpus)
        for n in list(mirror.nodes.values())
        if of == 1 or shard_of(n.name, of) == shard
    ]
    nodes.sort(key=lambda n: n[0])
    readings = samples.latest_all()
    rows: list[GpuRow] = []
    add = rows.append
    idle = (None, "", "")
    nobody: dict[int, Holder] = {}
    for name, inventory in nodes:
        on_node = held.get(name, nobody)
        reading = readings.get(name)
        if reading is None:
            for gpu in inventory:
                job, user, team = on_node.get(gpu.index, idle)
                add(GpuRow(name, gpu.index, gpu.uuid, gpu.memory_mb, None, None, None, None,
                           None, job, user, team))  # fmt: skip
            continue
        by_index = {g.index: g for g in reading.gpus}
        age = max(0.0, now - reading.time)
        for gpu in inventory:
            job, user, team = on_node.get(gpu.index, idle)
            t = by_index.get(gpu.index)
            if t is None:
                add(GpuRow(name, gpu.index, gpu.uuid, gpu.memory_mb, None, None, None, None,
                           None, job, user, team))  # fmt: skip
            else:
                add(GpuRow(name, gpu.index, gpu.uuid, gpu.memory_mb, t.utilization_pct,
                           t.memory_used_mb, t.temperature_c, t.power_w, age, job, user,
                           team, t.energy_j))  # fmt: skip
    return rows
