"""One scheduling cycle: `schedule(state, now) -> Decisions`, pure and deterministic.

The cycle reads the state, tries placements on it and undoes them before returning, so the
state is unchanged; the caller applies the decisions.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache

from sortedcontainers import SortedList

from phalanx.core.backfill import reserve
from phalanx.core.decisions import (
    Decisions,
    Preemption,
    Reason,
    ReasonCode,
    Reservation,
    Start,
)
from phalanx.core.model import Dependency, JobRequest, Placement
from phalanx.core.placement import UNCONSTRAINED, Constraints, excluded_indices, place
from phalanx.core.policies import StaticKey
from phalanx.core.preemption import VictimPool, choose_victims, could_preempt
from phalanx.core.quota import QuotaView
from phalanx.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Knobs of the cycle. `depth` bounds the jobs examined per cycle (like Slurm's
    bf_max_job_test); `max_preemption_attempts` bounds victim searches per cycle."""

    backfill: bool = True
    preemption: bool = True
    depth: int = 10_000
    max_preemption_attempts: int = 8


DEFAULT_CONFIG = SchedulerConfig()


@dataclass(slots=True)
class _Cycle:
    """Scratch state of one cycle: tentative starts (to undo) and what was learned."""

    state: ClusterState
    now: float
    config: SchedulerConfig
    quota: QuotaView
    starts: list[Start] = field(default_factory=list)
    # The last start's placement while not yet taken in the state: taken only if another
    # job is examined after it (`_examine`), so a cycle that ends with a start — the
    # common case on a lightly loaded cluster — takes and gives back one placement less.
    untaken: Placement | None = None
    preemptions: list[Preemption] = field(default_factory=list)
    reasons: dict[int, Reason] = field(default_factory=dict)
    taken_victims: set[int] = field(default_factory=set)
    preemption_attempts: int = 0
    reservation: Reservation | None = None
    spare: dict[int, int] = field(default_factory=dict)
    spare_only: Constraints | None = None  # Constraints(spare), for jobs without exclusions
    failed_shapes: dict[bool, list[tuple[int, int]]] = field(
        default_factory=lambda: {False: [], True: []}
    )
    team_blocked: dict[str, tuple[int, Reason]] = field(default_factory=dict)
    pool: VictimPool | None = None  # built on the first preemption test of the cycle
    # Free GPUs kept for jobs whose victims have not all exited yet, with when each such
    # job will release them (so later jobs cannot take what a preemption freed).
    holds: list[tuple[float, Placement]] = field(default_factory=list)
    preempt_failed: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    reason_memo: dict[tuple[int, int, bool], Reason] = field(default_factory=dict)
    # Facts about the queue that cannot change during a cycle (only running jobs start).
    preempt_possible: bool = False
    smallest_request: int = 0
    shortest_limit: float = 0.0
    nothing_fits: bool | None = None  # cached verdict of _stop_if_nothing_fits
    capable: dict[int, int] = field(default_factory=dict)  # g → nodes with ≥g GPUs, up or not
    # (nodes, GPUs per node, limited) → whether a plain job of that shape is feasible and
    # already known not to fit (see `_settled_reason`); cleared when a shape fails.
    settled: dict[tuple[int, int, bool], bool] = field(default_factory=dict)
    # The reasons of settled shapes: `reason_memo`'s entries for them, cleared with it.
    # (Keyed by the shape key's id in `ClusterState.shape_keys`.)
    settled_reasons: dict[int, Reason] = field(default_factory=dict)

    def known_to_fail(self, job: JobRequest, limited: bool) -> bool:
        nodes, per_node = job.nodes, job.gpus_per_node
        # A plain loop, not any() over a generator: the list is usually empty or short.
        for n, g in self.failed_shapes[limited]:  # noqa: SIM110 (hot: see above)
            if nodes >= n and per_node >= g:
                return True
        return False

    def remember_failure(self, job: JobRequest, limited: bool) -> None:
        if job.gpu_model is None and not job.exclude_nodes and not job.nodelist:
            shape = (job.nodes, job.gpus_per_node)
            if shape not in self.failed_shapes[limited]:
                self.failed_shapes[limited].append(shape)
                self.nothing_fits = None  # to be re-derived
                self.settled.clear()


