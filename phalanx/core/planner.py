"""Sizing serving pools for a traffic and an SLO (DistServe-style search), pure.

Inputs: a replica's latency profile (measured by `phalanx serve-calibrate`), a workload
(an arrival rate and the input/output lengths of a trace) and an SLO. Output: the cheapest
aggregated replica count and the cheapest (prefill, decode) split that hold the SLO's
attainment in a discrete-event simulation of iteration-level batching engines.

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
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Arrivals = Literal["poisson", "uniform", "trace"]
STABILITY = 10.0  # an open target: at most this × a full batch's latency (see capacity_curve)
Role = Literal["aggregated", "prefill", "decode"]


@dataclass(frozen=True, slots=True)
class LatencyProfile:
    """One replica's iteration times (ms), linear in what a batch holds:

    prefill(batch, tokens) = prefill_base + prefill_per_token·tokens + prefill_per_seq·batch
                             + prefill_per_token2·Σ input²/1000  (attention, per sequence)
    decode step(batch, ctx) = decode_base + decode_per_seq·batch + decode_per_ctx·Σ context
    """

    prefill_base_ms: float
    prefill_per_token_ms: float
    decode_base_ms: float
    decode_per_seq_ms: float
    prefill_per_seq_ms: float = 0.0
    prefill_per_token2_ms: float = 0.0
    decode_per_ctx_ms: float = 0.0
    slots: int = 16  # concurrent sequences (continuous batching)
    max_batch_tokens: int = 8192  # prompt tokens in one prefill iteration
    gpus: int = 1  # GPUs per replica (tensor parallel)
    kv_transfer_per_token_ms: float = 0.0  # prefill → decode hand-off, disaggregated only
    name: str = "replica"

    def __post_init__(self) -> None:
        for key in (
            "prefill_base_ms",
            "prefill_per_token_ms",
            "decode_base_ms",
            "decode_per_seq_ms",
            "prefill_per_seq_ms",
            "prefill_per_token2_ms",
            "decode_per_ctx_ms",
            "kv_transfer_per_token_ms",
        ):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{key} must be a finite number >= 0, not {value}")
        if self.prefill_base_ms + self.prefill_per_token_ms <= 0:
            raise ValueError("a prefill must take some time")
        if self.decode_base_ms + self.decode_per_seq_ms <= 0:
            raise ValueError("a decode step must take some time")
        if self.slots < 1 or self.max_batch_tokens < 1 or self.gpus < 1:
            raise ValueError("slots, max_batch_tokens and gpus must be at least 1")

    def prefill_ms(self, inputs: Sequence[int]) -> float:
        tokens = sum(inputs)
        quad = sum(n * n for n in inputs) / 1000.0
        return (
            self.prefill_base_ms
            + self.prefill_per_token_ms * tokens
            + self.prefill_per_seq_ms * len(inputs)
            + self.prefill_per_token2_ms * quad
        )

    def decode_ms(self, batch: int, context: int) -> float:
        return (
            self.decode_base_ms + self.decode_per_seq_ms * batch + self.decode_per_ctx_ms * context
        )


@dataclass(frozen=True, slots=True)
class Workload:
    """Traffic to plan for: `rate` requests/s with (input, output) token lengths drawn
    from `lengths` (a trace's rows, in order); arrivals Poisson, evenly spaced, or the
    trace's own `gaps_s` (inter-arrival times) rescaled to `rate`."""

    rate: float
    lengths: tuple[tuple[int, int], ...]
    arrivals: Arrivals = "poisson"
    gaps_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"rate must be > 0 requests/s, not {self.rate}")
        if not self.lengths:
            raise ValueError("a workload needs at least one (input, output) length")
        if any(i < 1 or o < 1 for i, o in self.lengths):
            raise ValueError("input and output lengths must be at least 1 token")
        if self.arrivals == "trace" and not any(g > 0 for g in self.gaps_s):
            raise ValueError("trace arrivals need the trace's inter-arrival gaps")


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    attainment: float = 0.9

    def __post_init__(self) -> None:
        if self.ttft_ms is None and self.tpot_ms is None:
            raise ValueError("an SLO needs a TTFT or a TPOT target")
        if not 0 < self.attainment <= 1:
            raise ValueError("attainment must be in (0, 1]")


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request's simulated latencies (ms)."""

    ttft_ms: float
    tpot_ms: float  # 0 for a one-token output, as `vllm bench serve` counts it for goodput


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
    capacity: dict[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)


