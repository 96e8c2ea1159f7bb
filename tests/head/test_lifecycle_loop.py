"""The head's job and node lifecycle in process, on a fake clock (phalanx.testing.headloop):
the real control loop, lifecycle and store; the test plays the agents. Table-driven like
the core's tests: a script of events in, the job's state transitions and its end out."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from phalanx.api.states import JOB_STATES, TERMINAL_JOB_STATES
from phalanx.core import (
    JOB_MOVES,
    NODE_MOVES,
    DrainCause,
    IllegalTransition,
    JobState,
    NodeState,
    move_job,
    move_node,
)
from phalanx.head import lifecycle, nodestates
from phalanx.head.mirror import Settings, Tx
from phalanx.testing.headloop import HeadLoop

# Short, round timings so the scripts read as arithmetic.
SETTINGS = Settings(
    heartbeat_s=1.0,
    lease_s=8.0,
    requeue_margin_s=2.0,
    tick_s=0.5,
    preempt_grace_s=30.0,
    hang_timeout_s=0.0,
    max_outage_s=60.0,
)
STARTED = [("PD", "R")]
REQUEUED = [("R", "CG"), ("CG", "PD"), ("PD", "R")]


@dataclass(frozen=True)
class Case:
    name: str
    script: Callable[[HeadLoop], int]  # drives the loop; returns the job to look at
    moves: list[tuple[str, str]]  # that job's transitions, in order
    state: str  # where it is at the end
    kinds: tuple[str, ...] = ()  # events it must have, among others
    settings: dict[str, float] = field(default_factory=dict)


def lease_expiry(loop: HeadLoop) -> int:
    """A node dies: down after the lease, its job requeued after lease + margin, on the
    other node in a new epoch."""
    loop.join("n1")
    job = loop.submit()
    loop.advance(2)
    loop.join("n2")  # the spare, joined after the job started on n1
    loop.silence("n1")
    loop.advance(SETTINGS.lease_s + 0.5)
    assert loop.node_state("n1") == "down" and loop.state(job) == "R"  # not yet requeued
    loop.advance(SETTINGS.requeue_margin_s + 2)
    assert loop.job(job).placement[0][0] == "n2" and loop.job(job).epoch == 2
    assert loop.node_moves("n1") == [("up", "down")]
    return job


def head_restart_grace(loop: HeadLoop) -> int:
    """The head is down 20 s (well past the lease) and restarts: it counts no node's silence
    from before it came up, so nothing is requeued; a node silent after it came up is still
    declared down a lease later."""
    loop.join("n1")
    loop.join("n2")
    job = loop.submit(nodes=2)
    loop.advance(3)
    loop.pause(20)
    loop.restart()
    loop.advance(SETTINGS.lease_s + SETTINGS.requeue_margin_s + 5)
    assert loop.node_state("n1") == loop.node_state("n2") == "up"
    loop.silence("n2")
    loop.advance(SETTINGS.lease_s + 1)
    assert loop.node_state("n2") == "down"
    return job


def head_pause(loop: HeadLoop) -> int:
    """The head itself is frozen for a minute: it blames no node for its own silence."""
    loop.join("n1")
    job = loop.submit()
    loop.advance(2)
    loop.pause(60)
    loop.advance(5)
    assert loop.node_state("n1") == "up"
    return job


def requeue_limit(loop: HeadLoop) -> int:
    """Restarts count against max_restarts: the second node failure ends it NF."""
    for name in ("n1", "n2", "n3"):
        loop.join(name)
    job = loop.submit(max_restarts=1)
    loop.advance(2)
    for _ in range(2):
        loop.silence(loop.job(job).placement[0][0])
        loop.advance(SETTINGS.lease_s + SETTINGS.requeue_margin_s + 4)
    assert loop.job(job).restart_count == 1
    return job


def preemption_grace(loop: HeadLoop) -> int:
    """A high-priority job preempts a running one: a notice first (PR), the victim is
    stopped only when its grace runs out, then requeued; the preemptor runs."""
    loop.join("n1")
    victim = loop.submit(qos="low")
    loop.advance(2)
    boss = loop.submit(qos="high", preemptible=False)
    loop.advance(2)
    assert loop.state(victim) == "PR" and loop.state(boss) == "PD"
    assert [n.signal for n in loop.job(victim).notices] == ["SIGUSR1"]
    loop.advance(SETTINGS.preempt_grace_s - 5)
    assert loop.state(victim) == "PR"  # still within its grace
    loop.advance(6)
    assert loop.state(boss) == "R"
    return victim


def preempted_job_exits_early(loop: HeadLoop) -> int:
    """A victim that checkpoints and exits within its grace is requeued at once."""
    loop.join("n1")
    victim = loop.submit(qos="low")
    loop.advance(2)
    boss = loop.submit(qos="high", preemptible=False)
    loop.advance(2)
    loop.exit(victim, 0, code=0)
    loop.advance(2)
    assert loop.state(boss) == "R"
    return victim


def time_limit_signal(loop: HeadLoop) -> int:
    """`--time 60 --signal USR1@10`: the signal 10 s before the limit, TO at the limit."""
    loop.join("n1")
    job = loop.submit(time_limit_s=60, signal={"signal": "SIGUSR1", "seconds_before": 10})
    loop.advance(45)
    assert loop.job(job).notices == []
    loop.advance(7)
    # Slurm's reach without B: the steps (srun's tasks), not a batch script.
    notices = [(n.signal, n.steps_only, n.batch_only) for n in loop.job(job).notices]
    assert notices == [("SIGUSR1", True, False)]
    assert loop.state(job) == "R"
    loop.advance(12)
    assert loop.job(job).exit_code == "0:15"
    return job


def hang_timeout(loop: HeadLoop) -> int:
    """A job that reported progress and then went silent for its window is restarted."""
    loop.join("n1")
    job = loop.submit(hang_timeout_s=30)
    loop.advance(2)
    loop.progress(job, 0, step=10)
    loop.advance(25)
    assert loop.state(job) == "R"
    loop.advance(8)
    return job


def rank_failure(loop: HeadLoop) -> int:
    """One rank of a 2-node gang fails: the whole gang is torn down at once (both nodes
    told), the job ends F with the rank's exit code."""
    loop.join("n1")
    loop.join("n2")
    job = loop.submit(nodes=2)
    loop.advance(2)
    loop.exit(job, 1, code=3)
    loop.advance(2)
    assert loop.job(job).exit_code == "3:0"
    assert {key[2] for a in loop.agents.values() for key in a.ranks} == {0, 1}
    assert all(r.signal == 15 for r in loop.agents["n1"].ranks.values())  # rank 0 stopped
    return job