# Waiting, not infeasible: the job runs as soon as a node is resumed or comes back.
NO_NODE_UP = Reason(
    ReasonCode.NODES_UNAVAILABLE,
    "no node with GPUs is up: every node is down or drained; it waits for one to come back",
)


WAITING = Reason(ReasonCode.PRIORITY, "waiting for jobs ahead of it")


@lru_cache(maxsize=64)
def _beyond_depth(depth: int) -> Reason:
    """The reason of the jobs beyond the depth (made once per depth, not per cycle)."""
    return Reason(
        ReasonCode.NOT_CONSIDERED,
        f"not examined this cycle: only the first {depth} queued jobs are",
    )


def schedule(
    state: ClusterState, now: float, config: SchedulerConfig = DEFAULT_CONFIG
) -> Decisions:
    cycle = _Cycle(state, now, config, QuotaView(state))
    cycle.preempt_possible = _preemption_possible(state, config)
    cycle.smallest_request = state.smallest_queued_request()
    cycle.shortest_limit = state.shortest_queued_limit()
    # Phase 1 — dependencies: the state re-evaluates them on every job transition; jobs
    # still waiting (or never satisfiable) are not in the team queues, only given reasons.
    for job_id, dep in state.held.items():
        cycle.reasons[job_id] = _dependency_reason(dep, never=False)
    for job_id, dep in state.never.items():
        cycle.reasons[job_id] = _dependency_reason(dep, never=True)
    # Jobs whose --begin time is still ahead wait for it, whatever else holds them (said
    # up front: a cycle that stops early never reaches them).
    if state.begins:  # (irange on an empty SortedList still costs microseconds)
        for begin_s, job_id in state.begins.irange((now, math.inf), inclusive=(False, True)):
            cycle.reasons[job_id] = _begin_reason(begin_s, now)
    if not state.gpus_up:
        # No node with a GPU is up: every queued job waits for one. Said once, as the
        # default, rather than found job by job (10,000 queued jobs took ~35 ms a cycle).
        return Decisions(
            starts=(),
            preemptions=(),
            reservation=None,
            reasons=cycle.reasons,
            team_reasons={},
            default_reason=NO_NODE_UP,
        )
    default = WAITING
    try:
        # Phase 2 — order: merge the team queues by the policy's key (runs of one team).
        stop = _examine(cycle, _queue_runs(state, now))
        if stop is not None:
            default = stop
    finally:
        taken = cycle.starts if cycle.untaken is None else cycle.starts[:-1]
        for start in reversed(taken):
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


def decides_nothing(state: ClusterState, config: SchedulerConfig = DEFAULT_CONFIG) -> bool:
    """Whether a cycle now would certainly start and preempt nothing, known in O(1): no
    node has as many free GPUs as the smallest queued request, so no queued job fits even
    alone, and no preemption is possible. Its reasons still differ from cycle to cycle: for
    adapters that apply only the decisions (the simulator skips such cycles)."""
    smallest = state.smallest_queued_request()
    if not smallest or (smallest < len(state.cluster_ge) and state.cluster_ge[smallest]):
        return False
    return not _preemption_possible(state, config)


