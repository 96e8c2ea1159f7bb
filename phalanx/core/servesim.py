"""A discrete-event model of serving engines: replicas batching at the iteration level.

Pure (no clock, no I/O): core.planner sizes pools with it and phalanx.sim.serving replays
the SLO policy on it. A replica runs one iteration at a time: a prefill iteration admits
waiting requests up to its free slots and `max_batch_tokens` and makes their first token
(running decodes wait: prefills go first, as llama.cpp and vLLM's default scheduler do);
a decode iteration advances every running sequence one token. A prefill pool only
prefills; a decode pool takes sequences whose KV arrived and only decodes. Requests go to
the least-loaded replica of a pool. Times are seconds on the virtual clock; latencies ms.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Arrivals = Literal["poisson", "uniform", "trace"]
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


def requests_for(workload: Workload, rate: float, count: int, seed: int) -> list[SimRequest]:
    times = _arrival_times(workload, rate, count, seed)
    n = len(workload.lengths)
    return [
        SimRequest(arrival=t, inp=workload.lengths[i % n][0], out=workload.lengths[i % n][1])
        for i, t in enumerate(times)
    ]


def run_pool(role: Role, profile: LatencyProfile, replicas: int, reqs: list[SimRequest]) -> None:
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
    reqs = requests_for(workload, rate, requests, seed)
    for r in reqs:
        r.ready = r.arrival
    if replicas:
        run_pool("aggregated", profile, replicas, reqs)
    else:
        if prefill < 1 or decode < 1:
            raise ValueError("simulate an aggregated pool or both a prefill and a decode pool")
        run_pool("prefill", profile, prefill, reqs)
        for r in reqs:
            r.ready = r.first + profile.kv_transfer_per_token_ms * r.inp / 1000.0
        todo = [r for r in reqs if r.out > 1]
        for r in todo:
            r.left = r.out - 1
        run_pool("decode", profile, decode, todo)
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


# ----------------------------------------------------------------------- profiles as data

_PROFILE_FIELDS = frozenset(LatencyProfile.__dataclass_fields__)


def profile_from_dict(data: object) -> LatencyProfile:
    """A profile from its JSON object (what `phalanx serve calibrate --json` prints);
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
