"""Wire types of the telemetry pipeline: the agent's sample batches and a job's efficiency.

A batch is columnar (one flat list per field, sample-major, GPU-minor) rather than a list
of objects: pydantic-core validates a list of numbers in one pass, so a head taking 1,000
nodes' batches spends its time storing them, not parsing them (bench/telemetry.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from phalanx.api.models import (
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    Count,
    Counter,
    GpuIndex,
    JobId,
    Lenient,
    Measure,
    Message,
    Name,
    UnixTime,
)

MAX_BATCH_SAMPLES = 360  # sampling instants in one batch (an hour at the default 10 s)
MAX_BATCH_JOBS = 4096  # job-usage readings in one batch
MAX_SERIES_POINTS = 20_000  # points in one series of an answer
MAX_NOTES = 32
Percent = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]
Joules = Annotated[float, Field(ge=0, le=1e15, allow_inf_nan=False)]
Watts = Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)]
Celsius = Annotated[float, Field(ge=-100, le=300, allow_inf_nan=False)]
Cores = Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)]
MiB = Annotated[int, Field(ge=0, le=2**40)]
Resolution = Literal["raw", "minute", "hour"]
_FLAT = MAX_BATCH_SAMPLES * (MAX_GPUS_PER_NODE + 1)


class JobUsage(Lenient):
    """One job's CPU and memory on this node at one instant (its cgroup, or /proc)."""

    job_id: JobId
    epoch: Count
    time: UnixTime  # the agent's clock
    cpu_cores: Cores  # CPU time used per second since the previous reading (cores busy)
    cpus: Annotated[int, Field(ge=0, le=100_000)]  # CPUs the job may use here (0: unknown)
    memory_mb: MiB


class TelemetryBatch(Lenient):
    """Samples of every GPU of one node (`POST /v1/telemetry`, node credential only).

    `gpus` names the G GPU indices; `times` the N sampling instants (the agent's clock,
    ascending); each per-GPU field holds N×G values, sample-major. `sent_at` is the
    agent's clock when sent: the head maps sample times onto its own clock by it.
    """

    node: Name
    sent_at: UnixTime
    dropped: Counter = 0  # samples the agent dropped (head unreachable, buffer full)
    gpus: list[GpuIndex] = Field(max_length=MAX_GPUS_PER_NODE + 1)
    times: list[UnixTime] = Field(max_length=MAX_BATCH_SAMPLES)
    utilization_pct: list[Percent | None] = Field(max_length=_FLAT)
    memory_used_mb: list[MiB | None] = Field(max_length=_FLAT)
    power_w: list[Watts | None] = Field(max_length=_FLAT)
    temperature_c: list[Celsius | None] = Field(max_length=_FLAT)
    energy_j: list[Joules | None] = Field(max_length=_FLAT)  # cumulative, per GPU
    job_id: list[JobId | None] = Field(max_length=_FLAT)  # who held the GPU (None: nobody)
    epoch: list[Count | None] = Field(max_length=_FLAT)
    jobs: list[JobUsage] = Field(default=[], max_length=MAX_BATCH_JOBS)

    @model_validator(mode="after")
    def _shape(self) -> TelemetryBatch:
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError("gpus: an index appears twice")
        if any(b < a for a, b in zip(self.times, self.times[1:], strict=False)):
            raise ValueError("times: must be ascending")
        if self.times and self.times[-1] > self.sent_at + 1.0:
            raise ValueError("times: a sample is later than sent_at")
        want = len(self.times) * len(self.gpus)
        for name in (
            "utilization_pct",
            "memory_used_mb",
            "power_w",
            "temperature_c",
            "energy_j",
            "job_id",
            "epoch",
        ):
            got = len(getattr(self, name))
            if got != want:
                raise ValueError(f"{name}: {got} values for {want} (times × gpus)")
        return self


class TelemetryAck(Lenient):
    samples: Count  # sampling instants stored
    dropped_total: Counter  # what this node's agents reported dropped since the head started


# ----------------------------------------------------------------------------- jobstats
class GpuStats(Lenient):
    node: Annotated[str, StringConstraints(max_length=128)]
    index: GpuIndex
    samples: Count
    mean_util_pct: Percent | None
    p95_util_pct: Percent | None
    max_util_pct: Percent | None
    peak_memory_mb: MiB | None
    memory_mb: MiB | None  # the GPU's total memory
    energy_j: Joules | None
    idle: bool  # at ~0% utilisation the whole time


class Point(Lenient):
    time: UnixTime
    value: Measure | None


class GpuSeries(Lenient):
    node: Annotated[str, StringConstraints(max_length=128)]
    index: GpuIndex
    points: list[Point] = Field(max_length=MAX_SERIES_POINTS)


class JobStats(Lenient):
    """`GET /v1/jobs/{ref}/stats`: a job's efficiency (docs in README, `phalanx jobstats`)."""

    job_id: JobId
    state: Annotated[str, StringConstraints(max_length=8)]
    final: bool  # the job ended and its stats will not change
    start_time: UnixTime | None
    end_time: UnixTime | None
    elapsed_s: Annotated[float, Field(ge=0, le=1e10, allow_inf_nan=False)]
    gpus_total: Count
    gpus_idle: Count
    mean_util_pct: Percent | None  # over all its GPUs
    energy_j: Joules | None
    cpu_cores_mean: Cores | None
    cpu_cores_max: Cores | None
    cpus: Annotated[int, Field(ge=0, le=100_000)] | None  # CPUs it may use (all nodes)
    memory_peak_mb: MiB | None
    memory_request_mb: Annotated[int, Field(ge=0, le=2**50)] | None = None  # --mem × nodes
    mfu_mean: Measure | None
    tokens_per_s_mean: Measure | None
    per_gpu: list[GpuStats] = Field(default=[], max_length=MAX_NODES * (MAX_GPUS_PER_NODE + 1))
    notes: list[Message] = Field(default=[], max_length=MAX_NOTES)
    resolution: Resolution | None = None  # of the series below (None: none kept)
    util_series: list[GpuSeries] = Field(default=[], max_length=MAX_NODES * (MAX_GPUS_PER_NODE + 1))
    mfu_series: list[Point] = Field(default=[], max_length=MAX_SERIES_POINTS)
    tokens_per_s_series: list[Point] = Field(default=[], max_length=MAX_SERIES_POINTS)