def _consider(cycle: _Cycle, job: JobRequest) -> Reason | None:
    """Phases 3–7 for one job; returns the reason for every later job if the cycle stops."""
    state, now = cycle.state, cycle.now
    if job.begin_s is not None and job.begin_s > now:
        return None  # not yet: its BeginTime reason was given in phase 1
    excluded = excluded_indices(state, job) if job.exclude_nodes or job.nodelist else frozenset()
    limited = cycle.reservation is not None and not _ends_before(job, now, cycle.reservation)
    constraints = _constraints(cycle, excluded, limited)
    if job.id in state.waiting_on:
        _hold(cycle, job, tuple(state.waiting_on[job.id]), constraints, limited)
        cycle.reasons[job.id] = Reason(
            ReasonCode.PREEMPTING,
            f"waiting for {len(state.waiting_on[job.id])} preempted job(s) to checkpoint and exit",
        )
        return None
    # Phase 3 — quota: within the team's nominal quota, or borrowing idle cohort GPUs.
    blocked = cycle.team_blocked.get(job.team)
    if blocked is not None and job.gpus >= blocked[0]:
        cycle.reasons[job.id] = blocked[1]
        return None
    admission = cycle.quota.admit(job.team, job.gpus)
    if not admission.ok:
        assert admission.reason is not None
        # Stopping lower-ranked jobs of its own team (or borrowed GPUs of its cohort) may
        # bring the team back within its quota; the victim trial re-checks the quota.
        if (
            cycle.preempt_possible
            and _infeasible(state, job, cycle.capable) is None
            and _preempt(cycle, job, excluded, constraints, limited)
        ):
            return None
        if blocked is None or job.gpus < blocked[0]:
            cycle.team_blocked[job.team] = (job.gpus, admission.reason)
        cycle.reasons[job.id] = admission.reason
        return None
    infeasible = _infeasible(state, job, cycle.capable)
    if infeasible is not None:
        cycle.reasons[job.id] = infeasible
        return None
    # Phase 4 — gang, topology-aware placement (respecting a reservation, if any).
    placement: Placement | None = None
    if not cycle.known_to_fail(job, limited):
        placement = place(state, job, constraints)
        if placement is None:
            cycle.remember_failure(job, limited)
    if placement is not None:
        cycle.untaken = placement  # `_examine` takes it before examining another job
        cycle.reason_memo.clear()
        cycle.settled_reasons.clear()
        cycle.quota.add(job.team, job.gpus)
        if limited:
            _use_spare(cycle, placement)
        cycle.starts.append(
            Start(job.id, placement, admission.borrowed, backfilled=cycle.reservation is not None)
        )
        return _stop_if_full(cycle, placement.slots)
    # Phase 5 — preemption: free a fitting placement from lower-ranked jobs.
    if cycle.preempt_possible and _preempt(cycle, job, excluded, constraints, limited):
        return None
    # Phase 6 — reservation for the first blocked job, then EASY backfill behind it.
    if cycle.reservation is None:
        if not cycle.config.backfill:
            cycle.reasons[job.id] = _resources_reason(state, job)
            return Reason(
                ReasonCode.PRIORITY,
                f"waiting behind job {job.id}, which needs {job.shape} (no backfill)",
            )
        found = reserve(state, job, now, excluded, _held(cycle))
        if found is None:  # not even with every running job gone
            cycle.reasons[job.id] = _never_fits_reason(state, job, excluded)
            return None
        cycle.reservation, cycle.spare = found
        cycle.nothing_fits = None
        when = "when jobs without a time limit end"
        if found[0].start_s != float("inf"):
            when = f"at t={found[0].start_s:.0f}s, in {found[0].start_s - now:.0f}s"
        # Slurm's name for the job next in line waiting on busy GPUs; the message says
        # when its reserved GPUs free up.
        cycle.reasons[job.id] = Reason(
            ReasonCode.RESOURCES,
            f"{_resources_reason(state, job).message}; GPUs reserved {when} "
            "(from running jobs' time limits)",
        )
        return _stop_if_full(cycle)
    # Phase 7 — reasons for a job that neither started nor reserved.
    cycle.reasons[job.id] = _blocked_reason(cycle, job, limited, excluded)
    return _stop_if_nothing_fits(cycle)


