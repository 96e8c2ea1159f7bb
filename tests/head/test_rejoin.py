"""A restarted head catches up with its fleet before it judges silence (head/rejoin.py).

At 10,000 nodes every agent reconnects to a restarted head at once, and the head hears them
back over more than a lease; nodes it had not got to yet were marked down and their running
jobs requeued (324 stopped by one restart, bench/fleet.py). Here the reconnect storm is
played on a fake clock: the head hears one node back per second, for longer than a lease
and its margin. In process (HeadLoop), with the real clock, lifecycle and store."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sqlalchemy import select

from phalanx.api.models import DesiredState
from phalanx.core import JobState
from phalanx.head import answers, db
from phalanx.head.mirror import Settings
from phalanx.head.rejoin import QUIET_MIN_S
from phalanx.testing.headloop import HeadLoop

# No riding out by peers here (max_outage_s 0): the head's own lease judgement alone.
SETTINGS = Settings(
    heartbeat_s=1.0,
    lease_s=4.0,
    requeue_margin_s=1.0,
    tick_s=0.5,
    max_outage_s=0.0,
    hang_timeout_s=0.0,
    overload_grace_s=30.0,
)


def _fleet(tmp_path: Path, settings: Settings, n: int) -> tuple[HeadLoop, list[str], list[int]]:
    loop = HeadLoop(tmp_path, settings)
    names = [f"n{i:02d}" for i in range(n)]
    for name in names:
        loop.join(name, gpus=1)
    jobs = [loop.submit(gpus_per_node=1) for _ in names]
    loop.advance(2)
    assert all(loop.state(j) == "R" for j in jobs)
    return loop, names, jobs


def _restart(loop: HeadLoop) -> None:
    """The head dies and starts again (as ControlThread.start does); every agent is cut off
    and reconnects when the test says."""
    loop.restart()
    loop.control.rejoin.begin(loop.mirror, loop.clock.time())
    for agent in loop.agents.values():
        agent.silent = True


def _requeued(loop: HeadLoop, jobs: list[int]) -> list[int]:
    return [j for j in jobs if "nodefail" in loop.kinds(j) or loop.state(j) != "R"]


def _cluster_events(loop: HeadLoop, kind: str) -> list[str]:
    with loop.engine.connect() as conn:
        rows = conn.execute(select(db.events.c.message).where(db.events.c.kind == kind))
        return [r.message for r in rows]


def _storm(loop: HeadLoop, names: list[str], every_s: float) -> None:
    for name in names:  # the head hears one node back every `every_s`: a reconnect storm
        loop.advance(every_s)
        loop.agents[name].silent = False
    loop.advance(3)


def test_nodes_heard_back_over_more_than_a_lease_keep_their_jobs(tmp_path: Path) -> None:
    loop, names, jobs = _fleet(tmp_path, SETTINGS, 12)
    try:
        _restart(loop)
        assert loop.control.rejoin.active
        _storm(loop, names, 1.0)  # the last node back 12 s after the start: lease 4 + 1
        assert _requeued(loop, jobs) == []
        assert all(loop.node_state(n) == "up" for n in names), [
            (n, loop.node_state(n)) for n in names
        ]
        assert not loop.control.rejoin.active
        (message,) = _cluster_events(loop, "head_caught_up")
        assert message.startswith("caught up after the start: 12 of 12 nodes heard back in 1")
    finally:
        loop.close()


def test_without_catching_up_the_same_storm_requeues_running_jobs(tmp_path: Path) -> None:
    """The test above can fail: with catching up off (overload grace 0, the head as before),
    the same storm marks the late nodes down and requeues their running jobs."""
    settings = dataclasses.replace(SETTINGS, overload_grace_s=0.0)
    loop, names, jobs = _fleet(tmp_path, settings, 12)
    try:
        _restart(loop)
        assert not loop.control.rejoin.active
        _storm(loop, names, 1.0)
        assert len(_requeued(loop, jobs)) >= 5
        assert _cluster_events(loop, "head_caught_up") == []
    finally:
        loop.close()


def test_a_node_that_does_not_come_back_is_judged_once_the_others_are_in(
    tmp_path: Path,
) -> None:
    """Catching up ends when no node came back for the quiet time: a node that died with
    the head is then down a lease later, and its job requeued after the margin."""
    loop, _, jobs = _fleet(tmp_path, SETTINGS, 3)
    try:
        _restart(loop)
        started = loop.clock.time()
        loop.agents["n00"].silent = loop.agents["n01"].silent = False
        dead_job = jobs[2]
        for _ in range(60):
            loop.advance(0.5)
            if loop.state(dead_job) != "R":
                break
        took = loop.clock.time() - started
        assert loop.job(dead_job).state is JobState.PENDING, loop.kinds(dead_job)
        assert "nodefail" in loop.kinds(dead_job)
        # Heard back within the first heartbeat; quiet for QUIET_MIN_S (2 × heartbeat 1 s);
        # then the lease and the margin, each within a tick or two.
        bound = SETTINGS.heartbeat_s + QUIET_MIN_S + SETTINGS.lease_s + SETTINGS.requeue_margin_s
        assert took <= bound + 4 * SETTINGS.tick_s, took
        assert loop.node_state("n02") == "down"
        assert [loop.state(j) for j in jobs[:2]] == ["R", "R"]
        (message,) = _cluster_events(loop, "head_caught_up")
        assert "2 of 3 nodes heard back" in message
        assert "1 not heard (none came back for 2 s)" in message, message
    finally:
        loop.close()


def test_a_node_heard_once_and_unheard_again_is_not_judged_while_catching_up(
    tmp_path: Path,
) -> None:
    """A node heard back once may wait again behind the storm (its full report), and its
    agent, told by a peer that the head is catching up, rides on instead of fencing: the
    head must not requeue its jobs meanwhile. It judges it by its lease once caught up."""
    loop, names, jobs = _fleet(tmp_path, SETTINGS, 12)
    try:
        _restart(loop)
        loop.agents["n00"].silent = False
        loop.advance(1.0)  # n00 heard back once...
        loop.agents["n00"].silent = True  # ...then unheard again, for the whole storm
        _storm(loop, names[1:], 1.0)  # 11 s: more than a lease and its margin
        assert loop.state(jobs[0]) == "R" and "nodefail" not in loop.kinds(jobs[0])
        assert not loop.control.rejoin.active
        loop.advance(SETTINGS.lease_s + SETTINGS.requeue_margin_s + 2)  # caught up: judged
        assert loop.node_state("n00") == "down"
        assert "nodefail" in loop.kinds(jobs[0])
        assert _requeued(loop, jobs[1:]) == []
    finally:
        loop.close()


def test_catching_up_is_bounded_by_the_overload_grace(tmp_path: Path) -> None:
    """Nodes trickling back for ever do not hold a dead node's lease for ever: catching up
    ends at the overload grace after the start."""
    settings = dataclasses.replace(SETTINGS, overload_grace_s=6.0)
    loop, names, jobs = _fleet(tmp_path, settings, 20)
    try:
        _restart(loop)
        started = loop.clock.time()
        for name in names[:-1]:  # one back a second; the last never
            loop.advance(1.0)
            loop.agents[name].silent = False
            if not loop.control.rejoin.active:
                break
        ended = loop.clock.time() - started
        assert not loop.control.rejoin.active
        assert settings.overload_grace_s <= ended <= settings.overload_grace_s + 1.0
        (message,) = _cluster_events(loop, "head_caught_up")
        assert "(the grace of 6 s)" in message, message
        # Nodes still waiting then are judged by their lease from there.
        loop.advance(settings.lease_s + settings.requeue_margin_s + 2)
        assert loop.node_state(names[-1]) == "down"
        assert loop.state(jobs[-1]) != "R"
    finally:
        loop.close()


def test_a_start_with_every_node_down_or_new_does_not_catch_up(tmp_path: Path) -> None:
    loop = HeadLoop(tmp_path, SETTINGS)
    try:
        loop.restart()
        loop.control.rejoin.begin(loop.mirror, loop.clock.time())
        assert not loop.control.rejoin.active  # no node: nothing to hear back
        loop.advance(2)
        assert _cluster_events(loop, "head_caught_up") == []
    finally:
        loop.close()


def test_every_answer_says_whether_the_head_is_catching_up() -> None:
    body = DesiredState(version=3, jobs=[], heartbeat_s=1.0, lease_s=4.0, kill_grace_s=1.0)
    cached = body.model_dump_json(exclude=set(answers.PER_ANSWER)).encode()
    for flag in (True, False):
        whole = answers.complete(
            cached,
            heartbeat_s=2.0,
            lease_s=8.0,
            health_ack=0,
            report_ack=None,
            full_report=False,
            catching_up=flag,
        )
        state = DesiredState.model_validate_json(whole)
        assert state.catching_up is flag
        assert (state.version, state.heartbeat_s) == (3, 2.0)
