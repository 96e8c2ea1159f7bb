"""Scheduler benchmark: cycle latency on a full cluster and gang-placement throughput.

What it measures (all on one `ClusterState` driven the way the head and the simulator
drive it: `schedule()` → apply each `Start` with `state.start(...)`):

* cycle_ms — a cluster filled with mixed-size jobs (1–8 GPUs on one node and 2-, 4- and
  8-node gangs, from `phalanx.testing.mixed_jobs`) and `--pending` jobs queued behind it.
  Each measured cycle: one random running job completes (`state.finish`), then ONE
  `schedule()` call is timed; its starts are applied untimed and the clock moves on 1 s.
  Reported: the median, p95 and max over `--cycles` cycles (after `--warmup` cycles).
* placements_per_s — an empty cluster and enough mixed jobs to overfill it (1.25× its
  GPUs); cycles run until one starts nothing. Gangs placed / seconds spent in `schedule()`
  plus applying its starts.

The baseline is a deliberately naive scheduler written here: every cycle it sorts the
whole pending queue by the same policy key, then first-fits each job by scanning all nodes
(all-or-nothing gangs, no topology preference), with the same EASY backfill rule (a
reservation for the first blocked job, found by sorting running jobs by expected end).
It keeps no index between cycles. It runs on the same states in the same invocation (for
cycle_ms on exactly the same state, right after the core's timed call), and its starts
are applied with the same `state.start`, so the ratios compare only the scheduling work.
It ignores quotas and preemption: the benchmark workload has neither.

Noise: before every timed phase the garbage collector runs and freezes what exists
(gc.collect(); gc.freeze()), so a full collection in a timed call does not walk the
million-object cluster built beforehand. Timing uses time.perf_counter (wall time); the
fill is also timed with time.process_time (`*_per_cpu_s`: this process's CPU time, which
other processes on a shared machine do not inflate). placements_per_s is the median of
`--fill-runs` fills on fresh clusters with the same jobs.

Run:  .venv/bin/python bench/scheduler.py --nodes 10000 --gpus-per-node 8 --pending 100000
      .venv/bin/python bench/scheduler.py --sweep      # growth with nodes × queue length
Prints one JSON object on stdout; progress (and the sweep's Markdown table) on stderr.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import gc
import json
import math
import os
import platform
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from phalanx.core import (
    POLICIES,
    ClusterState,
    JobRequest,
    JobState,
    Placement,
    SchedulerConfig,
    get_policy,
    schedule,
)
from phalanx.testing.builders import MIX, cluster_nodes, mixed_jobs

TARGET_CYCLE_MS = 50.0
TARGET_PLACEMENTS_PER_S = 10_000.0
FILL_FACTOR = 1.25  # fill jobs ask for this many times the cluster's GPUs
SWEEP_NODES = (1000, 2500, 5000, 10000)
SWEEP_PENDING = (1000, 10000, 100000)
CONFIG = SchedulerConfig()

Apply = Callable[[ClusterState, float], int]  # one cycle, decisions applied → starts


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def quiet_gc() -> None:
    """Collect, then move every live object out of the collector's sight (see docstring)."""
    gc.collect()
    gc.freeze()


def release_gc() -> None:
    """Undo `quiet_gc` so a dropped state can be freed."""
    gc.unfreeze()
    gc.collect()


# --------------------------------------------------------------------------- workload
def fill_jobs(
    nodes: int, gpus_per_node: int, rng: random.Random, policy: str, start_id: int = 0
) -> list[JobRequest]:
    """Mixed jobs asking for FILL_FACTOR × the cluster's GPUs (so the cluster ends full)."""
    mean_gpus = sum(w * n * min(g, gpus_per_node) for w, n, g in MIX) / sum(w for w, _, _ in MIX)
    count = math.ceil(nodes * gpus_per_node * FILL_FACTOR / mean_gpus)
    return with_durations(
        mixed_jobs(count, rng, start_id=start_id, gpus_per_node=gpus_per_node), rng, policy
    )


def with_durations(jobs: list[JobRequest], rng: random.Random, policy: str) -> list[JobRequest]:
    """Clairvoyant policies (sjf, srtf) need a duration for every job: a part of its limit."""
    if not get_policy(policy).needs_duration:
        return jobs
    return [replace(j, duration_s=(j.time_limit_s or 3600.0) * rng.uniform(0.1, 1.0)) for j in jobs]


