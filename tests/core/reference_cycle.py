"""Straightforward versions of the scheduling cycle's hot paths, kept for tests only.

They are the cycle as it was before the fast paths (one heap step per queued job, every job
through all phases, the reservation sweep over `heapq.merge` and node scans); the tests
check that `schedule`, `queue_order` and `reserve` decide exactly as these do — same
starts, placements, preemptions, reservation and reasons, in the same order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence

from phalanx.core import ClusterState, Decisions, JobRequest, Placement, Reason, ReasonCode
from phalanx.core.cycle import (
    DEFAULT_CONFIG,
    NO_NODE_UP,
    SchedulerConfig,
    _begin_reason,
    _consider,
    _Cycle,
    _dependency_reason,
    _preemption_possible,
)
from phalanx.core.decisions import Reservation
from phalanx.core.quota import QuotaView


def reference_queue_order(state: ClusterState, now: float) -> Iterator[JobRequest]:
    """The policy's merge of the team queues, one heap step per job."""
    policy = state.policy
    heap: list[tuple[tuple[float, ...], int, Iterator[tuple[tuple[float, ...], int]], float]] = []
    for index, (team, queue) in enumerate(sorted(state.queues.items())):
        if not queue:
            continue
        fairshare = state.fairshare(team, now) if policy.uses_fairshare else 0.0
        it = iter(queue)
        key, _ = next(it)
        heap.append((policy.merge_key(key, fairshare), index, it, fairshare))
    heapq.heapify(heap)
    pending = state.pending
    while heap:
        key, index, it, fairshare = heap[0]
        yield pending[int(key[-1])]
        nxt = next(it, None)
        if nxt is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (policy.merge_key(nxt[0], fairshare), index, it, fairshare))


def reference_schedule(
    state: ClusterState, now: float, config: SchedulerConfig = DEFAULT_CONFIG
) -> Decisions:
    """`schedule` with every examined job going through all of `_consider`'s phases."""
    cycle = _Cycle(state, now, config, QuotaView(state))
    cycle.preempt_possible = _preemption_possible(state, config)
    cycle.smallest_request = state.smallest_queued_request()
    cycle.shortest_limit = state.shortest_queued_limit()
    for job_id, dep in state.held.items():
        cycle.reasons[job_id] = _dependency_reason(dep, never=False)
    for job_id, dep in state.never.items():
        cycle.reasons[job_id] = _dependency_reason(dep, never=True)
    for begin_s, job_id in state.begins.irange((now, math.inf), inclusive=(False, True)):
        cycle.reasons[job_id] = _begin_reason(begin_s, now)
    if not state.gpus_up:
        return Decisions(
            starts=(),
            preemptions=(),
            reservation=None,
            reasons=cycle.reasons,
            team_reasons={},
            default_reason=NO_NODE_UP,
        )
    default = Reason(ReasonCode.PRIORITY, "waiting for jobs ahead of it")
    try:
        for examined, job in enumerate(reference_queue_order(state, now)):
            if examined >= config.depth:
                default = Reason(
                    ReasonCode.NOT_CONSIDERED,
                    f"not examined this cycle: only the first {config.depth} queued jobs are",
                )
                break
            stop = _consider(cycle, job)
            if cycle.untaken is not None:  # it started: its GPUs are taken at once
                state.take(cycle.untaken)
                cycle.untaken = None
            if stop is not None:
                default = stop
                break
    finally:
        for start in reversed(cycle.starts):
            state.give(start.placement)
        for _, hold in reversed(cycle.holds):
            state.give(hold)
    return Decisions(
        starts=tuple(cycle.starts),
        preemptions=tuple(cycle.preemptions),
        reservation=cycle.reservation,
        reasons=cycle.reasons,
        team_reasons={team: reason for team, (_, reason) in cycle.team_blocked.items()},
        default_reason=default,
    )


def _releases(
    state: ClusterState, now: float, held: Sequence[tuple[float, Placement]]
) -> Iterator[tuple[float, Placement]]:
    for vid in sorted(state.preempting):
        yield now, state.running[vid].placement
    ends = (
        (max(end, now), state.running[jid].placement)
        for end, jid in state.ends
        if jid not in state.preempting
    )
    soon = sorted(((max(t, now), p) for t, p in held if t != math.inf), key=lambda e: e[0])
    yield from heapq.merge(ends, soon, key=lambda e: e[0])
    for jid, run in state.running.items():
        if run.request.time_limit_s is None and jid not in state.preempting:
            yield math.inf, run.placement
    for t, p in held:
        if t == math.inf:
            yield t, p


def reference_reserve(
    state: ClusterState,
    job: JobRequest,
    now: float,
    excluded: frozenset[int],
    held: Sequence[tuple[float, Placement]] = (),
) -> tuple[Reservation, dict[int, int]] | None:
    """`backfill.reserve` scanning the nodes one by one."""
    g, need = job.gpus_per_node, job.nodes
    model = job.gpu_model

    def usable(n: int) -> bool:
        return (
            state.up[n]
            and n not in excluded
            and (model is None or state.nodes[n].gpu_model == model)
            and state.nodes[n].gpus >= g
        )

    extra: dict[int, int] = {}

    def free_then(n: int) -> int:
        return state.free[n] + extra.get(n, 0)

    rack_q = [0] * len(state.rack_nodes)
    candidates = [
        n
        for m in (state.models if model is None else [model])
        for f in range(g, state.max_gpus + 1)
        for n in state.buckets.get(m, [[]] * (state.max_gpus + 1))[f]
    ]
    eligible_now = [n for n in candidates if usable(n) and state.free[n] >= g]
    for n in eligible_now:
        rack_q[state.rack_of[n]] += 1
    total = len(eligible_now)
    if total >= need:
        nodes = _choose(state, need, rack_q, free_then, usable, g)
        return Reservation(job.id, now, tuple(nodes)), {n: free_then(n) - g for n in nodes}
    for t, placement in _releases(state, now, held):
        grew = False
        for n, mask in placement.slots:
            if not usable(n):
                continue
            before = free_then(n)
            extra[n] = before + mask.bit_count() - state.free[n]
            if before < g <= free_then(n):
                rack_q[state.rack_of[n]] += 1
                total += 1
                grew = True
        if grew and total >= need:
            nodes = _choose(state, need, rack_q, free_then, usable, g)
            return Reservation(job.id, t, tuple(nodes)), {n: free_then(n) - g for n in nodes}
    return None


def _choose(
    state: ClusterState,
    need: int,
    rack_q: list[int],
    free_then: Callable[[int], int],
    usable: Callable[[int], bool],
    g: int,
) -> list[int]:
    racks = [r for r, q in enumerate(rack_q) if q >= need]
    if racks:
        domains = [[min(racks, key=lambda r: (rack_q[r], r))]]
    else:
        blocks = [b for b, rs in enumerate(state.block_racks) if sum(rack_q[r] for r in rs) >= need]
        if blocks:
            best = min(blocks, key=lambda b: (sum(rack_q[r] for r in state.block_racks[b]), b))
            domains = [state.block_racks[best]]
        else:
            domains = [list(range(len(state.rack_nodes)))]
    chosen: list[int] = []
    for r in sorted(domains[0], key=lambda r: (-rack_q[r], r)):
        nodes = [n for n in state.rack_nodes[r] if usable(n) and free_then(n) >= g]
        nodes.sort(key=lambda n: (free_then(n), n))
        chosen.extend(nodes[: need - len(chosen)])
        if len(chosen) == need:
            break
    return chosen
