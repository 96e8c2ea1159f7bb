"""The data behind a job page's charts, one small function each.

A page opens with the job's history from the telemetry store (`history`: each GPU's
utilisation and the progress reports, at the resolution the store picks for the job's
length); its live fragment then carries the latest point only (`gpu_series`: each GPU's
latest reading; `progress_series`: the ranks' latest reports, averaged), which the
browser appends (dash.js skips a point not newer than the last it has).
"""

from __future__ import annotations

from typing import Any

from phalanx.api import models as m
from phalanx.api import telemetry as t
from phalanx.head.jobstats import ProgressRow
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


def history(stats: t.JobStats | None, progress: list[ProgressRow]) -> dict[str, Any]:
    """The charts' data since the job started, in the shapes above: the stored per-GPU
    utilisation series (`stats.util_series`) on one time axis, and every progress report."""
    gpu: dict[str, Any] = {"t": [], "series": {}}
    if stats is not None and stats.util_series:
        times = sorted({p.time for s in stats.util_series for p in s.points})
        at = {when: i for i, when in enumerate(times)}
        columns: dict[str, list[float | None]] = {}
        for s in stats.util_series:
            column: list[float | None] = [None] * len(times)
            for p in s.points:
                column[at[p.time]] = p.value
            columns[f"{s.node}:{s.index}"] = column
        gpu = {"t": [round(x, 3) for x in times], "series": columns}
    return {
        "gpu": gpu,
        "progress": {
            "t": [p.time for p in progress],
            "step": [p.step for p in progress],
            "loss": [p.loss for p in progress],
            "mfu": [p.mfu for p in progress],
            "tokens_per_s": [p.tokens_per_s for p in progress],
        },
    }
