"""Builders for clusters and jobs, shared by tests, benchmarks and the simulator."""

from __future__ import annotations

import random
from collections.abc import Mapping

from phalanx.core.apply import apply_decisions as core_apply
from phalanx.core.decisions import Decisions
from phalanx.core.model import Dependency, JobRequest, Node, Placement
from phalanx.core.state import ClusterState


def cluster_nodes(
    nodes: int,
    gpus_per_node: int = 8,
    nodes_per_rack: int = 32,
    racks_per_block: int = 8,
    gpu_model: str = "H100",
    prefix: str = "n",
) -> list[Node]:
    """`nodes` identical nodes, named n0000…, in racks of `nodes_per_rack` and blocks of
    `racks_per_block` racks."""
    width = max(4, len(str(nodes - 1)))
    out = []
    for i in range(nodes):
        rack = i // nodes_per_rack
        out.append(
            Node(
                name=f"{prefix}{i:0{width}d}",
                gpus=gpus_per_node,
                gpu_model=gpu_model,
                rack=f"r{rack}",
                block=f"b{rack // racks_per_block}",
            )
        )
    return out


def job(
    job_id: int,
    team: str = "t",
    gpus: int = 1,
    nodes: int = 1,
    submit: float = 0.0,
    limit: float | None = None,
    priority: int = 0,
    duration: float | None = None,
    deps: tuple[Dependency, ...] = (),
    preemptible: bool = True,
) -> JobRequest:
    """A job of `nodes` × `gpus` GPUs (gpus is per node)."""
    return JobRequest(
        id=job_id,
        team=team,
        priority=priority,
        nodes=nodes,
        gpus_per_node=gpus,
        time_limit_s=limit,
        submit_s=submit,
        duration_s=duration,
        dependencies=deps,
        preemptible=preemptible,
    )


# (probability, nodes, GPUs per node) — a mix shaped like shared training clusters:
# mostly small jobs, a tail of full-node and multi-node gangs.
MIX: tuple[tuple[float, int, int], ...] = (
    (0.55, 1, 1),
    (0.12, 1, 2),
    (0.10, 1, 4),
    (0.13, 1, 8),
    (0.05, 2, 8),
    (0.03, 4, 8),
    (0.02, 8, 8),
)


def mixed_jobs(
    count: int,
    rng: random.Random,
    start_id: int = 0,
    teams: int = 8,
    gpus_per_node: int = 8,
    submit: float = 0.0,
) -> list[JobRequest]:
    """`count` jobs of mixed gang sizes (see MIX), with time limits of 10 min to 1 day."""
    weights = [w for w, _, _ in MIX]
    shapes = rng.choices([(n, g) for _, n, g in MIX], weights=weights, k=count)
    out = []
    for k, (n, g) in enumerate(shapes):
        out.append(
            JobRequest(
                id=start_id + k,
                team=f"team{rng.randrange(teams)}",
                nodes=n,
                gpus_per_node=min(g, gpus_per_node),
                time_limit_s=float(rng.choice((600, 3600, 4 * 3600, 12 * 3600, 86400))),
                submit_s=submit + k * 1e-3,
            )
        )
    return out


def node(
    name: str,
    gpus: int = 8,
    rack: str = "r0",
    block: str = "b0",
    gpu_model: str = "H100",
) -> Node:
    """One node with its place in the topology (shorter to read in test tables than Node)."""
    return Node(name=name, gpus=gpus, gpu_model=gpu_model, rack=rack, block=block)


def placement_on(state: ClusterState, gpus_on: Mapping[str, int]) -> Placement:
    """A placement taking the lowest free GPUs of each named node (in the mapping's order)."""
    slots = []
    for name, count in gpus_on.items():
        n = state.node_index[name]
        free, mask = state.free_mask[n], 0
        for _ in range(count):
            low = free & -free
            if not low:
                raise ValueError(f"node {name} has fewer than {count} free GPUs")
            mask |= low
            free ^= low
        slots.append((n, mask))
    return Placement(tuple(slots))


def run_job(
    state: ClusterState,
    request: JobRequest,
    gpus_on: Mapping[str, int] | None = None,
    at: float = 0.0,
    checkpoint: float | None = None,
    borrowed: int = 0,
) -> Placement:
    """Submit `request` and start it at `at` on the named nodes (default: the first nodes with
    enough free GPUs, in node order); `checkpoint` sets its last checkpoint time."""
    if gpus_on is None:
        names = [
            nd.name
            for i, nd in enumerate(state.nodes)
            if state.up[i] and state.free[i] >= request.gpus_per_node
        ][: request.nodes]
        gpus_on = {name: request.gpus_per_node for name in names}
    placement = placement_on(state, gpus_on)
    state.submit(request, at)
    state.start(request.id, placement, at, borrowed)
    if checkpoint is not None:
        state.checkpoint(request.id, checkpoint)
    return placement


def apply_decisions(state: ClusterState, decisions: Decisions, now: float) -> None:
    """Apply a cycle's starts and preemption notices to the state, as the head would."""
    core_apply(state, decisions, now)
