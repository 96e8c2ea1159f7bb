"""Hypothesis invariants of `schedule()` on random clusters, teams and queues, over a few
cycles each: no GPU double-booked, gangs all-or-nothing, quotas only passed by borrowing
idle cohort capacity, backfill never delays the reservation, the same input gives the same
decisions, and the cycle leaves the state as it found it."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phalanx.core import (
    ClusterState,
    Decisions,
    Dependency,
    DependencyKind,
    JobRequest,
    JobState,
    Node,
    Placement,
    ReasonCode,
    SchedulerConfig,
    StateError,
    Team,
    schedule,
)
from phalanx.core.backfill import reserve
from phalanx.core.placement import Constraints, excluded_indices, place

POLICY_NAMES = ("priority", "fifo", "sjf", "srtf", "las")
LIMITS = (None, 30.0, 100.0, 400.0, 1500.0)
CYCLE_S = 100.0
ENDINGS = (JobState.COMPLETED, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class Scenario:
    nodes: tuple[Node, ...]
    teams: tuple[Team, ...]
    policy: str
    jobs: tuple[tuple[int, JobRequest], ...]  # (cycle it is submitted in, request)
    cycles: int
    seed: int  # drives finishes, checkpoints, requeues and node failures between cycles
    config: SchedulerConfig


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    nodes: list[Node] = []
    for b in range(draw(st.integers(1, 2))):
        for r in range(draw(st.integers(1, 3))):
            for _ in range(draw(st.integers(1, 4))):
                nodes.append(
                    Node(
                        name=f"n{len(nodes)}",
                        gpus=draw(st.integers(1, 8)),
                        gpu_model=draw(st.sampled_from(("H100", "H100", "H100", "A100"))),
                        rack=f"r{r}",
                        block=f"b{b}",
                    )
                )
    widest = max(n.gpus for n in nodes)
    team_count = draw(st.integers(1, 4))
    teams = tuple(
        Team(
            name=f"t{k}",
            quota=draw(st.sampled_from((None, None, 0, 2, 4, 8, 16))),
            cohort=draw(st.sampled_from((None, "c0", "c0", "c0", "c1"))),
            borrowing_limit=draw(st.sampled_from((None, None, 0, 2, 8))),
        )
        for k in range(team_count)
    )
    cycles = draw(st.integers(1, 5))
    jobs: list[tuple[int, JobRequest]] = []
    for job_id in range(draw(st.integers(1, 36))):
        per_node = draw(st.sampled_from((1, 1, 2, 4, widest, draw(st.integers(1, 8)))))
        deps: tuple[Dependency, ...] = ()
        if job_id and draw(st.integers(0, 5)) == 0:
            deps = (
                Dependency(
                    draw(st.sampled_from(list(DependencyKind))),
                    draw(st.integers(0, job_id + 2)),  # may name a job that never exists
                ),
            )
        when = draw(st.integers(0, cycles - 1))
        # Later arrivals often rank higher, so running jobs get preempted.
        priority = draw(st.integers(0, 3)) + (when if draw(st.booleans()) else 0)
        jobs.append(
            (
                when,
                JobRequest(
                    id=job_id,
                    team=f"t{draw(st.integers(0, team_count))}",  # t<count>: unconfigured
                    priority=priority,
                    nodes=draw(st.sampled_from((1, 1, 1, 2, 3))),
                    gpus_per_node=per_node,
                    time_limit_s=draw(st.sampled_from(LIMITS)),
                    submit_s=0.0,
                    dependencies=deps,
                    dependency_any=draw(st.booleans()),
                    preemptible=draw(st.sampled_from((True, True, True, False))),
                    gpu_model=draw(st.sampled_from((None,) * 8 + ("H100", "A100"))),
                    duration_s=float(draw(st.integers(10, 2000))),
                    attained_s=float(draw(st.sampled_from((0, 0, 500, 5000)))),
                    exclude_nodes=frozenset(
                        {f"n{draw(st.integers(0, len(nodes)))}"}
                        if draw(st.integers(0, 5)) == 0
                        else ()
                    ),
                ),
            )
        )
    config = SchedulerConfig(
        backfill=draw(st.sampled_from((True, True, True, False))),
        preemption=draw(st.sampled_from((True, True, True, False))),
        depth=draw(st.sampled_from((10_000, 10_000, 5))),
        max_preemption_attempts=draw(st.sampled_from((8, 8, 1))),
    )
    return Scenario(
        tuple(nodes),
        teams,
        draw(st.sampled_from(POLICY_NAMES)),
        tuple(jobs),
        cycles,
        draw(st.integers(0, 2**32 - 1)),
        config,
    )


# ----------------------------------------------------------------- state snapshots


def snapshot(state: ClusterState) -> dict[str, Any]:
    """Everything a cycle could disturb, including the order of the free-GPU indexes
    (single-node best fit walks them in order, so their order is part of the state)."""
    return {
        "free_mask": list(state.free_mask),
        "free": list(state.free),
        "free_total": state.free_total,
        "gpus_up": state.gpus_up,
        "buckets": {m: [list(b) for b in bs] for m, bs in state.buckets.items()},
        "rack_ge": [list(g) for g in state.rack_ge],
        "block_ge": [list(g) for g in state.block_ge],
        "cluster_ge": list(state.cluster_ge),
        "capacity_ge": list(state.capacity_ge),
        "usage": dict(state.usage),
        "running": {j: (r.placement, r.start_s, r.checkpoint_s) for j, r in state.running.items()},
        "pending": dict(state.pending),
        "queues": {t: list(q) for t, q in state.queues.items()},
        "held": dict(state.held),
        "never": dict(state.never),
        "preempting": dict(state.preempting),
        "waiting_on": {j: set(v) for j, v in state.waiting_on.items()},
        "fairshare": dict(state._fairshare),
        "node_jobs": [dict(d) for d in state.node_jobs],
        "plain": dict(state.plain),
    }


def check_plain(state: ClusterState) -> None:
    """`state.plain` holds exactly the queued plain jobs (no begin time, GPU model,
    nodelist or exclusions), each with its time limit, shape keys and team."""
    expected = {}
    for job_id in state.queue_key:
        job = state.pending[job_id]
        plain = job.gpu_model is None and not job.exclude_nodes and not job.nodelist
        if plain and job.begin_s is None:
            limit = math.inf if job.time_limit_s is None else job.time_limit_s
            shape = (job.nodes, job.gpus_per_node)
            unlimited = job.time_limit_s is None
            expected[job_id] = (limit, (*shape, True), (*shape, unlimited), job.team)
    keys = state.shape_keys
    assert {j: (p[0], keys[p[1]], keys[p[2]], p[3]) for j, p in state.plain.items()} == expected
    assert all(state.shape_ids[key] == i for i, key in enumerate(keys))
    assert state.quota_teams == {t.name for t in state.teams.values() if t.quota is not None}


def check_masks(state: ClusterState) -> None:
    """Running jobs' GPUs are disjoint and exactly the GPUs that are not free."""
    busy = [0] * len(state.nodes)
    for run in state.running.values():
        for n, mask in run.placement.slots:
            assert busy[n] & mask == 0, f"GPU double-booked on {state.nodes[n].name}"
            busy[n] |= mask
    for n, node in enumerate(state.nodes):
        full = (1 << node.gpus) - 1
        assert busy[n] | state.free_mask[n] == full
        assert busy[n] & state.free_mask[n] == 0
        assert state.free[n] == state.free_mask[n].bit_count()