def _examine(cycle: _Cycle, runs: Iterator[tuple[SortedList, int, int]]) -> Reason | None:
    """Phases 3–7 for the queued jobs in order, up to the depth; returns the reason for
    every later job if the cycle stops early."""
    state, depth = cycle.state, cycle.config.depth
    pending, waiting_on, reasons = state.pending, state.waiting_on, cycle.reasons
    plain_jobs, shape_keys = state.plain, state.shape_keys
    now, settled_shapes, reason_memo = cycle.now, cycle.settled, cycle.reason_memo
    settled_reasons = cycle.settled_reasons
    examined = 0
    untaken = False  # whether cycle.untaken is set
    settling = False  # behind a reservation with no preemption left to try
    horizon = math.inf  # the reservation's start, once settling
    # Teams whose jobs pass phase 3 without a quota check (teams do not change in a cycle).
    quota_teams = state.quota_teams
    # While settling, with no start to take, no preemptor waiting and no team with a quota,
    # a plain job's settled reason is all the loop has to find (the first test below).
    plain_only = not waiting_on and not quota_teams
    fast = False
    beyond_depth = _beyond_depth(depth)
    for queue, first, stop_at in runs:  # runs are never empty
        if examined >= depth:
            return beyond_depth
        last = min(stop_at, first + depth - examined)
        examined += last - first
        for _, job_id in _run_items(queue, first, last):
            if fast:  # the hot loop: as the settled path below, with its tests already met
                plain = plain_jobs.get(job_id)
                if plain is not None:
                    reason = settled_reasons.get(
                        plain[2] if now + plain[0] <= horizon else plain[1]
                    )
                    if reason is not None:
                        reasons[job_id] = reason
                        if cycle.nothing_fits is not False:
                            stop = _stop_if_nothing_fits(cycle)
                            if stop is not None:
                                return stop
                        continue
            if untaken:  # the previous job started: take its GPUs before looking further
                assert cycle.untaken is not None
                state.take(cycle.untaken)
                cycle.untaken = None
                untaken = False
                fast = settling and plain_only
            # Behind a reservation most jobs only get the reason their shape already has:
            # found without the phases (the backfill scan of a long queue is the hot loop
            # of a busy cluster). Plain jobs only, for which nothing else can differ; the
            # state keeps what this needs of each plain queued job (`ClusterState.plain`).
            if settling:
                plain = plain_jobs.get(job_id)
                if (
                    plain is not None
                    and job_id not in waiting_on
                    and (not quota_teams or plain[3] not in quota_teams)
                ):
                    # Settled (see `_settled`): the reason of its shape, nothing else.
                    # `limited` as in `_ends_before` (a job without a limit has inf and
                    # the same key both ways).
                    shape_id = plain[2] if now + plain[0] <= horizon else plain[1]
                    reason = settled_reasons.get(shape_id)
                    if reason is None:
                        key = shape_keys[shape_id]
                        job = pending[job_id]
                        limited = key[2]
                        settled = settled_shapes.get(key)
                        if settled is None:
                            settled = _settled(cycle, job, limited)
                        if settled:
                            reason = reason_memo.get(key)
                            if reason is None:
                                reason = _blocked_reason(cycle, job, limited, frozenset())
                            settled_reasons[shape_id] = reason
                    if reason is not None:
                        reasons[job_id] = reason
                        if cycle.nothing_fits is not False:
                            stop = _stop_if_nothing_fits(cycle)
                            if stop is not None:
                                return stop
                        continue
            job = pending[job_id]
            stop = _consider(cycle, job)
            if stop is not None:
                return stop
            untaken = cycle.untaken is not None
            settling = cycle.reservation is not None and not _preemption_left(cycle)
            if settling:
                assert cycle.reservation is not None
                horizon = cycle.reservation.start_s
            fast = settling and not untaken and plain_only
        if last < stop_at:
            return beyond_depth
    return None


def _settled(cycle: _Cycle, job: JobRequest, limited: bool) -> bool:
    """For a plain job (no begin time, GPU model, nodelist or exclusions; a team without a
    quota) behind the reservation, when no preemption is left to try: whether its shape is
    feasible and already failed to fit this cycle (with the reservation's limits or
    without, as for this job). Such a job neither starts, preempts nor changes the cycle:
    phases 3–6 do nothing for it and phase 7 gives it the memoised reason of its shape.
    Cached per shape in `cycle.settled` until another shape fails."""
    settled = _infeasible(cycle.state, job, cycle.capable) is None and cycle.known_to_fail(
        job, limited
    )
    cycle.settled[job.nodes, job.gpus_per_node, limited] = settled
    return settled


