"""Discrete-event simulator: replays a workload through the scheduling core on a virtual clock.

Events (arrivals, completions, preemption exits, node failures and repairs) are processed in
time order; after all events of one instant, one scheduling cycle runs — the same
`phalanx.core.schedule` the head runs — and its decisions are applied.
"""

from __future__ import annotations

import heapq
import random
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

from phalanx.core import (
    ClusterState,
    JobRequest,
    JobState,
    SchedulerConfig,
    apply_decisions,
    decides_nothing,
    gang_shape,
    schedule,
)
from phalanx.core.placement import domain_of
from phalanx.sim.failures import FailureModel
from phalanx.sim.layout import ClusterLayout
from phalanx.sim.stepmodel import StepModel
from phalanx.sim.workload import TraceJob, Workload, gc_paused

ARRIVE, FINISH, PREEMPT_EXIT, FAIL, REPAIR = range(5)


@dataclass(frozen=True, slots=True)
class SimConfig:
    policy: str = "priority"
    placement: str = "topology"
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    limit_factor: float | None = 1.0  # time limit = duration × factor (None: no limits)
    preemption_grace_s: float = 30.0  # notice → exit (a cooperative job checkpoints)
    step_model: StepModel = field(default_factory=StepModel)
    failures: FailureModel = field(default_factory=FailureModel)


@dataclass(slots=True)
class _Job:
    trace: TraceJob
    gpus: int  # GPUs of the gang (the trace's count rounded to whole per-node slots)
    remaining: float  # work-seconds left, at ideal speed
    epoch: int = 0
    seg_start: float = 0.0
    seg_restart: float = 0.0  # restart cost at the start of this segment
    seg_rate: float = 1.0  # wall seconds per work-second in this segment
    first_start: float = -1.0
    finish: float = -1.0
    restarts: int = 0
    alloc_gpu_s: float = 0.0  # GPU-seconds held, including lost work and overheads
    lost_gpu_s: float = 0.0

    def progress(self, now: float) -> float:
        """Work-seconds done in the current segment by `now`."""
        return max(0.0, now - self.seg_start - self.seg_restart) / self.seg_rate


def _floats() -> array[float]:
    return array("d")


@dataclass(slots=True)
class SimResult:
    """Per-job records (arrays in job order) and the cluster's time series."""

    cluster: str
    gpus: int
    policy: str
    submit: array[float] = field(default_factory=_floats)
    start: array[float] = field(default_factory=_floats)
    finish: array[float] = field(default_factory=_floats)
    duration: array[float] = field(default_factory=_floats)
    job_gpus: array[float] = field(default_factory=_floats)
    teams: list[str] = field(default_factory=list)
    times: array[float] = field(default_factory=_floats)
    busy: array[float] = field(default_factory=_floats)
    queued: array[float] = field(default_factory=_floats)
    cycles: int = 0
    idle_cycles: int = 0  # of which decided nothing, known without running (`decides_nothing`)
    preemptions: int = 0
    failures: int = 0
    restarts: int = 0
    alloc_gpu_s: float = 0.0
    useful_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0
    unfinished: int = 0
    wall_s: float = 0.0
    spread_jobs: int = 0  # gangs placed wider than one rack


Progress = Callable[[float, int, int], None]  # (virtual time, jobs done, jobs total)


