"""Reservations for the blocked head job and the EASY-backfill rule that protects them.

The reservation is found by sweeping running jobs in order of expected end (start + time
limit; jobs being preempted end first, jobs without a limit never), together with the GPUs
the cycle itself has already given to jobs ahead (its starts, until their time limits), and
releasing their GPUs until the job's gang fits; the smallest domain that fits then (rack,
block, cluster) is reserved. A later job may start now only if it ends before the reservation
starts, or if on the reserved nodes it uses no more than their spare GPUs at that time.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from itertools import chain

from phalanx.core.decisions import Reservation
from phalanx.core.model import JobRequest, Placement
from phalanx.core.state import ClusterState


def _releases(
    state: ClusterState, now: float, held: Sequence[tuple[float, Placement]]
) -> Iterator[tuple[float, Placement]]:
    running, preempting = state.running, state.preempting
    for vid in sorted(preempting):
        yield now, running[vid].placement
    soon = sorted(((max(t, now), p) for t, p in held if t != math.inf), key=lambda e: e[0])
    if not soon:  # the common case: no merge (its key calls are the sweep's main cost)
        for end, jid in state.ends:
            if jid not in preempting:
                yield (end if end > now else now), running[jid].placement
    else:
        ends = (
            (max(end, now), running[jid].placement)
            for end, jid in state.ends
            if jid not in preempting
        )
        yield from heapq.merge(ends, soon, key=lambda e: e[0])
    for jid, run in state.running.items():
        if run.request.time_limit_s is None and jid not in state.preempting:
            yield math.inf, run.placement
    for t, p in held:
        if t == math.inf:
            yield t, p


def reserve(
    state: ClusterState,
    job: JobRequest,
    now: float,
    excluded: frozenset[int],
    held: Sequence[tuple[float, Placement]] = (),
) -> tuple[Reservation, dict[int, int]] | None:
    """The earliest reservation for `job` and the spare GPUs per reserved node, or None
    if it could not run even on an empty cluster.

    `held` are GPUs a cycle has taken in the state for jobs that are not running yet (its
    tentative starts), each with the time it will release them.
    """
    g, need = job.gpus_per_node, job.nodes
    model = job.gpu_model

    def usable(n: int) -> bool:
        return (
            state.up[n]
            and n not in excluded
            and (model is None or state.nodes[n].gpu_model == model)
            and state.nodes[n].gpus >= g
        )

    extra: dict[int, int] = {}  # node → GPUs freed so far by the sweep

    def free_then(n: int) -> int:
        return state.free[n] + extra.get(n, 0)

    if model is None and not excluded and g < len(state.cluster_ge):
        # Every up node with ≥ g free GPUs is usable: the indexes already count them.
        rack_q = [ge[g] for ge in state.rack_ge]
        total = state.cluster_ge[g]
    else:
        rack_q = [0] * len(state.rack_nodes)
        eligible_now = [n for n in _candidates(state, job) if usable(n) and state.free[n] >= g]
        for n in eligible_now:
            rack_q[state.rack_of[n]] += 1
        total = len(eligible_now)
    if total >= need:
        nodes = _choose(state, need, rack_q, extra, usable, g)
        return Reservation(job.id, now, tuple(nodes)), {n: free_then(n) - g for n in nodes}
    # The sweep is the hot loop of a blocked cycle: plain locals, no closures inside it.
    up, free, rack_of, nodes_ = state.up, state.free, state.rack_of, state.nodes
    if model is None and not excluded and not held and not state.preempting:
        # The common case, as `_releases` would sweep it without a generator step per
        # running job: jobs by expected end, then those without a limit (at inf).
        running = state.running
        no_limit = (
            (math.inf, jid) for jid, run in running.items() if run.request.time_limit_s is None
        )
        capacity = state.capacity_ge  # some up node has fewer than g GPUs:
        small = g >= len(capacity) or capacity[g] < capacity[0]
        for end, jid in chain(state.ends, no_limit):
            grew = False
            for n, mask in running[jid].placement.slots:
                if not up[n] or (small and nodes_[n].gpus < g):
                    continue
                before = free[n] + extra.get(n, 0)
                after = before + mask.bit_count()
                extra[n] = after - free[n]
                if before < g <= after:
                    rack_q[rack_of[n]] += 1
                    total += 1
                    grew = True
            if grew and total >= need:
                nodes = _choose(state, need, rack_q, extra, usable, g)
                spare = {n: free_then(n) - g for n in nodes}
                return Reservation(job.id, end if end > now else now, tuple(nodes)), spare
        return None
    for t, placement in _releases(state, now, held):
        grew = False
        for n, mask in placement.slots:
            if not up[n] or nodes_[n].gpus < g or n in excluded:
                continue
            if model is not None and nodes_[n].gpu_model != model:
                continue
            before = free[n] + extra.get(n, 0)
            after = before + mask.bit_count()
            extra[n] = after - free[n]
            if before < g <= after:
                rack_q[rack_of[n]] += 1
                total += 1
                grew = True
        if grew and total >= need:
            nodes = _choose(state, need, rack_q, extra, usable, g)
            spare = {n: free_then(n) - g for n in nodes}
            return Reservation(job.id, t, tuple(nodes)), spare
    return None


def _candidates(state: ClusterState, job: JobRequest) -> list[int]:
    """Nodes that may already have ≥ g free GPUs (from the free-count buckets)."""
    out: list[int] = []
    models = state.models if job.gpu_model is None else [job.gpu_model]
    for model in models:
        buckets = state.buckets.get(model)
        if buckets is None:
            continue
        for f in range(job.gpus_per_node, state.max_gpus + 1):
            if buckets[f]:
                out.extend(buckets[f])
    return out


def _choose(
    state: ClusterState,
    need: int,
    rack_q: list[int],
    extra: dict[int, int],
    usable: Callable[[int], bool],
    g: int,
) -> list[int]:
    """The nodes placement would pick at reservation time: tightest rack, block, cluster."""
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
    free, freed = state.free, extra.get
    for r in sorted(domains[0], key=lambda r: (-rack_q[r], r)):
        # Best fit: (free GPUs then, node) pairs sort as the nodes by that key would.
        nodes = [
            (then, n)
            for n in state.rack_nodes[r]
            if (then := free[n] + freed(n, 0)) >= g and usable(n)
        ]
        want = need - len(chosen)
        if want == 1:  # one node (a single-node job): the best, without sorting them all
            if nodes:
                chosen.append(min(nodes)[1])
        else:
            nodes.sort()
            chosen.extend(n for _, n in nodes[:want])
        if len(chosen) == need:
            break
    return chosen