def _constraints(cycle: _Cycle, excluded: frozenset[int], limited: bool) -> Constraints:
    if limited:
        if excluded:
            return Constraints(cycle.spare, excluded)
        spare = cycle.spare_only  # made once per reservation (it reads `spare` live)
        if spare is None or spare.limits is not cycle.spare:
            spare = cycle.spare_only = Constraints(cycle.spare)
        return spare
    return Constraints(excluded=excluded) if excluded else UNCONSTRAINED


def _preempt(
    cycle: _Cycle,
    job: JobRequest,
    excluded: frozenset[int],
    constraints: Constraints,
    limited: bool,
) -> bool:
    """Phase 5: choose victims for `job` and keep the free GPUs it will need; True if so."""
    if not _may_try_preemption(cycle, job):
        return False
    assert cycle.pool is not None
    cycle.preemption_attempts += 1
    preemption = choose_victims(
        cycle.state,
        cycle.quota,
        job,
        cycle.now,
        cycle.taken_victims | cycle.state.preempting.keys(),
        excluded,
        cycle.pool,
        cycle.spare if limited else None,  # stay off GPUs reserved for a job ahead
    )
    if preemption is None:
        # Later jobs of this team rank no higher, so a larger gang cannot do better.
        cycle.preempt_failed.setdefault(job.team, []).append((job.nodes, job.gpus_per_node))
        return False
    cycle.preemptions.append(preemption)
    cycle.taken_victims.update(preemption.victims)
    _hold(cycle, job, preemption.victims, constraints, limited)
    cycle.reasons[job.id] = Reason(
        ReasonCode.PREEMPTING,
        f"preempting {len(preemption.victims)} job(s) to make room; it starts when "
        "they have checkpointed and exited",
    )
    return True


def _hold(
    cycle: _Cycle,
    job: JobRequest,
    victims: tuple[int, ...],
    constraints: Constraints,
    limited: bool,
) -> None:
    """Keep, for the rest of the cycle, the free GPUs `job` will use once `victims` exit.

    Without this a later job could take GPUs a preemption freed (even the victim itself,
    requeued), and the preempting job would find no room when its last victim exits.
    """
    state = cycle.state
    runs = [state.running[v] for v in victims if v in state.running]
    for run in runs:
        state.give(run.placement)
    try:
        target = place(state, job, constraints)
    finally:
        for run in runs:
            state.take(run.placement)
    if target is None:
        return
    free = tuple((n, mask & state.free_mask[n]) for n, mask in target.slots)
    hold = Placement(tuple((n, mask) for n, mask in free if mask))
    if limited:
        _use_spare(cycle, target)
    if not hold.slots:
        return
    state.take(hold)
    cycle.reason_memo.clear()
    cycle.settled_reasons.clear()
    cycle.holds.append((_release_time(cycle.now, job), hold))


def _held(cycle: _Cycle) -> list[tuple[float, Placement]]:
    """The GPUs this cycle took in the state, with when their jobs will release them."""
    held = list(cycle.holds)
    for start in cycle.starts:
        held.append((_release_time(cycle.now, cycle.state.pending[start.job_id]), start.placement))
    return held


def _release_time(now: float, job: JobRequest) -> float:
    """When a job started now gives its GPUs back at the latest (its time limit)."""
    return math.inf if job.time_limit_s is None else now + job.time_limit_s


def _use_spare(cycle: _Cycle, placement: Placement) -> None:
    """A job that may not delay the reservation used some of its nodes' spare GPUs."""
    for n, mask in placement.slots:
        if n in cycle.spare:
            cycle.spare[n] -= mask.bit_count()


