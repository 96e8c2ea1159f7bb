"""Serving in the simulator: "how many GPUs for this traffic", and the autoscaler replayed.

`plan_for_trace` sizes pools for a real trace's lengths at any rate with core.planner (the
same search `phalanx serve plan` prints); `replay_autoscaler` runs core.slo's policy on a
virtual clock against a load that changes (a step), with the planner's engine model
serving the traffic, and reports the SLO attainment held through it.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from phalanx.core import planner, servesim, slo
from phalanx.serve.bench import traces


def workload_from_trace(
    rows: Sequence[traces.TraceRow],
    *,
    rate: float | None = None,
    arrivals: planner.Arrivals = "poisson",
    length_scale: float = 1.0,
) -> planner.Workload:
    """The trace's (input, output) lengths (× `length_scale`) at `rate` (default: the
    trace's own mean rate); `arrivals="trace"` keeps its inter-arrival pattern."""
    if len(rows) < 2:
        raise ValueError("a trace workload needs at least 2 rows")
    lengths = tuple(
        (
            max(1, round(r.input_tokens * length_scale)),
            max(1, round(r.output_tokens * length_scale)),
        )
        for r in rows
    )
    span = rows[-1].time_s - rows[0].time_s
    own_rate = (len(rows) - 1) / span if span > 0 else 1.0
    gaps = tuple(b.time_s - a.time_s for a, b in itertools.pairwise(rows))
    return planner.Workload(
        rate=own_rate if rate is None else rate, lengths=lengths, arrivals=arrivals, gaps_s=gaps
    )


def plan_for_trace(
    profile: planner.LatencyProfile,
    workload: planner.Workload,
    target: planner.Slo,
    *,
    max_gpus: int = 100_000,
    config: planner.SearchConfig | None = None,
    sweep: Sequence[float] = (),
) -> dict[str, Any]:
    """The plan as a JSON-ready dict, with the search's own run time; `sweep`: more
    rates to answer from the same capacity curves (`"sweep"`: one row per rate)."""
    config = config or planner.SearchConfig()
    t0 = time.perf_counter()
    curves = planner.capacities(profile, workload, target, config)
    result = planner.plan(
        profile, workload, target, max_gpus=max_gpus, config=config, curves=curves
    )
    rows = []
    for rate in sweep:
        other = planner.Workload(rate, workload.lengths, workload.arrivals, workload.gaps_s)
        p = planner.plan(profile, other, target, max_gpus=max_gpus, config=config, curves=curves)
        rows.append(
            {
                "rate": rate,
                "best": p.best,
                "gpus": p.gpus,
                "aggregated_replicas": p.aggregated_replicas,
                "prefill_replicas": p.prefill_replicas,
                "decode_replicas": p.decode_replicas,
            }
        )
    elapsed = time.perf_counter() - t0
    return {
        "sweep": rows,
        "rate": result.rate,
        "best": result.best,
        "gpus": result.gpus,
        "gpus_per_replica": result.gpus_per_replica,
        "aggregated_replicas": result.aggregated_replicas,
        "prefill_replicas": result.prefill_replicas,
        "decode_replicas": result.decode_replicas,
        "capacity_req_per_s": {
            role: [[n, None if math.isinf(c) else round(c, 4)] for n, c in curve]
            for role, curve in result.capacity.items()
        },
        "slo": {
            "ttft_ms": target.ttft_ms,
            "tpot_ms": target.tpot_ms,
            "attainment": target.attainment,
        },
        "profile": planner.profile_to_dict(profile),
        "max_gpus": max_gpus,
        "search": {
            "requests": config.requests,
            "cell": config.cell,
            "bisections": config.bisections,
        },
        "planner_seconds": round(elapsed, 3),
    }


@dataclass(frozen=True, slots=True)
class Phase:
    """`rate` requests/s for `seconds` of virtual time."""

    rate: float
    seconds: float


@dataclass(frozen=True, slots=True)
class ReplayResult:
    attainment: float  # share of all requests meeting the SLO
    requests: int
    replicas: tuple[tuple[float, int], ...]  # (time, replica count) at every change
    decisions: tuple[tuple[float, str], ...]


