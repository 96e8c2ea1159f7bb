"""The head's own backlog is not a node's silence (head/overload.py), and heartbeats go first
while it is behind (head/shedding.py): the measures, the lease horizon, the clock judging
leases against it, and which requests may be shed. In process, on given times."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from phalanx.api.models import GpuInfo
from phalanx.core import NodeState
from phalanx.head import clock, db
from phalanx.head.migrate import upgrade
from phalanx.head.mirror import Mirror, Settings, Tx
from phalanx.head.overload import LOOP_PASSES, Backlog, Horizon
from phalanx.head.records import NodeRecord
from phalanx.head.shedding import sheddable

SETTINGS = Settings(heartbeat_s=2.0, lease_s=8.0, requeue_margin_s=2.0, overload_grace_s=30.0)
T0 = 1_000_000.0


class Mono:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = db.make_engine(db.default_url(tmp_path))
    upgrade(engine)
    yield engine
    engine.dispose()


def mirror(*names: str) -> Mirror:
    m = Mirror(SETTINGS)
    for name in names:
        gpu = GpuInfo(index=0, uuid=f"GPU-{name}", model="H100", memory_mb=81920)
        m.nodes[name] = NodeRecord(
            name=name,
            address=name,
            agent_url=f"http://{name}:1",
            agent_secret="s",
            cpus=8,
            memory_mb=1024,
            gpus=[gpu],
            labels={},
            state=NodeState.UP,
            last_heartbeat=T0,
        )
    return m


def states(m: Mirror) -> dict[str, str]:
    return {n.name: n.state.value for n in m.nodes.values()}


def test_the_backlog_is_the_largest_of_loop_lag_heartbeats_waiting_and_the_control_queue() -> None:
    mono = Mono()
    backlog = Backlog(mono)
    assert backlog.behind_s() == 0.0
    backlog.loop_lag(0.5, mono.t)  # the loop's timer fired half a second late
    assert backlog.parts()["loop"] == pytest.approx(LOOP_PASSES * 0.5)
    backlog.loop_lag(0.1, mono.t + 0.1)  # a smaller one after it does not hide it
    mono.t += 1.0
    assert backlog.behind_s() == pytest.approx(LOOP_PASSES * 0.5)
    mono.t += 5.0  # out of the window: the loop keeps up again
    assert backlog.parts()["loop"] == 0.0
    with backlog.handling():  # a heartbeat waiting for the control thread, 4 s
        mono.t += 4.0
        with backlog.handling():  # a younger one does not hide the oldest
            assert backlog.parts()["heartbeats"] == pytest.approx(4.0)
    assert backlog.parts()["heartbeats"] == 0.0  # handled
    backlog.control_batch(mono.t - 7.0)  # a batch whose oldest operation waited 7 s
    assert backlog.behind_s() == pytest.approx(7.0)
    backlog.control_idle()
    assert backlog.behind_s() == 0.0


def test_the_horizon_trails_now_by_the_worst_backlog_of_a_lease_within_the_grace() -> None:
    h = Horizon()
    lease, grace = 8.0, 30.0
    assert h.heard_until(T0, 0.0, grace, lease) == T0
    assert h.heard_until(T0 + 1, 2.5, grace, lease) == T0  # 2.5 s behind: stands still
    # A live node's heartbeats come two backlogs apart (its answer waits as its request
    # did). The backlog is gone, but a heartbeat may have been sent at its worst: the
    # horizon keeps that worst for a lease (and never moves back).
    assert h.heard_until(T0 + 2, 0.0, grace, lease) == T0
    assert h.heard_until(T0 + 8, 0.0, grace, lease) == T0 + 8 - 2 * 2.5
    assert h.heard_until(T0 + 10, 0.0, grace, lease) == T0 + 10  # a lease later: caught up
    # Overloaded for good: never more than the grace behind now.
    assert h.heard_until(T0 + 100, 500.0, grace, lease) == T0 + 100 - grace
    assert h.heard_until(T0 + 200, 500.0, grace, lease) == T0 + 200 - grace
    # Grace 0: the wall clock alone (the head before this).
    assert Horizon().heard_until(T0, 50.0, 0.0, lease) == T0


def test_a_lease_is_judged_up_to_when_the_head_could_hear(engine: Engine) -> None:
    judged, walled = mirror("a", "b"), mirror("a", "b")
    now = T0 + SETTINGS.lease_s + 3  # 11 s on the wall since both were heard
    heard = now - 6.0  # the head was 6 s behind: it could hear only 5 s of it
    with engine.connect() as conn:
        clock.tick(judged, Tx(lambda: conn, now), now, heard_until=heard)
        clock.tick(walled, Tx(lambda: conn, now), now)
    assert states(judged) == {"a": "up", "b": "up"}
    assert states(walled) == {"a": "down", "b": "down"}
    # Once the head has heard for a full lease and still not them, they are down.
    later = now + 4.0
    with engine.connect() as conn:
        clock.tick(judged, Tx(lambda: conn, later), later, heard_until=later - 1.0)
    assert states(judged) == {"a": "down", "b": "down"}
    # The reason says the wall-clock silence.
    assert judged.nodes["a"].down_reason is not None
    assert "for 15 s" in judged.nodes["a"].down_reason


def test_a_dead_node_is_down_within_lease_plus_grace_however_far_behind_the_head_is(
    engine: Engine,
) -> None:
    m = mirror("a")
    h = Horizon()
    downs = []
    with engine.connect() as conn:
        for step in range(1, 100):
            now = T0 + step * 0.5
            heard = h.heard_until(now, 1e6, SETTINGS.overload_grace_s, SETTINGS.lease_s)
            clock.tick(m, Tx(lambda: conn, now), now, heard_until=heard)
            if m.nodes["a"].state is NodeState.DOWN:
                downs.append(now - T0)
                break
    bound = SETTINGS.lease_s + SETTINGS.overload_grace_s
    assert downs and bound < downs[0] <= bound + 0.5


def test_a_frozen_head_pauses_the_lease_clock_but_a_busy_one_only_falls_behind() -> None:
    # A gap in which the process used (almost) no CPU was a freeze (SIGSTOP, a stopped VM):
    # every node gets a fresh lease, as before. One in which it kept running (starved of
    # CPU, or busy) is its backlog, bounded by the grace (else a head stalling again and
    # again would refresh a dead node's lease for ever).
    watch = clock.PauseWatch(SETTINGS, 0.0, cpu=0.0)
    assert watch.paused(20.5, cpu=0.01) == pytest.approx(20.0)  # frozen
    assert watch.paused(30.5, cpu=1.01) == 0.0  # 10 % of a core meanwhile: overloaded
    off = clock.PauseWatch(Settings(overload_grace_s=0.0), 0.0, cpu=0.0)
    assert off.paused(10.5, cpu=5.0) == pytest.approx(10.0)  # no grace: as before


@pytest.mark.parametrize(
    ("method", "path", "shed"),
    [
        ("POST", "/v1/jobs", True),  # a submit
        ("GET", "/v1/jobs", True),  # listings and reads
        ("GET", "/v1/nodes", True),
        ("HEAD", "/v1/jobs/12", True),
        ("GET", "/v1/jobs/12/logs", True),
        ("POST", "/v1/agent/heartbeat", False),  # what agents send
        ("POST", "/v1/agent/register", False),
        ("GET", "/v1/agent/anything", False),
        ("POST", "/v1/telemetry", False),
        ("POST", "/v1/jobs/12/cancel", False),  # changes to existing jobs
        ("DELETE", "/v1/jobs/12", False),
        ("POST", "/v1/jobs/12/progress", False),  # what jobs send
        ("GET", "/healthz", False),
        ("GET", "/metrics", False),
        ("GET", "/ui/", False),
    ],
)
def test_only_submits_and_reads_are_shed(method: str, path: str, shed: bool) -> None:
    assert sheddable(method, path) is shed
