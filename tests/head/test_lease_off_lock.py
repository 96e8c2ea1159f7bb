"""Heartbeats are answered while the control thread holds its lock (head/leases.py): a
lease renewal and a cached answer never wait for it, a renewal that lands before the
clock's down decision is seen by it, and a node marked down comes back through its next
heartbeat, which the control thread applies as a report.

The control thread runs for real (its own thread, a real SQLite store) on a fake clock
whose tick is far away: the tests tick it by hand. The control lock is held the way it is
in production: by an operation the control thread runs in a batch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from phalanx.api.models import (
    DesiredState,
    GpuInfo,
    Heartbeat,
    JobSpec,
    NodeHealth,
    ProcessStatus,
    RegisterRequest,
    ReportDelta,
    TeamSpec,
)
from phalanx.core import NodeState
from phalanx.head import clock as timed
from phalanx.head import db, jobs, nodestates, store
from phalanx.head.auth import Principal
from phalanx.head.control import ControlThread
from phalanx.head.migrate import upgrade
from phalanx.head.mirror import Settings, Tx
from phalanx.head.service import Head
from phalanx.testing.clock import FakeClock
from phalanx.testing.headloop import USER

LEASE_S = 8.0


@dataclass
class Rig:
    head: Head
    control: ControlThread
    clock: FakeClock

    def join(self, name: str) -> None:
        gpu = GpuInfo(index=0, uuid=f"GPU-{name}-0", model="H100", memory_mb=81920)
        req = RegisterRequest(
            name=name,
            address=name,
            agent_url=f"https://{name}:1",
            agent_secret="s" * 32,
            cpus=8,
            memory_mb=65536,
            gpus=[gpu],
        )
        self.control.call(lambda tx: nodestates.register(self.control.mirror, tx, req, tx.now))

    def beat(self, hb: Heartbeat) -> DesiredState:
        who = Principal(kind="node", token_id=1, node=hb.name)
        body = asyncio.run(asyncio.wait_for(self.head.heartbeat(who, hb), 60))
        return DesiredState.model_validate_json(body)

    def tick(self) -> None:
        """The clock's tick, now (its own tick is far off on this fake clock)."""
        self.control.call(lambda tx: timed.tick(self.control.mirror, tx, tx.now))

    def state(self, name: str) -> NodeState:
        with self.control.lock:
            return self.control.mirror.nodes[name].state

    def beats(self, kind: str) -> float:
        value = self.head.metrics.registry.get_sample_value(
            "phalanx_heartbeats_total", {"kind": kind}
        )
        return value or 0.0

    def while_locked(self, fn: Callable[[], None]) -> bool:
        """Run `fn` in this thread while the control thread holds the control lock in an
        operation of its own; True when `fn` returned before that operation let go."""
        entered, release, left = threading.Event(), threading.Event(), threading.Event()

        def hold(tx: Tx) -> None:
            entered.set()
            release.wait(120)
            left.set()

        done = self.control.submit_op(hold)
        assert entered.wait(60)
        try:
            fn()
            answered_first = not left.is_set()
        finally:
            release.set()
        done.result(60)
        return answered_first


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    clock = FakeClock()
    engine = db.make_engine(db.default_url(tmp_path))
    upgrade(engine)
    with engine.begin() as conn:
        store.put_team(conn, TeamSpec(name="default"), clock.time())
    # A tick far off: the control thread never ticks by itself in these tests.
    control = ControlThread(engine, Settings(lease_s=LEASE_S, tick_s=100_000.0), clock)
    control.load()
    control.start()
    try:
        yield Rig(Head(control), control, clock)
    finally:
        control.stop()
        engine.dispose()


def full(
    name: str, seq: int, version: int = 0, processes: list[ProcessStatus] | None = None
) -> Heartbeat:
    return Heartbeat(
        name=name,
        version=version,
        processes=processes or [],
        master_ports={},
        gpus=[],
        health=NodeHealth(),
        seq=seq,
    )


