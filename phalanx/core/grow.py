"""A node joins a live `ClusterState` without rebuilding it.

Building the state afresh costs every node and every job (100,000 queued jobs: seconds);
a node that joins a running cluster only adds its own entries to the indexes. `add_node`
leaves the state exactly as a rebuild with the node appended would, for a node whose GPU
count is at most the largest node's (the indexes' width); a larger node needs a rebuild
(`fits` says which).
"""

from __future__ import annotations

import bisect

from sortedcontainers import SortedList

from phalanx.core.model import Node
from phalanx.core.state import ClusterState, StateError


def fits(state: ClusterState, node: Node) -> bool:
    """Whether `node` can join `state` incrementally (its GPUs fit the indexes' width)."""
    return 0 < node.gpus <= state.max_gpus


def add_node(state: ClusterState, node: Node) -> int:
    """Append `node` (up, all GPUs free) to the state and its indexes; its index."""
    if node.name in state.node_index:
        raise StateError(f"duplicate node name {node.name!r}")
    if not fits(state, node):
        raise StateError(
            f"node {node.name} has {node.gpus} GPUs; only 1..{state.max_gpus} join without "
            "a rebuild"
        )
    i = len(state.nodes)
    state.nodes.append(node)
    state.node_index[node.name] = i
    width = state.max_gpus + 1
    if node.gpu_model not in state.buckets:
        bisect.insort(state.models, node.gpu_model)
        state.buckets[node.gpu_model] = [SortedList() for _ in range(width)]
    # Topology: a new block or rack gets the next id, as in the constructor.
    try:
        b = state.block_names.index(node.block)
    except ValueError:
        b = len(state.block_names)
        state.block_names.append(node.block)
        state.block_racks.append([])
        state.block_ge.append([0] * (width + 1))
    r = next(
        (
            k
            for k in state.block_racks[b]
            if state.rack_names[k] == node.rack and state.rack_block[k] == b
        ),
        -1,
    )
    if r < 0:
        r = len(state.rack_nodes)
        state.rack_nodes.append([])
        state.rack_block.append(b)
        state.rack_names.append(node.rack)
        state.rack_ge.append([0] * (width + 1))
        state.block_racks[b].append(r)
    state.rack_of.append(r)
    state.block_of.append(b)
    state.rack_nodes[r].append(i)
    state.free_mask.append((1 << node.gpus) - 1)
    state.free.append(node.gpus)
    state.up.append(True)
    state.node_jobs.append({})
    state._index_node(i, +1)
    return i
