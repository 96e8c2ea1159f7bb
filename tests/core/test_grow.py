"""A node joins a live ClusterState (core/grow.py) and leaves it as a rebuild would."""

from __future__ import annotations

import pytest

from phalanx.core import ClusterState, JobRequest, Node, StateError, schedule
from phalanx.core.grow import add_node, fits


def _nodes() -> list[Node]:
    return [
        Node("a", 8, rack="r1"),
        Node("b", 8, rack="r1"),
        Node("c", 4, gpu_model="A100", rack="r2", block="b2"),
        Node("d", 8, rack="r3", block="b2"),  # a new rack in a known block
        Node("e", 2, gpu_model="L4", rack="r9", block="b9"),  # new model, rack and block
        Node("f", 8, rack="r1"),
    ]


def _indexes(s: ClusterState) -> dict[str, object]:
    return {
        "nodes": s.nodes,
        "node_index": s.node_index,
        "models": s.models,
        "rack_of": s.rack_of,
        "block_of": s.block_of,
        "rack_nodes": s.rack_nodes,
        "rack_block": s.rack_block,
        "rack_names": s.rack_names,
        "block_names": s.block_names,
        "block_racks": s.block_racks,
        "free": s.free,
        "free_mask": s.free_mask,
        "up": s.up,
        "buckets": {m: [list(b) for b in bs] for m, bs in s.buckets.items()},
        "rack_ge": s.rack_ge,
        "block_ge": s.block_ge,
        "cluster_ge": s.cluster_ge,
        "capacity_ge": s.capacity_ge,
        "free_total": s.free_total,
        "gpus_up": s.gpus_up,
        "node_jobs": s.node_jobs,
    }


def _jobs(s: ClusterState) -> None:
    for i, (nodes, gpus) in enumerate([(1, 8), (2, 8), (1, 4), (1, 2), (1, 1), (3, 8)]):
        s.submit(JobRequest(id=i + 1, team="t", user="u", nodes=nodes, gpus_per_node=gpus), 0.0)


@pytest.mark.parametrize("first", [2, 3, 5])
def test_nodes_added_one_by_one_index_as_a_rebuild_with_them_does(first: int) -> None:
    nodes = _nodes()
    whole = ClusterState(nodes)
    grown = ClusterState(nodes[:first])
    for node in nodes[first:]:
        assert fits(grown, node)
        assert add_node(grown, node) == whole.node_index[node.name]
    assert _indexes(grown) == _indexes(whole)
    # And the scheduler decides the same on both.
    _jobs(whole)
    _jobs(grown)
    a, b = schedule(whole, 1.0), schedule(grown, 1.0)
    assert [(s.job_id, s.placement) for s in a.starts] == [
        (s.job_id, s.placement) for s in b.starts
    ]
    assert a.starts  # something was placed on the grown nodes


def test_a_node_added_while_jobs_run_takes_queued_work() -> None:
    s = ClusterState([Node("a", 8)])
    for i in (1, 2):
        s.submit(JobRequest(id=i, team="t", user="u", nodes=1, gpus_per_node=8), 0.0)
    first = schedule(s, 1.0)
    for start in first.starts:
        s.start(start.job_id, start.placement, 1.0)
    waiting = set(s.pending)
    add_node(s, Node("b", 8, rack="r2"))
    second = schedule(s, 2.0)
    placed = {start.job_id for start in second.starts}
    assert placed == waiting == {2}
    assert all(s.node_index["b"] in start.placement.node_indices for start in second.starts)


def test_a_larger_or_known_node_is_refused() -> None:
    s = ClusterState([Node("a", 4)])
    assert not fits(s, Node("big", 8))
    with pytest.raises(StateError, match=r"only 1\.\.4"):
        add_node(s, Node("big", 8))
    with pytest.raises(StateError, match="duplicate"):
        add_node(s, Node("a", 4))
    assert len(s.nodes) == 1
