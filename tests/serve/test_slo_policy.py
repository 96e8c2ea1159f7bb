"""core.slo: the autoscaling policy, table-driven, plus invariants (bounds, no flapping)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.core.slo import PolicyState, PoolWindow, ScaleDecision, Target, Tuning, decide

TUNING = Tuning(slots_per_replica=4, up_cooldown_s=10, down_cooldown_s=60, down_stable_s=30)
SLO = Target(ttft_ms=500, tpot_ms=50, attainment=0.9)


def window(
    ttft: float = 100.0,
    tpot: float = 20.0,
    n: int = 20,
    bad: int = 0,
    in_flight: int = 4,
    queued: int = 0,
    ready: int = 2,
    errors: int = 0,
) -> PoolWindow:
    """`n` requests of which `bad` miss both targets (10× over)."""
    return PoolWindow(
        requests=n,
        errors=errors,
        ttft_ms=tuple([ttft * 10] * bad + [ttft] * (n - bad)),
        tpot_ms=tuple([tpot * 10] * bad + [tpot] * (n - bad)),
        in_flight=in_flight,
        queued=queued,
        replicas_ready=ready,
    )


@dataclass(frozen=True)
class Case:
    name: str
    window: PoolWindow
    current: int
    expect: int
    reason: str  # the reason starts with this
    state: PolicyState = field(default_factory=PolicyState)
    now: float = 1000.0
    lo: int = 1
    hi: int = 10


CASES = [
    Case("below min goes to min", window(), 0, 1, "below min_replicas 1", lo=1),
    Case("above max goes to max", window(ready=12), 12, 10, "above max_replicas 10"),
    Case("steady and healthy holds", window(in_flight=6, ready=2), 2, 2, "hold"),
    Case(
        "TTFT misses under load: up by the shortfall (90% − 50% → ×1.4)",
        window(bad=10, in_flight=8, ready=2),
        2,
        3,
        "scale up: TTFT attainment 50% < 90%",
    ),
    Case(
        "queue beyond the ready slots: up to what the demand needs at 80%",
        window(in_flight=8, queued=8, ready=2),
        2,
        4,  # ceil(16 / (4 * 0.8)) = 5, capped at ×2
        "scale up: 8 requests queued beyond 2 ready",
    ),
    Case(
        "every request missing: ×1.9",
        window(n=100, bad=100, in_flight=40, ready=10),
        10,
        19,
        "scale up: TTFT attainment 0% < 90%",
        hi=40,
    ),
    Case(
        "a long queue asks for more: ×2 at most",
        window(n=100, bad=100, in_flight=40, queued=60, ready=10),
        10,
        20,
        "scale up: TTFT attainment 0% < 90%",
        hi=40,
    ),
    Case(
        "a small shortfall still adds one",
        window(bad=3, in_flight=8, ready=4),
        4,
        5,
        "scale up: TTFT attainment 85% < 90%",
    ),
    Case(
        "misses while replicas of the last step still start: hold",
        window(bad=10, in_flight=8, queued=4, ready=2),
        4,
        4,
        "hold",
        state=PolicyState(last_up_s=990.0),
    ),
    Case(
        "within the up cooldown: hold",
        window(bad=10, in_flight=8, queued=4, ready=2),
        2,
        2,
        "hold",
        state=PolicyState(last_up_s=995.0),
    ),
    Case(
        "a queue shorter than at the last call is draining: hold",
        window(bad=10, in_flight=8, queued=6, ready=2),
        2,
        2,
        "hold",
        state=PolicyState(last_queued=9),
    ),
    Case(
        "the same queue, not draining: up",
        window(bad=10, in_flight=8, queued=6, ready=2),
        2,
        4,
        "scale up",
        state=PolicyState(last_queued=6),
    ),
    Case(
        "misses alone within a window of the last step up: hold (stale samples)",
        window(bad=10, in_flight=8, ready=2),
        2,
        2,
        "hold",
        state=PolicyState(last_up_s=980.0),
    ),
    Case(
        "misses alone a window after the last step up: up",
        window(bad=10, in_flight=8, ready=2),
        2,
        3,
        "scale up: TTFT",
        state=PolicyState(last_up_s=950.0),
    ),
    Case("missing at max: hold", window(bad=10, in_flight=40, ready=10), 10, 10, "hold"),
    Case(
        "too few samples to judge attainment, no queue: hold",
        window(n=3, bad=3, in_flight=5, ready=2),
        2,
        2,
        "hold",
    ),
    Case(
        "old misses on an over-provisioned pool: no second step",
        window(bad=10, in_flight=2, ready=6),
        6,
        6,
        "hold",
    ),
    Case(
        "low load, first seen: hold (and start the stability clock)",
        window(in_flight=1, ready=4),
        4,
        4,
        "hold",
    ),
    Case(
        "low load for down_stable_s, cooled down: one fewer",
        window(in_flight=1, ready=4),
        4,
        3,
        "scale down: 1 in flight fit 3 replicas",
        state=PolicyState(low_since_s=900.0, last_up_s=100.0),
    ),
    Case(
        "low load but recently scaled: hold",
        window(in_flight=1, ready=4),
        4,
        4,
        "hold",
        state=PolicyState(low_since_s=900.0, last_down_s=980.0),
    ),
    Case(
        "low load but errors in the window: hold",
        window(in_flight=1, ready=4, errors=2),
        4,
        4,
        "hold",
        state=PolicyState(low_since_s=900.0),
    ),
    Case(
        "scaled to zero, a request queues: up",
        window(n=0, in_flight=0, queued=1, ready=0),
        0,
        1,
        "scale up",
        lo=0,
    ),
    Case(
        "idle at min 0 for long: down to 0",
        window(n=0, in_flight=0, ready=1),
        1,
        0,
        "scale down",
        state=PolicyState(low_since_s=0.0),
        lo=0,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decisions(case: Case) -> None:
    d = decide(case.window, SLO, case.lo, case.hi, case.current, case.state, case.now, TUNING)
    assert (d.replicas, d.reason[: len(case.reason)]) == (case.expect, case.reason)
    assert d.changed == (d.replicas != case.current)


def test_stability_clock_is_remembered_and_reset() -> None:
    low = window(in_flight=1, ready=4)
    first = decide(low, SLO, 1, 10, 4, PolicyState(), 100.0, TUNING)
    assert first.state.low_since_s == 100.0
    later = decide(low, SLO, 1, 10, 4, first.state, 120.0, TUNING)
    assert (later.replicas, later.state.low_since_s) == (4, 100.0)
    busy = decide(window(in_flight=12, ready=4), SLO, 1, 10, 4, later.state, 125.0, TUNING)
    assert busy.state.low_since_s is None  # load came back: the clock starts over
    done = decide(low, SLO, 1, 10, 4, later.state, 131.0, TUNING)
    assert done.replicas == 3
    assert (done.state.last_down_s, done.state.low_since_s) == (131.0, None)


def test_bad_bounds_and_tuning_are_refused() -> None:
    with pytest.raises(ValueError, match="bad bounds"):
        decide(window(), SLO, 5, 2, 3, PolicyState(), 0.0, TUNING)
    with pytest.raises(ValueError, match="down_utilisation"):
        Tuning(down_utilisation=0.9, target_utilisation=0.8)


windows = st.builds(
    PoolWindow,
    requests=st.integers(0, 200),
    errors=st.integers(0, 5),
    ttft_ms=st.lists(st.floats(0, 5000), max_size=30).map(tuple),
    tpot_ms=st.lists(st.floats(0, 500), max_size=30).map(tuple),
    in_flight=st.integers(0, 500),
    queued=st.integers(0, 500),
    replicas_ready=st.integers(0, 64),
)


@settings(max_examples=300, deadline=None)
@given(
    w=windows,
    lo=st.integers(0, 8),
    span=st.integers(0, 40),
    current=st.integers(0, 64),
    last_up=st.none() | st.floats(0, 1000),
    last_down=st.none() | st.floats(0, 1000),
    low_since=st.none() | st.floats(0, 1000),
)
def test_always_within_bounds(
    w: PoolWindow,
    lo: int,
    span: int,
    current: int,
    last_up: float | None,
    last_down: float | None,
    low_since: float | None,
) -> None:
    hi = max(lo, 1) + span
    state = PolicyState(last_up, last_down, low_since)
    d = decide(w, SLO, lo, hi, current, state, 1000.0, TUNING)
    assert lo <= d.replicas <= hi
    if lo <= current <= hi:
        # One step down at most; up at most ×max_up_factor (and at least one).
        assert d.replicas >= current - 1
        assert d.replicas <= max(current + 1, math.floor(current * TUNING.max_up_factor))


def steady(load: int, replicas: int, ready: int, slots: int) -> PoolWindow:
    """A steady load of `load` concurrent requests on `ready` replicas: what overflows the
    slots queues, and the SLO is met while the busy share of the slots is at most 80%."""
    capacity = ready * slots
    ok = capacity > 0 and load <= 0.8 * capacity
    return PoolWindow(
        requests=50,
        errors=0,
        ttft_ms=tuple([100.0 if ok else 5000.0] * 50),
        tpot_ms=tuple([20.0] * 50),
        in_flight=min(load, capacity),
        queued=max(0, load - capacity),
        replicas_ready=ready,
    )


@settings(max_examples=100, deadline=None)
@given(
    load=st.integers(0, 200),
    start=st.integers(1, 30),
    lo=st.integers(1, 4),
    hi=st.integers(4, 40),
    startup_ticks=st.integers(0, 3),
)
def test_never_flaps_under_a_steady_load(
    load: int, start: int, lo: int, hi: int, startup_ticks: int
) -> None:
    """Under a constant load the count never oscillates: it moves one way, or overshoots
    once going up fast and then comes down (slowly) and stays — never up again."""
    tick = 5.0
    replicas, state = max(lo, min(hi, start)), PolicyState()
    ready_at: list[float] = []
    history = [replicas]
    for step in range(400):
        now = step * tick
        ready_at = [t for t in ready_at if t > now]
        ready = replicas - len(ready_at)
        d = decide(steady(load, replicas, ready, 4), SLO, lo, hi, replicas, state, now, TUNING)
        state = d.state
        if d.replicas > replicas:
            ready_at += [now + startup_ticks * tick] * (d.replicas - replicas)
        replicas = d.replicas
        history.append(replicas)
    moves = [b - a for a, b in itertools.pairwise(history) if b != a]
    reversals = sum(1 for a, b in itertools.pairwise(moves) if (a > 0) != (b > 0))
    assert reversals <= 1, history
    if reversals:
        first_down = next(i for i, m in enumerate(moves) if m < 0)
        assert all(m > 0 for m in moves[:first_down]), history  # up, then down only
    assert history[-1] == history[-40]  # settled


def test_the_queue_is_remembered() -> None:
    d = decide(window(queued=3, in_flight=8), SLO, 1, 10, 2, PolicyState(), 0.0, TUNING)
    assert d.state.last_queued == 3


def test_decision_is_frozen() -> None:
    d = decide(window(), SLO, 1, 4, 2, PolicyState(), 0.0, TUNING)
    assert isinstance(d, ScaleDecision)
    with pytest.raises(AttributeError):
        d.replicas = 3  # type: ignore[misc]
