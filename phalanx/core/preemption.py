"""Victim choice: which running jobs to stop so a pending job can run, losing the least work.

A higher-priority job may preempt lower-priority preemptible jobs of its own team (or of any
team where teams have no quotas); a team reclaiming its nominal quota may preempt jobs of
cohort teams that are borrowing; a preemptive policy (`srtf`, `las`) may preempt jobs it
ranks lower. Exact minimum-loss victim choice is a knapsack problem; this picks, per node,
the cheapest victims that free enough GPUs, then the cheapest set of nodes in the smallest
domain (rack, block, cluster), and checks the result with a trial placement.
"""

from __future__ import annotations

from collections.abc import Iterable

from phalanx.core.decisions import Preemption
from phalanx.core.model import JobRequest, RunningJob
from phalanx.core.placement import Constraints, place
from phalanx.core.quota import QuotaView
from phalanx.core.state import ClusterState


def could_preempt(state: ClusterState, qv: QuotaView, job: JobRequest) -> bool:
    """A cheap test that victims might exist at all, to skip hopeless searches."""
    if state.policy.outranks is not None and state.running:
        return True
    if state.running_priorities and min(state.running_priorities) < job.priority:
        return True
    team = state.teams[job.team]
    if team.cohort is not None and qv.within_nominal(job.team, job.gpus):
        return any(qv.borrowing(t) for t in state.cohorts[team.cohort] if t != job.team)
    return False


def _why(state: ClusterState, qv: QuotaView, job: JobRequest, v: RunningJob, now: float) -> str:
    """Why `job` may preempt `v`, or '' if it may not."""
    victim = v.request
    if not victim.preemptible:
        return ""
    higher = victim.priority < job.priority
    policy_rank = (
        victim.priority == job.priority
        and state.policy.outranks is not None
        and state.policy.outranks(job, v, now)
    )
    mine, theirs = state.teams[job.team], state.teams[victim.team]
    same_team = victim.team == job.team
    unmanaged = mine.quota is None or theirs.quota is None
    if same_team or unmanaged:
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
) -> Preemption | None:
    """The cheapest victim set that lets `job` be placed, or None."""
    g = job.gpus_per_node
    teams: Iterable[str]
    cohort = state.teams[job.team].cohort
    if state.teams[job.team].quota is None:
        teams = state.team_running.keys()
    else:
        teams = {job.team, *(state.cohorts.get(cohort, ()) if cohort else ())}
        teams |= {t for t in state.team_running if state.teams[t].quota is None}
    why: dict[int, str] = {}
    per_node: dict[int, list[RunningJob]] = {}
    for team in teams:
        for vid in state.team_running.get(team, ()):
            if vid in taken:
                continue
            run = state.running[vid]
            reason = _why(state, qv, job, run, now)
            if not reason:
                continue
            why[vid] = reason
            for n, _ in run.placement.slots:
                per_node.setdefault(n, []).append(run)
    if not per_node:
        return None

    # Per node: the cheapest victims that leave ≥ g GPUs free there.
    cost: dict[int, tuple[float, tuple[int, ...]]] = {}
    for n, runs in per_node.items():
        if not state.up[n] or n in excluded or state.nodes[n].gpus < g:
            continue
        if job.gpu_model is not None and state.nodes[n].gpu_model != job.gpu_model:
            continue
        free = state.free[n]
        total, chosen = 0.0, []
        for run in sorted(runs, key=lambda r: (r.lost_work(now), r.request.priority, -r.start_s)):
            if free >= g:
                break
            free += state.node_jobs[n][run.request.id].bit_count()
            total += run.lost_work(now)
            chosen.append(run.request.id)
        if free >= g:
            cost[n] = (total, tuple(chosen))
    if not cost:
        return None
    nodes = _cheapest_nodes(state, job, cost, excluded)
    if nodes is None:
        return None
    victims = tuple(sorted({v for n in nodes for v in cost.get(n, (0.0, ()))[1]}))
    if not victims:
        return None
    return _check(state, qv, job, victims, why, now, excluded)


def _cheapest_nodes(
    state: ClusterState,
    job: JobRequest,
    cost: dict[int, tuple[float, tuple[int, ...]]],
    excluded: frozenset[int],
) -> list[int] | None:
    need = job.nodes
    if need == 1:
        n = min(cost, key=lambda n: (cost[n][0], n))
        return [n]
    g = job.gpus_per_node
    options = dict(cost)
    for r in {state.rack_of[n] for n in cost}:  # nodes already free cost nothing
        for n in state.rack_nodes[r]:
            if n not in options and state.up[n] and n not in excluded and state.free[n] >= g:
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
) -> Preemption | None:
    """Trial: free the victims' GPUs, place the job, check its quota, undo."""
    runs = [state.running[v] for v in victims]
    for run in runs:
        state.give(run.placement)
        qv.add(run.request.team, -run.request.gpus)
    try:
        if place(state, job, Constraints(excluded=excluded)) is None:
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
