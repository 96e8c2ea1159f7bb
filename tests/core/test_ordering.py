"""Phase 2 — queue order by the registered policy (fifo, priority, sjf, srtf, las)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from phalanx.core import (
    DEFAULT_POLICY,
    POLICIES,
    ClusterState,
    JobRequest,
    JobState,
    StateError,
    Team,
    get_policy,
    schedule,
)
from phalanx.core.policies import las_level
from phalanx.testing import cluster_nodes, job

DAY = 24 * 3600.0


@dataclass(frozen=True)
class History:
    """A finished job that leaves fair-share usage: `gpus` GPUs from `start` to `end`."""

    team: str
    gpus: int
    start: float
    end: float


def _q(
    job_id: int,
    team: str = "t",
    priority: int = 0,
    submit: float = 0.0,
    duration: float = 100.0,
    attained: float = 0.0,
    gpus: int = 1,
) -> JobRequest:
    return replace(
        job(job_id, team=team, gpus=gpus, priority=priority, submit=submit, duration=duration),
        attained_s=attained,
    )


@dataclass(frozen=True)
class OrderCase:
    policy: str
    queue: tuple[JobRequest, ...]
    order: tuple[int, ...]  # the order the jobs are considered (and, with room, started) in
    teams: tuple[Team, ...] = ()
    history: tuple[History, ...] = ()
    now: float = 1000.0
    halflife: float = 7 * DAY


CASES: dict[str, OrderCase] = {
    "fifo-by-submit-time-ignores-priority": OrderCase(
        "fifo", (_q(1, submit=30, priority=9), _q(2, submit=10), _q(3, submit=20)), (2, 3, 1)
    ),
    "fifo-same-submit-time-by-id": OrderCase(
        "fifo", (_q(3, submit=5), _q(1, submit=5), _q(2, submit=5)), (1, 2, 3)
    ),
    "fifo-merges-team-queues-by-submit": OrderCase(
        "fifo",
        (_q(1, "a", submit=1), _q(2, "b", submit=2), _q(3, "a", submit=3), _q(4, "b", submit=0)),
        (4, 1, 2, 3),
    ),
    "priority-class-first": OrderCase(
        "priority", (_q(1, priority=0, submit=0), _q(2, priority=5, submit=9)), (2, 1)
    ),
    "priority-same-class-by-age": OrderCase(
        "priority", (_q(1, submit=9), _q(2, submit=3), _q(3, submit=6)), (2, 3, 1)
    ),
    "priority-same-class-lower-fairshare-first": OrderCase(
        "priority",
        (_q(1, "heavy", submit=0), _q(2, "light", submit=5)),
        (2, 1),
        history=(History("heavy", 8, 0, 500), History("light", 1, 0, 500)),
    ),
    "priority-class-beats-fairshare": OrderCase(
        "priority",
        (_q(1, "heavy", priority=1, submit=5), _q(2, "light", submit=0)),
        (1, 2),
        history=(History("heavy", 8, 0, 500),),
    ),
    "priority-fairshare-is-divided-by-share": OrderCase(
        # big used 4 GPUs over a quota of 8, small used 1 over a quota of 1: big is lighter.
        "priority",
        (_q(1, "small", submit=0), _q(2, "big", submit=5)),
        (2, 1),
        teams=(Team("big", quota=8), Team("small", quota=1)),
        history=(History("big", 4, 0, 500), History("small", 1, 0, 500)),
    ),
    "priority-fairshare-weight-overrides-quota": OrderCase(
        "priority",
        (_q(1, "small", submit=0), _q(2, "big", submit=5)),
        (1, 2),
        teams=(Team("big", quota=8, weight=1.0), Team("small", quota=1, weight=4.0)),
        history=(History("big", 4, 0, 500), History("small", 1, 0, 500)),
    ),
    "priority-old-usage-decays": OrderCase(
        # old used 8 GPUs for a day 60 days ago; recent used 1 GPU for 10 minutes just now.
        "priority",
        (_q(1, "recent", submit=60 * DAY), _q(2, "old", submit=60 * DAY + 1)),
        (2, 1),
        history=(History("old", 8, 0, DAY), History("recent", 1, 60 * DAY - 600, 60 * DAY)),
        now=60 * DAY + 10,
        halflife=DAY,
    ),
    "priority-recent-usage-counts-without-decay": OrderCase(
        "priority",
        (_q(1, "recent", submit=2 * DAY), _q(2, "old", submit=2 * DAY + 1)),
        (1, 2),
        history=(History("old", 8, 0, DAY), History("recent", 1, 2 * DAY - 600, 2 * DAY)),
        now=2 * DAY + 10,
        halflife=30 * DAY,
    ),
    "priority-team-order-kept-inside-team": OrderCase(
        "priority",
        (_q(1, "a", submit=2), _q(2, "a", submit=1), _q(3, "b", submit=0)),
        (2, 1, 3),
        history=(History("b", 8, 0, 500),),
    ),
    "sjf-shortest-total-first": OrderCase(
        "sjf",
        (_q(1, duration=300), _q(2, duration=100), _q(3, duration=200, submit=-1)),
        (2, 3, 1),
    ),
    "sjf-orders-by-total-not-remaining": OrderCase(
        "sjf", (_q(1, duration=300, attained=250), _q(2, duration=100)), (2, 1)
    ),
    "srtf-orders-by-remaining": OrderCase(
        "srtf", (_q(1, duration=300, attained=250), _q(2, duration=100)), (1, 2)
    ),
    "srtf-ties-by-submit": OrderCase(
        "srtf", (_q(1, duration=100, submit=5), _q(2, duration=100, submit=1)), (2, 1)
    ),
    "las-least-attained-level-first": OrderCase(
        "las", (_q(1, attained=7200, submit=0), _q(2, attained=0, submit=9)), (2, 1)
    ),
    "las-fifo-inside-a-level": OrderCase(
        "las", (_q(1, attained=3000, submit=9), _q(2, attained=10, submit=0)), (2, 1)
    ),
    "las-service-counts-gpus": OrderCase(
        # 1000 s on 8 GPUs (8000 GPU-s, level 1) ranks below 3000 s on 1 GPU (level 0).
        "las",
        (_q(1, attained=1000, gpus=8, submit=0), _q(2, attained=3000, submit=9)),
        (2, 1),
    ),
}


def _run(case: OrderCase) -> list[int]:
    state = ClusterState(cluster_nodes(4, gpus_per_node=8), case.teams, case.policy, case.halflife)
    next_id = 1000
    for h in case.history:
        state.submit(replace(job(next_id, team=h.team, gpus=h.gpus), duration_s=1.0), h.start)
        state.start(next_id, schedule(state, h.start).starts[0].placement, h.start)
        state.finish(next_id, h.end, JobState.COMPLETED)
        next_id += 1
    for request in case.queue:
        state.submit(request, request.submit_s)
    return [s.job_id for s in schedule(state, case.now).starts]


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_order_table(case: OrderCase) -> None:
    assert _run(case) == list(case.order)


def test_only_the_head_starts_when_room_is_short() -> None:
    state = ClusterState(cluster_nodes(1, gpus_per_node=2), policy="fifo")
    for k, submit in enumerate((30.0, 10.0, 20.0), start=1):
        state.submit(job(k, gpus=2, submit=submit), submit)
    assert [s.job_id for s in schedule(state, 40.0).starts] == [2]


def test_fairshare_usage_decays_by_halflife() -> None:
    state = ClusterState(cluster_nodes(1), [Team("a", quota=8)], fairshare_halflife_s=100.0)
    state.submit(job(1, team="a", gpus=8), 0.0)
    state.start(1, schedule(state, 0.0).starts[0].placement, 0.0)
    state.finish(1, 100.0, JobState.COMPLETED)
    at_end = state.fairshare("a", 100.0)
    assert at_end > 0
    assert state.fairshare("a", 200.0) == pytest.approx(at_end / 2)
    assert state.fairshare("a", 300.0) == pytest.approx(at_end / 4)


def test_registered_policies_and_default() -> None:
    assert {"fifo", "priority", "sjf", "srtf", "las"} <= set(POLICIES)
    assert DEFAULT_POLICY == "priority"
    assert ClusterState(cluster_nodes(1)).policy.name == "priority"
    with pytest.raises(ValueError, match=r"known policies: .*fifo"):
        get_policy("lottery")


@pytest.mark.parametrize("policy", ["sjf", "srtf"])
def test_clairvoyant_policies_need_durations(policy: str) -> None:
    state = ClusterState(cluster_nodes(1), policy=policy)
    with pytest.raises(StateError, match="known duration"):
        state.submit(job(1), 0.0)


def test_las_levels() -> None:
    assert [las_level(s) for s in (0, 3599, 3600, 35999, 36000, 1e9)] == [0, 0, 1, 1, 2, 2]