def rank_failure_restarts(loop: HeadLoop) -> int:
    """With --restart-on-failure the failed gang is requeued instead, in a new epoch."""
    loop.join("n1")
    loop.join("n2")
    job = loop.submit(nodes=2, restart_on_failure=True)
    loop.advance(2)
    loop.exit(job, 0, code=1)
    loop.advance(3)
    assert loop.job(job).epoch == 2
    return job


def completes(loop: HeadLoop) -> int:
    loop.join("n1")
    job = loop.submit()
    loop.advance(2)
    loop.exit(job, 0)
    loop.advance(2)
    return job


def cancel_pending(loop: HeadLoop) -> int:
    job = loop.submit()  # no node yet: it waits
    loop.advance(1)
    loop.cancel(job)
    return job


ENDED = [("R", "CG")]
CASES = [
    Case("lease expiry", lease_expiry, STARTED + REQUEUED, "R", ("nodefail",)),
    Case("head restart grace", head_restart_grace, STARTED, "R"),
    Case("head pause", head_pause, STARTED, "R", ()),
    Case(
        "requeue limit",
        requeue_limit,
        STARTED + REQUEUED + ENDED + [("CG", "NF")],
        "NF",
        ("nodefail",),
    ),
    Case(
        "preemption grace",
        preemption_grace,
        [*STARTED, ("R", "PR"), ("PR", "CG"), ("CG", "PD")],
        "PD",
        ("preempting", "signal"),
    ),
    Case(
        "preempted job exits within its grace",
        preempted_job_exits_early,
        [*STARTED, ("R", "PR"), ("PR", "CG"), ("CG", "PD")],
        "PD",
    ),
    Case("time limit with --signal", time_limit_signal, STARTED + ENDED + [("CG", "TO")], "TO"),
    Case("hang timeout", hang_timeout, STARTED + REQUEUED, "R", ("hang",)),
    Case("rank failure teardown", rank_failure, STARTED + ENDED + [("CG", "F")], "F"),
    Case("rank failure restart", rank_failure_restarts, STARTED + REQUEUED, "R", ("rankfailed",)),
    Case("completes", completes, STARTED + ENDED + [("CG", "CD")], "CD"),
    Case("cancel while pending", cancel_pending, [("PD", "CA")], "CA", ("cancelled",)),
]


