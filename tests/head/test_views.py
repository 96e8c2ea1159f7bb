"""The head's read-only views, from typed events and the core's numbers: run times over
every run of a requeued job, the queue's priority order and the teams' fair share."""

from __future__ import annotations

import pytest

from phalanx.api.models import JobEvent
from phalanx.core import ClusterState, Team
from phalanx.head.views import priorities, run_times, shares
from phalanx.testing import job, node, run_job


def _move(time: float, to: str) -> JobEvent:
    return JobEvent(time=time, kind="x", message="", to_state=to)  # type: ignore[arg-type]


def test_a_requeued_job_runs_from_its_first_start_over_every_run() -> None:
    events = [
        JobEvent(time=0.0, kind="submitted", message=""),
        _move(10.0, "R"),  # run 1: 10 → 40 (CG counts: it still holds its GPUs)
        _move(35.0, "CG"),
        _move(40.0, "PD"),  # queued again: 40 → 100 does not count
        _move(100.0, "R"),  # run 2: 100 → 130, preempted on the way
        _move(120.0, "PR"),
        _move(125.0, "CG"),
        _move(130.0, "CD"),
    ]
    assert run_times(events, now=1000.0) == (10.0, 60.0)
    # Still running: its current run counts up to now.
    assert run_times(events[:5], now=150.0) == (10.0, 80.0)
    assert run_times(events[:1], now=150.0) == (None, None)


def test_priority_lists_the_queue_in_the_cycles_order_with_its_numbers() -> None:
    state = ClusterState([node("n0", gpus=2)], [Team("a", 2), Team("b", 2)])
    run_job(state, job(1, team="a", gpus=2), {"n0": 2}, at=0.0)  # a has used 2 GPUs
    state.submit(job(2, team="a", gpus=1, priority=100, submit=5.0), 5.0)
    state.submit(job(3, team="b", gpus=1, priority=100, submit=9.0), 9.0)
    state.submit(job(4, team="b", gpus=1, priority=0, submit=1.0), 1.0)
    state.submit(job(5, team="a", gpus=1, priority=1000, submit=20.0), 20.0)
    listed = priorities(state, 3600.0, {5: "high", 4: "low"}, visible=None)
    # QOS first; then b's fair share (nothing used) beats a's; then age.
    assert [(j.rank, j.job_id, j.qos) for j in listed.jobs] == [
        (1, 5, "high"),
        (2, 3, "normal"),
        (3, 2, "normal"),
        (4, 4, "low"),
    ]
    by_id = {j.job_id: j for j in listed.jobs}
    assert (
        by_id[3].fairshare
        == 0.0
        < by_id[2].fairshare
        == pytest.approx(state.fairshare("a", 3600.0))
    )
    assert by_id[2].age_s == 3595.0 and by_id[5].qos_priority == 1000
    mine = priorities(state, 3600.0, {}, visible={2, 4})
    assert [(j.rank, j.job_id) for j in mine.jobs] == [(3, 2), (4, 4)]  # ranks stay global


def test_share_shows_quota_use_borrowing_and_decayed_usage() -> None:
    state = ClusterState([node("n0", gpus=8)], [Team("a", 2, cohort="c"), Team("b", 6, "c")])
    run_job(state, job(1, team="a", gpus=4), {"n0": 4}, at=0.0, borrowed=2)
    state.submit(job(2, team="b", gpus=3), 10.0)
    listed = shares(state, 3600.0)
    a, b = listed.teams
    assert (a.team, a.quota_gpus, a.cohort, a.gpus_in_use, a.borrowed_gpus) == ("a", 2, "c", 4, 2)
    assert a.fairshare == pytest.approx(state.fairshare("a", 3600.0))
    assert a.usage_gpu_h == pytest.approx(a.fairshare * a.share / 3600.0)
    assert 3.9 < a.usage_gpu_h < 4.0  # 4 GPUs for an hour, decayed by a week's half-life
    assert (b.gpus_in_use, b.usage_gpu_h, b.pending_jobs, b.pending_gpus) == (0, 0.0, 1, 3)
    assert listed.uses_fairshare and listed.halflife_s == 7 * 86400
