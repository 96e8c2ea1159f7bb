"""The Rich summary table for one or more simulation runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table


def _hours(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


ROWS: tuple[tuple[str, str, str], ...] = (
    ("jobs", "jobs finished", "int"),
    ("unfinished", "jobs not finished", "int"),
    ("avg_jct_s", "avg JCT", "time"),
    ("p50_jct_s", "p50 JCT", "time"),
    ("p95_jct_s", "p95 JCT", "time"),
    ("p99_jct_s", "p99 JCT", "time"),
    ("avg_queue_s", "avg queueing delay", "time"),
    ("p99_queue_s", "p99 queueing delay", "time"),
    ("utilization", "GPU utilisation, whole run", "pct"),
    ("utilization_while_arriving", "GPU utilisation, while jobs arrive", "pct"),
    ("makespan_s", "makespan", "time"),
    ("jain_fairness", "fairness (Jain, teams)", "float"),
    ("preemptions", "preemptions", "int"),
    ("failures", "node failures", "int"),
    ("lost_gpu_hours", "lost work (GPU-h)", "float"),
    ("goodput", "goodput (useful / allocated)", "pct"),
    ("young_daly_s_8gpu", "Young/Daly interval, 8 GPUs", "time"),
    ("young_daly_s_largest", "Young/Daly interval, largest job", "time"),
    ("spread_jobs", "gangs spread over racks", "int"),
    ("wall_s", "simulation wall time", "secs"),
)


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "–"
    if kind == "int":
        return f"{int(value):,}"
    if kind == "time":
        return _hours(float(value))
    if kind == "pct":
        return f"{100 * float(value):.1f}%"
    if kind == "secs":
        return f"{float(value):.1f} s"
    return f"{float(value):.3f}"


def summary_table(summaries: Mapping[str, Mapping[str, Any]], title: str) -> Table:
    """One column per run (e.g. per policy), one row per metric present in any run."""
    table = Table(title=title)
    table.add_column("metric")
    for label in summaries:
        table.add_column(label, justify="right")
    for key, name, kind in ROWS:
        if not any(key in s for s in summaries.values()):
            continue
        table.add_row(name, *(_fmt(s.get(key), kind) for s in summaries.values()))
    return table
