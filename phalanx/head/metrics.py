"""The head's Prometheus metrics: Kueue-style counters and histograms of committed job and
node transitions, and gauges of the cluster computed at scrape time from the mirror.

One registry per head (tests run several heads in one process). Counters move only for
what committed: the control thread calls `observe` after each commit with the
transaction's typed transitions (head/lifecycle.py's `move` is the one place jobs change
state), so a rolled-back batch counts nothing. Gauges read the mirror under the control
lock at scrape time; no database query per scrape.

Cardinality is bounded: no per-job or per-node label on the head's series. `team` takes
the configured teams' names (at most MAX_TEAM_LABELS of them, in name order; any other
team counts as `other`), `qos` the known QOS names (else `other`), `state` the job or node
state names.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from phalanx.api.models import JobProgress
from phalanx.core import JobState, JobTransition, NodeState, NodeTransition
from phalanx.head.gpuscrape import GpuHolders
from phalanx.head.lifecycle import PREEMPTED_FOR
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import QOS_PRIORITY, JobRecord

if TYPE_CHECKING:
    from phalanx.head.usage import Usage

MAX_TEAM_LABELS = 100
OTHER = "other"
# Wait times: a second to a week (queue waits in a busy cluster reach days).
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400, 259200, 604800)
CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
CHECKPOINT_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
JOB_STATE_NAMES = {s: s.name.lower() for s in JobState}
LIVE_STATES = (JobState.PENDING, JobState.RUNNING, JobState.PREEMPTED, JobState.COMPLETING)

# No `_created` series beside each counter and histogram: they double the head's series
# for a start time Prometheus does not need (the head's restart resets them all anyway).
# prometheus_client keeps this setting per process.
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client


class HeadMetrics:
    """The head's registry: counters and histograms fed by `observe`/`progress` on the
    control thread, gauges collected from `mirror` under `lock` at each scrape."""

    def __init__(self, mirror: Mirror, lock: threading.RLock) -> None:
        self.mirror = mirror
        self.lock = lock
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        tq = ("team", "qos")
        self.started = Counter(
            "phalanx_jobs_started", "Job starts (every run, restarts included).", tq, registry=r
        )
        self.ended = Counter(
            "phalanx_jobs_ended",
            "Jobs that ended, by final state.",
            (*tq, "state"),
            registry=r,
        )
        self.preemptions = Counter(
            "phalanx_job_preemptions",
            "Running jobs chosen as preemption victims (notice sent or stopped).",
            tq,
            registry=r,
        )
        self.requeues = Counter(
            "phalanx_job_requeues",
            "Jobs put back in the queue after a run (preemption, node failure, requeue).",
            tq,
            registry=r,
        )
        self.node_failures = Counter(
            "phalanx_node_failures", "Nodes that went down (no heartbeat for a lease).", registry=r
        )
        self.submit_to_running = Histogram(
            "phalanx_job_submit_to_running_seconds",
            "From submission to the job's first start.",
            tq,
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "phalanx_job_queue_wait_seconds",
            "Time queued before each start (since submission or the last requeue).",
            tq,
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.cycle = Histogram(
            "phalanx_scheduling_cycle_duration_seconds",
            "Duration of committed scheduling cycles (the core's decisions and their applying).",
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self.checkpoint = Histogram(
            "phalanx_job_checkpoint_duration_seconds",
            "Checkpoint save durations jobs reported (phalanx.train progress reports).",
            tq,
            buckets=CHECKPOINT_BUCKETS,
            registry=r,
        )
        # Idle-GPU detection and accounting (head/usage.py), for the idle-GPU series; set by
        # the head (Head.__init__) after both exist.
        self.usage: Usage | None = None
        r.register(_Gauges(self))
        # Who holds each GPU, for the per-GPU series (kept here: `observe` feeds it).
        self.gpu_holders = GpuHolders(mirror, lock)
        # Job id → when it last entered the queue (a requeue); its submission otherwise.
        self._queued_since: dict[int, float] = {}
        # Job id → (epoch, step) of the last checkpoint observed (each observed once).
        self._checkpoint_step: dict[int, tuple[int, int]] = {}

    # ------------------------------------------------------------------ labels
    def team(self, name: str) -> str:
        return self.team_labeler()(name)

    def team_labeler(self) -> Callable[[str], str]:
        """Team name → its label, for the teams configured now (a scrape makes one)."""
        teams = self.mirror.teams
        if len(teams) <= MAX_TEAM_LABELS:
            return lambda name: name if name in teams else OTHER
        allowed = frozenset(sorted(teams)[:MAX_TEAM_LABELS])
        return lambda name: name if name in allowed else OTHER

    @staticmethod
    def qos(name: str) -> str:
        return name if name in QOS_PRIORITY else OTHER

    def _labels(self, rec: JobRecord | None) -> tuple[str, str]:
        if rec is None:
            return OTHER, OTHER
        return self.team(rec.team), self.qos(rec.qos)

    # ------------------------------------------------------------------ feeding
    def observe(self, tx: Tx) -> None:
        """After a commit (on the control thread): count its transitions."""
        self.gpu_holders.observe(tx)
        if tx.cycle_s is not None:
            self.cycle.observe(tx.cycle_s)
        for move in tx.moves:
            if isinstance(move, JobTransition):
                self._job_move(move, tx.moved_jobs.get(move.job_id))
            elif isinstance(move, NodeTransition) and move.to_state is NodeState.DOWN:
                self.node_failures.inc()

    def _job_move(self, move: JobTransition, rec: JobRecord | None) -> None:
        team, qos = self._labels(rec)
        to, was = move.to_state, move.from_state
        if to is JobState.RUNNING and was is JobState.PENDING:
            self.started.labels(team, qos).inc()
            submitted = rec.submit_time if rec is not None else move.time
            since = self._queued_since.pop(move.job_id, submitted)
            self.queue_wait.labels(team, qos).observe(max(0.0, move.time - since))
            if move.epoch == 1:
                self.submit_to_running.labels(team, qos).observe(max(0.0, move.time - submitted))
        elif to is JobState.PREEMPTED or (
            to is JobState.COMPLETING
            and was is JobState.RUNNING
            and move.reason.startswith(PREEMPTED_FOR)
        ):
            self.preemptions.labels(team, qos).inc()
        elif to is JobState.PENDING:
            self.requeues.labels(team, qos).inc()
            self._queued_since[move.job_id] = move.time
        elif to.terminal:
            self.ended.labels(team, qos, JOB_STATE_NAMES[to]).inc()
            self._queued_since.pop(move.job_id, None)
            self._checkpoint_step.pop(move.job_id, None)

    def progress(self, rec: JobRecord, report: JobProgress) -> None:
        """A job's progress report (under the control lock): observe a checkpoint's
        duration the first time any rank reports it."""
        if report.checkpoint_s is None:
            return
        step = report.checkpoint_step if report.checkpoint_step is not None else report.step
        seen = (rec.epoch, step)  # a run after a requeue may save the same step again
        if self._checkpoint_step.get(rec.id) == seen:
            return
        self._checkpoint_step[rec.id] = seen
        self.checkpoint.labels(*self._labels(rec)).observe(report.checkpoint_s)

    # ------------------------------------------------------------------ scrape
    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Gauges(Collector):
    """The cluster now, from the mirror: GPUs and nodes by state, jobs by state, the
    queue by team and QOS, each team's quota and use."""

    def __init__(self, metrics: HeadMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        m = self.m
        usage = m.usage
        # Read before the control lock: the idle detector has its own.
        flagged = usage.flagged_by_team() if usage is not None else {}
        idle_s = usage.idle_seconds() if usage is not None else {}
        with m.lock:
            snapshot = _snapshot(m.mirror, m.team_labeler(), m.qos)
            label = m.team_labeler()
            flagged_by = _relabel(flagged, label)
            idle_by = _relabel(idle_s, label)
        gpus, nodes, jobs, pending, quota, in_use = snapshot
        yield _family("phalanx_gpus", "GPUs by state (their sum is every GPU).", "state", gpus)
        yield _family("phalanx_nodes", "Nodes by state.", "state", nodes)
        yield _family("phalanx_jobs", "Live jobs by state (queue depth: pending).", "state", jobs)
        family = GaugeMetricFamily(
            "phalanx_pending_jobs", "Queued jobs by team and QOS.", labels=("team", "qos")
        )
        for (team, qos), n in sorted(pending.items()):
            family.add_metric((team, qos), n)
        yield family
        yield _family("phalanx_team_quota_gpus", "Each team's GPU quota.", "team", quota)
        yield _family(
            "phalanx_team_gpus_in_use", "GPUs each team's jobs hold (quota use).", "team", in_use
        )
        yield _family(
            "phalanx_gpus_allocated_idle",
            "Allocated GPUs flagged idle (at or below their team's threshold for its window).",
            "team",
            flagged_by,
        )
        counter = CounterMetricFamily(
            "phalanx_gpu_idle_seconds",
            "GPU-seconds allocated GPUs spent flagged idle (as the usage report's idle "
            "GPU-hours; counted each minute, when the rollup is written).",
            labels=("team",),
        )
        for team, seconds in sorted(idle_by.items()):
            counter.add_metric((team,), seconds)
        yield counter


def _relabel(values: dict[str, Any], label: Callable[[str], str]) -> dict[str, float]:
    """Per-team values summed per team label (beyond MAX_TEAM_LABELS: `other`)."""
    out: dict[str, float] = {}
    for team, value in values.items():
        key = label(team)
        out[key] = out.get(key, 0.0) + value
    return out


def _family(name: str, help_text: str, label: str, values: dict[str, float]) -> Any:
    family = GaugeMetricFamily(name, help_text, labels=(label,))
    for key, value in sorted(values.items()):
        family.add_metric((key,), value)
    return family


def _snapshot(
    mirror: Mirror, team: Callable[[str], str], qos: Callable[[str], str]
) -> tuple[
    dict[str, float],
    dict[str, float],
    dict[str, float],
    dict[tuple[str, str], float],
    dict[str, float],
    dict[str, float],
]:
    """One pass over the mirror's nodes and live jobs."""
    held: dict[str, int] = {}
    jobs = {JOB_STATE_NAMES[s]: 0.0 for s in LIVE_STATES}
    pending: dict[tuple[str, str], float] = {}
    in_use: dict[str, float] = {team(t): 0.0 for t in mirror.teams}
    for rec in mirror.jobs.values():
        state = rec.state
        jobs[JOB_STATE_NAMES[state]] = jobs.get(JOB_STATE_NAMES[state], 0.0) + 1
        if state is JobState.PENDING:
            key = (team(rec.team), qos(rec.qos))
            pending[key] = pending.get(key, 0.0) + 1
        elif state.holds_gpus:
            count = 0
            for name, indices in rec.placement:
                held[name] = held.get(name, 0) + len(indices)
                count += len(indices)
            label = team(rec.team)
            in_use[label] = in_use.get(label, 0.0) + count
    gpus = {"allocated": 0.0, "idle": 0.0, "drained": 0.0, "down": 0.0}
    nodes = {s.value: 0.0 for s in NodeState}
    for node in mirror.nodes.values():
        total = len(node.gpus)
        nodes[node.state.value] += 1
        if node.state is NodeState.DOWN:
            gpus["down"] += total
            continue
        used = min(total, held.get(node.name, 0))
        gpus["allocated"] += used
        gpus["idle" if node.state is NodeState.UP else "drained"] += total - used
    quota: dict[str, float] = {}
    for name, t in mirror.teams.items():
        if t.quota is not None:
            label = team(name)
            quota[label] = quota.get(label, 0.0) + t.quota
    return gpus, nodes, jobs, pending, quota, in_use
