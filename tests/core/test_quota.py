"""Phase 3 — team quotas: nominal quota, borrowing idle cohort GPUs, borrowing limits."""

from __future__ import annotations

import pytest

from phalanx.core import ReasonCode, Team, schedule
from phalanx.core.quota import QuotaView
from phalanx.testing import cluster_nodes, job
from tests.core.helpers import Case, Running, build, check

QUOTA = ReasonCode.QUOTA
NODES = cluster_nodes(4, gpus_per_node=8)  # 32 GPUs: room is never the problem here


def _case(
    teams: tuple[Team, ...],
    running: tuple[tuple[str, int], ...],
    queue: tuple[tuple[int, str, int], ...],
    starts: dict[int, int],
    reasons: dict[int, tuple[str, ...]] | None = None,
) -> tuple[Case, dict[int, int]]:
    """teams; (team, GPUs) already running; (id, team, GPUs) queued in that order;
    started job → GPUs borrowed; quota-refused job → words of its reason."""
    case = Case(
        nodes=NODES,
        teams=teams,
        running=tuple(
            Running(job(100 + k, team=t, gpus=g), start=0.0) for k, (t, g) in enumerate(running)
        ),
        queue=tuple(job(j, team=t, gpus=g, submit=float(j)) for j, t, g in queue),
        reasons={j: (QUOTA, words) for j, words in (reasons or {}).items()},
        policy="fifo",
    )
    return case, starts


COHORT = (Team("a", 4, "c"), Team("b", 4, "c"))
CASES: dict[str, tuple[Case, dict[int, int]]] = {
    "within-quota-starts": _case((Team("a", 8),), (), ((1, "a", 8),), {1: 0}),
    "over-quota-without-cohort-refused": _case(
        (Team("a", 8),),
        (("a", 6),),
        ((1, "a", 4),),
        {},
        {1: ("team a quota 6/8", "needs 4", "no cohort")},
    ),
    "team-without-quota-is-unlimited": _case((Team("a"),), (("a", 8),), ((1, "a", 8),), {1: 0}),
    "unconfigured-team-is-unlimited": _case((), (), ((1, "x", 8), (2, "x", 8)), {1: 0, 2: 0}),
    "borrows-idle-cohort-gpus": _case(COHORT, (), ((1, "a", 7),), {1: 3}),
    "borrowed-counts-only-gpus-above-quota": _case(COHORT, (("a", 2),), ((1, "a", 4),), {1: 2}),
    "borrows-all-cohort-idle-exactly": _case(COHORT, (("b", 1),), ((1, "a", 7),), {1: 3}),
    "cohort-idle-too-small-refused": _case(
        COHORT,
        (("b", 3),),
        ((1, "a", 6),),
        {},
        {1: ("team a quota 0/4", "cohort c has 5 idle GPUs")},
    ),
    "borrowing-limit-reached-exactly": _case(
        (Team("a", 4, "c", borrowing_limit=2), Team("b", 4, "c")), (), ((1, "a", 6),), {1: 2}
    ),
    "borrowing-limit-passed-refused": _case(
        (Team("a", 4, "c", borrowing_limit=2), Team("b", 4, "c")),
        (),
        ((1, "a", 7),),
        {},
        {1: ("borrowing 3", "borrowing limit of 2")},
    ),
    "zero-quota-team-borrows-everything": _case(
        (Team("a", 0, "c"), Team("b", 8, "c")), (), ((1, "a", 8),), {1: 8}
    ),
    "quota-fills-up-inside-one-cycle": _case(
        (Team("a", 8),),
        (),
        ((1, "a", 4), (2, "a", 4), (3, "a", 1)),
        {1: 0, 2: 0},
        {3: ("team a quota 8/8", "needs 1")},
    ),
    "borrowing-in-one-cycle-shrinks-cohort-idle": _case(
        COHORT,
        (),
        ((1, "a", 6), (2, "a", 2), (3, "b", 2), (4, "a", 1)),
        {1: 2, 2: 2, 3: 0},
        {4: ("team a quota 8/4", "cohort c has 0 idle GPUs")},
    ),
    "lender-always-gets-its-nominal-quota": _case(COHORT, (("a", 8),), ((1, "b", 4),), {1: 0}),
    "lender-starts-within-quota-while-lent-out": _case(
        COHORT,
        (("a", 7),),
        ((1, "b", 2),),
        {1: 0},
    ),
    "lender-above-own-quota-refused": _case(
        COHORT,
        (("a", 7),),
        ((1, "b", 5),),
        {},
        {1: ("team b quota 0/4", "cohort c has 1 idle GPUs")},
    ),
    "smaller-job-of-blocked-team-still-admitted": _case(
        (Team("a", 4),),
        (),
        ((1, "a", 8), (2, "a", 2)),
        {2: 0},
        {1: ("team a quota 0/4", "needs 8")},
    ),
    "other-cohort-does-not-lend": _case(
        (Team("a", 4, "c"), Team("b", 8, "d")),
        (),
        ((1, "a", 5),),
        {},
        {1: ("cohort c has 4 idle GPUs",)},
    ),
    "quota-refusal-does-not-block-other-teams": _case(
        (Team("a", 2), Team("b", 8)),
        (),
        ((1, "a", 4), (2, "b", 8)),
        {2: 0},
        {1: ("no cohort",)},
    ),
}