def _blocked_reason(
    cycle: _Cycle, job: JobRequest, limited: bool, excluded: frozenset[int]
) -> Reason:
    """Why a job that passed its quota still cannot start; memoised per shape (a shape's
    answer only changes when this cycle starts another job, which clears the memo)."""
    simple = job.gpu_model is None and not excluded
    key = (job.nodes, job.gpus_per_node, limited)
    if simple and key in cycle.reason_memo:
        return cycle.reason_memo[key]
    state = cycle.state
    reason = _resources_reason(state, job)
    if limited and cycle.reservation is not None:
        fits = not cycle.known_to_fail(job, False) and (
            place(state, job, Constraints(excluded=excluded) if excluded else UNCONSTRAINED)
            is not None
        )
        if fits:
            limit = job.time_limit_s
            reason = Reason(
                ReasonCode.BACKFILL_WOULD_DELAY,
                f"fits now, but with a time limit of "
                f"{'none' if limit is None else f'{limit:.0f}s'} it would delay job "
                f"{cycle.reservation.job_id}, which has GPUs reserved",
            )
    if simple:
        cycle.reason_memo[key] = reason
    return reason


def _stop_if_nothing_fits(cycle: _Cycle) -> Reason | None:
    """Stop when the smallest queued request already failed both with and without the
    reservation's limits: every later job asks for at least as much."""
    if cycle.nothing_fits is False:  # nothing learned since the last look
        return None
    reservation = cycle.reservation
    smallest = cycle.smallest_request

    def failed(limited: bool) -> bool:
        return any(n == 1 and g <= smallest for n, g in cycle.failed_shapes[limited])

    unlimited = failed(False) or (
        reservation is not None and cycle.now + cycle.shortest_limit > reservation.start_s
    )  # no queued job is short enough to run unconstrained before the reservation
    limited = reservation is None or failed(True)
    cycle.nothing_fits = unlimited and limited
    if unlimited and limited and not _preemption_left(cycle):
        return Reason(
            ReasonCode.RESOURCES,
            "no free GPU can take another job now (all in use or reserved for jobs ahead)",
        )
    return None


def _may_try_preemption(cycle: _Cycle, job: JobRequest) -> bool:
    if not _preemption_left(cycle):
        return False
    failed = cycle.preempt_failed.get(job.team, ())
    if any(job.nodes >= n and job.gpus_per_node >= g for n, g in failed):
        return False
    if not could_preempt(cycle.state, cycle.quota, job, cycle.pool):
        return False
    if cycle.pool is None:  # built once per cycle, only when a search will run
        cycle.pool = VictimPool.build(cycle.state, cycle.now)
        return could_preempt(cycle.state, cycle.quota, job, cycle.pool)
    return True


def _stop_if_full(cycle: _Cycle, taking: tuple[tuple[int, int], ...] = ()) -> Reason | None:
    """Stop early when nothing more can start: no free GPU and no preemption left to try.
    `taking`: the slots of a start not yet taken in the state (`_Cycle.untaken`)."""
    free = cycle.state.free_total
    for _, mask in taking:
        free -= mask.bit_count()
    if free > 0 or _preemption_left(cycle):
        return None
    return Reason(ReasonCode.RESOURCES, "all GPUs are in use or reserved for jobs ahead of it")


def _preemption_left(cycle: _Cycle) -> bool:
    """Whether a later job might still preempt, so the cycle must go on."""
    return (
        cycle.preempt_possible and cycle.preemption_attempts < cycle.config.max_preemption_attempts
    )


def _preemption_possible(state: ClusterState, config: SchedulerConfig) -> bool:
    """Whether any queued job could preempt anything this cycle."""
    if not config.preemption or not state.running_priorities:
        return False
    return (
        state.policy.preemptive
        or max(state.queued_priorities, default=0) > min(state.running_priorities)
        # A team in a cohort (`set_team` lists each under its cohort; usually none).
        or any(state.cohorts.values())
    )


def _ends_before(job: JobRequest, now: float, reservation: Reservation) -> bool:
    return job.time_limit_s is not None and now + job.time_limit_s <= reservation.start_s


def queue_order(state: ClusterState, now: float) -> Iterator[JobRequest]:
    """The eligible queued jobs in the order a cycle at `now` considers them (the
    policy's merge of the team queues); `phalanx priority` shows it."""
    pending = state.pending
    for queue, first, stop in _queue_runs(state, now):
        for _, job_id in _run_items(queue, first, stop):
            yield pending[job_id]