# ----------------------------------------------------------------- the checks of one cycle


def check_gangs(state: ClusterState, decisions: Decisions) -> None:
    """Every start is the whole gang, on free GPUs of distinct, usable nodes, and no two
    starts share a GPU."""
    taken = [0] * len(state.nodes)
    seen: set[int] = set()
    for start in decisions.starts:
        assert start.job_id not in seen
        seen.add(start.job_id)
        request = state.pending[start.job_id]
        assert start.job_id in state.queue_key, "a job held by a dependency started"
        assert start.job_id not in state.waiting_on
        slots = start.placement.slots
        assert len(slots) == request.nodes
        assert len({n for n, _ in slots}) == request.nodes
        excluded = excluded_indices(state, request)
        for n, mask in slots:
            assert mask.bit_count() == request.gpus_per_node
            assert state.up[n] and n not in excluded
            assert request.gpu_model in (None, state.nodes[n].gpu_model)
            assert mask & ~state.free_mask[n] == 0, "start on busy GPUs"
            assert mask & taken[n] == 0, "two starts share a GPU"
            taken[n] |= mask


def check_quotas(state: ClusterState, decisions: Decisions) -> None:
    """Replays the starts in order from the usage before the cycle: a team goes above its
    quota only in a cohort, within its borrowing limit, by no more than the idle quota of
    its cohort, and `borrowed` is exactly what it takes above its quota."""
    usage = dict(state.usage)
    for start in decisions.starts:
        request = state.pending[start.job_id]
        team = state.teams[request.team]
        gpus = request.gpus
        if team.quota is None:
            assert start.borrowed == 0
        else:
            used = usage.get(team.name, 0)
            over = used + gpus - team.quota
            if over <= 0:
                assert start.borrowed == 0
            else:
                assert team.cohort is not None, f"team {team.name} passed its quota alone"
                assert start.borrowed == min(gpus, over)
                if team.borrowing_limit is not None:
                    assert over <= team.borrowing_limit
                idle = max(0, team.quota - used) + sum(
                    max(0, (state.teams[m].quota or 0) - usage.get(m, 0))
                    for m in state.teams
                    if m != team.name and state.teams[m].cohort == team.cohort
                )
                assert gpus <= idle, f"team {team.name} borrowed GPUs its cohort does not have"
        usage[request.team] = usage.get(request.team, 0) + gpus