class Simulator:
    def __init__(self, layout: ClusterLayout, workload: Workload, config: SimConfig) -> None:
        self.layout = layout
        self.config = config
        self.state = ClusterState(
            layout.nodes, layout.teams, policy=config.policy, placement=config.placement
        )
        self.gpus_per_node = max(n.gpus for n in layout.nodes)
        self.total_gpus = sum(n.gpus for n in layout.nodes)
        self.arrivals = sorted(workload.jobs, key=lambda j: (j.submit_s, j.id))
        self.jobs: dict[int, _Job] = {}
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.busy = 0
        self.repairs = 0  # repair events outstanding
        self.rng = random.Random(config.failures.seed)
        self.result = SimResult(layout.name, self.total_gpus, config.policy)

    # ------------------------------------------------------------------ events
    def _push(self, t: float, kind: int, a: int, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, a, b))

    def _next_failure(self, now: float) -> None:
        mtbf = self.config.failures.mtbf_gpu_hours
        if mtbf is None:
            return
        rate_per_s = self.total_gpus / (mtbf * 3600.0)
        node = self.rng.randrange(len(self.layout.nodes))
        self._push(now + self.rng.expovariate(rate_per_s), FAIL, node)

    def _request(self, tj: TraceJob) -> JobRequest:
        nodes, per_node = gang_shape(tj.gpus, self.gpus_per_node)
        factor = self.config.limit_factor
        return JobRequest(
            id=tj.id,
            team=tj.team,
            priority=tj.priority,
            nodes=nodes,
            gpus_per_node=per_node,
            time_limit_s=None if factor is None else max(60.0, tj.duration_s * factor),
            submit_s=tj.submit_s,
            duration_s=tj.duration_s,
        )

    # ------------------------------------------------------------------ run
    def run(self, progress: Progress | None = None) -> SimResult:
        # A replay makes no reference cycles but keeps a few objects per job alive (its
        # record, request, events): with the cyclic GC on, young collections promote them
        # and the full ones rescan them all — ~15% of a 1M-job replay's CPU time. Without
        # cycles, reference counting frees everything the replay drops.
        with gc_paused():
            return self._run(progress)

    def _run(self, progress: Progress | None) -> SimResult:
        wall0 = time.perf_counter()
        res = self.result
        arrivals, n_arrivals, next_arrival = self.arrivals, len(self.arrivals), 0
        done = 0
        last_report = wall0
        if arrivals:
            self._next_failure(arrivals[0].submit_s)
        while True:
            t_arr = arrivals[next_arrival].submit_s if next_arrival < n_arrivals else None
            t_evt = self.events[0][0] if self.events else None
            if t_arr is None and (t_evt is None or not self._active()):
                break
            now = t_arr if t_evt is None or (t_arr is not None and t_arr <= t_evt) else t_evt
            assert now is not None
            while next_arrival < n_arrivals and arrivals[next_arrival].submit_s == now:
                tj = arrivals[next_arrival]
                next_arrival += 1
                request = self._request(tj)
                self.jobs[tj.id] = _Job(tj, request.gpus, tj.duration_s)
                self.state.submit(request, now)
            while self.events and self.events[0][0] == now:
                _, _, kind, a, b = heapq.heappop(self.events)
                done += self._handle(kind, a, b, now)
            self._cycle(now)
            if progress is not None and time.perf_counter() - last_report > 5.0:
                last_report = time.perf_counter()
                progress(now, done, n_arrivals)
        res.unfinished = len(self.state.pending) + len(self.state.running)
        self._collect()
        res.wall_s = time.perf_counter() - wall0
        if progress is not None:
            progress(res.times[-1] if res.times else 0.0, done, n_arrivals)
        return res

    def _active(self) -> bool:
        """Whether the run can still make progress: a job runs, or a repair may let a
        pending job start (failure events alone do not keep a run going)."""
        return bool(self.state.running) or (bool(self.state.pending) and self.repairs > 0)

    def _handle(self, kind: int, a: int, b: int, now: float) -> int:
        state = self.state
        if kind == FINISH:
            job = self.jobs[a]
            if job.epoch != b or a not in state.running:
                return 0
            self._close_segment(job, now, lost=0.0)
            job.remaining = 0.0
            job.finish = now
            state.finish(a, now, JobState.COMPLETED)
            return 1
        if kind == PREEMPT_EXIT:
            job = self.jobs[a]
            if job.epoch == b and a in state.running:
                self._requeue(job, now, saved=job.progress(now - self.config.preemption_grace_s))
                self.result.preemptions += 1
            return 0
        if kind == FAIL:
            self._fail_node(a, now)
            self._next_failure(now)
            return 0
        if kind == REPAIR:
            self.repairs -= 1
            state.set_node_up(self.layout.nodes[a].name, True)
            return 0
        raise AssertionError(f"unknown event kind {kind}")

    def _fail_node(self, n: int, now: float) -> None:
        state = self.state
        if not state.up[n]:
            return
        self.result.failures += 1
        for job_id in sorted(state.node_jobs[n]):
            job = self.jobs[job_id]
            ran = now - job.seg_start - job.seg_restart
            saved = self.config.failures.saved_progress(ran) / self._placement_factor(job)
            self._requeue(job, now, saved=saved)
        state.set_node_up(self.layout.nodes[n].name, False, "simulated failure")
        self._push(now + self.config.failures.repair_s, REPAIR, n)
        self.repairs += 1

    def _placement_factor(self, job: _Job) -> float:
        return job.seg_rate / self.config.failures.overhead

    def _requeue(self, job: _Job, now: float, saved: float) -> None:
        done = job.progress(now)
        saved = min(saved, done, job.remaining)
        self._close_segment(job, now, lost=(done - saved) * self._placement_factor(job))
        job.remaining -= saved
        job.restarts += 1
        job.epoch += 1
        self.result.restarts += 1
        attained = job.trace.duration_s - job.remaining
        self.state.requeue(job.trace.id, now, attained_s=attained)

    def _close_segment(self, job: _Job, now: float, lost: float) -> None:
        job.alloc_gpu_s += (now - job.seg_start) * job.gpus
        job.lost_gpu_s += lost * job.gpus
        self.busy -= job.gpus

    def _cycle(self, now: float) -> None:
        state, res, cfg = self.state, self.result, self.config
        if state.pending:
            res.cycles += 1
            if decides_nothing(state, cfg.scheduler):
                res.idle_cycles += 1
                self._sample(now)
                return
            decisions = schedule(state, now, cfg.scheduler)
            applied = apply_decisions(state, decisions, now)
            for start in applied.starts:
                job = self.jobs[start.job_id]
                request = state.running[start.job_id].request
                domain = domain_of(state, start.placement)
                if domain in ("block", "cluster"):
                    res.spread_jobs += 1
                slow = cfg.step_model.slowdown(request.gpus, request.nodes, domain)
                job.seg_start = now
                job.seg_restart = cfg.failures.restart_cost_s if job.restarts else 0.0
                job.seg_rate = slow * cfg.failures.overhead
                if job.first_start < 0:
                    job.first_start = now
                self.busy += request.gpus
                end = now + job.seg_restart + job.remaining * job.seg_rate
                self._push(end, FINISH, start.job_id, job.epoch)
            for victim, _for_job in applied.notices:
                due = now + cfg.preemption_grace_s
                self._push(due, PREEMPT_EXIT, victim, self.jobs[victim].epoch)
        self._sample(now)

    def _sample(self, now: float) -> None:
        res = self.result
        res.times.append(now)
        res.busy.append(self.busy)
        res.queued.append(len(self.state.pending))

    def _collect(self) -> None:
        res = self.result
        for tj in self.arrivals:
            job = self.jobs[tj.id]
            res.submit.append(tj.submit_s)
            res.start.append(job.first_start)
            res.finish.append(job.finish)
            res.duration.append(tj.duration_s)
            res.job_gpus.append(job.gpus)
            res.teams.append(tj.team)
            res.alloc_gpu_s += job.alloc_gpu_s
            res.lost_gpu_s += job.lost_gpu_s
            if job.finish >= 0:
                res.useful_gpu_s += tj.duration_s * job.gpus


def simulate(
    layout: ClusterLayout, workload: Workload, config: SimConfig, progress: Progress | None = None
) -> SimResult:
    """Replay `workload` on `layout` and return the raw result (see `metrics.summarize`)."""
    return Simulator(layout, workload, config).run(progress)
