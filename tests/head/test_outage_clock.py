"""Head outages, in process with a fake clock: the head notices its own pause and blames no
node for it; peer lists and the quorums agents and head share (docs/fault-tolerance.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from phalanx.api.models import GpuInfo
from phalanx.api.quorum import fresh_quorum, ride_quorum
from phalanx.core import NodeState
from phalanx.head import clock, db, peers
from phalanx.head.migrate import upgrade
from phalanx.head.mirror import Mirror, Settings, Tx
from phalanx.head.records import NodeRecord

SETTINGS = Settings(heartbeat_s=2.0, lease_s=8.0, requeue_margin_s=2.0, tick_s=0.5)
T0 = 1_000_000.0


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = db.make_engine(db.default_url(tmp_path))
    upgrade(engine)
    yield engine
    engine.dispose()


def node(name: str, last: float, state: NodeState = NodeState.UP) -> NodeRecord:
    gpu = GpuInfo(index=0, uuid=f"GPU-{name}", model="H100", memory_mb=81920)
    return NodeRecord(
        name=name,
        address=name,
        agent_url=f"http://{name}:1",
        agent_secret="s",
        cpus=8,
        memory_mb=1024,
        gpus=[gpu],
        labels={},
        state=state,
        last_heartbeat=last,
    )


def mirror(*names: str) -> Mirror:
    m = Mirror(SETTINGS)
    for name in names:
        m.nodes[name] = node(name, T0)
    return m


def states(m: Mirror) -> dict[str, str]:
    return {n.name: n.state.value for n in m.nodes.values()}


def test_the_pause_watch_tells_a_frozen_loop_from_a_busy_one() -> None:
    watch = clock.PauseWatch(SETTINGS, 0.0)
    assert [watch.paused(t) for t in (0.5, 1.0, 1.6, 2.9)] == [0.0, 0.0, 0.0, 0.0]
    assert watch.paused(62.9) == pytest.approx(59.5)  # SIGSTOP, a GC pause, a frozen VM
    assert watch.paused(63.4) == 0.0


def test_a_head_that_was_paused_blames_no_node_for_its_own_silence(engine: Engine) -> None:
    paused, blamed = mirror("a", "b", "c"), mirror("a", "b", "c")
    later = T0 + 60  # no tick ran for a minute: no heartbeat was heard either
    with engine.connect() as conn:
        clock.tick(paused, Tx(lambda: conn, later), later, paused_s=59.5)
        clock.tick(blamed, Tx(lambda: conn, later), later)
    assert states(paused) == {"a": "up", "b": "up", "c": "up"}
    assert states(blamed) == {"a": "down", "b": "down", "c": "down"}
    # Each node got a fresh lease from the moment the head ran again.
    with engine.connect() as conn:
        clock.tick(paused, Tx(lambda: conn, later), later + SETTINGS.lease_s + 1)
    assert states(paused) == {"a": "down", "b": "down", "c": "down"}


def test_every_node_gets_spread_peers_never_itself_nor_a_down_node() -> None:
    m = mirror(*(f"n{i:02d}" for i in range(40)))
    m.nodes["n05"].state = NodeState.DOWN
    lists = peers.pick(m)
    assert set(lists) == set(m.nodes)
    for name, chosen in lists.items():
        assert len(chosen) == peers.PEERS_PER_NODE == len(set(chosen))
        assert name not in chosen and "n05" not in chosen
    # Spread around the ring (one rack of neighbours does not hold them all).
    assert lists["n00"][:2] == ["n01", "n06"] and lists["n00"][-1] >= "n35"
    assert peers.pick(mirror("solo")) == {"solo": []}
    assert peers.pick(mirror("a", "b")) == {"a": ["b"], "b": ["a"]}


def test_the_agents_and_the_heads_quorums_always_share_a_peer() -> None:
    for n in range(1, 30):
        assert ride_quorum(n) + fresh_quorum(n) > n
        assert 1 <= fresh_quorum(n) <= 3  # the head needs few peers heard to requeue fast
        assert n - ride_quorum(n) <= 2  # an outage is ridden out with up to 2 peers dead


def test_a_silent_node_is_requeued_early_only_while_enough_of_its_peers_are_heard() -> None:
    m = mirror("a", "b", "c", "d")
    m.peers_sent["a"] = ["b", "c", "d"]  # 3 peers: the head needs 2 of them heard
    now = T0 + SETTINGS.lease_s + SETTINGS.requeue_margin_s + 1
    m.nodes["a"].last_heartbeat = T0
    for name in "bcd":
        m.nodes[name].last_heartbeat = now - 1
    assert clock._peers_hear_head(m, "a", now)
    m.nodes["c"].last_heartbeat = m.nodes["d"].last_heartbeat = T0  # cut off with "a"?
    assert not clock._peers_hear_head(m, "a", now)
    m.peers_sent["a"] = []  # no peers: it fenced at its lease, as before
    assert clock._peers_hear_head(m, "a", now)
