"""The scheduler's incremental view of the cluster: free GPUs, running jobs, per-team queues.

`ClusterState` is plain data with pure mutations (the time is always an argument, no I/O).
Adapters (the head, the simulator) apply what happened — submits, starts, finishes,
requeues, node changes — and `schedule()` reads it. Indexes are kept up to date on every
change so a scheduling cycle never scans the whole cluster or queue:

* per GPU model and free count, the nodes sorted by index (best-fit single-node placement;
  sorted, not insertion-ordered, so a cycle's try-and-undo leaves the order as it was);
* per rack, block and cluster, how many nodes have at least g free GPUs (gang placement);
* per team, the eligible queue sorted by the ordering policy's static key;
* running jobs sorted by expected end (reservations).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

from sortedcontainers import SortedList

from phalanx.core.deps import DepStatus, evaluate
from phalanx.core.model import (
    DEFAULT_PLACEMENT,
    PLACEMENT_POLICIES,
    Dependency,
    JobRequest,
    JobState,
    Node,
    Placement,
    RunningJob,
    Team,
)
from phalanx.core.policies import DEFAULT_POLICY, OrderingPolicy, get_policy

DEFAULT_FAIRSHARE_HALFLIFE_S = 7 * 24 * 3600.0
_LN2 = math.log(2)


# (time limit or inf, id of (nodes, GPUs per node, True), id of (nodes, GPUs per node,
# limit is None), team): see `ClusterState.plain`.
PlainJob = tuple[float, int, int, str]


class StateError(ValueError):
    """An adapter asked the state for something impossible (unknown job, busy GPUs, …)."""


class ClusterState:
    def __init__(
        self,
        nodes: Sequence[Node],
        teams: Iterable[Team] = (),
        policy: str = DEFAULT_POLICY,
        fairshare_halflife_s: float = DEFAULT_FAIRSHARE_HALFLIFE_S,
        placement: str = DEFAULT_PLACEMENT,
    ) -> None:
        if not nodes:
            raise StateError("a cluster needs at least one node")
        if placement not in PLACEMENT_POLICIES:
            known = ", ".join(PLACEMENT_POLICIES)
            raise StateError(f"unknown placement policy {placement!r}; known: {known}")
        self.placement = placement
        self.policy: OrderingPolicy = get_policy(policy)
        self.fairshare_halflife_s = fairshare_halflife_s
        self.nodes: list[Node] = list(nodes)
        self.node_index: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            if node.name in self.node_index:
                raise StateError(f"duplicate node name {node.name!r}")
            self.node_index[node.name] = i
        self.max_gpus = max(n.gpus for n in self.nodes)
        self.models: list[str] = sorted({n.gpu_model for n in self.nodes})

        # Topology: racks are (block, rack) pairs so equal rack names in two blocks differ.
        rack_ids: dict[tuple[str, str], int] = {}
        block_ids: dict[str, int] = {}
        self.rack_of: list[int] = []
        self.block_of: list[int] = []
        self.rack_nodes: list[list[int]] = []
        self.rack_block: list[int] = []
        self.rack_names: list[str] = []
        self.block_names: list[str] = []
        for i, node in enumerate(self.nodes):
            b = block_ids.setdefault(node.block, len(block_ids))
            if b == len(self.block_names):
                self.block_names.append(node.block)
            r = rack_ids.setdefault((node.block, node.rack), len(rack_ids))
            if r == len(self.rack_nodes):
                self.rack_nodes.append([])
                self.rack_block.append(b)
                self.rack_names.append(node.rack)
            self.rack_of.append(r)
            self.block_of.append(b)
            self.rack_nodes[r].append(i)
        self.block_racks: list[list[int]] = [[] for _ in self.block_names]
        for r, b in enumerate(self.rack_block):
            self.block_racks[b].append(r)

        # Free GPUs and the indexes over them (only nodes that are up are indexed).
        width = self.max_gpus + 1
        self.free_mask: list[int] = [(1 << n.gpus) - 1 for n in self.nodes]
        self.free: list[int] = [n.gpus for n in self.nodes]
        self.up: list[bool] = [True] * len(self.nodes)
        self.down_reason: dict[int, str] = {}
        self.buckets: dict[str, list[SortedList]] = {
            m: [SortedList() for _ in range(width)] for m in self.models
        }
        self.rack_ge: list[list[int]] = [[0] * (width + 1) for _ in self.rack_nodes]
        self.block_ge: list[list[int]] = [[0] * (width + 1) for _ in self.block_names]
        self.cluster_ge: list[int] = [0] * (width + 1)
        self.capacity_ge: list[int] = [0] * (width + 1)  # nodes up with ≥ g GPUs in total
        self.free_total = 0
        self.gpus_up = 0
        for i in range(len(self.nodes)):
            self._index_node(i, +1)

        # Jobs.
        self.running: dict[int, RunningJob] = {}
        self.team_running: dict[str, dict[int, None]] = {}
        self.running_priorities: Counter[int] = Counter()  # priority → running preemptible jobs
        self.node_jobs: list[dict[int, int]] = [{} for _ in self.nodes]
        self.ends: SortedList = SortedList()  # (expected end, job id) for jobs with a limit
        self.pending: dict[int, JobRequest] = {}
        self.queues: dict[str, SortedList] = {}  # team → [(static key, job id)], eligible only
        self.queue_key: dict[int, tuple[float, ...]] = {}
        self.queued_limits: SortedList = SortedList()  # time limits of queued jobs (inf: none)
        self.queued_priorities: Counter[int] = Counter()
        self.queued_gpus_per_node: Counter[int] = Counter()
        # Queued plain jobs (no begin time, GPU model, nodelist or exclusions): their time
        # limit (inf: none), the ids of their shape keys (nodes, GPUs per node, limited)
        # with and without a reservation's limits, and team — what the cycle's settled-job
        # scan reads. A shape key's id indexes `shape_keys` (ints hash faster than tuples).
        self.plain: dict[int, PlainJob] = {}
        self.shape_keys: list[tuple[int, int, bool]] = []
        self.shape_ids: dict[tuple[int, int, bool], int] = {}
        self.held: dict[int, Dependency] = {}  # waiting on this dependency
        self.never: dict[int, Dependency] = {}  # dependency that can never be satisfied
        self.dependents: dict[int, set[int]] = {}
        self.known: dict[int, tuple[bool, JobState | None]] = {}
        # Pending jobs taken out of the queue without ending (a hold): their dependents wait.
        self.withdrawn: dict[int, JobRequest] = {}
        # (not-before time, job id) of queued jobs with a `--begin` time (BeginTime reasons).
        self.begins: SortedList = SortedList()
        self.preempting: dict[int, int] = {}  # victim → the job it makes room for
        self.waiting_on: dict[int, set[int]] = {}  # preemptor → victims still running

        # Teams, quotas, fair share.
        self.teams: dict[str, Team] = {}
        self.quota_teams: set[str] = set()  # the teams with a quota
        self.usage: dict[str, int] = {}
        self.cohorts: dict[str, list[str]] = {}
        self._fairshare: dict[str, tuple[float, float]] = {}  # team → (decayed GPU-s, as of)
        for team in teams:
            self.set_team(team)

    # ----------------------------------------------------------------- free-GPU indexes
    def _index_node(self, i: int, sign: int) -> None:
        """Add (+1) or remove (-1) node i from every index (it comes up or goes down)."""
        f = self.free[i]
        bucket = self.buckets[self.nodes[i].gpu_model][f]
        if sign > 0:
            bucket.add(i)
        else:
            bucket.remove(i)
        self._shift_ge(i, 0, f, sign)  # g = 0..f
        for g in range(self.nodes[i].gpus + 1):
            self.capacity_ge[g] += sign
        self.free_total += sign * f
        self.gpus_up += sign * self.nodes[i].gpus

    def _shift_ge(self, i: int, first: int, last: int, sign: int) -> None:
        """Counts of nodes with ≥ g free, for g in first..last, change by `sign`."""
        rack_ge = self.rack_ge[self.rack_of[i]]
        block_ge = self.block_ge[self.block_of[i]]
        cluster_ge = self.cluster_ge
        for g in range(first, last + 1):
            rack_ge[g] += sign
            block_ge[g] += sign
            cluster_ge[g] += sign

    def _set_free(self, i: int, mask: int) -> None:
        old, new = self.free[i], mask.bit_count()
        self.free_mask[i] = mask
        self.free[i] = new
        if not self.up[i] or old == new:
            return
        buckets = self.buckets[self.nodes[i].gpu_model]
        buckets[old].remove(i)
        buckets[new].add(i)
        if new > old:
            self._shift_ge(i, old + 1, new, +1)
        else:
            self._shift_ge(i, new + 1, old, -1)
        self.free_total += new - old

    def take(self, placement: Placement) -> None:
        """Mark a placement's GPUs busy (also used by a cycle's trial, with `give` as undo).
        All or nothing: if any GPU is not free, it raises and nothing changes."""
        for n, mask in _merged(placement):
            if self.free_mask[n] & mask != mask:
                raise StateError(f"GPUs {mask:#b} on {self.nodes[n].name} are not free")
        for n, mask in placement.slots:
            self._set_free(n, self.free_mask[n] & ~mask)

    def give(self, placement: Placement) -> None:
        """Return a placement's GPUs to the free pool (all or nothing, like `take`)."""
        for n, mask in _merged(placement):
            if self.free_mask[n] & mask:
                raise StateError(f"GPUs {mask:#b} on {self.nodes[n].name} are already free")
        for n, mask in placement.slots:
            self._set_free(n, self.free_mask[n] | mask)

    # ----------------------------------------------------------------- nodes
    def set_node_up(self, name: str, up: bool, reason: str = "") -> None:
        """Mark a node schedulable or not (down, drained). Its running jobs are untouched."""
        i = self._node(name)
        if self.up[i] == up:
            if not up:
                self.down_reason[i] = reason
            return
        if up:
            self.up[i] = True
            self.down_reason.pop(i, None)
            self._index_node(i, +1)
        else:
            self._index_node(i, -1)
            self.up[i] = False
            self.down_reason[i] = reason

    def _node(self, name: str) -> int:
        try:
            return self.node_index[name]
        except KeyError:
            raise StateError(f"unknown node {name!r}") from None

    # ----------------------------------------------------------------- teams
    def set_team(self, team: Team) -> None:
        old = self.teams.get(team.name)
        if old is not None and old.cohort is not None:
            self.cohorts[old.cohort].remove(old.name)
        self.teams[team.name] = team
        if team.quota is None:
            self.quota_teams.discard(team.name)
        else:
            self.quota_teams.add(team.name)
        self.usage.setdefault(team.name, 0)
        if team.cohort is not None:
            self.cohorts.setdefault(team.cohort, []).append(team.name)

    def _team(self, name: str) -> Team:
        team = self.teams.get(name)
        if team is None:  # a team nobody configured runs without a quota
            team = Team(name)
            self.set_team(team)
        return team

    def _accrue(self, team: str, now: float) -> None:
        value, as_of = self._fairshare.get(team, (0.0, now))
        self._fairshare[team] = (self._decayed(value, as_of, self.usage[team], now), now)

    def _decayed(self, value: float, as_of: float, gpus: int, now: float) -> float:
        # Exponentially decayed GPU-seconds: U(t) = U(t0)·d + g·H/ln2·(1 − d), d = 2^(−Δt/H).
        h = self.fairshare_halflife_s
        d = math.exp(-_LN2 * max(0.0, now - as_of) / h)
        return value * d + gpus * h / _LN2 * (1.0 - d)

    def fairshare(self, team: str, now: float) -> float:
        """Decayed GPU-seconds used by the team divided by its share (lower goes first)."""
        value, as_of = self._fairshare.get(team, (0.0, now))
        used = self._decayed(value, as_of, self.usage.get(team, 0), now)
        return used / self._team(team).share

    # ----------------------------------------------------------------- jobs
    def lookup(self, job_id: int) -> tuple[bool, JobState | None] | None:
        return self.known.get(job_id)

    def remember(self, job_id: int, started: bool, final: JobState) -> None:
        """Record a job that ended before this state was built, so dependencies on it resolve.

        Adapters that rebuild the state from a store (the head after a restart, or after a
        node joins) call this before submitting the jobs that depend on it.
        """
        if not final.terminal:
            raise StateError(f"{final.name} is not a terminal state")
        if job_id in self.known and self.known[job_id][1] is None:
            raise StateError(f"job {job_id} is live in this state")
        self.known[job_id] = (started, final)
        self._notify_dependents(job_id)

    def submit(self, job: JobRequest, now: float) -> None:
        """Queue a new job, or again a withdrawn one (released, or changed while held)."""
        again = self.withdrawn.pop(job.id, None)
        if job.id in self.known and again is None:
            raise StateError(f"job {job.id} was already submitted")
        if self.policy.needs_duration and job.duration_s is None:
            raise StateError(
                f"job {job.id}: policy {self.policy.name!r} needs a known duration for every job"
            )
        self._team(job.team)
        started = self.known[job.id][0] if again is not None else False
        self.known[job.id] = (started, None)
        self.pending[job.id] = job
        for dep in job.dependencies:
            self.dependents.setdefault(dep.job_id, set()).add(job.id)
        self._refresh_dependencies(job.id)

    def withdraw(self, job_id: int) -> JobRequest:
        """Take a pending job out of the queue without ending it (a hold, or to submit it
        again changed): jobs that depend on it keep waiting; `submit` queues it again."""
        job = self.pending.pop(job_id, None)
        if job is None:
            raise StateError(f"job {job_id} is not pending")
        self._dequeue(job)
        self.waiting_on.pop(job_id, None)
        for dep in job.dependencies:
            self.dependents.get(dep.job_id, set()).discard(job_id)
        self.withdrawn[job_id] = job
        return job

    def _enqueue(self, job: JobRequest) -> None:
        key = self.policy.static_key(job)
        self.queue_key[job.id] = key
        queue = self.queues.get(job.team)
        if queue is None:
            queue = self.queues[job.team] = SortedList()
        queue.add((key, job.id))
        self.queued_limits.add(_limit(job))
        self.queued_priorities[job.priority] += 1
        self.queued_gpus_per_node[job.gpus_per_node] += 1
        if job.begin_s is not None:
            self.begins.add((job.begin_s, job.id))
        elif job.gpu_model is None and not job.exclude_nodes and not job.nodelist:
            limited = self._shape_id((job.nodes, job.gpus_per_node, True))
            if job.time_limit_s is None:
                self.plain[job.id] = (math.inf, limited, limited, job.team)
            else:
                free = self._shape_id((job.nodes, job.gpus_per_node, False))
                self.plain[job.id] = (job.time_limit_s, limited, free, job.team)

    def _shape_id(self, key: tuple[int, int, bool]) -> int:
        shape_id = self.shape_ids.get(key)
        if shape_id is None:
            shape_id = self.shape_ids[key] = len(self.shape_keys)
            self.shape_keys.append(key)
        return shape_id

    def _dequeue(self, job: JobRequest) -> None:
        key = self.queue_key.pop(job.id, None)
        if key is not None:
            self.queues[job.team].remove((key, job.id))
            self.queued_limits.remove(_limit(job))
            self.queued_priorities[job.priority] -= 1
            if not self.queued_priorities[job.priority]:
                del self.queued_priorities[job.priority]
            self.queued_gpus_per_node[job.gpus_per_node] -= 1
            if not self.queued_gpus_per_node[job.gpus_per_node]:
                del self.queued_gpus_per_node[job.gpus_per_node]
            if job.begin_s is not None:
                self.begins.remove((job.begin_s, job.id))
            self.plain.pop(job.id, None)
        self.held.pop(job.id, None)
        self.never.pop(job.id, None)

    def _refresh_dependencies(self, job_id: int) -> None:
        job = self.pending.get(job_id)
        if job is None or job_id in self.queue_key:
            return
        status, dep = evaluate(job, self.lookup)
        self.held.pop(job_id, None)
        self.never.pop(job_id, None)
        if status is DepStatus.SATISFIED:
            self._enqueue(job)
        elif status is DepStatus.WAITING:
            assert dep is not None
            self.held[job_id] = dep
        else:
            assert dep is not None
            self.never[job_id] = dep

    def _notify_dependents(self, job_id: int) -> None:
        for dependent in sorted(self.dependents.get(job_id, ())):
            self._refresh_dependencies(dependent)

    def start(self, job_id: int, placement: Placement, now: float, borrowed: int = 0) -> None:
        job = self.pending.get(job_id)
        if job is None:
            raise StateError(f"job {job_id} is not pending")
        if job_id not in self.queue_key:
            raise StateError(f"job {job_id} is waiting on a dependency and cannot start")
        self.take(placement)
        self._dequeue(job)
        del self.pending[job_id]
        self.waiting_on.pop(job_id, None)
        self._accrue(job.team, now)
        self.usage[job.team] += job.gpus
        run = RunningJob(job, placement, now, now, borrowed)
        self.running[job_id] = run
        self.team_running.setdefault(job.team, {})[job_id] = None
        if job.preemptible:
            self.running_priorities[job.priority] += 1
        for n, mask in placement.slots:
            self.node_jobs[n][job_id] = mask
        if job.time_limit_s is not None:
            self.ends.add((run.expected_end_s, job_id))
        self.known[job_id] = (True, None)
        self._notify_dependents(job_id)

    def _stop(self, job_id: int, now: float) -> RunningJob:
        run = self.running.pop(job_id)
        self.give(run.placement)
        del self.team_running[run.request.team][job_id]
        if run.request.preemptible:
            self.running_priorities[run.request.priority] -= 1
            if not self.running_priorities[run.request.priority]:
                del self.running_priorities[run.request.priority]
        for n, _ in run.placement.slots:
            del self.node_jobs[n][job_id]
        if run.request.time_limit_s is not None:
            self.ends.remove((run.expected_end_s, job_id))
        self._accrue(run.request.team, now)
        self.usage[run.request.team] -= run.request.gpus
        preemptor = self.preempting.pop(job_id, None)
        if preemptor is not None:
            victims = self.waiting_on.get(preemptor)
            if victims is not None:
                victims.discard(job_id)
                if not victims:
                    del self.waiting_on[preemptor]
        return run

    def finish(self, job_id: int, now: float, final: JobState) -> None:
        """A running or pending job ended (completed, failed, cancelled, timed out, …)."""
        if not final.terminal:
            raise StateError(f"{final.name} is not a terminal state")
        if job_id in self.running:
            self._stop(job_id, now)
            self.known[job_id] = (True, final)
        elif job_id in self.pending:
            job = self.pending.pop(job_id)
            self._dequeue(job)
            self.waiting_on.pop(job_id, None)
            started, _ = self.known[job_id]
            self.known[job_id] = (started, final)
        elif job_id in self.withdrawn:
            del self.withdrawn[job_id]
            started, _ = self.known[job_id]
            self.known[job_id] = (started, final)
        else:
            raise StateError(f"job {job_id} is neither running nor pending")
        self._notify_dependents(job_id)

    def requeue(self, job_id: int, now: float, attained_s: float | None = None) -> JobRequest:
        """Put a running job back in the queue (preempted, or its node failed).

        `attained_s` is the service it keeps (work up to its last checkpoint); by default the
        run time up to its last checkpoint is added to what it had.
        """
        run = self.running.get(job_id)
        if run is None:
            raise StateError(f"job {job_id} is not running")
        self._stop(job_id, now)
        if attained_s is None:
            attained_s = run.request.attained_s + max(0.0, run.checkpoint_s - run.start_s)
        job = replace(run.request, attained_s=attained_s)
        self.pending[job_id] = job
        self._enqueue(job)
        return job

    def checkpoint(self, job_id: int, at: float) -> None:
        run = self.running.get(job_id)
        if run is None:
            raise StateError(f"job {job_id} is not running")
        run.checkpoint_s = at

    def mark_preempting(self, victim: int, preemptor: int) -> None:
        if victim not in self.running:
            raise StateError(f"job {victim} is not running")
        self.preempting[victim] = preemptor
        self.waiting_on.setdefault(preemptor, set()).add(victim)

    # ----------------------------------------------------------------- derived
    def smallest_queued_request(self) -> int:
        """The fewest GPUs per node any queued job asks for (0 if none is queued)."""
        return min(self.queued_gpus_per_node, default=0)

    def shortest_queued_limit(self) -> float:
        """The shortest time limit of any queued job (inf if none has one)."""
        return float(self.queued_limits[0]) if self.queued_limits else math.inf

    def node_names(self, placement: Placement) -> tuple[str, ...]:
        return tuple(self.nodes[n].name for n in placement.node_indices)

    def gpus_in_use(self) -> int:
        return sum(self.usage.values())


def _merged(placement: Placement) -> list[tuple[int, int]]:
    """The placement's GPUs per node, refusing a placement that names a GPU twice."""
    if len(placement.slots) == 1:
        return list(placement.slots)
    merged: dict[int, int] = {}
    for n, mask in placement.slots:
        if merged.get(n, 0) & mask:
            raise StateError(f"placement names GPUs {mask:#b} of node index {n} twice")
        merged[n] = merged.get(n, 0) | mask
    return list(merged.items())


def _limit(job: JobRequest) -> float:
    return math.inf if job.time_limit_s is None else job.time_limit_s