@pytest.mark.parametrize(("case", "borrowed"), list(CASES.values()), ids=list(CASES))
def test_quota_table(case: Case, borrowed: dict[int, int]) -> None:
    _, decisions = check(case)
    assert {s.job_id: s.borrowed for s in decisions.starts} == borrowed


def test_later_jobs_of_a_refused_team_get_the_team_reason() -> None:
    # The cycle stops after job 3 fills the cluster; job 4 of the refused team was never
    # examined, and its reason is still the team's quota.
    case = Case(
        nodes=cluster_nodes(1, gpus_per_node=8),
        teams=(Team("a", 2), Team("b")),
        queue=(
            job(1, team="a", gpus=4, submit=1),
            job(3, team="b", gpus=8, submit=2),
            job(4, team="a", gpus=4, submit=3),
        ),
        policy="fifo",
        starts={3: ("n0000",)},
    )
    state, decisions = check(case)
    assert decisions.reason_for(state.pending[4]).code is QUOTA
    assert decisions.team_reasons["a"].code is QUOTA


def test_quota_view_is_a_copy_and_counts_tentative_starts() -> None:
    state = build(Case(nodes=NODES, teams=COHORT, running=(Running(job(9, team="a", gpus=3)),)))
    view = QuotaView(state)
    assert view.cohort_idle("c") == 5
    view.add("b", 4)
    assert view.cohort_idle("c") == 1
    assert view.within_nominal("a", 1) and not view.within_nominal("a", 2)
    assert state.usage == {"a": 3, "b": 0}  # the live usage is untouched
    assert not view.admit("a", 2).ok
    assert view.admit("a", 1) == view.admit("a", 1)


def test_usage_follows_start_and_finish() -> None:
    state = build(Case(nodes=NODES, teams=COHORT))
    state.submit(job(1, team="a", gpus=6), 0.0)
    start = schedule(state, 0.0).starts[0]
    assert start.borrowed == 2
    state.start(1, start.placement, 0.0, start.borrowed)
    assert state.usage["a"] == 6
    assert state.running[1].borrowed == 2
    state.requeue(1, 10.0)
    assert state.usage["a"] == 0


def test_a_quota_set_or_lifted_later_applies_at_the_next_cycle() -> None:
    """The state keeps the teams with a quota (`quota_teams`, read by the cycle's settled
    scan) up to date as `set_team` changes a team."""
    from phalanx.core import ClusterState

    state = ClusterState(NODES, [Team("a")])
    for i in range(3):
        state.submit(job(i, team="a", gpus=8), 0.0)
    assert len(schedule(state, 0.0).starts) == 3
    state.set_team(Team("a", quota=8))
    assert state.quota_teams == {"a"}
    decisions = schedule(state, 0.0)
    assert [s.job_id for s in decisions.starts] == [0]
    assert decisions.reason_for(state.pending[1]).code is QUOTA
    state.set_team(Team("a"))
    assert state.quota_teams == set()
    assert len(schedule(state, 0.0).starts) == 3