def new_state(
    nodes: int, gpus_per_node: int, policy: str, jobs: Sequence[JobRequest]
) -> ClusterState:
    state = ClusterState(cluster_nodes(nodes, gpus_per_node), policy=policy)
    for job in jobs:
        state.submit(job, job.submit_s)
    return state


def set_pending(
    state: ClusterState,
    pending: int,
    rng: random.Random,
    gpus_per_node: int,
    now: float,
    queue: str = "mixed",
) -> None:
    """Top the queue up with new mixed jobs, or cancel the newest, to `pending` jobs.

    With queue="full-node" the queue is instead `pending` jobs of one whole node each."""
    if queue == "full-node":
        for job_id in sorted(state.pending):
            state.finish(job_id, now, JobState.CANCELLED)
    extra = pending - len(state.pending)
    if extra > 0:
        start = max(state.known) + 1
        jobs = mixed_jobs(extra, rng, start_id=start, gpus_per_node=gpus_per_node, submit=now)
        if queue == "full-node":
            jobs = [replace(j, nodes=1, gpus_per_node=gpus_per_node) for j in jobs]
        for job in with_durations(jobs, rng, state.policy.name):
            state.submit(job, now)
    for job_id in sorted(state.pending, reverse=True)[: max(0, -extra)]:
        state.finish(job_id, now, JobState.CANCELLED)


# --------------------------------------------------------------------------- core driver
def core_cycle(state: ClusterState, now: float) -> int:
    """One core cycle with its decisions applied; returns the number of starts."""
    decisions = schedule(state, now, CONFIG)
    for start in decisions.starts:
        state.start(start.job_id, start.placement, now, start.borrowed)
    for p in decisions.preemptions:  # only preemptive policies (las, srtf) get here
        for victim in p.victims:
            state.mark_preempting(victim, p.for_job)
    return len(decisions.starts)


# --------------------------------------------------------------------------- baseline
def _lowest_bits(mask: int, count: int) -> int:
    out = 0
    while count:
        low = mask & -mask
        out |= low
        mask ^= low
        count -= 1
    return out


def naive_schedule(
    state: ClusterState, now: float, depth: int = CONFIG.depth
) -> list[tuple[int, Placement]]:
    """The obvious scheduler, with no index kept between cycles (the baseline).

    Sort every queued job by the policy's key; first-fit each over all nodes (a gang takes
    the first `nodes` nodes with enough free GPUs, or nothing); the first job that does not
    fit gets an EASY reservation and later jobs may not delay it. Stops when no later job
    could start, or after `depth` jobs (as the core does).
    """
    policy = state.policy
    up = state.up
    count = list(state.free)  # this cycle's working copy of free GPUs per node
    masks = list(state.free_mask)
    n_nodes = len(count)
    fairshare = {
        team: state.fairshare(team, now) if policy.uses_fairshare else 0.0 for team in state.queues
    }
    queue = [j for j in state.pending.values() if j.id in state.queue_key]
    queue.sort(key=lambda j: policy.merge_key(policy.static_key(j), fairshare[j.team]))
    free_total = sum(count[n] for n in range(n_nodes) if up[n])
    usable = free_total  # GPUs a later job could still use (reserved GPUs excepted)
    reserved_at: float | None = None
    spare: dict[int, int] = {}  # reserved node → GPUs a job may use there without delaying
    only_limited = False  # no queued job ends before the reservation starts

    def usable_on(n: int) -> int:
        if not up[n]:
            return 0
        return min(count[n], spare[n]) if only_limited and n in spare else count[n]

    starts: list[tuple[int, Placement]] = []
    for examined, job in enumerate(queue):
        if examined >= depth or usable <= 0:
            break
        g, need, model = job.gpus_per_node, job.nodes, job.gpu_model
        limited = reserved_at is not None and not (
            job.time_limit_s is not None and now + job.time_limit_s <= reserved_at
        )
        chosen: list[int] = []
        for n in range(n_nodes):
            free = count[n]
            if limited and n in spare and spare[n] < free:
                free = spare[n]
            if free >= g and up[n] and (model is None or state.nodes[n].gpu_model == model):
                chosen.append(n)
                if len(chosen) == need:
                    break
        if len(chosen) == need:
            slots = []
            for n in chosen:
                before = usable_on(n)
                mask = _lowest_bits(masks[n], g)
                masks[n] &= ~mask
                count[n] -= g
                free_total -= g
                if limited and n in spare:
                    spare[n] -= g
                usable += usable_on(n) - before
                slots.append((n, mask))
            starts.append((job.id, Placement(tuple(slots))))
        elif reserved_at is None:
            found = _naive_reserve(state, job, now, count)
            if found is not None:
                reserved_at, spare = found
                only_limited = not any(
                    j.time_limit_s is not None and now + j.time_limit_s <= reserved_at
                    for j in queue
                )
                usable = sum(usable_on(n) for n in range(n_nodes))
    return starts