def _run_items(queue: SortedList, first: int, stop: int) -> Iterable[tuple[StaticKey, int]]:
    """Positions first..stop-1 of a team queue (SortedList.islice costs ~5 µs to set up:
    a whole queue or one job, the common runs, go without it)."""
    items: Iterable[tuple[StaticKey, int]]
    if stop - first == 1:
        items = (queue[first],)
    elif first == 0 and stop == len(queue):
        items = queue
    else:
        items = queue.islice(first, stop)
    return items


def _queue_runs(state: ClusterState, now: float) -> Iterator[tuple[SortedList, int, int]]:
    """The merge of the team queues by the policy's `merge_key`, as runs: (queue, first,
    stop) — positions first..stop-1 of one team's queue come next, in order.

    A team's queue is sorted by its static key and `merge_key` keeps that order, so the
    jobs of the team at the top of the merge stay next for as long as their merged key is
    below every other team's head: that run's end is one bisection (`merge_bound`) instead
    of one heap step per job — under fair share a team's whole queue is usually one run."""
    policy = state.policy
    merge = policy.merge_key
    # (merged key of the team's next job, team index, position, queue, fair share). The job
    # id is the key's last element, so merged keys are unique and never tie.
    heap: list[tuple[tuple[float, ...], int, int, SortedList, float]] = []
    queued = [(team, queue) for team, queue in state.queues.items() if queue]
    if len(queued) == 1:  # one team's queue: all of it, no merge keys to compute
        yield queued[0][1], 0, len(queued[0][1])
        return
    queued.sort(key=_first)  # by team name (the heap's tie-break; keys never tie)
    for index, (team, queue) in enumerate(queued):
        fairshare = state.fairshare(team, now) if policy.uses_fairshare else 0.0
        heap.append((merge(queue[0][0], fairshare), index, 0, queue, fairshare))
    heapq.heapify(heap)
    while heap:
        _, index, first, queue, fairshare = heapq.heappop(heap)
        size = len(queue)
        if not heap:
            yield queue, first, size
            return
        # The team's jobs whose merged key is below the next team's head come next.
        high = queue.bisect_left(policy.merge_bound(heap[0][0], fairshare))
        high = max(high, first + 1)  # the team's head is below the bound (heap order)
        yield queue, first, high
        if high < size:
            heapq.heappush(heap, (merge(queue[high][0], fairshare), index, high, queue, fairshare))


def _first(pair: tuple[str, SortedList]) -> str:
    return pair[0]


def _infeasible(state: ClusterState, job: JobRequest, capable: dict[int, int]) -> Reason | None:
    """Why `job` cannot run on the nodes that are up whatever else runs, or None;
    `capable` caches how many nodes (up or not) have at least g GPUs."""
    g = job.gpus_per_node
    if job.nodelist:
        return _nodelist_infeasible(state, job)
    if job.gpu_model is not None and job.gpu_model not in state.models:
        return Reason(
            ReasonCode.INFEASIBLE,
            f"needs {job.gpu_model} GPUs; this cluster has {', '.join(state.models)}",
        )
    if g > state.max_gpus:
        return Reason(
            ReasonCode.INFEASIBLE,
            f"needs {g} GPUs on one node; the largest node has {state.max_gpus}",
        )
    if state.capacity_ge[g] < job.nodes:
        if job.gpu_model is not None or job.exclude_nodes:  # count only nodes it may use
            return _never_fits_reason(state, job, excluded_indices(state, job))
        up = state.capacity_ge[g]
        if g not in capable:  # counted once per cycle and shape: this path may be hot
            capable[g] = sum(1 for node in state.nodes if node.gpus >= g)
        return _too_few_up(job, up, f"node(s) with ≥{g} GPUs are up", capable[g] - up)
    return None


