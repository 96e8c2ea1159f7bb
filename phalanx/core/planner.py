"""Sizing serving pools for a traffic and an SLO (DistServe-style search), pure.

Inputs: a replica's latency profile (measured by `phalanx serve calibrate`), a workload
(an arrival rate and the input/output lengths of a trace) and an SLO. Output: the cheapest
aggregated replica count and the cheapest (prefill, decode) split that hold the SLO's
attainment in a discrete-event simulation of iteration-level batching engines
(core.servesim; its types are re-exported here).

How the search stays fast at 100,000 GPUs (docs/serving-slo.md): it measures each pool's
*capacity curve* — the highest arrival rate n replicas hold, by bisection on the rate, for
n in 1, 2, 4 … `cell` — by simulating n replicas behind a least-loaded router. A larger
pool is split into independent cells of `cell` replicas, each taking its share of the
traffic (randomly split Poisson traffic is Poisson): its capacity is n / cell times a
cell's (one big least-loaded pool pools at least as well as cells; the finite simulation
makes each capacity a few percent uncertain either way — bench/serve_plan.py compares the
answer with a whole-pool search). The curve is made non-decreasing (n replicas can always
idle down to fewer), so the answer — the least n whose capacity covers the rate — never
falls when the load rises.

Disaggregated pools are sized separately, as DistServe does: the prefill pool holds TTFT,
the decode pool TPOT, each at attainment 1 − (1 − target) / 2, so that both hold together
for at least `target` of the requests (a union bound).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from phalanx.core.servesim import (
    Arrivals,
    LatencyProfile,
    Outcome,
    Role,
    Slo,
    Workload,
    joint_attainment,
    outcome_of,
    profile_from_dict,
    profile_to_dict,
    requests_for,
    run_pool,
    simulate,
)

__all__ = [
    "STABILITY",
    "Arrivals",
    "LatencyProfile",
    "Outcome",
    "Plan",
    "SearchConfig",
    "Slo",
    "Workload",
    "capacities",
    "capacity_curve",
    "joint_attainment",
    "plan",
    "profile_from_dict",
    "profile_to_dict",
    "replicas_for",
    "simulate",
]

STABILITY = 10.0  # an open target: at most this × a full batch's latency (see capacity_curve)


@dataclass(frozen=True, slots=True)
class SearchConfig:
    requests: int = 600  # simulated per capacity probe, at least ...
    per_slot: int = 4  # ... this many per slot of the pool, so a burst cannot hide in free slots
    cell: int = 8  # largest pool simulated whole; bigger pools are cells of this size
    bisections: int = 14
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests < 10 or self.cell < 1 or self.bisections < 1 or self.per_slot < 1:
            raise ValueError("requests >= 10, cell, bisections and per_slot >= 1")


@dataclass(frozen=True, slots=True)
class Plan:
    """The answer: both layouts and the cheaper one."""

    rate: float
    aggregated_replicas: int | None  # None: no pool up to max_gpus holds the SLO
    prefill_replicas: int | None
    decode_replicas: int | None
    gpus_per_replica: int
    best: Literal["aggregated", "disaggregated", "none"]
    gpus: int | None
    capacity: dict[Role, tuple[tuple[int, float], ...]] = field(default_factory=dict)


# ----------------------------------------------------------------------- search


def _pool_sizes(cell: int) -> list[int]:
    sizes, n = [], 1
    while n < cell:
        sizes.append(n)
        n *= 2
    return [*sizes, cell]


def capacity_curve(
    profile: LatencyProfile, workload: Workload, slo: Slo, role: Role, config: SearchConfig
) -> tuple[tuple[int, float], ...]:
    """(replicas, highest rate they hold) for 1, 2, 4 … cell replicas of one role: the
    aggregated pool is judged on both targets, a prefill pool on TTFT, a decode pool on
    TPOT (each at the union-bound attainment, see the module docstring). A target the
    SLO leaves open is STABILITY × a full batch's latency."""
    # A target the SLO leaves open still bounds the pool: STABILITY × the latency of a
    # full batch, or an overloaded pool (its queue growing without end) would pass.
    mean_in = max(1, round(sum(i for i, _ in workload.lengths) / len(workload.lengths)))
    full = max(1, min(profile.slots, profile.max_batch_tokens // mean_in))
    loose_ttft = STABILITY * profile.prefill_ms([mean_in] * full)
    loose_tpot = STABILITY * profile.decode_ms(profile.slots, profile.slots * mean_in)
    ttft = slo.ttft_ms if slo.ttft_ms is not None else loose_ttft
    tpot = slo.tpot_ms if slo.tpot_ms is not None else loose_tpot
    share = 1 - (1 - slo.attainment) / 2
    judged = {
        "aggregated": Slo(ttft_ms=ttft, tpot_ms=tpot, attainment=slo.attainment),
        "prefill": Slo(ttft_ms=ttft, attainment=share),
        "decode": Slo(tpot_ms=tpot, attainment=share),
    }[role]
    # A rate no single replica could ever exceed: one request per bare prefill.
    ceiling = profile.slots * 1000.0 / max(profile.prefill_ms([mean_in]), 1e-6)
    curve: list[tuple[int, float]] = []
    best = 0.0
    for n in _pool_sizes(config.cell):

        def holds(rate: float, n: int = n) -> bool:
            outcomes = _simulate_role(profile, workload, role, n, rate, config)
            # The first pool-full of requests met an empty pool: warm-up, not judged.
            warm = min(len(outcomes) // 4, n * profile.slots)
            return joint_attainment(outcomes[warm:], judged) >= judged.attainment

        lo, hi = 0.0, ceiling * n
        if holds(hi):
            lo = hi
        else:
            for _ in range(config.bisections):
                mid = (lo + hi) / 2
                if holds(mid):
                    lo = mid
                else:
                    hi = mid
        best = max(best, lo)  # n replicas can always idle down to what fewer held
        curve.append((n, best))
    return tuple(curve)


def _simulate_role(
    profile: LatencyProfile,
    workload: Workload,
    role: Role,
    n: int,
    rate: float,
    config: SearchConfig,
) -> list[Outcome]:
    if rate <= 0:
        return [Outcome(0.0, 0.0)]
    count = max(config.requests, config.per_slot * n * profile.slots)
    reqs = requests_for(workload, rate, count, config.seed)
    for r in reqs:
        r.ready = r.arrival
    if role == "decode":
        # The KV arrives one bare prefill after the request did (the prefill pool is
        # sized on its own); TPOT counts from there.
        for r in reqs:
            r.first = r.ready = (
                r.arrival
                + (profile.prefill_ms([r.inp]) + profile.kv_transfer_per_token_ms * r.inp) / 1000.0
            )
            r.left = r.out - 1
        todo = [r for r in reqs if r.out > 1]
        run_pool("decode", profile, n, todo)
        for r in reqs:
            if r.out <= 1:
                r.end = r.first
    else:
        run_pool(role, profile, n, reqs)
    return [outcome_of(r) for r in reqs]


def replicas_for(curve: Sequence[tuple[int, float]], rate: float, limit: int) -> int | None:
    """The least replica count whose capacity covers `rate` (None above `limit`).

    Between and beyond the measured sizes m, n replicas hold at least n/m times what m
    held (a bigger least-loaded pool pools at least as well): n = min over m of
    max(m, ⌈rate·m / capacity(m)⌉) — non-decreasing in `rate`, term by term."""
    best: int | None = None
    for m, cap in curve:
        if cap <= 0:
            continue
        n = m if cap >= rate else max(m, math.ceil(rate * m / cap))
        best = n if best is None else min(best, n)
    return best if best is not None and best <= limit else None


Capacities = dict[Role, tuple[tuple[int, float], ...]]


def capacities(
    profile: LatencyProfile, workload: Workload, slo: Slo, config: SearchConfig = SearchConfig()
) -> Capacities:
    """The capacity curves of the three pool roles (the workload's rate is not used)."""
    roles: tuple[Role, ...] = ("aggregated", "prefill", "decode")
    return {role: capacity_curve(profile, workload, slo, role, config) for role in roles}


def plan(
    profile: LatencyProfile,
    workload: Workload,
    slo: Slo,
    *,
    max_gpus: int = 100_000,
    config: SearchConfig = SearchConfig(),
    curves: Capacities | None = None,
) -> Plan:
    """The cheapest aggregated pool and the cheapest prefill + decode split for the
    workload's rate, in GPUs (replicas × the profile's GPUs per replica). `curves`:
    capacities() of the same profile, lengths and SLO — they do not depend on the rate,
    so a sweep over rates measures them once."""
    limit = max(0, max_gpus // profile.gpus)
    curves = curves or capacities(profile, workload, slo, config)
    agg = replicas_for(curves["aggregated"], workload.rate, limit)
    pre = replicas_for(curves["prefill"], workload.rate, limit)
    dec = replicas_for(curves["decode"], workload.rate, limit)
    if pre is not None and dec is not None and (pre + dec) > limit:
        pre = dec = None
    options: list[tuple[int, Literal["aggregated", "disaggregated"]]] = []
    if agg is not None:
        options.append((agg * profile.gpus, "aggregated"))
    if pre is not None and dec is not None:
        options.append(((pre + dec) * profile.gpus, "disaggregated"))
    gpus: int | None = None
    best: Literal["aggregated", "disaggregated", "none"] = "none"
    if options:
        gpus, best = min(options)
    return Plan(
        rate=workload.rate,
        aggregated_replicas=agg,
        prefill_replicas=pre,
        decode_replicas=dec,
        gpus_per_replica=profile.gpus,
        best=best,
        gpus=gpus,
        capacity=curves,
    )
