"""Run one or more simulations — per virtual cluster, per policy — in parallel processes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from phalanx.sim.engine import SimConfig, SimResult, simulate
from phalanx.sim.layout import ClusterLayout
from phalanx.sim.metrics import summarize
from phalanx.sim.workload import Workload


@dataclass(frozen=True, slots=True)
class Scenario:
    """Clusters simulated independently, each with its own workload (same keys)."""

    layouts: Mapping[str, ClusterLayout]
    workloads: Mapping[str, Workload]
    description: str = ""

    @classmethod
    def single(cls, layout: ClusterLayout, workload: Workload) -> Scenario:
        return cls({layout.name: layout}, {layout.name: workload}, workload.source)

    @classmethod
    def per_vc(cls, layouts: Mapping[str, ClusterLayout], workload: Workload) -> Scenario:
        """Split one workload by team (the Philly VC) over one cluster per VC; other VCs drop."""
        parts: dict[str, list[Any]] = {vc: [] for vc in layouts}
        for job in workload.jobs:
            if job.team in parts:
                parts[job.team].append(job)
        workloads = {
            vc: replace(workload, jobs=tuple(jobs), source=f"{workload.source} [VC {vc}]")
            for vc, jobs in parts.items()
        }
        return cls(layouts, workloads, workload.source)

    @property
    def jobs(self) -> int:
        return sum(len(w.jobs) for w in self.workloads.values())


@dataclass(frozen=True, slots=True)
class RunOutcome:
    results: list[SimResult]
    summary: dict[str, Any]


Report = Callable[[str], None]


def print_progress(label: str, now: float, done: int, total: int) -> None:
    """Progress of one long simulation on stderr (also from worker processes)."""
    print(
        f"  … {label}: {done:,}/{total:,} jobs done, virtual day {now / 86400:.1f}",
        file=sys.stderr,
        flush=True,
    )


def _simulate(
    layout: ClusterLayout, workload: Workload, config: SimConfig, label: str, progress: bool
) -> SimResult:
    callback = partial(print_progress, label) if progress else None
    return simulate(layout, workload, config, callback)


def run(
    scenario: Scenario,
    configs: Mapping[str, SimConfig],
    workers: int | None = None,
    report: Report | None = None,
) -> dict[str, RunOutcome]:
    """Simulate every (config, cluster) pair; summarize per config label."""
    tasks = [(label, name) for label in configs for name in scenario.layouts]
    workers = max(1, min(workers or os.cpu_count() or 1, len(tasks)))
    results: dict[tuple[str, str], SimResult] = {}
    started = time.perf_counter()

    def args(label: str, name: str) -> tuple[ClusterLayout, Workload, SimConfig, str, bool]:
        return (
            scenario.layouts[name],
            scenario.workloads[name],
            configs[label],
            f"{label} · {name}",
            report is not None,
        )

    def done(label: str, name: str, res: SimResult) -> None:
        results[label, name] = res
        if report:
            report(f"{label} · {name}: {len(res.submit):,} jobs in {res.wall_s:.1f} s")

    if workers == 1:
        for label, name in tasks:
            done(label, name, _simulate(*args(label, name)))
    else:
        # Biggest clusters first so the slowest runs do not start last.
        order = sorted(tasks, key=lambda t: -len(scenario.workloads[t[1]].jobs))
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {
                pool.submit(_simulate, *args(label, name)): (label, name) for label, name in order
            }
            for future in as_completed(futures):
                done(*futures[future], future.result())
    elapsed = time.perf_counter() - started
    out: dict[str, RunOutcome] = {}
    for label, config in configs.items():
        runs = [results[label, name] for name in scenario.layouts]
        summary = summarize(runs, config.failures, wall_s=sum(r.wall_s for r in runs))
        summary["elapsed_s"] = elapsed
        out[label] = RunOutcome(runs, summary)
    return out
