"""Gang, topology-aware placement: all of a job's GPUs at once or none.

A job that fits one node goes on one node (best fit: the node with the fewest free GPUs that
still fit). A multi-node job goes into the smallest domain that holds it — one rack, else one
block, else the whole cluster — choosing the tightest such domain and best-fit nodes inside it
to limit fragmentation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from phalanx.core.model import JobRequest, Placement
from phalanx.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class Constraints:
    """Per-cycle limits on where a job may go.

    `limits` caps the GPUs usable per node (the spare GPUs of nodes held by a reservation);
    `excluded` are node indices the job must avoid.
    """

    limits: Mapping[int, int] = field(default_factory=dict)
    excluded: frozenset[int] = frozenset()


UNCONSTRAINED = Constraints()


def _pick_gpus(free_mask: int, count: int) -> int:
    """The lowest `count` free GPU indices as a bitmask."""
    mask = 0
    while count:
        low = free_mask & -free_mask
        mask |= low
        free_mask ^= low
        count -= 1
    return mask


def _usable(state: ClusterState, n: int, job: JobRequest, c: Constraints) -> bool:
    if not state.up[n] or n in c.excluded:
        return False
    if job.gpu_model is not None and state.nodes[n].gpu_model != job.gpu_model:
        return False
    free = state.free[n]
    limit = c.limits.get(n)
    if limit is not None and limit < free:
        free = limit
    return free >= job.gpus_per_node


def excluded_indices(state: ClusterState, job: JobRequest) -> frozenset[int]:
    """The nodes a job may not use: those it excludes, and with a nodelist every other."""
    excluded = {state.node_index[n] for n in job.exclude_nodes if n in state.node_index}
    if job.nodelist:
        allowed = {state.node_index[n] for n in job.nodelist if n in state.node_index}
        excluded.update(i for i in range(len(state.nodes)) if i not in allowed)
    return frozenset(excluded)


def place(state: ClusterState, job: JobRequest, c: Constraints = UNCONSTRAINED) -> Placement | None:
    """A placement for the whole gang on free GPUs, or None if it does not fit now."""
    g = job.gpus_per_node
    if g > state.max_gpus or state.cluster_ge[g] < job.nodes:
        return None
    if state.placement == "spread":
        return _place_spread(state, job, c)
    if job.nodes == 1:
        return _place_single(state, job, c)
    return _place_gang(state, job, c)


def _place_spread(state: ClusterState, job: JobRequest, c: Constraints) -> Placement | None:
    """The `spread` baseline: the nodes with the most free GPUs, wherever they are."""
    g = job.gpus_per_node
    models = state.models if job.gpu_model is None else [job.gpu_model]
    chosen: list[int] = []
    for f in range(state.max_gpus, g - 1, -1):
        for model in models:
            buckets = state.buckets.get(model)
            if buckets is None:
                continue
            for n in buckets[f]:
                if _usable(state, n, job, c):
                    chosen.append(n)
                    if len(chosen) == job.nodes:
                        return _slots(state, job, chosen)
    return None


def _place_single(state: ClusterState, job: JobRequest, c: Constraints) -> Placement | None:
    g = job.gpus_per_node
    models = state.models if job.gpu_model is None else [job.gpu_model]
    special = c.limits or c.excluded
    for f in range(g, state.max_gpus + 1):
        for model in models:
            buckets = state.buckets.get(model)
            if buckets is None:
                continue
            bucket = buckets[f]
            if not bucket:  # much cheaper than iterating an empty SortedList
                continue
            if not special:  # the first node: indexing, not an iterator (~1 µs to set up)
                n = bucket[0]
                return Placement(((n, _pick_gpus(state.free_mask[n], g)),))
            for n in bucket:
                if not _usable(state, n, job, c):
                    continue
                return Placement(((n, _pick_gpus(state.free_mask[n], g)),))
    return None


def _eligible(state: ClusterState, nodes: list[int], job: JobRequest, c: Constraints) -> list[int]:
    return [n for n in nodes if _usable(state, n, job, c)]


def _best_fit(state: ClusterState, nodes: list[int], count: int) -> list[int]:
    return sorted(nodes, key=lambda n: (state.free[n], n))[:count]


def _rack_counts(state: ClusterState, job: JobRequest, c: Constraints) -> list[int]:
    """Per rack, how many nodes could host one of the job's per-node slots now."""
    g = job.gpus_per_node
    if job.gpu_model is not None and len(state.models) > 1:
        return [len(_eligible(state, nodes, job, c)) for nodes in state.rack_nodes]
    counts = [ge[g] for ge in state.rack_ge]
    # The indexes count every up node with ≥ g free; correct for per-cycle constraints.
    for n in (*c.limits, *c.excluded):
        if state.up[n] and state.free[n] >= g and not _usable(state, n, job, c):
            counts[state.rack_of[n]] -= 1
    if c.limits and c.excluded:  # a node both limited and excluded was subtracted twice
        for n in c.excluded:
            if n in c.limits and state.up[n] and state.free[n] >= g:
                counts[state.rack_of[n]] += 1
    return counts


def _place_gang(state: ClusterState, job: JobRequest, c: Constraints) -> Placement | None:
    need = job.nodes
    counts = _rack_counts(state, job, c)
    # 1. The tightest single rack that holds the gang.
    best_rack = -1
    for r, count in enumerate(counts):
        if count >= need and (best_rack < 0 or count < counts[best_rack]):
            best_rack = r
    if best_rack >= 0:
        nodes = _eligible(state, state.rack_nodes[best_rack], job, c)
        return _slots(state, job, _best_fit(state, nodes, need))
    # 2. The tightest block; 3. the whole cluster. Fill the fullest racks first.
    block_counts = [sum(counts[r] for r in racks) for racks in state.block_racks]
    best_block = -1
    for b, count in enumerate(block_counts):
        if count >= need and (best_block < 0 or count < block_counts[best_block]):
            best_block = b
    if best_block >= 0:
        racks = state.block_racks[best_block]
    elif sum(block_counts) >= need:
        racks = list(range(len(state.rack_nodes)))
    else:
        return None
    chosen: list[int] = []
    for r in sorted(racks, key=lambda r: (-counts[r], r)):
        if counts[r] <= 0:
            break
        nodes = _eligible(state, state.rack_nodes[r], job, c)
        chosen.extend(_best_fit(state, nodes, need - len(chosen)))
        if len(chosen) == need:
            return _slots(state, job, chosen)
    return None


def _slots(state: ClusterState, job: JobRequest, nodes: list[int]) -> Placement | None:
    if len(nodes) < job.nodes:
        return None
    g = job.gpus_per_node
    return Placement(tuple((n, _pick_gpus(state.free_mask[n], g)) for n in nodes))


def domain_of(state: ClusterState, placement: Placement) -> str:
    """'node', 'rack', 'block' or 'cluster': the smallest domain holding the placement."""
    nodes = placement.node_indices
    if len(nodes) == 1:
        return "node"
    if len({state.rack_of[n] for n in nodes}) == 1:
        return "rack"
    if len({state.block_of[n] for n in nodes}) == 1:
        return "block"
    return "cluster"
