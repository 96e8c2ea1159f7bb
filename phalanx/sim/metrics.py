"""Turn raw simulation results into the report: JCT, queueing, utilisation, fairness, goodput."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from phalanx.sim.engine import SimResult
from phalanx.sim.failures import FailureModel

FloatArray = npt.NDArray[np.float64]


def _pct(values: FloatArray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else 0.0


def _mean(values: FloatArray) -> float:
    return float(values.mean()) if values.size else 0.0


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all equal, 1/n when one gets all."""
    x = np.asarray(values, dtype=float)
    if x.size == 0 or not np.any(x):
        return 1.0
    return float(x.sum() ** 2 / (x.size * (x**2).sum()))


def timeline(results: Sequence[SimResult]) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Busy GPUs and queued jobs over time, summed over independently simulated clusters."""
    parts = [np.frombuffer(r.times, dtype=float) for r in results if len(r.times)]
    if not parts:
        empty = np.zeros(0)
        return empty, empty, empty
    grid = np.unique(np.concatenate(parts))
    busy = np.zeros(grid.size)
    queued = np.zeros(grid.size)
    for r in results:
        if not len(r.times):
            continue
        t = np.frombuffer(r.times, dtype=float)
        idx = np.searchsorted(t, grid, side="right") - 1
        valid = idx >= 0
        busy[valid] += np.frombuffer(r.busy, dtype=float)[idx[valid]]
        queued[valid] += np.frombuffer(r.queued, dtype=float)[idx[valid]]
    return grid, busy, queued


def busy_gpu_s(grid: FloatArray, busy: FloatArray, start: float, end: float) -> float:
    """GPU-seconds busy between `start` and `end` (busy[i] holds from grid[i] to grid[i+1])."""
    if grid.size < 2 or end <= start:
        return 0.0
    return float(np.sum(busy[:-1] * np.diff(np.clip(grid, start, end))))


def summarize(
    results: Sequence[SimResult], failures: FailureModel | None = None, wall_s: float | None = None
) -> dict[str, Any]:
    """One JSON-ready summary over one or more independently simulated clusters."""
    submit = np.concatenate([np.frombuffer(r.submit, dtype=float) for r in results])
    start = np.concatenate([np.frombuffer(r.start, dtype=float) for r in results])
    finish = np.concatenate([np.frombuffer(r.finish, dtype=float) for r in results])
    duration = np.concatenate([np.frombuffer(r.duration, dtype=float) for r in results])
    gpus = np.concatenate([np.frombuffer(r.job_gpus, dtype=float) for r in results])
    teams = np.array([t for r in results for t in r.teams])
    done = finish >= 0
    jct = (finish - submit)[done]
    queue = (start - submit)[done]
    total_gpus = sum(r.gpus for r in results)

    t0 = float(submit.min()) if submit.size else 0.0
    t1 = float(finish[done].max()) if done.any() else t0
    grid, busy, queued = timeline(results)
    span = max(t1 - t0, 1e-9)
    whole = busy_gpu_s(grid, busy, t0, t1) / (total_gpus * span) if total_gpus else 0.0
    # The whole-run figure averages in the drain after the last arrival, when the queue
    # empties and GPUs go idle (days, on a long trace); while jobs still arrive is the
    # steady state a cluster of that load would see.
    last_submit = float(submit.max()) if submit.size else t0
    arriving = last_submit - t0
    steady = (
        busy_gpu_s(grid, busy, t0, last_submit) / (total_gpus * arriving)
        if total_gpus and arriving > 0
        else None
    )

    service: list[float] = []
    for team in sorted(set(teams[done].tolist())):
        mask = done & (teams == team)
        ratio = duration[mask] / np.maximum(finish[mask] - submit[mask], 1e-9)
        service.append(float(np.minimum(ratio, 1.0).mean()))

    alloc = sum(r.alloc_gpu_s for r in results)
    useful = sum(r.useful_gpu_s for r in results)
    out: dict[str, Any] = {
        "cluster": ",".join(r.cluster for r in results),
        "policy": results[0].policy if results else "",
        "gpus": total_gpus,
        "jobs": int(done.sum()),
        "unfinished": int(sum(r.unfinished for r in results)),
        "single_gpu_share": float((gpus == 1).mean()) if gpus.size else 0.0,
        "avg_jct_s": _mean(jct),
        "p50_jct_s": _pct(jct, 50),
        "p95_jct_s": _pct(jct, 95),
        "p99_jct_s": _pct(jct, 99),
        "avg_run_s": _mean(duration[done]),
        "offered_load": float((duration * gpus).sum()) / (total_gpus * span) if total_gpus else 0.0,
        "avg_queue_s": _mean(queue),
        "p50_queue_s": _pct(queue, 50),
        "p99_queue_s": _pct(queue, 99),
        "utilization": whole,
        "utilization_while_arriving": steady,
        "makespan_s": t1 - t0,
        "jain_fairness": jain_index(service),
        "preemptions": int(sum(r.preemptions for r in results)),
        "failures": int(sum(r.failures for r in results)),
        "restarts": int(sum(r.restarts for r in results)),
        "lost_gpu_hours": sum(r.lost_gpu_s for r in results) / 3600.0,
        "goodput": useful / alloc if alloc else 1.0,
        "spread_jobs": int(sum(r.spread_jobs for r in results)),
        "cycles": int(sum(r.cycles for r in results)),
        "max_queue": int(queued.max()) if queued.size else 0,
        "wall_s": wall_s if wall_s is not None else sum(r.wall_s for r in results),
    }
    if failures is not None and failures.enabled:
        largest = int(gpus.max()) if gpus.size else 1
        out["checkpoint_interval_s"] = failures.checkpoint_interval_s
        out["young_daly_s_8gpu"] = failures.young_daly_s(8)
        out["young_daly_s_largest"] = failures.young_daly_s(largest)
        out["largest_job_gpus"] = largest
    return out