@pytest.fixture
def make_loop(tmp_path: Path) -> Iterator[Callable[[Settings], HeadLoop]]:
    loops: list[HeadLoop] = []

    def make(settings: Settings) -> HeadLoop:
        loops.append(HeadLoop(tmp_path / str(len(loops)), settings))
        return loops[-1]

    yield make
    for loop in loops:
        loop.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_lifecycle(case: Case, make_loop: Callable[[Settings], HeadLoop]) -> None:
    loop = make_loop(SETTINGS)
    job = case.script(loop)
    assert loop.moves(job) == case.moves, loop.kinds(job)
    assert loop.state(job) == case.state
    kinds = loop.kinds(job)
    assert all(k in kinds for k in case.kinds), kinds
    # Every recorded move is one the state machine allows, in its epoch order.
    events = [e for e in loop.events(job) if e.to_state]
    assert all(e.epoch is not None for e in events)
    epochs = [e.epoch or 0 for e in events]
    assert epochs == sorted(epochs)


def test_the_recorded_moves_survive_a_head_restart(
    make_loop: Callable[[Settings], HeadLoop],
) -> None:
    loop = make_loop(SETTINGS)
    job = completes(loop)
    loop.restart()
    assert loop.moves(job) == STARTED + ENDED + [("CG", "CD")]
    assert loop.state(job) == "CD"


def test_a_drained_node_that_goes_silent_comes_back_drained(
    make_loop: Callable[[Settings], HeadLoop],
) -> None:
    loop = make_loop(SETTINGS)
    loop.join("n1")
    loop.advance(1)
    node = loop.mirror.nodes["n1"]
    loop.op(lambda tx: nodestates.drain(loop.mirror, tx, node, DrainCause.ADMIN, "fix", tx.now))
    loop.silence("n1")
    loop.advance(SETTINGS.lease_s + 1)
    reason = loop.mirror.nodes["n1"].reason or ""
    assert reason.startswith("no heartbeat for ") and reason.endswith("; was drained: fix")
    loop.join("n1")  # the agent restarts and rejoins
    loop.advance(2)
    assert loop.node_state("n1") == "drain" and loop.mirror.nodes["n1"].reason == "fix"
    # A passing health check does not undo an admin's drain.
    loop.op(lambda tx: nodestates.health_check(loop.mirror, tx, node, None, tx.now))
    assert loop.node_state("n1") == "drain"
    assert loop.node_moves("n1") == [("up", "drain"), ("drain", "down"), ("down", "drain")]


def test_a_health_check_drain_is_undone_by_the_check_alone(
    make_loop: Callable[[Settings], HeadLoop],
) -> None:
    loop = make_loop(SETTINGS)
    loop.join("n1")
    node = loop.mirror.nodes["n1"]
    loop.op(lambda tx: nodestates.health_check(loop.mirror, tx, node, "disk full", tx.now))
    assert loop.node_state("n1") == "drain"
    assert node.reason == "health check failed: disk full"
    loop.op(lambda tx: nodestates.health_check(loop.mirror, tx, node, None, tx.now))
    assert loop.node_state("n1") == "up"


def test_an_illegal_move_is_refused_and_the_loop_rolls_it_back(
    make_loop: Callable[[Settings], HeadLoop],
) -> None:
    loop = make_loop(SETTINGS)
    job = completes(loop)
    loop.join("n2")
    job2 = loop.submit()
    loop.advance(1)
    errors = loop.control.loop_errors
    rec = loop.mirror.jobs[job2]

    def bad(tx: Tx) -> None:
        lifecycle.move(tx, rec, JobState.PENDING, "oops", "R → PD skips CG", tx.now)

    with pytest.raises(Exception, match="internal error"):
        loop.op(bad)
    assert loop.control.loop_errors == errors + 1
    assert loop.state(job2) == "R" and loop.moves(job2) == STARTED  # nothing half-applied
    assert loop.state(job) == "CD"


def test_the_state_machines_refuse_what_they_do_not_allow() -> None:
    for frm, allowed in JOB_MOVES.items():
        for to in JobState:
            if to in allowed:
                assert move_job(1, frm, to, "why", 1, 0.0).to_state is to
            else:
                with pytest.raises(IllegalTransition):
                    move_job(1, frm, to, "why", 1, 0.0)
        assert frm.terminal == (not allowed)  # only an ended job never moves again
    for nfrm, nallowed in NODE_MOVES.items():
        assert nfrm not in nallowed
        with pytest.raises(IllegalTransition):
            move_node("n1", nfrm, nfrm, "same", 0.0)
    assert NodeState.UP.schedulable and not NodeState.DRAIN.schedulable
    assert [s.value for s in JobState if s.holds_gpus] == ["R", "CG", "PR"]
    assert [s.value for s in JobState if s.running] == ["R", "PR"]


def test_the_wire_spells_the_same_states_as_the_core() -> None:
    assert set(JOB_STATES) == {s.value for s in JobState}
    assert {s.value for s in JobState if s.terminal} == TERMINAL_JOB_STATES
