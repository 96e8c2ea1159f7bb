"""Phase 6 — a reservation for the first blocked job, and EASY backfill behind it: a later
job starts only if it ends before the reservation or fits in the reserved nodes' spare GPUs."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from phalanx.core import (
    ClusterState,
    JobRequest,
    JobState,
    ReasonCode,
    SchedulerConfig,
    schedule,
)
from phalanx.core.backfill import reserve
from phalanx.core.placement import excluded_indices
from phalanx.testing import apply_decisions, job, node, run_job
from tests.core.helpers import Case, Running, check

DELAY = ReasonCode.BACKFILL_WOULD_DELAY
RESERVED = ReasonCode.RESOURCES  # the reservation holder waits on Resources
NOW = 100.0
N2 = [node("n0"), node("n1")]
N3 = [node("n0"), node("n1"), node("n2")]
RACKED = [
    node("a0", rack="ra"),
    node("a1", rack="ra"),
    node("b0", rack="rb"),
    node("b1", rack="rb"),
    node("b2", rack="rb"),
]


def _run(job_id: int, on: str, gpus: int, limit: float | None, start: float = 0.0) -> Running:
    """A running job holding `gpus` GPUs of `on` until start + limit (forever without one)."""
    return Running(job(job_id, team="other", gpus=gpus, limit=limit), on={on: gpus}, start=start)


def _q(
    job_id: int, gpus: int = 8, nodes: int = 1, limit: float | None = None, **kw: Any
) -> JobRequest:
    request = job(job_id, gpus=gpus, nodes=nodes, limit=limit, submit=float(job_id))
    return replace(request, **kw)


CASES: dict[str, Case] = {
    "short-job-backfills-long-job-would-delay": Case(
        nodes=N2,
        running=[_run(10, "n0", 8, 1000.0), _run(11, "n1", 4, 500.0)],
        queue=[_q(1, nodes=2), _q(2, gpus=4, limit=5000.0), _q(3, gpus=4, limit=300.0)],
        policy="fifo",
        starts={3: ["n1"]},
        reservation=(1, 1000.0, ["n0", "n1"]),
        reasons={
            1: (RESERVED, ("needs 2 nodes × 8 GPUs", "reserved at t=1000s, in 900s")),
            2: (DELAY, ("time limit of 5000s", "delay job 1")),
        },
    ),
    "job-ending-exactly-at-reservation-backfills": Case(
        nodes=N2,
        running=[_run(10, "n0", 8, 1000.0), _run(11, "n1", 4, 500.0)],
        queue=[_q(1, nodes=2), _q(2, gpus=4, limit=900.0)],
        policy="fifo",
        starts={2: ["n1"]},
        reservation=(1, 1000.0, ["n0", "n1"]),
    ),
    "job-without-limit-would-delay": Case(
        nodes=N2,
        running=[_run(10, "n0", 8, 1000.0), _run(11, "n1", 4, 500.0)],
        queue=[_q(1, nodes=2), _q(2, gpus=1)],
        policy="fifo",
        starts={},
        reasons={2: (DELAY, ("time limit of none",))},
    ),
    "long-job-fits-spare-gpus-of-reserved-node": Case(
        # Job 1 needs 2 × 6 at t=1000: n1 keeps 2 spare GPUs then, and job 2 fits in them.
        nodes=N2,
        running=[_run(10, "n0", 8, 1000.0), _run(11, "n1", 2, 500.0)],
        queue=[_q(1, gpus=6, nodes=2), _q(2, gpus=2), _q(3, gpus=2)],
        policy="fifo",
        starts={2: ["n1"]},
        reservation=(1, 1000.0, ["n0", "n1"]),
        reasons={3: (DELAY, ())},
    ),
    "long-job-on-unreserved-node": Case(
        nodes=N3,
        running=[
            _run(10, "n0", 8, 1000.0),
            _run(11, "n1", 8, 2000.0),
            _run(12, "n2", 4, None),
        ],
        queue=[_q(1), _q(2, gpus=4)],
        policy="fifo",
        starts={2: ["n2"]},
        reservation=(1, 1000.0, ["n0"]),
    ),
    "reservation-when-jobs-without-limit-end": Case(
        nodes=N2,
        running=[_run(10, "n0", 8, None), _run(11, "n1", 4, None)],
        queue=[_q(1), _q(2, gpus=4, limit=10_000.0), _q(3, gpus=1)],
        policy="fifo",
        starts={2: ["n1"]},
        reservation=(1, math.inf, ["n0"]),
        reasons={1: (RESERVED, ("when jobs without a time limit end",))},
    ),
    "reservation-counts-this-cycles-starts": Case(
        # Job 1 starts now and ends at t=200; job 2 must get n0 then, not never.
        nodes=[node("n0")],
        queue=[_q(1, gpus=4, limit=100.0), _q(2), _q(3, gpus=4), _q(4, gpus=4, limit=50.0)],
        policy="fifo",
        starts={1: ["n0"], 4: ["n0"]},
        reservation=(2, 200.0, ["n0"]),
        reasons={2: (RESERVED, ("at t=200s",)), 3: (DELAY, ("delay job 2",))},
    ),
    "preempting-victims-free-their-gpus-now": Case(
        nodes=N2,
        running=[_run(10, "n0", 8, 10_000.0), _run(11, "n1", 8, 500.0)],
        preempting={10: 99},
        queue=[_q(1, nodes=2)],
        reservation=(1, 500.0, ["n0", "n1"]),
    ),
    "gang-reserves-tightest-rack-at-that-time": Case(
        # At t=300 the 5-node job ends: ra then has 2 free nodes, rb 3; ra is tighter.
        nodes=RACKED,
        running=[
            Running(
                job(10, gpus=8, nodes=5, limit=300.0),
                on={n.name: 8 for n in RACKED},
            )
        ],
        queue=[_q(1, nodes=2)],
        reservation=(1, 300.0, ["a0", "a1"]),
    ),
    "gang-reserves-earliest-time-over-one-rack": Case(
        # At t=300 one node of each rack is free: the gang reserves across racks then rather
        # than waiting until t=400 for a whole rack.
        nodes=RACKED,
        running=[
            _run(10, "a0", 8, 300.0),
            _run(11, "a1", 8, 400.0),
            _run(12, "b0", 8, 200.0),
            _run(13, "b1", 8, 500.0),
            _run(14, "b2", 8, 600.0),
        ],
        queue=[_q(1, nodes=2)],
        reservation=(1, 300.0, ["a0", "b0"]),
    ),
    "reservation-avoids-excluded-nodes": Case(
        nodes=N2,
        running=[_run(10, "n0", 8, 200.0), _run(11, "n1", 8, 700.0)],
        queue=[_q(1, exclude_nodes=frozenset({"n0"})), _q(2, gpus=8, limit=150.0)],
        policy="fifo",
        starts={},
        reservation=(1, 700.0, ["n1"]),
    ),
    "only-the-first-blocked-job-reserves": Case(
        nodes=N2,
        running=[_run(10, "n0", 8, 300.0), _run(11, "n1", 4, 600.0)],
        queue=[_q(1), _q(2), _q(3, gpus=1, limit=100.0)],
        policy="fifo",
        starts={3: ["n1"]},
        reservation=(1, 300.0, ["n0"]),
        reasons={2: (ReasonCode.RESOURCES, ("needs 8 free GPUs on one node", "most free", "4"))},
    ),
    "backfill-disabled-stops-at-the-first-blocked-job": Case(
        nodes=N2,
        running=[_run(10, "n0", 8, 300.0)],
        queue=[_q(1, nodes=2), _q(2, gpus=1, limit=10.0)],
        policy="fifo",
        config=SchedulerConfig(backfill=False),
        starts={},
        reservation=None,
        reasons={
            1: (ReasonCode.RESOURCES, ("needs 2 nodes × 8 GPUs",)),
            2: (ReasonCode.PRIORITY, ("waiting behind job 1", "no backfill")),
        },
    ),
    "later-preemption-keeps-off-reserved-gpus": Case(
        # Job 1 (priority 5) holds the reservation for n0 + n1 at t=200. Job 2 (priority 3)
        # may preempt job 10 but must not take the GPUs job 1 has reserved.
        nodes=N2,
        running=[
            Running(job(10, gpus=8, limit=100.0), on={"n0": 8}),
            Running(job(11, gpus=8, limit=200.0, preemptible=False), on={"n1": 8}),
        ],
        queue=[_q(1, nodes=2, priority=5), _q(2, gpus=8, limit=1000.0, priority=3)],
        preemptions={},
        reservation=(1, 200.0, ["n0", "n1"]),
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_backfill_table(case: Case) -> None:
    check(case)


def test_backfilled_flag_marks_starts_behind_the_reservation() -> None:
    _, decisions = check(CASES["reservation-counts-this-cycles-starts"])
    assert [(s.job_id, s.backfilled) for s in decisions.starts] == [(1, False), (4, True)]


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_applying_the_starts_never_delays_the_reservation(case_id: str) -> None:
    state, decisions = check(CASES[case_id])
    before = decisions.reservation
    if before is None:
        return
    holder = state.pending[before.job_id]
    apply_decisions(state, decisions, CASES[case_id].now)
    after = reserve(state, holder, CASES[case_id].now, excluded_indices(state, holder))
    assert after is not None
    assert after[0].start_s <= before.start_s


def test_reserve_is_none_only_when_the_job_can_never_fit() -> None:
    state = ClusterState(N2)
    state.set_node_up("n1", False)
    two = _q(1, nodes=2)
    assert reserve(state, two, NOW, frozenset()) is None
    state.set_node_up("n1", True)
    found = reserve(state, two, NOW, frozenset())
    assert found is not None and found[0].start_s == NOW
    assert reserve(state, two, NOW, frozenset({0})) is None


def test_reservation_holds_across_cycles_until_the_job_starts() -> None:
    # Short jobs keep arriving behind job 1; they may fill the gap but never push job 1 past
    # t=300, when the job blocking it ends.
    state = ClusterState(N2, policy="fifo")
    run_job(state, job(10, gpus=8, limit=300.0))  # all of n0 until t=300
    run_job(state, job(11, gpus=4, limit=250.0))  # half of n1 until t=250
    state.submit(_q(1, nodes=2), 1.0)
    backfilled = []
    for k, now in enumerate((50.0, 150.0, 260.0, 300.0)):
        for jid, run in sorted(state.running.items()):
            if run.expected_end_s <= now:
                state.finish(jid, now, JobState.COMPLETED)
        state.submit(job(20 + k, gpus=4, limit=100.0, submit=now), now)
        decisions = schedule(state, now)
        apply_decisions(state, decisions, now)
        backfilled += [s.job_id for s in decisions.starts if s.backfilled]
        if 1 in state.running:
            break
        assert decisions.reservation is not None
        assert (decisions.reservation.job_id, decisions.reservation.start_s) == (1, 300.0)
    assert state.running[1].start_s == 300.0
    assert backfilled == [20, 21]  # job 22 (t=260 + 100 s) would have delayed job 1
