"""A job's GPU efficiency from its telemetry: pure functions over telemetry blocks.

What `phalanx jobstats` and `GET /v1/jobs/{ref}/stats` show, in the spirit of Princeton's
jobstats: per-GPU mean/p95 utilisation, peak memory and energy; idle GPUs; the job's CPU
and memory use; MFU and tokens/s over time; and notes a person can act on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from phalanx.api import telemetry as t
from phalanx.head.tsblocks import RawBlock, RollupBlock, energy_steps

IDLE_PCT = 1.0  # a GPU whose mean utilisation stays under this is unused
LOW_UTIL_PCT = 50.0  # mean utilisation under this is low
CPU_SATURATED = 0.9  # CPU use at this share of the job's CPUs or more is saturated
LOW_MEMORY = 0.25  # peak GPU memory under this share of the GPU's is far below it
MAX_POINTS = 2000  # points per GPU in a series (evenly thinned)


@dataclass(frozen=True)
class ProgressRow:
    time: float
    step: int
    loss: float | None
    tokens_per_s: float | None
    mfu: float | None


@dataclass(frozen=True)
class JobFacts:
    """What the head knows of the job besides its telemetry."""

    job_id: int
    state: str
    final: bool
    start_time: float | None
    end_time: float | None
    now: float
    memory_request_mb: int | None = None  # over all its nodes (--mem × nodes); None: none


def compute(
    facts: JobFacts,
    blocks: Mapping[str, Sequence[RawBlock]],
    memory_total: Mapping[tuple[str, int], int],
    progress: Sequence[ProgressRow],
) -> t.JobStats:
    """The stats of job `facts.job_id` from each node's raw blocks (only its samples count:
    those whose GPU the job held) and its progress reports."""
    jid = facts.job_id
    per_gpu: list[t.GpuStats] = []
    all_util: list[float] = []
    energy_total = 0.0
    has_energy = False
    cores_mean = cores_max = 0.0
    cpus = 0
    mem_peak = 0.0
    has_usage = False
    for node in sorted(blocks):
        node_cores: list[float] = []
        node_cpus: list[int] = []
        node_mem: list[float] = []
        by_gpu: dict[int, tuple[list[float], list[float], float, bool]] = {}
        for b in blocks[node]:
            steps = energy_steps(b.energy)
            held = b.job == jid
            for gi, gpu in enumerate(b.gpus.tolist()):
                mask = held[gi]
                if not mask.any():
                    continue
                util, mem, energy, has_e = by_gpu.get(gpu, ([], [], 0.0, False))
                u = b.util[gi][mask]
                util.extend(u[~np.isnan(u)].tolist())
                mm = b.memory[gi][mask]
                mem.extend(mm[~np.isnan(mm)].tolist())
                # Energy of a step counts when the job held the GPU at both of its ends.
                both = mask.copy()
                both[1:] &= mask[:-1]
                both[0] = False
                e = steps[gi][both]
                has_e = has_e or bool((~np.isnan(b.energy[gi][mask])).any())
                by_gpu[gpu] = (util, mem, energy + float(e.sum()), has_e)
            u_mask = b.u_job == jid
            node_cores.extend(b.u_cores[u_mask].tolist())
            node_cpus.extend(b.u_cpus[u_mask].tolist())
            node_mem.extend(b.u_memory[u_mask].tolist())
        for gpu in sorted(by_gpu):
            util, mem, energy, has_e = by_gpu[gpu]
            arr = np.array(util)
            mean = float(arr.mean()) if arr.size else None
            per_gpu.append(
                t.GpuStats(
                    node=node,
                    index=gpu,
                    samples=len(util),
                    mean_util_pct=_r(mean),
                    p95_util_pct=_r(float(np.percentile(arr, 95))) if arr.size else None,
                    max_util_pct=_r(float(arr.max())) if arr.size else None,
                    peak_memory_mb=int(max(mem)) if mem else None,
                    memory_mb=memory_total.get((node, gpu)),
                    energy_j=round(energy, 1) if has_e else None,
                    idle=mean is not None and mean < IDLE_PCT,
                )
            )
            all_util.extend(util)
            if has_e:
                energy_total += energy
                has_energy = True
        if node_cores:
            has_usage = True
            cores_mean += float(np.mean(node_cores))
            cores_max += float(np.max(node_cores))
            cpus += int(max(node_cpus))
            mem_peak += float(np.max(node_mem))
    mfu = [p.mfu for p in progress if p.mfu is not None]
    tps = [p.tokens_per_s for p in progress if p.tokens_per_s is not None]
    elapsed = 0.0
    if facts.start_time is not None:
        elapsed = max(0.0, (facts.end_time or facts.now) - facts.start_time)
    stats = t.JobStats(
        memory_request_mb=facts.memory_request_mb,
        job_id=jid,
        state=facts.state,
        final=facts.final,
        start_time=facts.start_time,
        end_time=facts.end_time,
        elapsed_s=round(elapsed, 3),
        gpus_total=len(per_gpu),
        gpus_idle=sum(g.idle for g in per_gpu),
        mean_util_pct=_r(float(np.mean(all_util))) if all_util else None,
        energy_j=round(energy_total, 1) if has_energy else None,
        cpu_cores_mean=round(cores_mean, 3) if has_usage else None,
        cpu_cores_max=round(cores_max, 3) if has_usage else None,
        cpus=cpus if has_usage else None,
        memory_peak_mb=int(mem_peak) if has_usage else None,
        mfu_mean=round(float(np.mean(mfu)), 6) if mfu else None,
        tokens_per_s_mean=round(float(np.mean(tps)), 3) if tps else None,
        per_gpu=per_gpu,
    )
    return stats.model_copy(update={"notes": notes(stats)})


def notes(s: t.JobStats) -> list[str]:
    """Plain-language findings, most important first."""
    out: list[str] = []
    if not s.per_gpu:
        out.append("no GPU samples for this job yet" if not s.final else "no GPU samples")
        return out
    idle = [g for g in s.per_gpu if g.idle]
    if idle:
        where = ", ".join(f"{g.node}:{g.index}" for g in idle[:8])
        more = f" and {len(idle) - 8} more" if len(idle) > 8 else ""
        out.append(
            f"{len(idle)} of {len(s.per_gpu)} GPUs unused (~0% utilisation the whole time: "
            f"{where}{more}); ask for fewer GPUs"
        )
    used = [g.mean_util_pct for g in s.per_gpu if not g.idle and g.mean_util_pct is not None]
    mean_used = sum(used) / len(used) if used else None
    saturated = (
        s.cpu_cores_mean is not None
        and s.cpus is not None
        and s.cpus > 0
        and s.cpu_cores_mean >= CPU_SATURATED * s.cpus
    )
    if mean_used is not None and mean_used < LOW_UTIL_PCT:
        if saturated:
            assert s.cpu_cores_mean is not None
            out.append(
                f"data-loader bound? the GPUs in use average {mean_used:.0f}% while the job's "
                f"CPUs are saturated ({s.cpu_cores_mean:.1f} of {s.cpus} cores busy): use more "
                "data-loader workers or CPUs, or preprocess the data ahead"
            )
        else:
            out.append(
                f"low GPU utilisation: the GPUs in use average {mean_used:.0f}% "
                f"(aim for {LOW_UTIL_PCT:.0f}% or more)"
            )
    peaks = [
        (g.peak_memory_mb, g.memory_mb)
        for g in s.per_gpu
        if not g.idle and g.peak_memory_mb is not None and g.memory_mb
    ]
    if peaks and all(p < LOW_MEMORY * total for p, total in peaks):
        peak = max(p for p, _ in peaks)
        total = max(total for _, total in peaks)
        out.append(
            f"GPU memory far below what the GPUs have: peak {peak / 1024:.1f} GiB of "
            f"{total / 1024:.0f} GiB ({100 * peak / total:.0f}%): a larger batch, or a "
            "smaller GPU, would do"
        )
    request = s.memory_request_mb
    if request and s.memory_peak_mb is not None and s.memory_peak_mb < LOW_MEMORY * request:
        out.append(
            f"memory far below the request: peak {s.memory_peak_mb / 1024:.1f} GiB of "
            f"{request / 1024:.1f} GiB asked for (--mem); ask for less"
        )
    if not out and mean_used is not None:
        out.append(f"GPUs well used: {mean_used:.0f}% on average")
    return out


def raw_series(job_id: int, blocks: Mapping[str, Sequence[RawBlock]]) -> list[t.GpuSeries]:
    """Each of the job's GPUs' utilisation at every sample it held the GPU."""
    out: list[t.GpuSeries] = []
    for node in sorted(blocks):
        points: dict[int, list[t.Point]] = {}
        for b in blocks[node]:
            held = b.job == job_id
            for gi, gpu in enumerate(b.gpus.tolist()):
                mask = held[gi]
                if mask.any():
                    points.setdefault(gpu, []).extend(_points(b.times[mask], b.util[gi][mask]))
        out.extend(t.GpuSeries(node=node, index=g, points=_thin(points[g])) for g in sorted(points))
    return out


def rollup_series(job_id: int, rollups: Mapping[str, Sequence[RollupBlock]]) -> list[t.GpuSeries]:
    """Each of the job's GPUs' mean utilisation per bucket it held the GPU."""
    out: list[t.GpuSeries] = []
    for node in sorted(rollups):
        points: dict[int, list[t.Point]] = {}
        for r in rollups[node]:
            held = r.job == job_id
            for gi, gpu in enumerate(r.gpus.tolist()):
                mask = held[gi] & (r.samples[gi] > 0)
                if mask.any():
                    points.setdefault(gpu, []).extend(
                        _points(r.starts[mask], r.mean_util[gi][mask])
                    )
        out.extend(
            t.GpuSeries(node=node, index=g, points=_thin(sorted(points[g], key=lambda p: p.time)))
            for g in sorted(points)
        )
    return out


def progress_series(progress: Sequence[ProgressRow]) -> tuple[list[t.Point], list[t.Point]]:
    """(MFU, tokens/s) over time from the job's progress reports."""
    mfu = [t.Point(time=p.time, value=p.mfu) for p in progress if p.mfu is not None]
    tps = [t.Point(time=p.time, value=p.tokens_per_s) for p in progress if p.tokens_per_s]
    return _thin(mfu), _thin(tps)


def _points(times: npt.NDArray[Any], values: npt.NDArray[Any]) -> list[t.Point]:
    return [
        t.Point(time=float(x), value=None if np.isnan(v) else round(float(v), 1))
        for x, v in zip(times.tolist(), values.tolist(), strict=True)
    ]


def _thin(points: list[t.Point], limit: int = MAX_POINTS) -> list[t.Point]:
    if len(points) <= limit:
        return points
    step = len(points) / limit
    return [points[int(i * step)] for i in range(limit)]


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