def replay_autoscaler(
    profile: planner.LatencyProfile,
    lengths: Sequence[tuple[int, int]],
    phases: Sequence[Phase],
    target: planner.Slo,
    *,
    min_replicas: int = 1,
    max_replicas: int = 64,
    start_replicas: int = 1,
    interval_s: float = 5.0,
    window_s: float = 30.0,
    startup_s: float = 10.0,
    tuning: slo.Tuning | None = None,
    seed: int = 0,
) -> ReplayResult:
    """Serve Poisson traffic through `phases` on replicas the policy adds and removes.

    Every `interval_s` the policy sees the last `window_s` of ended requests and the load
    now; a replica it adds serves after `startup_s`; one it removes takes no new requests
    and ends once idle (a drain). Requests go to the least-loaded serving replica.
    """
    tuning = tuning or slo.Tuning(slots_per_replica=profile.slots)
    if not lengths:
        raise ValueError("need at least one (input, output) length")
    rng = random.Random(seed)
    arrivals: list[float] = []
    t0 = 0.0
    for ph in phases:
        t = t0
        while True:
            t += rng.expovariate(ph.rate)
            if t >= t0 + ph.seconds:
                break
            arrivals.append(t)
        t0 += ph.seconds
    end = t0
    reqs = [
        servesim.SimRequest(
            arrival=a, inp=lengths[i % len(lengths)][0], out=lengths[i % len(lengths)][1]
        )
        for i, a in enumerate(arrivals)
    ]
    for r in reqs:
        r.ready = r.arrival
    serving: list[servesim.SimReplica] = []
    starting: list[float] = []  # when each starting replica begins to serve
    drained: list[servesim.SimReplica] = []
    for _ in range(start_replicas):
        serving.append(servesim.SimReplica("aggregated", profile))
    state = slo.PolicyState()
    changes: list[tuple[float, int]] = [(0.0, start_replicas)]
    decisions: list[tuple[float, str]] = []
    target_slo = slo.Target(target.ttft_ms, target.tpot_ms, target.attainment)
    next_tick = interval_s
    i = 0
    while i < len(reqs) or next_tick <= end:
        now = min(reqs[i].arrival if i < len(reqs) else math.inf, next_tick)
        for rep in serving + drained:
            rep.advance(now)
        while starting and starting[0] <= now:
            starting.pop(0)
            rep = servesim.SimReplica("aggregated", profile)
            rep.now = now
            serving.append(rep)
        if i < len(reqs) and reqs[i].arrival == now:
            min(serving, key=lambda rep: rep.load).waiting.append(reqs[i])
            i += 1
            continue
        window = _window(serving + drained, now, window_s, len(serving))
        current = len(serving) + len(starting)
        decision = slo.decide(
            window, target_slo, min_replicas, max_replicas, current, state, now, tuning
        )
        state = decision.state
        if decision.replicas > current:
            starting.extend([now + startup_s] * (decision.replicas - current))
            starting.sort()
        elif decision.replicas < current:
            for _ in range(current - decision.replicas):
                if starting:
                    starting.pop()
                elif len(serving) > 1:
                    victim = min(serving, key=lambda rep: rep.load)
                    serving.remove(victim)
                    drained.append(victim)
        if decision.replicas != current:
            changes.append((now, decision.replicas))
            decisions.append((now, decision.reason))
        next_tick += interval_s
    for rep in serving + drained:
        rep.advance(math.inf)
    outcomes = [servesim.outcome_of(r) for r in reqs]
    return ReplayResult(
        attainment=planner.joint_attainment(outcomes, target),
        requests=len(reqs),
        replicas=tuple(changes),
        decisions=tuple(decisions),
    )


def _window(
    replicas: Sequence[servesim.SimReplica], now: float, seconds: float, ready: int
) -> slo.PoolWindow:
    ended = [r for rep in replicas for r in rep.done if now - seconds <= r.end <= now]
    ttft = tuple((r.first - r.arrival) * 1000.0 for r in ended)
    tpot = tuple((r.end - r.first) * 1000.0 / (r.out - 1) for r in ended if r.out > 1)
    return slo.PoolWindow(
        requests=len(ended),
        errors=0,
        ttft_ms=ttft,
        tpot_ms=tpot,
        in_flight=sum(len(rep.running) for rep in replicas),
        queued=sum(len(rep.waiting) for rep in replicas),
        replicas_ready=ready,
    )
