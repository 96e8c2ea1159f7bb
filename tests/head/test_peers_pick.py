"""Peer lists (head/peers.py): `pick` chooses as it always did (the O(nodes²) original is the
reference here), and `pick_one` chooses one node's list the same way."""

from __future__ import annotations

import random

import pytest

from phalanx.api.models import JobSpec
from phalanx.core import JobState, NodeState
from phalanx.head import peers
from phalanx.head.mirror import Mirror, Settings
from phalanx.head.records import JobRecord, NodeRecord


def reference(mirror: Mirror) -> dict[str, list[str]]:
    """head/peers.py `pick` before it stopped building every node's whole ring."""
    ring = sorted(name for name, n in mirror.nodes.items() if n.state.heard)
    where = {name: i for i, name in enumerate(ring)}
    out: dict[str, list[str]] = {}
    for name in mirror.nodes:
        chosen: list[str] = []
        for job_id in sorted(mirror.node_jobs.get(name, ())):
            rec = mirror.jobs.get(job_id)
            for other, _ in rec.placement if rec is not None else ():
                if other != name and other in where and other not in chosen:
                    chosen.append(other)
        chosen = chosen[: peers.PEERS_PER_NODE]
        want = peers.PEERS_PER_NODE - len(chosen)
        start = where.get(name, -1)
        rest = [ring[(start + 1 + k) % len(ring)] for k in range(len(ring))] if ring else []
        rest = [r for r in rest if r != name and r not in chosen]
        if want > 0 and rest:
            step = max(1.0, len(rest) / want)
            picked = {int(k * step) for k in range(want) if int(k * step) < len(rest)}
            chosen += [rest[i] for i in sorted(picked)]
        out[name] = chosen
    return out


def mirror_of(rng: random.Random, count: int) -> Mirror:
    mirror = Mirror(Settings())
    names = [f"n{k:03d}" for k in rng.sample(range(1000), count)]
    states = [NodeState.UP, NodeState.UP, NodeState.UP, NodeState.DRAIN, NodeState.DOWN]
    for name in names:
        mirror.nodes[name] = NodeRecord(
            name=name,
            address="127.0.0.1",
            agent_url="https://127.0.0.1:1",
            agent_secret="s" * 32,
            cpus=1,
            memory_mb=1,
            gpus=[],
            labels={},
            state=rng.choice(states),
        )
    for job_id in range(1, count // 2 + 1):
        gang = rng.sample(names, min(len(names), rng.choice([1, 2, 4, 12])))
        rec = JobRecord(
            id=job_id,
            name="j",
            user="u",
            team="t",
            account=None,
            qos="normal",
            priority=1,
            state=JobState.RUNNING,
            spec=JobSpec(command=["x"], workdir="/", nodes=len(gang)),
            submit_time=0.0,
            placement=[(n, [0]) for n in gang],
        )
        mirror.jobs[job_id] = rec
        for n in gang:
            mirror.node_jobs.setdefault(n, set()).add(job_id)
    return mirror


@pytest.mark.parametrize("count", [1, 2, 5, 9, 10, 40, 300])
def test_pick_chooses_as_the_original_did(count: int) -> None:
    for seed in range(5):
        mirror = mirror_of(random.Random(seed * 1000 + count), count)
        expected = reference(mirror)
        assert peers.pick(mirror) == expected
        for name in mirror.nodes:
            assert peers.pick_one(mirror, name) == expected[name]


def test_a_node_not_heard_still_gets_peers_and_is_nobodys_peer() -> None:
    mirror = mirror_of(random.Random(7), 30)
    lists = peers.pick(mirror)
    down = {n for n, rec in mirror.nodes.items() if not rec.state.heard}
    assert down  # the seed has some
    assert all(not down & set(chosen) for chosen in lists.values())
    assert all(len(lists[n]) == peers.PEERS_PER_NODE for n in down)