def _naive_reserve(
    state: ClusterState, job: JobRequest, now: float, count: list[int]
) -> tuple[float, dict[int, int]] | None:
    """When and where the blocked job could start: release running jobs' GPUs in order of
    expected end until enough nodes have ≥ g free; first-fit the gang there."""
    g, need, up = job.gpus_per_node, job.nodes, state.up
    then = list(count)
    ok = sum(1 for n in range(len(then)) if up[n] and then[n] >= g)
    at = now
    if ok < need:
        runs = sorted(state.running.values(), key=lambda r: (r.expected_end_s, r.request.id))
        for run in runs:
            for n, mask in run.placement.slots:
                was = then[n] >= g
                then[n] += mask.bit_count()
                if up[n] and not was and then[n] >= g:
                    ok += 1
            if ok >= need:
                at = max(run.expected_end_s, now)
                break
        else:
            return None
    nodes = [n for n in range(len(then)) if up[n] and then[n] >= g][:need]
    return at, {n: then[n] - g for n in nodes}


def naive_cycle(state: ClusterState, now: float) -> int:
    starts = naive_schedule(state, now)
    for job_id, placement in starts:
        state.start(job_id, placement, now)
    return len(starts)


# --------------------------------------------------------------------------- measurements
@dataclass
class Fill:
    cycles: int
    gangs: int
    multi_node_gangs: int
    gpus: int
    seconds: float  # wall time (perf_counter)
    cpu_seconds: float  # this process's CPU time (process_time): blind to other processes

    @property
    def per_s(self) -> float:
        return self.gangs / self.seconds if self.seconds > 0 else math.inf

    @property
    def per_cpu_s(self) -> float:
        return self.gangs / self.cpu_seconds if self.cpu_seconds > 0 else math.inf


def measure_fill(
    state: ClusterState, cycle: Apply, label: str, profiler: cProfile.Profile | None = None
) -> Fill:
    """Run cycles on an empty cluster until one starts nothing; time schedule + apply."""
    before_running = set(state.running)
    before_free = state.free_total
    quiet_gc()
    now, seconds, cpu_seconds, cycles = 0.0, 0.0, 0.0, 0
    while True:
        if profiler is not None:
            profiler.enable()
        c0, t0 = time.process_time(), time.perf_counter()
        started = cycle(state, now)
        seconds += time.perf_counter() - t0
        cpu_seconds += time.process_time() - c0
        if profiler is not None:
            profiler.disable()
        cycles += 1
        log(f"  {label} fill cycle {cycles}: {started} starts, {state.free_total} GPUs free")
        if started == 0:
            break
        now += 1.0
    new = [state.running[j] for j in state.running if j not in before_running]
    return Fill(
        cycles=cycles,
        gangs=len(new),
        multi_node_gangs=sum(1 for r in new if r.request.nodes > 1),
        gpus=before_free - state.free_total,
        seconds=seconds,
        cpu_seconds=cpu_seconds,
    )


@dataclass
class Cycles:
    core_s: list[float]
    core_cpu_s: list[float]  # the same calls in process CPU time
    core_starts: int
    baseline_s: list[float]
    baseline_starts: int
    core_starts_on_baseline_cycles: int  # to compare with baseline_starts


