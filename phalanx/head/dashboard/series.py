"""The data behind a job page's charts, one small function each.

`gpu_series` is the GPU utilisation chart's only source. The head keeps only each node's
latest reading (head.telemetry.GpuSamples), so today it answers one point per GPU (now)
and the browser appends the points it is sent while the page is open; when the head
keeps a time series, this function returns the job's stored history in the same shape
and the chart shows it from the start.
`progress_series` is the loss/MFU chart's: the latest report of each rank (the head keeps
the last only), averaged over ranks, as one point; the same holds.
"""

from __future__ import annotations

from typing import Any

from phalanx.api import models as m
from phalanx.head.records import JobRecord
from phalanx.head.service import Head


def gpu_series(head: Head, rec: JobRecord) -> dict[str, Any]:
    """`{"t": [unix s…], "series": {"node:gpu": [util %…]}}` for the GPUs the job holds."""
    now = head.now()
    with head.control.lock:
        placement = [(n, list(g)) for n, g in rec.placement] if rec.state.holds_gpus else []
        inventory = {
            n: list(head.mirror.nodes[n].gpus) for n, _ in placement if n in head.mirror.nodes
        }
    gpus = head.samples.of_job(placement, inventory, now)
    if not gpus:
        return {"t": [], "series": {}}
    series: dict[str, list[float | None]] = {}
    ages = [g.age_s for g in gpus if g.age_s is not None]
    when = now - min(ages) if ages else now
    for g in gpus:
        series[f"{g.node}:{g.index}"] = [g.utilization_pct]
    return {"t": [round(when, 3)], "series": series}


def progress_series(progress: list[m.JobProgress]) -> dict[str, Any]:
    """`{"t": [...], "step": [...], "loss": [...], "mfu": [...], "tokens_per_s": [...]}` from
    the ranks' latest reports (means over the ranks that report each number)."""
    if not progress:
        return {"t": [], "step": [], "loss": [], "mfu": [], "tokens_per_s": []}

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) / len(known) if known else None

    return {
        "t": [max(p.time for p in progress)],
        "step": [max(p.step for p in progress)],
        "loss": [mean([p.loss for p in progress])],
        "mfu": [mean([p.mfu for p in progress])],
        "tokens_per_s": [mean([p.tokens_per_s for p in progress])],
    }