def renewal(name: str, seq: int, version: int = 0) -> Heartbeat:
    """A delta with no news on report `seq - 1`."""
    return Heartbeat(
        name=name,
        version=version,
        processes=None,
        master_ports=None,
        gpus=None,
        health=None,
        seq=seq,
        delta=ReportDelta(base=seq - 1),
    )


def test_a_renewal_is_answered_while_the_control_lock_is_held_and_the_clock_sees_it(
    rig: Rig,
) -> None:
    rig.join("n1")
    rig.join("n2")  # joined before either's answer is cached: the peers in it are final
    for name in ("n1", "n2"):
        assert rig.beat(full(name, 1)).report_ack == 1
    rig.clock.advance(LEASE_S + 1)  # both silent past the lease; no tick has looked yet
    answers: list[DesiredState] = []
    assert rig.while_locked(lambda: answers.append(rig.beat(renewal("n1", 2))))
    assert answers[0].report_ack == 2  # the renewal was taken: the next delta builds on it
    assert rig.beats("lease") == 1
    with rig.control.lock:
        assert rig.control.mirror.nodes["n1"].last_heartbeat == rig.clock.time()
    rig.tick()
    assert rig.state("n1") is NodeState.UP  # the renewal just before the decision won
    assert rig.state("n2") is NodeState.DOWN  # the one not heard went down


def test_a_node_marked_down_comes_back_through_its_next_heartbeat(rig: Rig) -> None:
    for name in ("n1", "n2"):
        rig.join(name)
        rig.beat(full(name, 1))
    rig.clock.advance(LEASE_S + 1)
    rig.tick()
    assert rig.state("n1") is NodeState.DOWN and rig.state("n2") is NodeState.DOWN
    # A delta with no news from a down node is not a lease renewal on the side: the control
    # thread applies it as a report, which brings the node back.
    answer = rig.beat(renewal("n1", 2))
    assert rig.state("n1") is NodeState.UP
    assert answer.report_ack == 2
    assert rig.beats("lease") == 0 and rig.beats("delta") == 1
    # A full report (an agent that restarted) does too.
    rig.beat(full("n2", 1))
    assert rig.state("n2") is NodeState.UP
    # Back up, its next renewal takes the lease-only path again, and counts.
    rig.clock.advance(LEASE_S - 1)
    answers: list[DesiredState] = []
    assert rig.while_locked(lambda: answers.append(rig.beat(renewal("n1", 3))))
    assert answers[-1].report_ack == 3
    rig.tick()
    assert rig.state("n1") is NodeState.UP
    assert rig.beats("lease") == 1


def test_a_node_whose_jobs_were_requeued_is_never_told_to_keep_them(rig: Rig) -> None:
    rig.join("n1")
    rig.beat(full("n1", 1))
    spec = JobSpec(command=["train"], workdir="/work")
    mirror = rig.control.mirror
    job = int(rig.control.call(lambda tx: jobs.submit(mirror, tx, USER, spec)).job_ids[0])
    rig.clock.advance(1.0)  # a scheduling cycle is due (the fake monotonic clock moved)
    rig.control.call(lambda tx: None)  # the batch that runs it
    placed = rig.beat(full("n1", 2))
    (assignment,) = placed.jobs
    assert assignment.job_id == job
    running = ProcessStatus(
        job_id=job,
        epoch=assignment.epoch,
        rank=0,
        local_rank=0,
        pid=4242,
        running=True,
        started_at=rig.clock.time(),
    )
    rig.beat(full("n1", 10, placed.version, [running]))
    # Silent past its lease and the requeue margin: down, its job requeued.
    rig.clock.advance(LEASE_S + Settings().requeue_margin_s + 1)
    rig.tick()
    assert rig.state("n1") is NodeState.DOWN
    with rig.control.lock:
        assert job not in rig.control.mirror.node_jobs.get("n1", set())  # requeued
    # Its agent (which fenced itself) renews on its old report: not a lease renewal on the
    # side — the answer the control thread gives no longer holds the old run.
    answer = rig.beat(renewal("n1", 11, placed.version))
    assert rig.beats("lease") == 0
    assert all((a.job_id, a.epoch) != (job, assignment.epoch) for a in answer.jobs)
