"""Phase 1 — dependencies with Slurm semantics (after, afterok, afterany, afternotok)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from phalanx.core import (
    ClusterState,
    Dependency,
    DependencyKind,
    JobState,
    ReasonCode,
    schedule,
)
from phalanx.core.deps import DepStatus, evaluate
from phalanx.testing import apply_decisions, cluster_nodes, job

AFTER, OK, ANY, NOTOK = (
    DependencyKind.AFTER,
    DependencyKind.AFTEROK,
    DependencyKind.AFTERANY,
    DependencyKind.AFTERNOTOK,
)
START = "start"  # the dependent job starts in this cycle
WAIT = ReasonCode.DEPENDENCY
NEVER = ReasonCode.DEPENDENCY_NEVER_SATISFIED

# What happened to an upstream job before the cycle.
PENDING, RUNNING, CANCELLED_PENDING = "pending", "running", "cancelled while pending"


def _upstream(state: ClusterState, job_id: int, fate: str | JobState) -> None:
    state.submit(job(job_id, gpus=1, limit=1000.0), 0.0)
    if fate == PENDING:
        return
    if fate == CANCELLED_PENDING:
        state.finish(job_id, 5.0, JobState.CANCELLED)
        return
    decisions = schedule(state, 1.0)
    apply_decisions(state, decisions, 1.0)
    assert job_id in state.running
    if isinstance(fate, JobState):
        state.finish(job_id, 5.0, fate)


# (upstream fates {job id: fate}, dependencies, any-of, expected outcome, words in the reason)
CASES: dict[
    str,
    tuple[
        dict[int, str | JobState],
        tuple[tuple[DependencyKind, int], ...],
        bool,
        str | ReasonCode,
        tuple[str, ...],
    ],
] = {
    "after-pending-waits": ({1: PENDING}, ((AFTER, 1),), False, WAIT, ("job 1", "after")),
    "after-running-starts": ({1: RUNNING}, ((AFTER, 1),), False, START, ()),
    "after-cancelled-before-start-starts": (
        {1: CANCELLED_PENDING},
        ((AFTER, 1),),
        False,
        START,
        (),
    ),
    "after-completed-starts": ({1: JobState.COMPLETED}, ((AFTER, 1),), False, START, ()),
    "afterok-running-waits": ({1: RUNNING}, ((OK, 1),), False, WAIT, ("job 1", "afterok")),
    "afterok-completed-starts": ({1: JobState.COMPLETED}, ((OK, 1),), False, START, ()),
    "afterok-failed-never": (
        {1: JobState.FAILED},
        ((OK, 1),),
        False,
        NEVER,
        ("afterok:1", "never be satisfied"),
    ),
    "afterok-cancelled-never": ({1: CANCELLED_PENDING}, ((OK, 1),), False, NEVER, ("afterok:1",)),
    "afterok-timeout-never": ({1: JobState.TIMEOUT}, ((OK, 1),), False, NEVER, ("afterok:1",)),
    "afterok-node-fail-never": ({1: JobState.NODE_FAIL}, ((OK, 1),), False, NEVER, ()),
    "afterany-running-waits": ({1: RUNNING}, ((ANY, 1),), False, WAIT, ("afterany",)),
    "afterany-completed-starts": ({1: JobState.COMPLETED}, ((ANY, 1),), False, START, ()),
    "afterany-failed-starts": ({1: JobState.FAILED}, ((ANY, 1),), False, START, ()),
    "afterany-cancelled-starts": ({1: CANCELLED_PENDING}, ((ANY, 1),), False, START, ()),
    "afternotok-running-waits": ({1: RUNNING}, ((NOTOK, 1),), False, WAIT, ("afternotok",)),
    "afternotok-failed-starts": ({1: JobState.FAILED}, ((NOTOK, 1),), False, START, ()),
    "afternotok-timeout-starts": ({1: JobState.TIMEOUT}, ((NOTOK, 1),), False, START, ()),
    "afternotok-completed-never": (
        {1: JobState.COMPLETED},
        ((NOTOK, 1),),
        False,
        NEVER,
        ("afternotok:1",),
    ),
    "unknown-job-never": ({}, ((OK, 99),), False, NEVER, ("afterok:99", "cancel the job")),
    "unknown-job-after-never": ({}, ((AFTER, 99),), False, NEVER, ("after:99",)),
    "all-of-one-waiting-waits-on-it": (
        {1: JobState.COMPLETED, 3: RUNNING},
        ((OK, 1), (ANY, 3)),
        False,
        WAIT,
        ("job 3", "afterany"),
    ),
    "all-of-any-never-is-never": (
        {1: JobState.FAILED, 3: RUNNING},
        ((ANY, 3), (OK, 1)),
        False,
        NEVER,
        ("afterok:1",),
    ),
    "all-of-all-satisfied-starts": (
        {1: JobState.COMPLETED, 3: JobState.FAILED},
        ((OK, 1), (NOTOK, 3)),
        False,
        START,
        (),
    ),
    "any-of-one-satisfied-starts": (
        {1: JobState.FAILED, 3: JobState.COMPLETED},
        ((OK, 1), (OK, 3)),
        True,
        START,
        (),
    ),
    "any-of-never-and-waiting-waits": (
        {1: JobState.FAILED, 3: RUNNING},
        ((OK, 1), (OK, 3)),
        True,
        WAIT,
        ("job 3",),
    ),
    "any-of-all-never-is-never": (
        {1: JobState.FAILED, 3: JobState.CANCELLED},
        ((OK, 1), (OK, 3)),
        True,
        NEVER,
        (),
    ),
}


@pytest.mark.parametrize(
    ("fates", "deps", "any_of", "outcome", "words"), list(CASES.values()), ids=list(CASES)
)
def test_dependency_table(
    fates: dict[int, str | JobState],
    deps: tuple[tuple[DependencyKind, int], ...],
    any_of: bool,
    outcome: str | ReasonCode,
    words: tuple[str, ...],
) -> None:
    state = ClusterState(cluster_nodes(1, gpus_per_node=8))
    for job_id, fate in sorted(fates.items()):
        _upstream(state, job_id, fate)
    dependent = replace(
        job(2, gpus=1, submit=10.0),
        dependencies=tuple(Dependency(kind, j) for kind, j in deps),
        dependency_any=any_of,
    )
    state.submit(dependent, 10.0)
    decisions = schedule(state, 10.0)
    started = [s.job_id for s in decisions.starts]
    if outcome == START:
        assert 2 in started
        return
    assert 2 not in started
    reason = decisions.reason_for(dependent)
    assert reason.code is outcome, str(reason)
    for word in words:
        assert word in reason.message


def test_dependent_starts_once_its_dependency_completes() -> None:
    state = ClusterState(cluster_nodes(1, gpus_per_node=2))
    state.submit(job(1, gpus=1, limit=100.0), 0.0)
    state.submit(replace(job(2, gpus=1), dependencies=(Dependency(OK, 1),)), 0.0)
    first = schedule(state, 0.0)
    assert [s.job_id for s in first.starts] == [1]
    assert first.reason_for(state.pending[2]).code is WAIT
    apply_decisions(state, first, 0.0)
    assert [s.job_id for s in schedule(state, 50.0).starts] == []
    state.finish(1, 60.0, JobState.COMPLETED)
    assert [s.job_id for s in schedule(state, 60.0).starts] == [2]


def test_held_job_neither_starts_nor_blocks_later_jobs() -> None:
    # Job 2 waits on job 1; job 3 behind it must not wait behind a job that cannot run.
    state = ClusterState(cluster_nodes(1, gpus_per_node=8), policy="fifo")
    state.submit(job(4, gpus=1, limit=100.0), 0.0)
    apply_decisions(state, schedule(state, 0.0), 0.0)
    state.submit(replace(job(2, gpus=8, submit=2.0), dependencies=(Dependency(ANY, 4),)), 2.0)
    state.submit(job(3, gpus=4, submit=3.0), 3.0)
    decisions = schedule(state, 3.0)
    assert [s.job_id for s in decisions.starts] == [3]
    assert decisions.reason_for(state.pending[2]).code is WAIT
    assert decisions.reservation is None


def test_never_satisfiable_chain_propagates_on_cancel() -> None:
    # 1 fails → 2 (afterok:1) can never run; 3 (afterok:2) keeps waiting on 2 until 2 is
    # cancelled, then it can never run either.
    state = ClusterState(cluster_nodes(1, gpus_per_node=8))
    state.submit(job(1, gpus=1), 0.0)
    state.submit(replace(job(2), dependencies=(Dependency(OK, 1),)), 0.0)
    state.submit(replace(job(3), dependencies=(Dependency(OK, 2),)), 0.0)
    apply_decisions(state, schedule(state, 0.0), 0.0)
    state.finish(1, 5.0, JobState.FAILED)
    decisions = schedule(state, 5.0)
    assert decisions.reason_for(state.pending[2]).code is NEVER
    assert decisions.reason_for(state.pending[3]).code is WAIT
    state.finish(2, 6.0, JobState.CANCELLED)
    decisions = schedule(state, 6.0)
    assert decisions.starts == ()
    assert decisions.reason_for(state.pending[3]).code is NEVER


def test_after_stays_satisfied_when_the_upstream_job_is_requeued() -> None:
    state = ClusterState(cluster_nodes(1, gpus_per_node=1))
    state.submit(job(1, gpus=1), 0.0)
    state.submit(replace(job(2), dependencies=(Dependency(AFTER, 1),)), 0.0)
    apply_decisions(state, schedule(state, 0.0), 0.0)
    state.requeue(1, 10.0)  # preempted: back in the queue, but it did start
    decisions = schedule(state, 10.0)
    assert len(decisions.starts) == 1
    assert state.lookup(1) == (True, None)
    assert decisions.reason_for(state.pending[2]).code is not WAIT


def test_start_rejects_a_job_held_by_a_dependency() -> None:
    state = ClusterState(cluster_nodes(1))
    state.submit(job(1), 0.0)
    state.submit(replace(job(2), dependencies=(Dependency(OK, 1),)), 0.0)
    placement = schedule(state, 0.0).starts[0].placement
    with pytest.raises(ValueError, match="dependency"):
        state.start(2, placement, 0.0)


@pytest.mark.parametrize(
    ("info", "kind", "status"),
    [
        (None, AFTER, DepStatus.NEVER),
        ((False, None), AFTER, DepStatus.WAITING),
        ((True, None), AFTER, DepStatus.SATISFIED),
        ((False, JobState.CANCELLED), AFTER, DepStatus.SATISFIED),
        ((True, None), OK, DepStatus.WAITING),
        ((True, JobState.COMPLETED), OK, DepStatus.SATISFIED),
        ((True, JobState.FAILED), OK, DepStatus.NEVER),
        ((True, JobState.FAILED), ANY, DepStatus.SATISFIED),
        ((True, JobState.COMPLETED), NOTOK, DepStatus.NEVER),
        ((True, JobState.NODE_FAIL), NOTOK, DepStatus.SATISFIED),
    ],
    ids=[
        "unknown-job",
        "after-not-started",
        "after-started",
        "after-cancelled-pending",
        "afterok-running",
        "afterok-completed",
        "afterok-failed",
        "afterany-failed",
        "afternotok-completed",
        "afternotok-node-fail",
    ],
)
def test_evaluate_one_dependency(
    info: tuple[bool, JobState | None] | None, kind: DependencyKind, status: DepStatus
) -> None:
    dependent = replace(job(2), dependencies=(Dependency(kind, 1),))
    assert evaluate(dependent, lambda _id: info)[0] is status
