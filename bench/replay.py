"""Replay benchmark: how fast the simulator replays whole traces through the real core.

Two workloads (both through `phalanx.sim`, the same code `phalanx sim` runs):

* philly — the full Philly CSV (82,247 jobs, Sept–Dec 2017) on one shared cluster of
  `--nodes` 8-GPU nodes (default 100 nodes = 800 GPUs, ~47% offered load, so jobs queue and
  reservations/backfill run), teams = the trace's virtual clusters, default policy.
  Target: ≤ 20 s (anchor: Alibaba's PAI simulator takes 51–111 s for 20k jobs).
* synthetic — `--synthetic-jobs` (default 1,000,000) generated jobs on a 100k-GPU cluster
  (12,500 × 8). Target: ≤ 600 s. Skipped with --philly-only.

Baseline, side by side in the same invocation: the same Philly replay under strict FIFO
without backfill or preemption — the cheapest scheduling there is — so
`philly_cost_ratio` = default policy time / strict FIFO time shows what fair share,
reservations and backfill cost. Times are wall-clock seconds of the simulation itself
(trace loading is reported apart).

Run:  .venv/bin/python bench/replay.py [--philly-only] [--synthetic-jobs N]
Prints one JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import Any

from phalanx.core import SchedulerConfig
from phalanx.sim.demo import find_trace
from phalanx.sim.engine import SimConfig, simulate
from phalanx.sim.layout import uniform
from phalanx.sim.metrics import summarize
from phalanx.sim.workload import Workload, read_philly, synthetic

PHILLY_TARGET_S = 20.0
SYNTHETIC_TARGET_S = 600.0


def _run(label: str, workload: Workload, nodes: int, config: SimConfig) -> dict[str, Any]:
    layout = uniform(nodes, gpus_per_node=8, name=label)
    gc.collect()
    started = time.perf_counter()
    result = simulate(layout, workload, config)
    wall = time.perf_counter() - started
    summary = summarize([result], config.failures, wall_s=wall)
    print(
        f"{label}: {summary['jobs']:,} jobs, {summary['cycles']:,} cycles in {wall:.1f} s",
        file=sys.stderr,
    )
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=100, help="8-GPU nodes for the Philly replay")
    parser.add_argument("--synthetic-jobs", type=int, default=1_000_000)
    parser.add_argument("--synthetic-nodes", type=int, default=12_500)
    parser.add_argument("--philly-only", action="store_true")
    args = parser.parse_args()

    t0 = time.perf_counter()
    philly = read_philly(find_trace())
    load_s = time.perf_counter() - t0
    default = _run("philly-default", philly, args.nodes, SimConfig())
    strict = _run(
        "philly-strict-fifo",
        philly,
        args.nodes,
        SimConfig(policy="fifo", scheduler=SchedulerConfig(backfill=False, preemption=False)),
    )
    out: dict[str, Any] = {
        "benchmark": "replay",
        "philly_jobs": default["jobs"],
        "philly_gpus": args.nodes * 8,
        "philly_load_s": round(load_s, 3),
        "philly_wall_s": round(default["wall_s"], 3),
        "philly_jobs_per_s": round(default["jobs"] / default["wall_s"]),
        "philly_avg_queue_s": round(default["avg_queue_s"], 1),
        "philly_utilization": round(default["utilization"], 4),
        "baseline_strict_fifo_wall_s": round(strict["wall_s"], 3),
        "philly_cost_ratio": round(default["wall_s"] / strict["wall_s"], 3),
        "philly_target_s": PHILLY_TARGET_S,
        "philly_meets_target": default["wall_s"] + load_s <= PHILLY_TARGET_S,
    }
    if not args.philly_only:
        nodes = args.synthetic_nodes
        t0 = time.perf_counter()
        work = synthetic(args.synthetic_jobs, nodes * 8, load=0.9, seed=1)
        gen_s = time.perf_counter() - t0
        synth = _run("synthetic", work, nodes, SimConfig())
        out.update(
            {
                "synthetic_jobs": synth["jobs"],
                "synthetic_gpus": nodes * 8,
                "synthetic_generate_s": round(gen_s, 3),
                "synthetic_wall_s": round(synth["wall_s"], 3),
                "synthetic_jobs_per_s": round(synth["jobs"] / synth["wall_s"]),
                "synthetic_cycles": synth["cycles"],
                "synthetic_utilization": round(synth["utilization"], 4),
                "synthetic_target_s": SYNTHETIC_TARGET_S,
                "synthetic_meets_target": synth["wall_s"] + gen_s <= SYNTHETIC_TARGET_S,
            }
        )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
