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
from phalanx.head.mirror import Mirror
from phalanx.head.telemetry import GpuSamples

MAX_SHARDS = 1024


def shard_of(node: str, of: int) -> int:
    """The shard (0..of-1) node `node` belongs to."""
    return zlib.crc32(node.encode()) % of


def gpu_rows(
    mirror: Mirror,
    lock: threading.RLock,
    samples: GpuSamples,
    now: float,
    shard: int = 0,
    of: int = 1,
) -> list[GpuRow]:
    """One row per GPU of the nodes in shard `shard` of `of`, in node-name order."""
    with lock:  # the control thread's
        nodes = []
        for node in mirror.nodes.values():
            if of > 1 and shard_of(node.name, of) != shard:
                continue
            holders: dict[int, tuple[int, str, str]] = {}
            for job_id in mirror.node_jobs.get(node.name, ()):
                rec = mirror.jobs.get(job_id)
                if rec is None or not rec.state.holds_gpus:
                    continue
                for name, indices in rec.placement:
                    if name == node.name:
                        for i in indices:
                            holders[i] = (rec.id, rec.user, rec.team)
            nodes.append((node.name, list(node.gpus), holders))
    nodes.sort(key=lambda n: n[0])
    rows: list[GpuRow] = []
    for name, inventory, holders in nodes:
        reading = samples.latest(name)
        by_index = {g.index: g for g in reading.gpus} if reading is not None else {}
        age = None if reading is None else max(0.0, now - reading.time)
        for gpu in inventory:
            sample = by_index.get(gpu.index)
            job, user, team = holders.get(gpu.index, (None, "", ""))
            rows.append(
                GpuRow(
                    name,
                    gpu.index,
                    gpu.uuid,
                    gpu.memory_mb,
                    None if sample is None else sample.utilization_pct,
                    None if sample is None else sample.memory_used_mb,
                    None if sample is None else sample.temperature_c,
                    None if sample is None else sample.power_w,
                    None if sample is None else age,
                    job,
                    user,
                    team,
                )
            )
    return rows
