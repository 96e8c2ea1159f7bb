"""The SLO autoscaling policy: a pool's recent window and targets in, a replica count out.

Pure: no clock (the caller passes `now`), no I/O. phalanx/serve/autoscaler.py applies the
decisions to a live deployment; phalanx/sim/serving.py replays them on a virtual clock.

The rule, in order (docs/serving-slo.md):

1. Outside [min, max] → the nearest bound, at once.
2. Scale up fast when the pool misses its SLO (TTFT or TPOT attainment below target, over
   at least `min_samples` requests, while the pool is not plainly over-provisioned — so
   old misses in the window do not add replicas twice) or requests queue beyond what the
   ready replicas hold:
   to the replicas the demand needs at `target_utilisation` or the SLO shortfall asks
   for (current × (1 + target − attainment)), at least one more, at most `max_up_factor` times
   the current count. A queue shorter than at the last call is draining: no step then;
   misses alone (no queue) wait `miss_cooldown_s` (a window) after the last step up. Not
   again while replicas of the last step are still starting (they would be counted
   twice) or within `up_cooldown_s`.
3. Scale down slowly, one replica at a time, only when the pool meets its SLO, nothing
   queues, and one replica fewer would still run below `down_utilisation` (a lower
   threshold than the scale-up one: the gap between them is the hysteresis), continuously
   for `down_stable_s`, and not within `down_cooldown_s` of any change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class PoolWindow:
    """What the router measured for one pool over the last window (serving.md's
    `RouterStats.window`): the requests ended in it, their TTFT and TPOT (ms), and the
    load now."""

    requests: int
    errors: int
    ttft_ms: tuple[float, ...]
    tpot_ms: tuple[float, ...]
    in_flight: int
    queued: int
    replicas_ready: int


@dataclass(frozen=True, slots=True)
class Target:
    """The pool's SLO: each target optional; `attainment` is the share that must meet it."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    attainment: float = 0.9


@dataclass(frozen=True, slots=True)
class Tuning:
    """How eagerly the policy moves (seconds, shares of capacity)."""

    slots_per_replica: int = 4  # concurrent sequences one replica runs
    target_utilisation: float = 0.8  # scale up to run busy slots at this share
    down_utilisation: float = 0.5  # ... and down only if n-1 replicas would run below this
    min_samples: int = 5  # fewer requests in the window: attainment is not judged
    max_up_factor: float = 2.0
    up_cooldown_s: float = 10.0
    # A step on SLO misses alone waits a whole window after the last step up: until then
    # the window still holds requests that queued before the new replicas served.
    miss_cooldown_s: float = 45.0
    down_cooldown_s: float = 60.0
    down_stable_s: float = 30.0

    def __post_init__(self) -> None:
        if self.slots_per_replica < 1:
            raise ValueError("slots_per_replica must be at least 1")
        if not 0 < self.down_utilisation < self.target_utilisation <= 1:
            raise ValueError("need 0 < down_utilisation < target_utilisation <= 1")
        if self.max_up_factor < 1:
            raise ValueError("max_up_factor must be at least 1")


@dataclass(frozen=True, slots=True)
class PolicyState:
    """What the policy remembers between calls (the caller stores and passes it back)."""

    last_up_s: float | None = None
    last_down_s: float | None = None
    low_since_s: float | None = None  # since when one replica fewer would have sufficed
    last_queued: int | None = None  # the queue at the last call


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    replicas: int
    reason: str
    state: PolicyState

    @property
    def changed(self) -> bool:
        return self.reason != HOLD


HOLD = "hold"


def attainment(values: tuple[float, ...], limit: float | None) -> float | None:
    """Share of `values` at or under `limit` (None: no target, or no values)."""
    if limit is None or not values:
        return None
    return sum(1 for v in values if v <= limit) / len(values)


def decide(
    window: PoolWindow,
    target: Target,
    min_replicas: int,
    max_replicas: int,
    current: int,
    state: PolicyState,
    now: float,
    tuning: Tuning = Tuning(),
) -> ScaleDecision:
    """The replica count the pool should have now, why, and the policy's next state."""
    d = _decide(window, target, min_replicas, max_replicas, current, state, now, tuning)
    return ScaleDecision(d.replicas, d.reason, replace(d.state, last_queued=window.queued))


