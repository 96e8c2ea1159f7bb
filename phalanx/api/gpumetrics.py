"""Per-GPU Prometheus series in the text exposition format, shared by the agent's own
`/metrics` and the head's `/v1/metrics/gpus`: one row per GPU, labelled with the node, the
GPU's index and UUID and the job, user and team holding it (empty when idle).

Written by hand rather than through prometheus_client: 8,000 GPUs × 6 series are built
per scrape, and building that many client objects costs several times the text itself.
Names follow Prometheus's naming guide (base units, a unit suffix, `_total` only on
counters); README.md ("Prometheus metrics") maps them to dcgm-exporter's DCGM_FI_* names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU's latest reading and who holds it (None: not read / not held)."""

    node: str
    index: int
    uuid: str
    memory_mb: int | None = None  # the GPU's capacity
    utilization_pct: float | None = None
    memory_used_mb: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    age_s: float | None = None  # how old the reading is (head: since its heartbeat)
    job: int | None = None
    user: str = ""
    team: str = ""


# (name, type, help, how a row gives the value). Order is the exposition's order.
SERIES: tuple[tuple[str, str, str], ...] = (
    ("phalanx_gpu_utilization_ratio", "gauge", "GPU busy fraction (0-1) of the last sample"),
    ("phalanx_gpu_memory_used_bytes", "gauge", "GPU framebuffer memory in use"),
    ("phalanx_gpu_memory_capacity_bytes", "gauge", "GPU framebuffer memory in all"),
    ("phalanx_gpu_temperature_celsius", "gauge", "GPU temperature"),
    ("phalanx_gpu_power_watts", "gauge", "GPU power draw"),
    ("phalanx_gpu_reading_age_seconds", "gauge", "Age of the GPU's latest reading"),
)
NAMES = tuple(name for name, _, _ in SERIES)


def _values(row: GpuRow) -> tuple[float | None, ...]:
    mem_used = None if row.memory_used_mb is None else row.memory_used_mb * MIB
    mem_cap = None if row.memory_mb is None else row.memory_mb * MIB
    util = None if row.utilization_pct is None else row.utilization_pct / 100.0
    return (
        util,
        mem_used,
        mem_cap,
        row.temperature_c,
        row.power_w,
        row.age_s,
    )


def escape(value: str) -> str:
    """A label value escaped for the text format (backslash, quote, newline)."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def labels(row: GpuRow) -> str:
    job = "" if row.job is None else str(row.job)
    return (
        f'{{node="{escape(row.node)}",gpu="{row.index}",uuid="{escape(row.uuid)}",'
        f'job="{job}",user="{escape(row.user)}",team="{escape(row.team)}"}}'
    )


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def render(rows: Iterable[GpuRow], extra: Sequence[str] = ()) -> str:
    """The exposition of `rows` (every series has HELP and TYPE even with no row), then
    `extra` lines (already formatted, e.g. a scrape's own gauges)."""
    rows = list(rows)
    label_text = [labels(r) for r in rows]
    values = [_values(r) for r in rows]
    out: list[str] = []
    for i, (name, kind, help_text) in enumerate(SERIES):
        out.append(f"# HELP {name} {help_text}.")
        out.append(f"# TYPE {name} {kind}")
        for lab, vals in zip(label_text, values, strict=True):
            v = vals[i]
            if v is not None:
                out.append(f"{name}{lab} {_number(v)}")
    out.extend(extra)
    out.append("")
    return "\n".join(out)
