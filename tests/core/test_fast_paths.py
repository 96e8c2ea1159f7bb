"""The cycle's fast paths decide exactly as the straightforward cycle (`reference_cycle`).

`schedule` gives a plain job behind the reservation its shape's reason without the phases,
merges the team queues in runs, and `reserve` counts from the free-GPU indexes; the
simulator skips cycles `decides_nothing` vouches for. Each check runs both versions on the
same states, cycle after cycle, and asks for equal decisions: the same starts, placements,
preemptions, reservation, reasons (in the same order), team reasons and default reason.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings

from phalanx.core import (
    ClusterState,
    Decisions,
    JobRequest,
    JobState,
    Node,
    Placement,
    SchedulerConfig,
    Team,
    apply_decisions,
    decides_nothing,
    queue_order,
    schedule,
)
from phalanx.core.backfill import reserve
from phalanx.core.placement import excluded_indices
from tests.core.reference_cycle import (
    reference_queue_order,
    reference_reserve,
    reference_schedule,
)
from tests.core.test_invariants import Driver, Scenario, scenarios

POLICIES = ("priority", "fifo", "sjf", "srtf", "las")


def check_same(state: ClusterState, now: float, config: SchedulerConfig) -> Decisions:
    """One cycle both ways: equal decisions, reasons in the same order, the same queue
    order, the same reservation for every queued job, and `decides_nothing` only when
    the cycle starts and preempts nothing. Returns the decisions."""
    fast = schedule(state, now, config)
    ref = reference_schedule(state, now, config)
    assert fast == ref
    assert list(fast.reasons.items()) == list(ref.reasons.items())
    order = [job.id for job in queue_order(state, now)]
    assert order == [job.id for job in reference_queue_order(state, now)]
    if decides_nothing(state, config):
        assert not fast.starts and not fast.preemptions
    held = [(now + 50.0 * (i + 1), start.placement) for i, start in enumerate(fast.starts)]
    for job_id in order[:40]:
        job = state.pending[job_id]
        excluded = excluded_indices(state, job)
        assert reserve(state, job, now, excluded) == reference_reserve(state, job, now, excluded)
        for start in fast.starts:  # as in a cycle: the GPUs it took, until their limits
            state.take(start.placement)
        try:
            assert reserve(state, job, now, excluded, held) == reference_reserve(
                state, job, now, excluded, held
            )
        finally:
            for start in reversed(fast.starts):
                state.give(start.placement)
    return fast


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios())
def test_small_random_clusters(sc: Scenario) -> None:
    """The invariant tests' scenarios: quotas, cohorts, dependencies, GPU models,
    exclusions, node failures, preemption, shallow depths."""
    driver = Driver(sc)
    for k in range(sc.cycles):
        now = driver.before_cycle(k)
        decisions = check_same(driver.state, now, sc.config)
        apply_decisions(driver.state, decisions, now)


def _long_queue(policy: str, seed: int, config: SchedulerConfig) -> int:
    """A busy 128-GPU cluster with a queue of hundreds of jobs, most of them plain, from
    teams whose fair shares differ, tie (teams that never ran) and change; every cycle is
    checked. Returns how many cycles had a reservation (so the fast path had work)."""
    rng = random.Random(seed)
    nodes = [
        Node(
            f"n{i}",
            8,
            gpu_model="A100" if i % 7 == 6 else "H100",
            rack=f"r{i // 4}",
            block=f"b{i // 8}",
        )
        for i in range(16)
    ]
    teams = [
        Team("t0"),
        Team("t1", weight=2.0),
        Team("t2", quota=24, cohort="c"),
        Team("t3", quota=16, cohort="c", borrowing_limit=8),
        Team("t4"),  # t4 and t5 never run: equal (zero) fair shares
        Team("t5"),
    ]
    state = ClusterState(nodes, teams, policy=policy)
    next_id, reservations = 0, 0
    for k in range(14):
        now = 600.0 * k
        for job_id, run in sorted(state.running.items()):
            if job_id in state.preempting:
                state.requeue(job_id, now)
            elif run.expected_end_s <= now or rng.random() < 0.25:
                state.finish(job_id, now, JobState.COMPLETED)
        if k == 5:
            state.set_node_up("n3", False, "test")
        if k == 8:
            state.set_node_up("n3", True)
        for _ in range(60 if k < 6 else 10):
            team = rng.choice(("t0", "t0", "t1", "t1", "t2", "t3", "t4", "t5"))
            if team in ("t4", "t5") and k < 12:
                team = "t0"  # t4, t5 submit only at the end: their shares stay equal
            nodes_, per_node = rng.choice(((1, 1),) * 8 + ((1, 2), (1, 4), (1, 8), (2, 8), (3, 4)))
            special = rng.random()
            state.submit(
                JobRequest(
                    id=next_id,
                    team=team,
                    priority=rng.choice((0, 0, 0, 1, 2)),
                    nodes=nodes_,
                    gpus_per_node=per_node,
                    time_limit_s=rng.choice((None, 300.0, 900.0, 1800.0, 3600.0, 7200.0)),
                    submit_s=now + next_id * 1e-3,
                    duration_s=float(rng.randint(60, 7200)),
                    attained_s=rng.choice((0.0, 0.0, 1200.0)),
                    preemptible=rng.random() < 0.9,
                    gpu_model="A100" if special < 0.03 else None,
                    exclude_nodes=frozenset({"n1"}) if 0.03 <= special < 0.06 else frozenset(),
                    begin_s=now + 900.0 if 0.06 <= special < 0.08 else None,
                ),
                now,
            )
            next_id += 1
        decisions = check_same(state, now, config)
        reservations += decisions.reservation is not None
        apply_decisions(state, decisions, now)
    return reservations


def test_long_queues_every_policy() -> None:
    with_reservation = 0
    for seed, policy in enumerate(POLICIES):
        with_reservation += _long_queue(policy, seed, SchedulerConfig())
        with_reservation += _long_queue(policy, seed + 10, SchedulerConfig(preemption=False))
    assert with_reservation > 20  # the fast path behind a reservation was exercised


def test_long_queues_shallow_depth_and_no_backfill() -> None:
    for seed, policy in enumerate(("priority", "fifo", "las")):
        _long_queue(policy, seed, SchedulerConfig(depth=37, max_preemption_attempts=1))
        _long_queue(policy, seed, SchedulerConfig(backfill=False))


def test_fair_share_ties_merge_by_the_rest_of_the_key() -> None:
    """Teams with equal fair shares interleave by priority, then age; a team with a lower
    share goes first within a priority class — run boundaries fall inside team queues."""
    nodes = [Node("n0", 8)]
    state = ClusterState(nodes, [Team("a"), Team("b"), Team("c")], policy="priority")
    jobs = [
        JobRequest(id=i, team="abc"[i % 3], priority=(i // 5) % 2, submit_s=float(i % 4))
        for i in range(30)
    ]
    for job in jobs:
        state.submit(job, 0.0)
    state.start(0, Placement(((0, 1),)), 0.0)  # team a runs: its share rises above b, c
    now = 3600.0
    order = [job.id for job in queue_order(state, now)]
    assert order == [job.id for job in reference_queue_order(state, now)]
    assert sorted(order) == list(range(1, 30))
    first_class = [i for i in order if state.pending[i].priority == 1]
    assert order[: len(first_class)] == first_class  # higher priority first
    b_and_c = [i for i in first_class if state.pending[i].team != "a"]
    assert first_class[: len(b_and_c)] == b_and_c  # then the lower shares (b, c tie)
    assert [state.pending[i].team for i in b_and_c] != sorted(
        state.pending[i].team for i in b_and_c
    )  # b and c interleave (by submit time), not one team after the other


def test_decides_nothing_only_when_nothing_fits() -> None:
    state = ClusterState([Node("n0", 4), Node("n1", 4)], policy="fifo")
    config = SchedulerConfig(preemption=False)
    assert not decides_nothing(state, config)  # nothing queued: a cycle still runs
    state.submit(JobRequest(id=1, team="t", gpus_per_node=4, time_limit_s=100.0), 0.0)
    state.submit(JobRequest(id=2, team="t", gpus_per_node=2, time_limit_s=100.0), 0.0)
    apply_decisions(state, schedule(state, 0.0, config), 0.0)
    assert 1 in state.running and 2 in state.running
    state.submit(JobRequest(id=3, team="t", gpus_per_node=2), 1.0)
    assert not decides_nothing(state, config)  # n1 has 2 free GPUs
    state.submit(JobRequest(id=4, team="t", gpus_per_node=2), 1.0)
    apply_decisions(state, schedule(state, 1.0, config), 1.0)
    assert 3 in state.running
    assert decides_nothing(state, config)  # job 4 needs 2 GPUs; none is free
    assert not schedule(state, 2.0, config).starts
    # A higher-priority job could preempt: the cycle must run.
    state.submit(replace(JobRequest(id=5, team="t", gpus_per_node=2), priority=5), 2.0)
    assert not decides_nothing(state, SchedulerConfig())
    assert schedule(state, 2.0, SchedulerConfig()).preemptions
