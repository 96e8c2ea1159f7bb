"""A node joining a running head is added to the scheduler's state as it is (no rebuild of
every node and every queued job per join), and gets its peers at once; a node rejoining in
another shape still rebuilds. In process, on a fake clock (phalanx.testing.headloop)."""

from __future__ import annotations

from pathlib import Path

from phalanx.core import JobState
from phalanx.head.mirror import Settings
from phalanx.testing.headloop import HeadLoop

SETTINGS = Settings(heartbeat_s=1.0, lease_s=8.0, tick_s=0.5, hang_timeout_s=0.0)


def test_joins_grow_the_live_core_and_get_queued_work(tmp_path: Path) -> None:
    loop = HeadLoop(tmp_path, SETTINGS)
    try:
        loop.join("n01", gpus=8)
        jobs = [loop.submit(gpus_per_node=8) for _ in range(6)]
        loop.advance(1)
        core = loop.mirror.core
        assert core is not None and len(core.pending) == 5
        for k in range(2, 7):
            loop.join(f"n{k:02d}", gpus=8, rack=f"r{k}")
            # The same state object, grown by one node: not rebuilt, nor due for a rebuild.
            assert loop.mirror.core is core and not loop.mirror.core_dirty
            assert core.nodes[-1].name == f"n{k:02d}" and core.nodes[-1].rack == f"r{k}"
            # Its peers at once (every other node heard: as many as there are, up to 8).
            assert loop.mirror.peer_lists[f"n{k:02d}"] == [f"n{j:02d}" for j in range(1, k)]
            # and, the cluster being small, the earlier nodes take it in at once (an agent
            # told too few peers fences at the lease through a head outage)
            assert loop.mirror.peer_lists["n01"] == [f"n{j:02d}" for j in range(2, k + 1)]
        loop.advance(2)
        assert all(loop.mirror.jobs[j].state is JobState.RUNNING for j in jobs)
        assert {n for j in jobs for n, _ in loop.mirror.jobs[j].placement} == {
            f"n{k:02d}" for k in range(1, 7)
        }
        assert loop.mirror.core is core
    finally:
        loop.close()


def test_a_rejoin_keeps_the_core_unless_its_shape_changed(tmp_path: Path) -> None:
    loop = HeadLoop(tmp_path, SETTINGS)
    try:
        loop.join("n1", gpus=8)
        loop.join("n2", gpus=4)
        loop.advance(1)
        core = loop.mirror.core
        assert core is not None
        loop.join("n2", gpus=4)  # the agent restarted: same node
        assert loop.mirror.core is core and not loop.mirror.core_dirty
        loop.join("n2", gpus=2)  # a GPU card pulled: another shape
        assert loop.mirror.core_dirty
        loop.advance(1)
        rebuilt = loop.mirror.core
        assert rebuilt is not None and rebuilt is not core
        assert rebuilt.nodes[rebuilt.node_index["n2"]].gpus == 2
        loop.join("big", gpus=16)  # larger than any node so far: rebuilt too
        assert loop.mirror.core_dirty
        loop.advance(1)
        assert loop.mirror.core is not None and loop.mirror.core.max_gpus == 16
    finally:
        loop.close()


def test_a_down_node_that_rejoins_is_schedulable_again(tmp_path: Path) -> None:
    loop = HeadLoop(tmp_path, SETTINGS)
    try:
        loop.join("n1", gpus=8)
        loop.join("n2", gpus=8)
        loop.advance(1)
        core = loop.mirror.core
        assert core is not None
        loop.silence("n2")
        loop.advance(SETTINGS.lease_s + 1)
        assert not core.up[core.node_index["n2"]]
        loop.join("n2", gpus=8)
        assert loop.mirror.core is core and core.up[core.node_index["n2"]]
        job = loop.submit(nodes=2, gpus_per_node=8)
        loop.advance(1)
        assert loop.mirror.jobs[job].state is JobState.RUNNING
    finally:
        loop.close()


def test_a_requeue_that_avoids_a_node_updates_the_job_not_the_whole_core(
    tmp_path: Path,
) -> None:
    """A node fails two jobs: the second is requeued avoiding it. Its queued request is
    replaced in the live core (once a rebuild of every node and queued job, per requeue),
    and it runs elsewhere."""
    loop = HeadLoop(tmp_path, SETTINGS)
    try:
        loop.join("n1", gpus=8)
        jobs = [loop.submit(gpus_per_node=4) for _ in range(2)]
        loop.advance(2)
        assert {n for j in jobs for n, _ in loop.mirror.jobs[j].placement} == {"n1"}
        loop.join("n2", gpus=8)
        loop.advance(1)
        core = loop.mirror.core
        assert core is not None
        loop.silence("n1")
        loop.advance(SETTINGS.lease_s + SETTINGS.requeue_margin_s + 3)
        assert loop.mirror.core is core and not loop.mirror.core_dirty
        avoiding = [j for j in jobs if loop.mirror.jobs[j].avoid == ["n1"]]
        assert avoiding  # the second job n1 failed avoids it
        for j in jobs:
            assert loop.mirror.jobs[j].state is JobState.RUNNING
            assert [n for n, _ in loop.mirror.jobs[j].placement] == ["n2"]
        for j in avoiding:
            assert "n1" in core.running[j].request.exclude_nodes
            assert loop.mirror.jobs[j].restart_count == 1
    finally:
        loop.close()
