"""Whether a job could ever run on the nodes that joined: refused at submit when not.

Slurm refuses such a job too ("Requested node configuration is not available"); waiting
for it would keep it pending forever, with a reason the user reads only later.
"""

from __future__ import annotations

from collections.abc import Iterable

from phalanx.api.models import JobSpec
from phalanx.head.control import HeadError
from phalanx.head.records import NodeRecord


def tasks_per_node(spec: JobSpec) -> int:
    """How many tasks the job runs on each node: one process per GPU with torchrun, else
    `--ntasks-per-node` (srun's steps run that many; default one)."""
    if spec.launcher == "torchrun":
        return spec.gpus_per_node
    return spec.ntasks_per_node or 1


def check(nodes: Iterable[NodeRecord], spec: JobSpec) -> None:
    """Refuse (422) a job no set of the `nodes` could ever run: more GPUs, CPUs or memory
    per node than any node has, or fewer nodes with all of them than it asks for. Nothing
    is checked before the first node joins (there is nothing to measure against)."""
    known = list(nodes)
    if not known:
        return
    wanted = spec.gpu_model
    shaped = [
        n for n in known if wanted is None or (n.gpus and n.gpus[0].model.lower() == wanted.lower())
    ]
    if not shaped:
        models = sorted({n.gpus[0].model for n in known if n.gpus})
        raise HeadError(422, f"no node has GPU model {wanted!r}; models: {', '.join(models)}")
    cpus = spec.cpus_per_task * tasks_per_node(spec) if spec.cpus_per_task else None
    mem = spec.mem_mb
    largest_gpus = max(len(n.gpus) for n in shaped)
    if spec.gpus_per_node > largest_gpus:
        raise HeadError(
            422,
            f"asks for {_count(spec.gpus_per_node, 'GPU')} per node; "
            f"the largest node has {largest_gpus}",
        )
    if cpus is not None and cpus > (most := max(n.cpus for n in shaped)):
        how = (
            f" (-c {spec.cpus_per_task} × {tasks_per_node(spec)} tasks)"
            if tasks_per_node(spec) > 1
            else ""
        )
        raise HeadError(
            422,
            f"asks for {_count(cpus, 'CPU')} per node{how}; "
            f"the node with the most has {_count(most, 'CPU')}",
        )
    if mem is not None and mem > (most := max(n.memory_mb for n in shaped)):
        raise HeadError(
            422,
            f"asks for {mem} MB of memory per node (--mem); the node with the most has {most} MB",
        )
    fitting = sum(
        1
        for n in shaped
        if len(n.gpus) >= spec.gpus_per_node
        and (cpus is None or n.cpus >= cpus)
        and (mem is None or n.memory_mb >= mem)
    )
    if spec.nodes > fitting:
        each = [_count(spec.gpus_per_node, "GPU")]
        if cpus is not None:
            each.append(_count(cpus, "CPU"))
        if mem is not None:
            each.append(f"{mem} MB of memory")
        shape = ", ".join(each[:-1]) + " and " + each[-1] if len(each) > 1 else each[0]
        such = "such node" if fitting == 1 else "such nodes"
        raise HeadError(
            422,
            f"asks for {_count(spec.nodes, 'node')} with {shape} each; "
            f"the cluster has {fitting} {such}",
        )


def _count(n: int, noun: str) -> str:
    """`1 GPU`, `2 GPUs`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