# ----------------------------------------------------------------------- simulation


@dataclass(slots=True)
class SimRequest:
    """One request in the simulation (seconds on the virtual clock)."""

    arrival: float
    inp: int
    out: int
    ready: float = 0.0  # decode pools: when the KV arrives
    first: float = -1.0  # when the first token came out
    end: float = -1.0  # when the last token came out
    left: int = 0  # decode steps left


@dataclass(slots=True)
class SimReplica:
    """One engine: iteration-level batching, prefills first (llama.cpp, vLLM's default)."""

    role: Role
    profile: LatencyProfile
    now: float = 0.0
    waiting: deque[SimRequest] = field(default_factory=deque)
    running: list[SimRequest] = field(default_factory=list)
    done: list[SimRequest] = field(default_factory=list)

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def advance(self, until: float) -> None:
        """Run iterations that start before `until` (math.inf: until idle)."""
        p = self.profile
        while self.now < until:
            if self.waiting and self.waiting[0].ready > self.now and not self.running:
                self.now = min(until, self.waiting[0].ready)
                continue
            admit = self._admissible()
            if admit and self.role != "decode":
                batch = [self.waiting.popleft() for _ in range(admit)]
                self.now += p.prefill_ms([r.inp for r in batch]) / 1000.0
                for r in batch:
                    r.first = self.now
                    r.left = r.out - 1
                    if r.left == 0:
                        r.end = self.now
                    if self.role == "prefill" or r.left == 0:
                        self.done.append(r)
                    else:
                        self.running.append(r)
                continue
            for _ in range(admit):  # decode pool: the KV is here, join the batch
                self.running.append(self.waiting.popleft())
            if not self.running:
                if not self.waiting:
                    self.now = until if until != math.inf else self.now
                    return
                continue
            self._decode_run(until)

    def _admissible(self) -> int:
        free = self.profile.slots - len(self.running)
        if self.role == "prefill":
            free = self.profile.slots
        count, tokens = 0, 0
        for r in self.waiting:
            if count >= free or r.ready > self.now:
                break
            if count and tokens + r.inp > self.profile.max_batch_tokens:
                break
            count += 1
            tokens += r.inp
        return count

    def _decode_run(self, until: float) -> None:
        """Decode steps with an unchanged batch: until a sequence ends, or — when a slot
        is free and a request waits or may arrive — until `until` is reached."""
        p = self.profile
        batch = len(self.running)
        context = sum(r.inp + (r.out - 1 - r.left) for r in self.running)
        limit = min(r.left for r in self.running)
        can_join = batch < p.slots
        steps = 0
        while steps < limit:
            self.now += p.decode_ms(batch, context) / 1000.0
            context += batch
            steps += 1
            if can_join and (
                self.now >= until or (self.waiting and self.waiting[0].ready <= self.now)
            ):
                break
        still = []
        for r in self.running:
            r.left -= steps
            if r.left == 0:
                r.end = self.now
                self.done.append(r)
            else:
                still.append(r)
        self.running = still


