"""`--begin` (a not-before time) and `-w/--nodelist` (only these nodes), and jobs taken out
of the queue without ending (held): table-driven, one cycle each."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from phalanx.core import (
    ClusterState,
    Dependency,
    DependencyKind,
    JobRequest,
    JobState,
    ReasonCode,
    StateError,
    schedule,
)
from phalanx.testing import job, node
from tests.core.helpers import Case, Running, check

R = ReasonCode
N3 = [node("n1", rack="r0"), node("n2", rack="r0"), node("n3", rack="r1")]


def _q(job_id: int, gpus: int = 8, **kw: Any) -> JobRequest:
    return replace(job(job_id, gpus=gpus, submit=float(job_id)), **kw)


CASES: dict[str, Case] = {
    "begin-ahead-waits-and-says-when": Case(
        nodes=N3,
        now=100.0,
        queue=[_q(1, begin_s=160.0), _q(2)],
        starts={2: ["n1"]},
        reasons={1: (R.BEGIN_TIME, ("t=160s", "in 60s", "--begin"))},
    ),
    "begin-reached-starts": Case(
        nodes=N3, now=100.0, queue=[_q(1, begin_s=100.0)], starts={1: ["n1"]}
    ),
    "begin-in-the-past-starts": Case(
        nodes=N3, now=100.0, queue=[_q(1, begin_s=5.0)], starts={1: ["n1"]}
    ),
    "begin-ahead-gets-no-reservation-and-blocks-nobody": Case(
        # The cluster is full; the waiting job's begin is ahead: the reservation goes to
        # the next job, not to one that may not start yet.
        nodes=[node("n1")],
        now=100.0,
        running=[Running(job(9, team="o", gpus=8, limit=500.0), on={"n1": 8})],
        queue=[_q(1, priority=10, begin_s=1000.0), _q(2)],
        reservation=(2, 500.0, ["n1"]),
        reasons={1: (R.BEGIN_TIME, ("t=1000s",))},
    ),
    "begin-reason-even-when-the-cycle-stops-early": Case(
        nodes=[node("n1")],
        now=100.0,
        running=[Running(job(9, team="o", gpus=8), on={"n1": 8})],
        queue=[_q(1), _q(2, begin_s=900.0)],
        reasons={2: (R.BEGIN_TIME, ("t=900s",))},
    ),
    "nodelist-places-on-the-named-node": Case(
        nodes=N3, queue=[_q(1, nodelist=frozenset({"n3"}))], starts={1: ["n3"]}
    ),
    "nodelist-gang-on-the-named-nodes": Case(
        nodes=N3,
        queue=[_q(1, nodes=2, nodelist=frozenset({"n1", "n3"}))],
        starts={1: ["n1", "n3"]},
    ),
    "nodelist-waits-for-its-busy-node-though-others-are-free": Case(
        nodes=N3,
        running=[Running(job(9, team="o", gpus=8), on={"n2": 8})],
        queue=[_q(1, nodelist=frozenset({"n2"})), _q(2)],
        starts={2: ["n1"]},
        reservation=(1, float("inf"), ["n2"]),
        reasons={1: (R.RESOURCES, ())},
    ),
    "nodelist-too-small-is-infeasible": Case(
        nodes=N3,
        queue=[_q(1, nodes=3, nodelist=frozenset({"n1", "n2"}))],
        starts={},
        reasons={1: (R.INFEASIBLE, ("nodelist (n1, n2)", "only 2 of those"))},
    ),
    "nodelist-node-too-small-is-infeasible": Case(
        nodes=[node("n1", gpus=4), node("n2")],
        queue=[_q(1, gpus=8, nodelist=frozenset({"n1"}))],
        starts={},
        reasons={1: (R.INFEASIBLE, ("only 0 of those node(s) have ≥8 GPUs",))},
    ),
    "nodelist-unknown-node-is-infeasible": Case(
        nodes=N3,
        queue=[_q(1, nodelist=frozenset({"n9"}))],
        starts={},
        reasons={1: (R.INFEASIBLE, ("unknown node(s): n9",))},
    ),
    "nodelist-node-down-waits-for-it": Case(
        nodes=N3,
        down=["n3"],
        queue=[_q(1, nodelist=frozenset({"n3"}))],
        starts={},
        reasons={1: (R.NODES_UNAVAILABLE, ("only 0 of its listed node(s) (n3) up",))},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case(name: str) -> None:
    check(CASES[name])


def test_a_withdrawn_job_leaves_the_queue_and_its_dependents_keep_waiting() -> None:
    """A held job (withdrawn) does not start; a job that depends on it still waits (not
    "never"); submitted again it starts, and its end then resolves the dependent."""
    state = ClusterState([node("n1")])
    state.submit(_q(1), 1.0)
    dependent = _q(2, dependencies=(Dependency(DependencyKind.AFTEROK, 1),))
    state.submit(dependent, 2.0)
    state.withdraw(1)
    decisions = schedule(state, 10.0)
    assert decisions.starts == ()
    assert decisions.reason_for(dependent).code is R.DEPENDENCY
    with pytest.raises(StateError):
        state.withdraw(1)  # not pending any more
    state.submit(_q(1, priority=5), 11.0)  # released, changed while held
    [start] = schedule(state, 12.0).starts
    assert (start.job_id, state.pending[1].priority) == (1, 5)
    state.start(1, start.placement, 12.0)
    state.finish(1, 20.0, JobState.COMPLETED)
    assert [s.job_id for s in schedule(state, 21.0).starts] == [2]


def test_a_withdrawn_job_that_ends_resolves_its_dependents() -> None:
    """Cancelled while held: its afterok dependents can never run (not waiting forever)."""
    state = ClusterState([node("n1")])
    state.submit(_q(1), 1.0)
    dependent = _q(2, dependencies=(Dependency(DependencyKind.AFTEROK, 1),))
    state.submit(dependent, 2.0)
    state.withdraw(1)
    state.finish(1, 5.0, JobState.CANCELLED)
    reason = schedule(state, 6.0).reason_for(dependent)
    assert reason.code is R.DEPENDENCY_NEVER_SATISFIED
    with pytest.raises(StateError):
        state.submit(_q(1), 7.0)  # ended: never queued again