def _decide(
    window: PoolWindow,
    target: Target,
    min_replicas: int,
    max_replicas: int,
    current: int,
    state: PolicyState,
    now: float,
    tuning: Tuning,
) -> ScaleDecision:
    if min_replicas < 0 or max_replicas < max(min_replicas, 1):
        raise ValueError(f"bad bounds [{min_replicas}, {max_replicas}]")
    if current < min_replicas:
        return ScaleDecision(min_replicas, f"below min_replicas {min_replicas}", _up(state, now))
    if current > max_replicas:
        return ScaleDecision(max_replicas, f"above max_replicas {max_replicas}", _down(state, now))

    slots = tuning.slots_per_replica
    demand = window.in_flight + window.queued
    needed = math.ceil(demand / (slots * tuning.target_utilisation)) if demand else 0
    misses, worst = _misses(window, target, tuning)
    # Misses in a window that ended on an over-provisioned pool (the replicas just added
    # already drained the queue) ask for nothing: scaling on them again would overshoot.
    if demand <= (current - 1) * slots * tuning.down_utilisation:
        misses = ""
    queueing = window.queued > 0 and demand > window.replicas_ready * slots
    # A queue shorter than at the last call is draining: the last step is working, and
    # sizing the pool to a passing backlog would overshoot.
    if state.last_queued is not None and window.queued < state.last_queued:
        misses, queueing = "", False
    if (
        misses
        and not queueing
        and state.last_up_s is not None
        and now - state.last_up_s < tuning.miss_cooldown_s
    ):
        misses = ""

    if misses or queueing or (current == 0 and demand > 0):
        why = misses or f"{window.queued} requests queued beyond {window.replicas_ready} ready"
        starting = current - window.replicas_ready
        if current >= max_replicas:
            return ScaleDecision(current, HOLD, replace(state, low_since_s=None))
        if current > 0 and starting > 0:
            return ScaleDecision(current, HOLD, replace(state, low_since_s=None))
        if state.last_up_s is not None and now - state.last_up_s < tuning.up_cooldown_s:
            return ScaleDecision(current, HOLD, replace(state, low_since_s=None))
        # Missing the SLO by a wide margin asks for more at once: attainment 45% against
        # a 90% target adds 45% (at most max_up_factor). Gentler than target/attainment:
        # misses lag the replicas just added, and the step repeats if they persist.
        by_slo = math.ceil(current * (1 + target.attainment - worst)) if misses else 0
        ceiling = max(current + 1, math.floor(current * tuning.max_up_factor))
        replicas = min(max_replicas, max(current + 1, min(max(needed, by_slo), ceiling)))
        return ScaleDecision(replicas, f"scale up: {why}", _up(state, now))

    fewer = current - 1
    shrinkable = (
        fewer >= min_replicas
        and window.queued == 0
        and demand <= fewer * slots * tuning.down_utilisation
        and window.errors == 0
    )
    if not shrinkable:
        return ScaleDecision(current, HOLD, replace(state, low_since_s=None))
    low_since = state.low_since_s if state.low_since_s is not None else now
    waited = now - low_since >= tuning.down_stable_s
    last_change = max(
        (t for t in (state.last_up_s, state.last_down_s) if t is not None), default=None
    )
    cooled = last_change is None or now - last_change >= tuning.down_cooldown_s
    if not (waited and cooled):
        return ScaleDecision(current, HOLD, replace(state, low_since_s=low_since))
    return ScaleDecision(
        fewer,
        f"scale down: {demand} in flight fit {fewer} replicas below "
        f"{tuning.down_utilisation:.0%} for {now - low_since:.0f} s",
        _down(state, now),
    )


def _misses(window: PoolWindow, target: Target, tuning: Tuning) -> tuple[str, float]:
    """Why the window misses the SLO ('' when it does not, or has too few samples), and
    the worst attainment seen."""
    worst = 1.0
    if window.requests < tuning.min_samples:
        return "", worst
    problems = []
    for name, values, limit in (
        ("TTFT", window.ttft_ms, target.ttft_ms),
        ("TPOT", window.tpot_ms, target.tpot_ms),
    ):
        share = attainment(values, limit) if len(values) >= tuning.min_samples else None
        if share is not None and share < target.attainment:
            worst = min(worst, share)
            problems.append(
                f"{name} attainment {share:.0%} < {target.attainment:.0%} (<= {limit:g} ms)"
            )
    return "; ".join(problems), worst


def _up(state: PolicyState, now: float) -> PolicyState:
    return replace(state, last_up_s=now, low_since_s=None)


def _down(state: PolicyState, now: float) -> PolicyState:
    return replace(state, last_down_s=now, low_since_s=None)