def _arrival_times(workload: Workload, rate: float, count: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    if workload.arrivals == "uniform":
        return [i / rate for i in range(count)]
    if workload.arrivals == "poisson":
        gaps = [rng.expovariate(1.0) for _ in range(count)]
        mean = 1.0
    else:
        trace = [g for g in workload.gaps_s if g >= 0]
        gaps = [trace[i % len(trace)] for i in range(count)]
        mean = sum(trace) / len(trace)
    t, times = 0.0, []
    for g in gaps:
        times.append(t)
        t += g / (mean * rate)
    return times


def _requests(workload: Workload, rate: float, count: int, seed: int) -> list[SimRequest]:
    times = _arrival_times(workload, rate, count, seed)
    n = len(workload.lengths)
    return [
        SimRequest(arrival=t, inp=workload.lengths[i % n][0], out=workload.lengths[i % n][1])
        for i, t in enumerate(times)
    ]


def _run_pool(role: Role, profile: LatencyProfile, replicas: int, reqs: list[SimRequest]) -> None:
    """Route `reqs` (by `ready` time) to the least-loaded of `replicas` and run them."""
    pool = [SimReplica(role, profile) for _ in range(replicas)]
    for r in sorted(reqs, key=lambda r: r.ready):
        for rep in pool:
            rep.advance(r.ready)
        min(pool, key=lambda rep: rep.load).waiting.append(r)
    for rep in pool:
        rep.advance(math.inf)


def simulate(
    profile: LatencyProfile,
    workload: Workload,
    *,
    replicas: int = 0,
    prefill: int = 0,
    decode: int = 0,
    rate: float | None = None,
    requests: int = 600,
    seed: int = 0,
) -> list[Outcome]:
    """Simulate `requests` requests at `rate` (default: the workload's) on an aggregated
    pool of `replicas`, or on `prefill` + `decode` pools; one Outcome per request."""
    rate = workload.rate if rate is None else rate
    reqs = _requests(workload, rate, requests, seed)
    for r in reqs:
        r.ready = r.arrival
    if replicas:
        _run_pool("aggregated", profile, replicas, reqs)
    else:
        if prefill < 1 or decode < 1:
            raise ValueError("simulate an aggregated pool or both a prefill and a decode pool")
        _run_pool("prefill", profile, prefill, reqs)
        for r in reqs:
            r.ready = r.first + profile.kv_transfer_per_token_ms * r.inp / 1000.0
        todo = [r for r in reqs if r.out > 1]
        for r in todo:
            r.left = r.out - 1
        _run_pool("decode", profile, decode, todo)
    return [outcome_of(r) for r in reqs]


def outcome_of(r: SimRequest) -> Outcome:
    ttft = (r.first - r.arrival) * 1000.0
    tpot = (r.end - r.first) * 1000.0 / (r.out - 1) if r.out > 1 else 0.0
    return Outcome(ttft_ms=ttft, tpot_ms=tpot)


def joint_attainment(outcomes: Sequence[Outcome], slo: Slo) -> float:
    """Share of requests meeting every target the SLO sets (goodput's test)."""
    if not outcomes:
        return 0.0
    good = sum(
        1
        for o in outcomes
        if (slo.ttft_ms is None or o.ttft_ms <= slo.ttft_ms)
        and (slo.tpot_ms is None or o.tpot_ms <= slo.tpot_ms)
    )
    return good / len(outcomes)


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
    reqs = _requests(workload, rate, count, config.seed)
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
        _run_pool("decode", profile, n, todo)
        for r in reqs:
            if r.out <= 1:
                r.end = r.first
    else:
        _run_pool(role, profile, n, reqs)
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


def plan(
    profile: LatencyProfile,
    workload: Workload,
    slo: Slo,
    *,
    max_gpus: int = 100_000,
    config: SearchConfig = SearchConfig(),
) -> Plan:
    """The cheapest aggregated pool and the cheapest prefill + decode split for the
    workload's rate, in GPUs (replicas × the profile's GPUs per replica)."""
    limit = max(0, max_gpus // profile.gpus)
    curves = {
        role: capacity_curve(profile, workload, slo, role, config)
        for role in ("aggregated", "prefill", "decode")
    }
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


# ----------------------------------------------------------------------- profiles as data

_PROFILE_FIELDS = frozenset(LatencyProfile.__dataclass_fields__)


def profile_from_dict(data: object) -> LatencyProfile:
    """A profile from its JSON object (what `phalanx serve-calibrate --json` prints);
    ValueError names an unknown or wrong field."""
    if not isinstance(data, dict):
        raise ValueError("a latency profile is a JSON object")
    unknown = sorted(set(data) - _PROFILE_FIELDS)
    if unknown:
        raise ValueError(f"unknown profile fields: {', '.join(map(str, unknown))}")
    values: dict[str, object] = {}
    for key, value in data.items():
        if key == "name":
            if not isinstance(value, str) or len(value) > 200:
                raise ValueError("name must be a string of at most 200 characters")
        elif key in ("slots", "max_batch_tokens", "gpus"):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20:
                raise ValueError(f"{key} must be an integer in [1, 1048576]")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key} must be a number")
        values[key] = value
    try:
        return LatencyProfile(**values)  # type: ignore[arg-type]  # checked field by field above
    except TypeError as exc:  # a required field is missing
        raise ValueError(str(exc).replace("__init__() ", "")) from None


def profile_to_dict(profile: LatencyProfile) -> dict[str, object]:
    return {key: getattr(profile, key) for key in LatencyProfile.__dataclass_fields__}
