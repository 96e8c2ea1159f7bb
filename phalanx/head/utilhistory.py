"""The cluster's GPU utilisation over time, minute by minute, for the dashboard's overview.

Fed by every GPU sample the head ingests (a GpuSamples subscriber): per minute, the sum and
count of utilisation readings, so the overview's chart shows the mean utilisation of all
GPUs reporting, and of those allocated to jobs, without reading the time-series store (a
query over every node's rollups per page would grow with the cluster). Kept in memory for
`keep_minutes` (default a day): a restarted head's chart starts again from its start; the
per-job history and the accounting are in the database (head/tsdb.py, head/accounting.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from phalanx.head.telemetry import GpuReading

MINUTE_S = 60.0


class UtilHistory:
    """minute → (∑ utilisation, readings, ∑ of allocated GPUs, their readings)."""

    def __init__(
        self, allocated: Callable[[str], frozenset[int]], keep_minutes: int = 24 * 60
    ) -> None:
        self._allocated = allocated  # node → its GPU indices held by jobs
        self._keep = keep_minutes
        self._lock = threading.Lock()
        self._minutes: dict[int, list[float]] = {}

    def add(self, node: str, gpus: Sequence[GpuReading], t: float) -> None:
        minute = int(t // MINUTE_S)
        held = self._allocated(node)
        total = count = total_held = count_held = 0.0
        for g in gpus:
            if g.utilization_pct is None:
                continue
            total += g.utilization_pct
            count += 1
            if g.index in held:
                total_held += g.utilization_pct
                count_held += 1
        if not count:
            return
        with self._lock:
            bucket = self._minutes.get(minute)
            if bucket is None:
                bucket = self._minutes[minute] = [0.0, 0.0, 0.0, 0.0]
                if len(self._minutes) > self._keep:
                    for old in sorted(self._minutes)[: len(self._minutes) - self._keep]:
                        del self._minutes[old]
            bucket[0] += total
            bucket[1] += count
            bucket[2] += total_held
            bucket[3] += count_held

    def series(self, since: float, now: float) -> dict[str, list[float | None]]:
        """`{"t": [minute start…], "all": [mean %…], "allocated": [mean %…]}`, oldest first,
        of the complete minutes from `since` to `now` (unix seconds): the minute still
        filling is left out (a chart appends it once it is complete)."""
        first, current = int(since // MINUTE_S), int(now // MINUTE_S)
        with self._lock:
            rows = sorted((m, list(b)) for m, b in self._minutes.items() if first <= m < current)
        return {
            "t": [m * MINUTE_S for m, _ in rows],
            "all": [round(b[0] / b[1], 1) if b[1] else None for _, b in rows],
            "allocated": [round(b[2] / b[3], 1) if b[3] else None for _, b in rows],
        }
