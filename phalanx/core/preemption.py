"""Victim choice: which running jobs to stop so a pending job can run, losing the least work.

A higher-priority job may preempt lower-priority preemptible jobs of its own team (or of any
team where teams have no quotas); a team reclaiming its nominal quota may preempt jobs of
cohort teams that are borrowing; a preemptive policy (`srtf`, `las`) may preempt jobs it
ranks lower. Exact minimum-loss victim choice over many nodes is a knapsack problem; this
picks, per node, the victim set losing the least work that frees enough GPUs there (a small
exact knapsack over the node's GPUs), then the cheapest set of nodes in the smallest domain
(rack, block, cluster), and checks the result with a trial placement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from phalanx.core.decisions import Preemption
from phalanx.core.model import JobRequest, RunningJob
from phalanx.core.placement import Constraints, place
from phalanx.core.quota import QuotaView
from phalanx.core.state import ClusterState


@dataclass(slots=True)
class VictimPool:
    """The running preemptible jobs as one cycle sees them: (job, policy rank, lost work)."""

    entries: list[tuple[RunningJob, float, float]]
    max_rank: float

    @classmethod
    def build(cls, state: ClusterState, now: float) -> VictimPool:
        rank = state.policy.running_rank
        entries = [
            (run, rank(run, now) if rank is not None else 0.0, run.lost_work(now))
            for run in state.running.values()
            if run.request.preemptible and run.request.id not in state.preempting
        ]
        return cls(entries, max((e[1] for e in entries), default=-math.inf))


def could_preempt(
    state: ClusterState, qv: QuotaView, job: JobRequest, pool: VictimPool | None
) -> bool:
    """A cheap test that victims might exist at all, to skip hopeless searches.

    Without a pool yet, a preemptive policy answers "maybe" (the caller builds the pool)."""
    if state.running_priorities and min(state.running_priorities) < job.priority:
        return True
    team = state.teams[job.team]
    if (
        team.cohort is not None
        and qv.within_nominal(job.team, job.gpus)
        and any(qv.borrowing(t) for t in state.cohorts[team.cohort] if t != job.team)
    ):
        return True
    policy = state.policy
    if policy.pending_rank is None or not state.running_priorities:
        return False
    if pool is None:
        return True
    return policy.pending_rank(job) * policy.rank_margin < pool.max_rank


def _why(
    state: ClusterState, qv: QuotaView, job: JobRequest, victim: JobRequest, ranked: bool
) -> str:
    """Why `job` may preempt `victim`, or '' if it may not. `ranked`: the policy ranks
    `job` ahead of `victim`."""
    higher = victim.priority < job.priority
    policy_rank = ranked and victim.priority == job.priority
    mine, theirs = state.teams[job.team], state.teams[victim.team]
    if victim.team == job.team or mine.quota is None or theirs.quota is None:
        if higher:
            return f"priority {job.priority} > {victim.priority}"
        if policy_rank:
            return f"policy {state.policy.name} ranks job {job.id} ahead"
        return ""
    if mine.cohort is None or mine.cohort != theirs.cohort or not qv.borrowing(victim.team):
        return ""
    if qv.within_nominal(job.team, job.gpus):
        return f"team {job.team} reclaims its nominal quota from borrowing team {victim.team}"
    if higher:
        return f"priority {job.priority} > {victim.priority} over borrowed GPUs of {victim.team}"
    return ""


def choose_victims(
    state: ClusterState,
    qv: QuotaView,
    job: JobRequest,
    now: float,
    taken: set[int],
    excluded: frozenset[int],
    pool: VictimPool,
    limits: Mapping[int, int] | None = None,
) -> Preemption | None:
    """The cheapest victim set that lets `job` be placed, or None.

    `limits` caps the GPUs the job may use per node (the spare GPUs of nodes reserved for a
    job ahead of it), as in placement.
    """
    limits = limits or {}
    g = job.gpus_per_node
    policy = state.policy
    threshold = (
        policy.pending_rank(job) * policy.rank_margin
        if policy.pending_rank is not None
        else math.inf
    )
    team = state.teams[job.team]
    reclaim = team.cohort is not None and qv.within_nominal(job.team, job.gpus)
    why: dict[int, str] = {}
    lost: dict[int, float] = {}
    per_node: dict[int, list[RunningJob]] = {}
    for run, rank, lost_work in pool.entries:
        victim = run.request
        ranked = rank > threshold
        if not (ranked or victim.priority < job.priority or reclaim) or victim.id in taken:
            continue
        reason = _why(state, qv, job, victim, ranked)
        if not reason:
            continue
        why[victim.id] = reason
        lost[victim.id] = lost_work
        for n, _ in run.placement.slots:
            per_node.setdefault(n, []).append(run)
    if not per_node:
        return None

    # Per node: the victims losing the least work that leave ≥ g GPUs free there.
    cost: dict[int, tuple[float, tuple[int, ...]]] = {}
    for n, runs in per_node.items():
        if not state.up[n] or n in excluded or min(state.nodes[n].gpus, limits.get(n, g)) < g:
            continue
        if job.gpu_model is not None and state.nodes[n].gpu_model != job.gpu_model:
            continue
        found = _cheapest_on_node(state, n, runs, g - state.free[n], lost)
        if found is not None:
            cost[n] = found
    if not cost:
        return None
    nodes = _cheapest_nodes(state, job, cost, excluded, limits)
    if nodes is None:
        return None
    victims = tuple(sorted({v for n in nodes for v in cost.get(n, (0.0, ()))[1]}))
    if not victims:
        return None
    return _check(state, qv, job, victims, why, now, excluded, limits)


def _cheapest_on_node(
    state: ClusterState, n: int, runs: list[RunningJob], missing: int, lost: dict[int, float]
) -> tuple[float, tuple[int, ...]] | None:
    """The set of `runs` losing the least work that frees ≥ `missing` GPUs on node n.

    Taking the cheapest victims one by one can lose more than needed (two small jobs losing
    6 + 8 GPU-s instead of one larger job losing 8), so when one victim is not enough this
    solves the 0/1 knapsack over the GPUs freed (capped at `missing`, ≤ 62); ties go to
    fewer victims, then to the order below (least lost work, lowest priority, latest start).
    """
    if missing <= 0:
        return 0.0, ()
    ordered = sorted(
        runs, key=lambda r: (lost[r.request.id], r.request.priority, -r.start_s, r.request.id)
    )
    freed = {r.request.id: state.node_jobs[n][r.request.id].bit_count() for r in ordered}
    for run in ordered:  # the cheapest single victim that is enough is the best set
        if freed[run.request.id] >= missing:
            cheaper = [r for r in ordered if lost[r.request.id] < lost[run.request.id]]
            if sum(freed[r.request.id] for r in cheaper) < missing:
                return lost[run.request.id], (run.request.id,)
            break
    # best[k]: (lost work, victim count, victims) of the cheapest set freeing k GPUs.
    best: list[tuple[float, int, tuple[int, ...]] | None] = [None] * (missing + 1)
    best[0] = (0.0, 0, ())
    for run in ordered:
        gpus = freed[run.request.id]
        cost = lost[run.request.id]
        step = list(best)
        for k, entry in enumerate(best):
            if entry is None:
                continue
            to = min(missing, k + gpus)
            option = (entry[0] + cost, entry[1] + 1, (*entry[2], run.request.id))
            current = step[to]
            if current is None or option[:2] < current[:2]:
                step[to] = option
        best = step
    done = best[missing]
    return None if done is None else (done[0], done[2])


def _cheapest_nodes(
    state: ClusterState,
    job: JobRequest,
    cost: dict[int, tuple[float, tuple[int, ...]]],
    excluded: frozenset[int],
    limits: Mapping[int, int],
) -> list[int] | None:
    need = job.nodes
    if need == 1:
        n = min(cost, key=lambda n: (cost[n][0], n))
        return [n]
    g = job.gpus_per_node
    options = dict(cost)
    for r in {state.rack_of[n] for n in cost}:  # nodes already free cost nothing
        for n in state.rack_nodes[r]:
            if (
                n not in options
                and state.up[n]
                and n not in excluded
                and min(state.free[n], limits.get(n, g)) >= g
            ):
                options[n] = (0.0, ())
    by_rack: dict[int, list[int]] = {}
    for n in options:
        by_rack.setdefault(state.rack_of[n], []).append(n)
    best: tuple[float, list[int]] | None = None
    for members in by_rack.values():
        if len(members) >= need:
            picked = sorted(members, key=lambda n: (options[n][0], n))[:need]
            total = sum(options[n][0] for n in picked)
            if best is None or total < best[0]:
                best = (total, picked)
    if best is None and len(options) >= need:
        picked = sorted(options, key=lambda n: (options[n][0], state.rack_of[n], n))[:need]
        best = (sum(options[n][0] for n in picked), picked)
    return None if best is None else best[1]


def _check(
    state: ClusterState,
    qv: QuotaView,
    job: JobRequest,
    victims: tuple[int, ...],
    why: dict[int, str],
    now: float,
    excluded: frozenset[int],
    limits: Mapping[int, int],
) -> Preemption | None:
    """Trial: free the victims' GPUs, place the job, check its quota, undo."""
    runs = [state.running[v] for v in victims]
    for run in runs:
        state.give(run.placement)
        qv.add(run.request.team, -run.request.gpus)
    try:
        if place(state, job, Constraints(limits, excluded)) is None:
            return None
        if not qv.admit(job.team, job.gpus).ok:
            return None
    finally:
        for run in runs:
            state.take(run.placement)
            qv.add(run.request.team, run.request.gpus)
    lost = sum(run.lost_work(now) for run in runs)
    reasons = sorted({why[v] for v in victims})
    return Preemption(job.id, victims, lost, f"preempted for job {job.id}: {'; '.join(reasons)}")