def check_preemptions(state: ClusterState, decisions: Decisions, now: float) -> None:
    started = {s.job_id for s in decisions.starts}
    starts_by_team: dict[str, int] = {}
    for s in decisions.starts:
        team = state.pending[s.job_id].team
        starts_by_team[team] = starts_by_team.get(team, 0) + state.pending[s.job_id].gpus
    victims_seen: set[int] = set()
    policy = state.policy
    for p in decisions.preemptions:
        request = state.pending[p.for_job]
        assert p.for_job not in started
        assert decisions.reason_for(request).code is ReasonCode.PREEMPTING
        assert p.victims and len(set(p.victims)) == len(p.victims)
        for v in p.victims:
            assert v not in victims_seen, "one victim given to two preemptors"
            victims_seen.add(v)
            assert v not in state.preempting
            run = state.running[v]
            victim = run.request
            assert victim.preemptible
            vteam, jteam = state.teams[victim.team], state.teams[request.team]
            borrowing = (
                vteam.quota is not None
                and state.usage[victim.team] + starts_by_team.get(victim.team, 0) > vteam.quota
            )
            assert (
                victim.priority < request.priority
                or (
                    victim.priority == request.priority
                    and policy.outranks is not None
                    and policy.outranks(request, run, now)
                )
                or (jteam.cohort is not None and jteam.cohort == vteam.cohort and borrowing)
            ), f"job {p.for_job} may not preempt job {v}"
        assert p.lost_work_gpu_s == sum(state.running[v].lost_work(now) for v in p.victims)


def check_reasons(state: ClusterState, decisions: Decisions, config: SchedulerConfig) -> None:
    started = {s.job_id for s in decisions.starts}
    for job_id, request in state.pending.items():
        if job_id in started:
            continue
        reason = decisions.reason_for(request)
        assert reason.message
        if job_id in state.held:
            assert reason.code is ReasonCode.DEPENDENCY
        elif job_id in state.never:
            assert reason.code is ReasonCode.DEPENDENCY_NEVER_SATISFIED
    r = decisions.reservation
    if r is not None:
        assert r.job_id not in started
        holder = decisions.reasons[r.job_id]
        assert holder.code is ReasonCode.RESOURCES and "GPUs reserved" in holder.message
        assert len(r.nodes) == state.pending[r.job_id].nodes
    elif config.backfill:
        # Without a reservation, no job may be blocked for resources (the first one would
        # hold the reservation); only jobs that could not run even on an empty cluster are
        # passed over: infeasible, or waiting for down or drained nodes.
        for job_id, reason in decisions.reasons.items():
            assert reason.code is not ReasonCode.RESOURCES, f"job {job_id} has no reservation"
            if reason.code not in (ReasonCode.INFEASIBLE, ReasonCode.NODES_UNAVAILABLE):
                continue
            request = state.pending[job_id]
            excluded = excluded_indices(state, request)
            fit = [
                n
                for n, node in enumerate(state.nodes)
                if n not in excluded
                and node.gpus >= request.gpus_per_node
                and request.gpu_model in (None, node.gpu_model)
            ]
            usable = sum(1 for n in fit if state.up[n])
            assert usable < request.nodes, f"job {job_id} is not short of nodes"
            # Waiting for nodes exactly when the down or drained ones would be enough.
            waits = reason.code is ReasonCode.NODES_UNAVAILABLE
            assert waits == (len(fit) >= request.nodes), f"job {job_id}: {reason}"


