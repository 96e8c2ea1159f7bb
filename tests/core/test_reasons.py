"""Phase 7 — every pending job gets a reason a person can act on (`Decisions.reason_for`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from phalanx.core import (
    Dependency,
    DependencyKind,
    JobRequest,
    Reason,
    ReasonCode,
    SchedulerConfig,
    Team,
)
from phalanx.testing import cluster_nodes, job, node
from tests.core.helpers import Case, Running, check

R = ReasonCode
N2 = [node("n0"), node("n1")]


def _q(job_id: int, gpus: int = 8, **kw: Any) -> JobRequest:
    return replace(job(job_id, gpus=gpus, submit=float(job_id)), **kw)


def _busy(job_id: int, on: str, gpus: int = 8, limit: float | None = 500.0) -> Running:
    return Running(job(job_id, team="other", gpus=gpus, limit=limit), on={on: gpus})


# Each case: the cycle, then (job id → code, words in the message) for the jobs it names.
CASES: dict[str, Case] = {
    "dependency-waiting": Case(
        nodes=N2,
        running=[_busy(10, "n0")],
        queue=[_q(1, dependencies=(Dependency(DependencyKind.AFTEROK, 10),))],
        reasons={1: (R.DEPENDENCY, ("waiting for job 10 (afterok)",))},
    ),
    "dependency-never": Case(
        nodes=N2,
        queue=[_q(1, dependencies=(Dependency(DependencyKind.AFTERANY, 77),))],
        reasons={1: (R.DEPENDENCY_NEVER_SATISFIED, ("afterany:77", "can never be satisfied"))},
    ),
    "quota": Case(
        nodes=N2,
        teams=[Team("t", 4)],
        queue=[_q(1)],
        reasons={1: (R.QUOTA, ("team t quota 0/4 GPUs in use, job needs 8", "no cohort"))},
    ),
    "infeasible-shape": Case(
        nodes=N2,
        queue=[_q(1, gpus=12)],
        reasons={1: (R.INFEASIBLE, ("needs 12 GPUs on one node", "largest node has 8"))},
    ),
    # A gang that fits the cluster waits for its down or drained nodes (it runs once they
    # are back): ReqNodeNotAvail, as Slurm says, not Infeasible.
    "nodes-unavailable-after-nodes-go-down": Case(
        nodes=N2,
        down=["n1"],
        queue=[_q(1, nodes=2)],
        reasons={
            1: (
                R.NODES_UNAVAILABLE,
                ("needs 2 nodes × 8 GPUs", "only 1 node(s)", "are up", "1 more down or drained"),
            )
        },
    ),
    "infeasible-when-even-the-down-nodes-are-too-few": Case(
        nodes=[*N2, node("n2")],
        down=["n1"],
        queue=[_q(1, nodes=3, gpus=8), _q(2, nodes=4, gpus=8)],
        reasons={
            1: (R.NODES_UNAVAILABLE, ("only 2 node(s) with ≥8 GPUs are up, 1 more down",)),
            2: (R.INFEASIBLE, ("needs 4 nodes × 8 GPUs; only 2 node(s) with ≥8 GPUs are up",)),
        },
    ),
    "nodes-unavailable-while-every-node-is-down": Case(
        nodes=N2,
        down=["n0", "n1"],
        queue=[_q(1), _q(2, gpus=1), _q(3, dependencies=(Dependency(DependencyKind.AFTEROK, 1),))],
        reasons={
            1: (R.NODES_UNAVAILABLE, ("no node with GPUs is up", "down or drained", "waits")),
            2: (R.NODES_UNAVAILABLE, ("no node with GPUs is up",)),
            3: (R.DEPENDENCY, ("waiting for job 1 (afterok)",)),
        },
    ),
    "nodes-unavailable-when-its-excluded-nodes-leave-too-few-up": Case(
        nodes=[*N2, node("n2")],
        down=["n2"],
        running=[_busy(10, "n0")],
        queue=[_q(1, nodes=2, exclude_nodes=frozenset({"n1"})), _q(2, gpus=8, time_limit_s=1e4)],
        reservation=None,
        starts={2: ["n1"]},
        reasons={
            1: (
                R.NODES_UNAVAILABLE,
                ("needs 2 nodes × 8 GPUs", "only 1 (not excluded) node(s)", "1 more down"),
            )
        },
    ),
    "infeasible-on-the-nodes-it-may-use": Case(
        # Excluding n1 leaves one node for a 2-node gang: it can never be placed.
        nodes=N2,
        running=[_busy(10, "n0")],
        queue=[_q(1, nodes=2, exclude_nodes=frozenset({"n1"})), _q(2, gpus=8, time_limit_s=1e4)],
        reservation=None,
        starts={2: ["n1"]},
        reasons={1: (R.INFEASIBLE, ("needs 2 nodes × 8 GPUs", "only 1 (not excluded) node(s)"))},
    ),
    "infeasible-gpu-model-has-too-few-nodes": Case(
        nodes=[node("h0"), node("a0", gpu_model="A100"), node("h1")],
        queue=[_q(1, nodes=2, gpu_model="A100")],
        reasons={1: (R.INFEASIBLE, ("needs 2 nodes × 8 GPUs", "only 1 A100 node(s)"))},
    ),
    # The job next in line for busy GPUs says Resources (Slurm's word), its message when.
    "resources-reserved-with-time-and-shape": Case(
        nodes=N2,
        running=[_busy(10, "n0"), _busy(11, "n1", gpus=4, limit=None)],
        queue=[_q(1)],
        reasons={
            1: (
                R.RESOURCES,
                (
                    "needs 8 free GPUs on one node; the most free on any node is 4",
                    "reserved at t=500s, in 400s",
                ),
            )
        },
    ),
    "resources-reserved-gang-names-rack-count": Case(
        nodes=cluster_nodes(4, gpus_per_node=8, nodes_per_rack=2),
        running=[_busy(10, "n0000"), _busy(11, "n0002")],
        queue=[_q(1, nodes=3)],
        reasons={
            1: (R.RESOURCES, ("needs 3 nodes × 8 GPUs; 2 node(s) have ≥8 free GPUs", "1 in one"))
        },
    ),
    "would-delay-reservation": Case(
        nodes=N2,
        running=[_busy(10, "n0", limit=None), _busy(11, "n1", gpus=4)],
        queue=[_q(1), _q(2, gpus=2, time_limit_s=3600.0)],
        policy="fifo",
        reasons={2: (R.BACKFILL_WOULD_DELAY, ("fits now", "3600s", "delay job 1"))},
    ),
    "preempting-this-cycle": Case(
        nodes=N2,
        running=[_busy(10, "n0"), _busy(11, "n1")],
        queue=[_q(1, priority=3)],
        reasons={1: (R.PREEMPTING, ("preempting 1 job(s) to make room",))},
    ),
    "preempting-waiting-for-victims": Case(
        nodes=N2,
        running=[_busy(10, "n0"), _busy(11, "n1")],
        preempting={10: 1, 11: 1},
        queue=[_q(1, nodes=2, priority=3)],
        reasons={1: (R.PREEMPTING, ("waiting for 2 preempted job(s) to checkpoint and exit",))},
    ),
    "priority-without-backfill": Case(
        nodes=N2,
        running=[_busy(10, "n0")],
        queue=[_q(1, nodes=2), _q(2, gpus=1), _q(3, gpus=1)],
        policy="fifo",
        config=SchedulerConfig(backfill=False),
        reasons={
            2: (R.PRIORITY, ("waiting behind job 1", "2 nodes × 8 GPUs", "no backfill")),
            3: (R.PRIORITY, ("waiting behind job 1",)),
        },
    ),
    "not-considered-past-depth": Case(
        nodes=N2,
        teams=[Team("q", 0), Team("r", 0)],
        queue=[_q(1, gpus=1, team="q"), _q(2, gpus=1, team="r"), _q(3, gpus=1, team="s")],
        policy="fifo",
        config=SchedulerConfig(depth=2),
        reasons={3: (R.NOT_CONSIDERED, ("only the first 2 queued jobs",))},
    ),
    "resources-cluster-full": Case(
        nodes=N2,
        queue=[_q(1, nodes=2), _q(2, gpus=1)],
        policy="fifo",
        starts={1: ["n0", "n1"]},
        reasons={2: (R.RESOURCES, ("all GPUs are in use",))},
    ),
    "resources-nothing-fits-after-reservation": Case(
        # n1 has one free GPU, but it is reserved for job 1; no queued job is short enough.
        nodes=N2,
        running=[_busy(10, "n0"), _busy(11, "n1", gpus=7, limit=200.0)],
        queue=[_q(1, gpus=8), _q(2, gpus=1), _q(3, gpus=1), _q(4, gpus=1)],
        policy="fifo",
        reservation=(1, 200.0, ["n1"]),
        reasons={
            2: (R.BACKFILL_WOULD_DELAY, ()),
            4: (R.RESOURCES, ("no free GPU can take another job now",)),
        },
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_reason_table(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_every_pending_job_has_a_reason(case_id: str) -> None:
    state, decisions = check(CASES[case_id])
    started = {s.job_id for s in decisions.starts}
    for job_id, request in state.pending.items():
        if job_id in started:
            continue
        reason = decisions.reason_for(request)
        assert isinstance(reason, Reason) and reason.message
        if job_id in state.held:
            assert reason.code is R.DEPENDENCY
        if job_id in state.never:
            assert reason.code is R.DEPENDENCY_NEVER_SATISFIED


def test_reasons_print_like_slurm() -> None:
    reason = Reason(R.RESOURCES, "needs 8 free GPUs on one node")
    assert str(reason) == "Resources: needs 8 free GPUs on one node"
    assert {c.value for c in R} >= {
        "Dependency",
        "DependencyNeverSatisfied",
        "QuotaExceeded",
        "Resources",
        "Priority",
    }


def test_default_reason_for_jobs_never_examined() -> None:
    _, decisions = check(CASES["resources-cluster-full"])
    late = job(99, gpus=1)
    assert decisions.reason_for(late).code is R.RESOURCES
    assert decisions.reason_for(replace(late, team="nobody")) == decisions.default_reason


def test_reason_of_a_quota_blocked_team_applies_to_its_unexamined_jobs() -> None:
    state, decisions = check(
        Case(
            nodes=N2,
            teams=[Team("a", 2), Team("b")],
            queue=[_q(1, gpus=4, team="a"), _q(2, nodes=2, team="b"), _q(3, gpus=8, team="a")],
            policy="fifo",
            starts={2: ["n0", "n1"]},
        )
    )
    assert decisions.reason_for(state.pending[3]).code is R.QUOTA
    assert decisions.reason_for(state.pending[3]).message.startswith("team a quota 0/2")


def test_a_cycle_with_every_node_down_examines_no_queued_job() -> None:
    """The reason is the cycle's default, not one entry per queued job: with 10,000 jobs
    queued, finding each infeasible one by one cost ~35 ms every cycle."""
    queue = [_q(i, gpus=1 + i % 8) for i in range(1, 501)]
    state, decisions = check(Case(nodes=N2, down=["n0", "n1"], queue=queue))
    assert decisions.reasons == {}
    assert {decisions.reason_for(state.pending[i]).code for i in range(1, 501)} == {
        R.NODES_UNAVAILABLE
    }