def measure_cycles(
    state: ClusterState,
    rng: random.Random,
    now: float,
    cycles: int,
    warmup: int,
    baseline_cycles: int,
    profiler: cProfile.Profile | None = None,
) -> Cycles:
    """Per cycle: one random running job completes, then ONE schedule() call is timed.

    On the first `baseline_cycles` measured cycles the naive scheduler is timed on the very
    same state right after the core (the core's cycle leaves the state unchanged); then the
    core's starts are applied."""
    out = Cycles([], [], 0, [], 0, 0)
    quiet_gc()
    for k in range(warmup + cycles):
        now += 1.0
        victim = rng.choice(sorted(state.running))
        state.finish(victim, now, JobState.COMPLETED)
        if profiler is not None:
            profiler.enable()
        c0, t0 = time.process_time(), time.perf_counter()
        decisions = schedule(state, now, CONFIG)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        if profiler is not None:
            profiler.disable()
        measured = k >= warmup
        if measured:
            out.core_s.append(elapsed)
            out.core_cpu_s.append(cpu)
            out.core_starts += len(decisions.starts)
        if measured and len(out.baseline_s) < baseline_cycles:
            t0 = time.perf_counter()
            naive = naive_schedule(state, now)
            out.baseline_s.append(time.perf_counter() - t0)
            out.baseline_starts += len(naive)
            out.core_starts_on_baseline_cycles += len(decisions.starts)
        for start in decisions.starts:
            state.start(start.job_id, start.placement, now, start.borrowed)
        for p in decisions.preemptions:
            for v in p.victims:
                state.mark_preempting(v, p.for_job)
    return out


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def p95(values: Sequence[float]) -> float:
    """Nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def ratio(a: float, b: float) -> float:
    """a / b, rounded (how many times faster the core is, for a baseline time over a core
    time or a core rate over a baseline rate)."""
    return round(a / b, 2) if b > 0 else math.inf


def filled_state(
    nodes: int,
    gpus_per_node: int,
    pending: int,
    policy: str,
    rng: random.Random,
    profiler: cProfile.Profile | None = None,
    queue: str = "mixed",
) -> tuple[ClusterState, Fill, list[JobRequest]]:
    """An empty cluster filled by the core (timed: the throughput run), then the queue set
    to `pending` jobs. Returns the state, the fill measurement and the fill jobs."""
    jobs = fill_jobs(nodes, gpus_per_node, rng, policy)
    log(f"building {nodes} nodes × {gpus_per_node} GPUs, {len(jobs)} fill jobs")
    state = new_state(nodes, gpus_per_node, policy, jobs)
    fill = measure_fill(state, core_cycle, "core", profiler)
    set_pending(state, pending, rng, gpus_per_node, float(fill.cycles), queue)
    return state, fill, jobs


# --------------------------------------------------------------------------- modes
def run_main(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    profiling = args.profile
    fill_profile = cProfile.Profile() if profiling else None
    cycle_profile = cProfile.Profile() if profiling else None
    state, first_fill, jobs = filled_state(
        args.nodes, args.gpus_per_node, args.pending, args.policy, rng, fill_profile, args.queue
    )
    log(
        f"full: {state.free_total} GPUs free, {len(state.running)} running, "
        f"{len(state.pending)} pending"
    )
    free_at_start, running_at_start = state.free_total, len(state.running)
    cyc = measure_cycles(
        state,
        rng,
        float(first_fill.cycles),
        args.cycles,
        args.warmup,
        args.baseline_cycles,
        cycle_profile,
    )
    del state
    release_gc()
    # More fills on fresh clusters with the same jobs; the baseline's fill runs between the
    # core's first and second so both see the same stretch of a noisy machine.
    fills = [first_fill]
    naive_fill: Fill | None = None
    for k in range(1, args.fill_runs + 1):
        if k == 1:
            log("baseline fill on a fresh cluster with the same jobs")
            naive_state = new_state(args.nodes, args.gpus_per_node, args.policy, jobs)
            naive_fill = measure_fill(naive_state, naive_cycle, "baseline")
            del naive_state
            release_gc()
        if k < args.fill_runs:
            log(f"core fill {k + 1} of {args.fill_runs} on a fresh cluster with the same jobs")
            fill_state = new_state(args.nodes, args.gpus_per_node, args.policy, jobs)
            fills.append(measure_fill(fill_state, core_cycle, "core"))
            del fill_state
            release_gc()
    assert naive_fill is not None
    for title, profile in (
        ("first fill (schedule + apply)", fill_profile),
        ("measured cycles (schedule only)", cycle_profile),
    ):
        if profile is not None:
            log(f"profile of the core in the {title}, by own time:")
            pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(20)

    rates = sorted(f.per_s for f in fills)
    fill = sorted(fills, key=lambda f: f.per_s)[len(fills) // 2]  # the median run
    cycle_ms = ms(statistics.median(cyc.core_s))
    baseline_cycle_ms = ms(statistics.median(cyc.baseline_s)) if cyc.baseline_s else math.nan
    placements = round(statistics.median(rates))
    baseline_placements = round(naive_fill.per_s)
    meets_cycle = cycle_ms <= TARGET_CYCLE_MS
    meets_placements = placements >= TARGET_PLACEMENTS_PER_S
    return {
        "benchmark": "scheduler",
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "gpus": args.nodes * args.gpus_per_node,
        "pending": args.pending,
        "policy": args.policy,
        "queue": args.queue,
        "seed": args.seed,
        "cycle_ms": cycle_ms,
        "cycle_p95_ms": ms(p95(cyc.core_s)),
        "cycle_max_ms": ms(max(cyc.core_s)),
        "cycle_cpu_ms": ms(statistics.median(cyc.core_cpu_s)),
        "cycles": len(cyc.core_s),
        "cycle_starts": cyc.core_starts,
        "cluster_free_gpus_before_cycles": free_at_start,
        "running_jobs_before_cycles": running_at_start,
        "baseline_cycle_ms": baseline_cycle_ms,
        "baseline_cycles": len(cyc.baseline_s),
        "baseline_cycle_starts": cyc.baseline_starts,
        "core_starts_on_baseline_cycles": cyc.core_starts_on_baseline_cycles,
        "cycle_speedup": ratio(baseline_cycle_ms, cycle_ms),
        "placements_per_s": placements,
        "placements_per_s_runs": [round(r) for r in rates],
        "placements_per_cpu_s": round(statistics.median(f.per_cpu_s for f in fills)),
        "placed_gangs": fill.gangs,
        "placed_multi_node_gangs": fill.multi_node_gangs,
        "gpus_placed": fill.gpus,
        "fill_cycles": fill.cycles,
        "fill_s": round(fill.seconds, 3),
        "baseline_placements_per_s": baseline_placements,
        "baseline_placements_per_cpu_s": round(naive_fill.per_cpu_s),
        "baseline_placed_gangs": naive_fill.gangs,
        "baseline_gpus_placed": naive_fill.gpus,
        "baseline_fill_cycles": naive_fill.cycles,
        "baseline_fill_s": round(naive_fill.seconds, 3),
        "placement_speedup": ratio(statistics.median(rates), naive_fill.per_s),
        "targets": {
            "cycle_ms_max": TARGET_CYCLE_MS,
            "placements_per_s_min": TARGET_PLACEMENTS_PER_S,
        },
        "meets_targets": {
            "cycle_ms": meets_cycle,
            "placements_per_s": meets_placements,
            "all": meets_cycle and meets_placements,
        },
        **environment(),
    }


def run_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """cycle_ms (and the baseline's) for every nodes × pending pair; placements/s per node
    count (the fill comes before the queue is set, so each pending value repeats it)."""
    rows: list[dict[str, Any]] = []
    for nodes in SWEEP_NODES:
        naive_fill: Fill | None = None
        for pending in SWEEP_PENDING:
            rng = random.Random(args.seed)
            state, fill, jobs = filled_state(
                nodes, args.gpus_per_node, pending, args.policy, rng, queue=args.queue
            )
            cyc = measure_cycles(
                state, rng, float(fill.cycles), args.cycles, args.warmup, args.baseline_cycles
            )
            del state
            release_gc()
            if naive_fill is None:
                naive_state = new_state(nodes, args.gpus_per_node, args.policy, jobs)
                naive_fill = measure_fill(naive_state, naive_cycle, "baseline")
                del naive_state
                release_gc()
            core = statistics.median(cyc.core_s)
            base = statistics.median(cyc.baseline_s) if cyc.baseline_s else math.nan
            rows.append(
                {
                    "nodes": nodes,
                    "gpus": nodes * args.gpus_per_node,
                    "pending": pending,
                    "cycle_ms": ms(core),
                    "cycle_p95_ms": ms(p95(cyc.core_s)),
                    "cycle_cpu_ms": ms(statistics.median(cyc.core_cpu_s)),
                    "baseline_cycle_ms": ms(base),
                    "cycle_speedup": ratio(base, core),
                    "placements_per_s": round(fill.per_s),
                    "placements_per_cpu_s": round(fill.per_cpu_s),
                    "baseline_placements_per_s": round(naive_fill.per_s),
                    "baseline_placements_per_cpu_s": round(naive_fill.per_cpu_s),
                }
            )
            log(f"  → {rows[-1]}")
    log_sweep_tables(rows)
    return {
        "benchmark": "scheduler-sweep",
        "gpus_per_node": args.gpus_per_node,
        "policy": args.policy,
        "queue": args.queue,
        "seed": args.seed,
        "cycles": args.cycles,
        "baseline_cycles": args.baseline_cycles,
        "rows": rows,
        **environment(),
    }


def log_sweep_tables(rows: list[dict[str, Any]]) -> None:
    """The sweep as two Markdown tables on stderr (ready for bench/README.md)."""
    pendings = sorted({r["pending"] for r in rows})
    log("")
    log("Cycle time, median ms (p95; naive baseline; speedup), by nodes × pending jobs:")
    log("")
    log("| nodes (GPUs) | " + " | ".join(f"{p:,} pending" for p in pendings) + " |")
    log("|---:|" + "---:|" * len(pendings))
    for nodes in sorted({r["nodes"] for r in rows}):
        cells, gpus = [], 0
        for p in pendings:
            r = next(r for r in rows if r["nodes"] == nodes and r["pending"] == p)
            gpus = r["gpus"]
            cells.append(
                f"{r['cycle_ms']} (p95 {r['cycle_p95_ms']}; baseline {r['baseline_cycle_ms']}; "
                f"{r['cycle_speedup']}×)"
            )
        log(f"| {nodes:,} ({gpus:,}) | " + " | ".join(cells) + " |")
    log("")
    log("Placements into an empty cluster, gangs/s (median of the fills at each node count):")
    log("")
    log("| nodes (GPUs) | core wall | core CPU | baseline wall | baseline CPU | speedup (wall) |")
    log("|---:|---:|---:|---:|---:|---:|")
    for nodes in sorted({r["nodes"] for r in rows}):
        same = [r for r in rows if r["nodes"] == nodes]
        wall = statistics.median(r["placements_per_s"] for r in same)
        cpu = statistics.median(r["placements_per_cpu_s"] for r in same)
        base, base_cpu = (
            same[0]["baseline_placements_per_s"],
            same[0]["baseline_placements_per_cpu_s"],
        )
        log(
            f"| {nodes:,} ({same[0]['gpus']:,}) | {wall:,.0f} | {cpu:,.0f} | {base:,} | "
            f"{base_cpu:,} | {ratio(wall, base)}× |"
        )


def environment() -> dict[str, Any]:
    return {
        "date": datetime.date.today().isoformat(),
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs",
        "gc": "collected and frozen before each timed phase",
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/scheduler.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=10_000, help="nodes (default 10000)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument(
        "--pending", type=int, default=100_000, help="jobs queued behind the full cluster"
    )
    parser.add_argument("--cycles", type=int, default=30, help="measured cycles (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured cycles first")
    parser.add_argument(
        "--baseline-cycles",
        type=int,
        default=5,
        help="measured cycles also timed with the naive baseline (default 5; it is slow)",
    )
    parser.add_argument(
        "--fill-runs",
        type=int,
        default=5,
        help="core fills on fresh clusters (placements_per_s is their median; default 5); "
        "the baseline fills once, after the core's first",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument(
        "--policy", default="priority", choices=sorted(POLICIES), help="ordering policy"
    )
    parser.add_argument(
        "--queue",
        default="mixed",
        choices=("mixed", "full-node"),
        help="what waits behind the full cluster: mixed jobs (default), or only jobs of one "
        "whole node each, so GPUs freed by a smaller job fit no queued job",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help=f"print cycle_ms for nodes in {SWEEP_NODES} × pending in {SWEEP_PENDING} instead",
    )
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the measured cycles (to stderr)"
    )
    args = parser.parse_args(argv)
    if min(args.nodes, args.gpus_per_node, args.cycles, args.fill_runs) < 1 or args.pending < 0:
        parser.error("--nodes, --gpus-per-node, --cycles, --fill-runs must be ≥ 1; --pending ≥ 0")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    result = run_sweep(args) if args.sweep else run_main(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