def apply_and_check(state: ClusterState, decisions: Decisions, now: float) -> None:
    """Apply the starts (the state itself refuses busy GPUs), then check that the
    reservation did not move later and that each preemption's job fits once its victims
    are gone."""
    for start in decisions.starts:
        state.start(start.job_id, start.placement, now, start.borrowed)
    check_masks(state)
    check_plain(state)
    for run in state.running.values():
        assert len(run.placement.slots) == run.request.nodes
        for _, mask in run.placement.slots:
            assert mask.bit_count() == run.request.gpus_per_node
    r = decisions.reservation
    if r is not None:
        holder = state.pending[r.job_id]
        again = reserve(state, holder, now, excluded_indices(state, holder))
        assert again is not None
        assert again[0].start_s <= r.start_s, "backfill delayed the reservation"
    for p in decisions.preemptions:
        request = state.pending[p.for_job]
        runs = [state.running[v] for v in p.victims]
        for run in runs:
            state.give(run.placement)
        try:
            excluded = excluded_indices(state, request)
            fits = place(state, request, Constraints(excluded=excluded)) is not None
        finally:
            for run in runs:
                state.take(run.placement)
        assert fits, f"preempting {p.victims} does not make room for job {p.for_job}"
        for v in p.victims:
            state.mark_preempting(v, p.for_job)


# ----------------------------------------------------------------- driving the cycles


class Driver:
    """Builds the state of a scenario and moves it from cycle to cycle the same way every
    time (so two drivers of one scenario must see the same decisions)."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.state = ClusterState(sc.nodes, sc.teams, policy=sc.policy)
        self.rng = random.Random(sc.seed)

    def before_cycle(self, k: int) -> float:
        now = k * CYCLE_S
        state, rng = self.state, self.rng
        for job_id, run in sorted(state.running.items()):
            if job_id in state.preempting:
                if rng.random() < 0.6:
                    state.requeue(job_id, now)  # the victim checkpointed and exited
            elif run.expected_end_s <= now or rng.random() < 0.1:
                state.finish(job_id, now, rng.choice(ENDINGS))
            elif rng.random() < 0.4:
                state.checkpoint(job_id, rng.uniform(run.start_s, now))
        if k and rng.random() < 0.3:
            node = rng.choice(state.nodes)
            state.set_node_up(node.name, not state.up[state.node_index[node.name]], "test")
        for when, request in self.sc.jobs:
            if when == k:
                state.submit(replace(request, submit_s=now + request.id * 1e-3), now)
        if k and rng.random() < 0.1 and state.pending:
            state.finish(rng.choice(sorted(state.pending)), now, JobState.CANCELLED)
        return now


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios())
def test_cycle_invariants(sc: Scenario) -> None:
    main, twin = Driver(sc), Driver(sc)
    for k in range(sc.cycles):
        now = main.before_cycle(k)
        assert twin.before_cycle(k) == now
        state = main.state
        before = snapshot(state)
        decisions = schedule(state, now, sc.config)
        assert snapshot(state) == before, "schedule() changed the state"
        assert schedule(state, now, sc.config) == decisions, "a second call decided otherwise"
        twin_decisions = schedule(twin.state, now, sc.config)
        assert twin_decisions == decisions, "an identical state got other decisions"
        check_gangs(state, decisions)
        check_quotas(state, decisions)
        check_preemptions(state, decisions, now)
        check_reasons(state, decisions, sc.config)
        apply_and_check(state, decisions, now)
        for start in twin_decisions.starts:
            twin.state.start(start.job_id, start.placement, now, start.borrowed)
        for p in twin_decisions.preemptions:
            for v in p.victims:
                twin.state.mark_preempting(v, p.for_job)
        check_masks(state)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.data())
def test_take_refuses_busy_gpus(gpus: int, data: st.DataObject) -> None:
    """The state itself never double-books: taking a busy GPU raises and changes nothing,
    even when other slots of the same placement are free."""
    state = ClusterState([Node("n0", gpus), Node("n1", gpus)])
    masks = st.integers(1, (1 << gpus) - 1)
    first, second, other = data.draw(masks), data.draw(masks), data.draw(masks)
    state.take(Placement(((0, first),)))
    before = snapshot(state)
    if first & second:
        with pytest.raises(StateError):
            state.take(Placement(((1, other), (0, second))))
        assert snapshot(state) == before
    else:
        state.take(Placement(((1, other), (0, second))))
        assert state.free_mask[0] == ((1 << gpus) - 1) & ~(first | second)
    check_masks_free_only(state, gpus)


def check_masks_free_only(state: ClusterState, gpus: int) -> None:
    for n in range(len(state.nodes)):
        assert state.free[n] == state.free_mask[n].bit_count()
    assert state.free_total == sum(state.free)
