"""How many agents the pool wants, and which to let go: pure functions over plain data.

Demand is Phalanx's own: the pending jobs whose reason says they wait for GPUs or nodes
(`Resources`, `Priority`, `ReqNodeNotAvail`, `Infeasible`, `WouldDelayReservation`), and
those being preempted (state PR: they are requeued in a moment, e.g. off a node that
leaves), whose GPUs per node one pool node can give. The pool wants a node for every node those
jobs ask for on top of the nodes busy now, within `min_nodes`..`max_nodes`:

    target = clamp(busy + sum(job.nodes for job in demand), min_nodes, max_nodes)

Nodes it has but does not need are let go: first those still pending in Slurm (nothing
runs there), then joined nodes idle for at least `idle_timeout_s`, the longest idle
first. A node that is starting (its Slurm job runs, its agent has not joined yet) is
never let go for being idle. Nodes whose Slurm job ended are simply gone: if they are
still needed, the target brings replacements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PREEMPTED = "Preempted"  # a job being preempted (PR): it is back in the queue in a moment
# Pending reasons that more nodes would cure (core.decisions.ReasonCode values), and jobs
# on their way back to the queue.
DEMAND_REASONS = frozenset(
    {"Resources", "Priority", "ReqNodeNotAvail", "Infeasible", "WouldDelayReservation", PREEMPTED}
)


@dataclass(frozen=True, slots=True)
class PoolLimits:
    min_nodes: int
    max_nodes: int
    gpus_per_node: int  # what each pool node has (0: CPU-only nodes)
    idle_timeout_s: float


@dataclass(frozen=True, slots=True)
class Member:
    """One of the pool's Slurm jobs (live in Slurm), with its Phalanx node if it joined."""

    slurm_id: str
    slurm_state: str  # PENDING, RUNNING, …
    node: str  # the Phalanx node name its agent takes
    joined: bool  # the head knows the node and it is up (or drained)
    jobs: int  # Phalanx jobs on it now
    idle_s: float | None  # how long it has been joined and without jobs (None: busy/not joined)


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: int
    nodes: int
    gpus_per_node: int
    reason: str | None
    held: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    target: int
    submit: int  # new Slurm jobs to submit
    release: tuple[Member, ...]  # members to drain and scancel
    demand_nodes: int  # nodes the demanding jobs ask for
    demanding: tuple[int, ...]  # their Phalanx job ids
    too_big: tuple[int, ...]  # pending jobs that want more GPUs per node than a pool node has


def demand(jobs: Sequence[PendingJob], gpus_per_node: int) -> tuple[list[PendingJob], list[int]]:
    """The pending jobs more pool nodes would let start, and those no pool node fits."""
    wanting = [j for j in jobs if not j.held and j.reason in DEMAND_REASONS]
    fits = [j for j in wanting if j.gpus_per_node <= gpus_per_node]
    too_big = [j.job_id for j in wanting if j.gpus_per_node > gpus_per_node]
    return fits, too_big


def decide(members: Sequence[Member], jobs: Sequence[PendingJob], limits: PoolLimits) -> Decision:
    fits, too_big = demand(jobs, limits.gpus_per_node)
    wanted = sum(j.nodes for j in fits)
    busy = sum(1 for m in members if m.jobs > 0)
    target = max(limits.min_nodes, min(limits.max_nodes, busy + wanted))
    submit = max(0, target - len(members))
    release: list[Member] = []
    excess = len(members) - target
    if excess > 0:
        pending = [m for m in members if m.slurm_state == "PENDING" and not m.joined]
        pending.sort(key=lambda m: int(m.slurm_id) if m.slurm_id.isdigit() else 0, reverse=True)
        idle = [
            m
            for m in members
            if m.joined
            and m.jobs == 0
            and m.idle_s is not None
            and m.idle_s >= limits.idle_timeout_s
        ]
        idle.sort(key=lambda m: -(m.idle_s or 0.0))
        release = (pending + idle)[:excess]
    return Decision(
        target=target,
        submit=submit,
        release=tuple(release),
        demand_nodes=wanted,
        demanding=tuple(j.job_id for j in fits),
        too_big=tuple(too_big),
    )
