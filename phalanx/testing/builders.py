"""Builders for clusters and jobs, shared by tests, benchmarks and the simulator."""

from __future__ import annotations

import random

from phalanx.core.model import Dependency, JobRequest, Node


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
