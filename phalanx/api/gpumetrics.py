"""Per-GPU Prometheus series in the text exposition format, shared by the agent's own
`/metrics` and the head's `/v1/metrics/gpus`: one row per GPU, labelled with the node, the
GPU's index and UUID and the job, user and team holding it (empty when idle).

Written by hand rather than through prometheus_client: 8,000 GPUs × 6 series are built
per scrape, and building that many client objects costs several times the text itself.
Names follow Prometheus's naming guide (base units, a unit suffix, `_total` only on
counters); README.md ("Prometheus metrics") maps them to dcgm-exporter's DCGM_FI_* names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MIB = 1024 * 1024
PERCENT = 0.01  # a field in percent: divided by 100


class GpuRow(NamedTuple):
    """One GPU's latest reading and who holds it (None: not read / not held). A tuple:
    a scrape builds one per GPU of the cluster."""

    node: str
    gpu: int  # its index on the node
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
    energy_j: float | None = None  # energy since the driver loaded (NVML's total energy)


# (name, type, help, the row's field, its scale: the value in base units is field × scale).
SERIES: tuple[tuple[str, str, str, str, int | float], ...] = (
    (
        "phalanx_gpu_utilization_ratio",
        "gauge",
        "GPU busy fraction (0-1) of the last sample",
        "utilization_pct",
        PERCENT,
    ),
    (
        "phalanx_gpu_memory_used_bytes",
        "gauge",
        "GPU framebuffer memory in use",
        "memory_used_mb",
        MIB,
    ),
    (
        "phalanx_gpu_memory_capacity_bytes",
        "gauge",
        "GPU framebuffer memory in all",
        "memory_mb",
        MIB,
    ),
    ("phalanx_gpu_temperature_celsius", "gauge", "GPU temperature", "temperature_c", 1),
    ("phalanx_gpu_power_watts", "gauge", "GPU power draw", "power_w", 1),
    ("phalanx_gpu_reading_age_seconds", "gauge", "Age of the GPU's latest reading", "age_s", 1),
    (
        "phalanx_gpu_energy_joules_total",
        "counter",
        "GPU energy consumed since its driver loaded",
        "energy_j",
        1,
    ),
)
NAMES = tuple(series[0] for series in SERIES)


def escape(value: str) -> str:
    """A label value escaped for the text format (backslash, quote, newline)."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def labels(row: GpuRow) -> str:
    """A GPU's label set, `{node="…",gpu="…",uuid="…",job="…",user="…",team="…"}`."""
    job = "" if row.job is None else str(row.job)
    return (
        f'{{node="{escape(row.node)}",gpu="{row.gpu}",uuid="{escape(row.uuid)}",'
        f'job="{job}",user="{escape(row.user)}",team="{escape(row.team)}"}}'
    )


def render(rows: Iterable[GpuRow], cache: dict[tuple[object, ...], str] | None = None) -> str:
    """The exposition of `rows`: every series has HELP and TYPE even with no row; a GPU
    without a reading has no sample of it. Numbers as Python writes them (ints exactly,
    floats shortest round-trip). `cache`: label sets kept between scrapes, keyed by their
    parts (one per caller; cleared when it outgrows the rows)."""
    rows = list(rows)
    if cache is None:
        label_text = [labels(r) for r in rows]
    else:  # label sets change only when a job starts or ends on a GPU
        if len(cache) > 4 * len(rows) + 1024:
            cache.clear()
        label_text = []
        for r in rows:
            key = (r.node, r.gpu, r.uuid, r.job, r.user, r.team)
            text = cache.get(key)
            if text is None:
                text = cache[key] = labels(r)
            label_text.append(text)
    out: list[str] = []
    for name, kind, help_text, field, scale in SERIES:
        out.append(f"# HELP {name} {help_text}.")
        out.append(f"# TYPE {name} {kind}")
        values = [getattr(r, field) for r in rows]
        pairs = zip(label_text, values, strict=True)
        if scale == 1:
            out.extend(f"{name}{lab} {v!r}" for lab, v in pairs if v is not None)
        elif scale == PERCENT:
            out.extend(f"{name}{lab} {v / 100!r}" for lab, v in pairs if v is not None)
        else:
            out.extend(f"{name}{lab} {v * scale!r}" for lab, v in pairs if v is not None)
    out.append("")
    return "\n".join(out)
