"""`phalanx jobstats ID`: a job's GPU efficiency, like Princeton's jobstats."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from phalanx.cli.connect import HeadOpt, JsonOpt, TokenOpt, connect
from phalanx.cli.jobctl import job_refs
from phalanx.cli.output import console, duration, fail, print_json, print_table

if TYPE_CHECKING:
    from phalanx.api.telemetry import JobStats

SPARK = "▁▂▃▄▅▆▇█"


def jobstats(
    job_id: Annotated[
        str, typer.Argument(help="Job id: 123, or 123_4 for an array task.", show_default=False)
    ],
    resolution: Annotated[
        str | None,
        typer.Option(
            help="Series resolution for --json: raw, minute or hour (default: by the job's "
            "length).",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """A job's GPU efficiency: per-GPU utilisation (mean, p95), peak memory, energy, idle
    GPUs, CPU and memory use, MFU and tokens/s, and notes on what to change."""
    if resolution is not None and resolution not in ("raw", "minute", "hour"):
        fail(f"--resolution must be raw, minute or hour, not {resolution!r}")
    refs = job_refs([job_id]) if "[" not in job_id else []
    if len(refs) != 1:
        fail(f"{job_id!r}: jobstats takes one job (123 or 123_4)")
    with connect(head, token) as client:
        stats = client.job_stats(refs[0], resolution=resolution, series=True)
    if json_out:
        print_json(stats)
        return
    _show(stats)


def _show(s: JobStats) -> None:
    out = console()
    status = "final" if s.final else "live"
    out.print(
        f"[bold]Job {s.job_id}[/bold]  state {s.state}  ({status})  "
        f"run time {duration(s.elapsed_s) or '0:00'}"
    )
    gpus = f"{s.gpus_total} GPU(s)"
    if s.gpus_idle:
        gpus += f", {s.gpus_idle} idle"
    util = "n/a" if s.mean_util_pct is None else f"{s.mean_util_pct:.1f}%"
    lines = [f"GPUs: {gpus}; mean utilisation {util}"]
    if s.energy_j is not None:
        lines.append(f"Energy: {s.energy_j / 3600:.1f} Wh ({s.energy_j / 1000:.1f} kJ)")
    if s.cpu_cores_mean is not None:
        of = f" of {s.cpus}" if s.cpus else ""
        lines.append(
            f"CPU: {s.cpu_cores_mean:.2f} cores busy on average{of} (max {s.cpu_cores_max:.2f}); "
            f"memory peak {(s.memory_peak_mb or 0) / 1024:.1f} GiB"
        )
    if s.mfu_mean is not None:
        lines.append(f"MFU: {100 * s.mfu_mean:.1f}% on average  {_spark(s.mfu_series)}")
    if s.tokens_per_s_mean is not None:
        lines.append(f"Tokens/s: {s.tokens_per_s_mean:,.0f} on average")
    for line in lines:
        out.print(line, highlight=False)
    if s.per_gpu:
        series = {(g.node, g.index): g.points for g in s.util_series}
        rows = [
            [
                g.node,
                str(g.index),
                _pct(g.mean_util_pct),
                _pct(g.p95_util_pct),
                _mem(g.peak_memory_mb, g.memory_mb),
                "" if g.energy_j is None else f"{g.energy_j / 3600:.1f}",
                "idle" if g.idle else "",
                _spark(series.get((g.node, g.index), [])),
            ]
            for g in s.per_gpu
        ]
        print_table(
            [
                ("NODE", False),
                ("GPU", True),
                ("MEAN", True),
                ("P95", True),
                ("PEAK MEM", True),
                ("WH", True),
                ("", False),
                ("UTILISATION", False),
            ],
            rows,
        )
    for note in s.notes:
        out.print(f"• {note}", highlight=False, markup=False)


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}%"


def _mem(peak: int | None, total: int | None) -> str:
    if peak is None:
        return ""
    return f"{peak / 1024:.1f}" + (f"/{total / 1024:.0f} GiB" if total else " GiB")


def _spark(points: Sequence[object], width: int = 24) -> str:
    """A one-line sparkline of a series' values (0–100 for utilisation; scaled to the
    series' own maximum otherwise)."""
    values = [v for p in points if (v := getattr(p, "value", None)) is not None]
    if not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        values = [values[int(i * step)] for i in range(width)]
    top = max(100.0, max(values)) if max(values) > 1.0 else max(values) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1)))] for v in values)