def _nodelist_infeasible(state: ClusterState, job: JobRequest) -> Reason | None:
    """For a job bound to a nodelist (`-w`): whether its nodes could ever hold it."""
    g = job.gpus_per_node
    listed = sorted(job.nodelist)
    unknown = [n for n in listed if n not in state.node_index]
    if unknown:
        return Reason(
            ReasonCode.INFEASIBLE, f"its nodelist names unknown node(s): {', '.join(unknown)}"
        )
    fitting = [
        n
        for n in listed
        if state.nodes[state.node_index[n]].gpus >= g
        and (job.gpu_model is None or state.nodes[state.node_index[n]].gpu_model == job.gpu_model)
    ]
    if len(fitting) < job.nodes:
        return Reason(
            ReasonCode.INFEASIBLE,
            f"needs {job.shape} on its nodelist ({', '.join(listed)}); only "
            f"{len(fitting)} of those node(s) have ≥{g}"
            f"{'' if job.gpu_model is None else ' ' + job.gpu_model} GPUs",
        )
    up = sum(1 for n in fitting if state.up[state.node_index[n]])
    if up < job.nodes:
        what = f"of its listed node(s) ({', '.join(listed)}) up"
        return _too_few_up(job, up, what, len(fitting) - up)
    return None


def _begin_reason(begin_s: float, now: float) -> Reason:
    return Reason(
        ReasonCode.BEGIN_TIME,
        f"may not start before t={begin_s:.0f}s (--begin), in {begin_s - now:.0f}s",
    )


def _too_few_up(job: JobRequest, up: int, what: str, out_of_service: int) -> Reason:
    """Too few of the nodes a job may use are up: it waits for down or drained ones
    (ReqNodeNotAvail) when the cluster has enough, else it can never run (Infeasible)."""
    if out_of_service and job.nodes <= up + out_of_service:
        return Reason(
            ReasonCode.NODES_UNAVAILABLE,
            f"needs {job.shape}; only {up} {what}, {out_of_service} more down or drained: "
            "it waits for them to come back",
        )
    return Reason(ReasonCode.INFEASIBLE, f"needs {job.shape}; only {up} {what}")


def _never_fits_reason(state: ClusterState, job: JobRequest, excluded: frozenset[int]) -> Reason:
    """For a job that fits the cluster's shape but not the nodes it may use (its GPU model,
    minus excluded nodes): waiting for busy GPUs would never help; waiting for down or
    drained nodes may."""
    g = job.gpus_per_node
    fit = [
        n
        for n, node in enumerate(state.nodes)
        if n not in excluded
        and node.gpus >= g
        and (job.gpu_model is None or node.gpu_model == job.gpu_model)
    ]
    usable = sum(1 for n in fit if state.up[n])
    where = "" if job.gpu_model is None else f" {job.gpu_model}"
    if job.nodelist:
        where += " (of its nodelist)"
    elif excluded:
        where += " (not excluded)"
    what = f"{where} node(s) with ≥{g} GPUs are up".lstrip()
    return _too_few_up(job, usable, what, len(fit) - usable)


def _resources_reason(state: ClusterState, job: JobRequest) -> Reason:
    g = job.gpus_per_node
    if job.nodes == 1:
        # The most free GPUs on any up node: counts of nodes with ≥ f free only fall with f.
        cluster_ge, most = state.cluster_ge, 0
        for f in range(state.max_gpus, 0, -1):
            if cluster_ge[f]:
                most = f
                break
        return _single_node_reason(g, most)
    best_rack = max((ge[g] for ge in state.rack_ge), default=0)
    return Reason(
        ReasonCode.RESOURCES,
        f"needs {job.shape}; {state.cluster_ge[g]} node(s) have ≥{g} free GPUs "
        f"(at most {best_rack} in one rack)",
    )


@lru_cache(maxsize=4096)
def _single_node_reason(g: int, most: int) -> Reason:
    """Made once per (request, most free) pair: a queue's worth of jobs shares a handful."""
    return Reason(
        ReasonCode.RESOURCES,
        f"needs {g} free GPU{'s' if g != 1 else ''} on one node; the most free on any "
        f"node is {most}",
    )


@lru_cache(maxsize=4096)
def _dependency_reason(dep: Dependency, never: bool) -> Reason:
    if never:
        return Reason(
            ReasonCode.DEPENDENCY_NEVER_SATISFIED,
            f"dependency {dep} can never be satisfied; cancel the job or fix the dependency",
        )
    return Reason(ReasonCode.DEPENDENCY, f"waiting for job {dep.job_id} ({dep.kind.value})")
