"""Idle-GPU detection: every GPU sample is matched to the job the head allocated that GPU
to, idle stretches are timed, flagged after the team's window and acted on after its grace;
the samples' utilisation- and idle-weighted GPU-seconds are summed for the daily rollup.

Off the control thread's transaction path: samples arrive on whatever thread records them
(GpuSamples.subscribe), the allocation map is updated from the control thread after each
commit (a few dict operations per job that moved), and flags and policy actions go back to
the control thread as operations of their own. Everything here is guarded by one lock held
only for in-memory work.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from phalanx.core import JobState
from phalanx.core.idle import DEFAULT_POLICY, IdleAction, IdlePolicy, Verdict, judge, split_days
from phalanx.head import lifecycle
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import JobRecord
from phalanx.head.telemetry import GpuReading

log = logging.getLogger("phalanx.head")

# A sample covers the time since the GPU's previous one, at most this long: after a longer
# silence (a node down, an agent restarting) nothing is assumed about the gap.
MAX_GAP_S = 120.0
# A tick flags an idle GPU only while its last sample is this fresh.
STALE_S = 60.0
GpuKey = tuple[str, int]  # (node, GPU index)
UsageKey = tuple[str, str, str, str]  # (day, user, team, qos)
RunOp = Callable[[Callable[[Tx], None]], object]


@dataclass(frozen=True, slots=True)
class Alloc:
    """One job's hold on its GPUs in one epoch, as the head allocated them."""

    job_id: int
    epoch: int
    user: str
    team: str
    qos: str
    since: float  # the run's start


@dataclass(slots=True)
class _Gpu:
    alloc: Alloc
    last_t: float  # the end of the time the samples so far covered
    idle_since: float | None = None
    flagged_at: float | None = None
    pending: dict[str, float] = field(default_factory=dict)  # day → idle s, before the flag


@dataclass(frozen=True, slots=True)
class IdleFlag:
    """A flagged GPU: allocated, and idle for its team's window."""

    job_id: int
    epoch: int
    node: str
    index: int
    user: str
    team: str
    idle_since: float
    flagged_at: float
    last_sample: float
    policy: IdlePolicy
    acted: bool


class IdleDetector:
    """The allocation map, each allocated GPU's idle standing, and the sample-weighted sums."""

    def __init__(self, mirror: Mirror, run_op: RunOp) -> None:
        self._mirror = mirror
        self._run_op = run_op
        self._lock = threading.Lock()
        self._alloc: dict[GpuKey, Alloc] = {}
        self._job_gpus: dict[int, tuple[Alloc, list[GpuKey]]] = {}
        self._gpus: dict[GpuKey, _Gpu] = {}
        self._acted: set[tuple[int, int]] = set()  # (job, epoch) the policy acted on
        self._policies: dict[str, IdlePolicy] = {}
        # (day, user, team, qos) → [utilisation-weighted GPU-s, idle GPU-s] not yet rolled up
        self._sums: dict[UsageKey, list[float]] = {}

    # ------------------------------------------------------------------ policies
    def policy(self, team: str) -> IdlePolicy:
        return self._policies.get(team, DEFAULT_POLICY)

    def set_policies(self, policies: dict[str, IdlePolicy]) -> None:
        with self._lock:
            self._policies = dict(policies)

    def set_policy(self, team: str, policy: IdlePolicy | None) -> None:
        with self._lock:
            if policy is None:
                self._policies.pop(team, None)
            else:
                self._policies[team] = policy

    # ------------------------------------------------------------------ allocations
    def load(self, jobs: Sequence[JobRecord], now: float) -> None:
        """Every job holding GPUs (the head's mirror at start-up, at `now`): samples count
        from now on (what came before was counted by the head that ran then)."""
        for rec in jobs:
            self.place(rec, now)

    def on_commit(self, tx: Tx) -> None:
        """After a control-thread commit: the jobs that moved hold (or no longer hold)
        their GPUs."""
        for rec in tx.moved_jobs.values():
            self.place(rec)

    def place(self, rec: JobRecord, counted_to: float | None = None) -> None:
        """Note where `rec` holds GPUs now (if it does); samples count from its start, or
        from `counted_to` if later."""
        holds = rec.state.holds_gpus and bool(rec.placement)
        with self._lock:
            current = self._job_gpus.get(rec.id)
            if current is not None and holds and current[0].epoch == rec.epoch:
                return  # R → PR → CG: the same hold
            if current is not None:
                for key in current[1]:
                    self._alloc.pop(key, None)
                    self._gpus.pop(key, None)
                del self._job_gpus[rec.id]
                self._acted = {a for a in self._acted if a[0] != rec.id}
            if not holds:
                return
            since = max(rec.start_time or 0.0, counted_to or 0.0)
            alloc = Alloc(rec.id, rec.epoch, rec.user, rec.team, rec.qos, since)
            keys = [(node, i) for node, gpus in rec.placement for i in gpus]
            for key in keys:
                self._alloc[key] = alloc
            self._job_gpus[rec.id] = (alloc, keys)

    def holder(self, node: str, index: int) -> Alloc | None:
        with self._lock:
            return self._alloc.get((node, index))

    # ------------------------------------------------------------------ samples
    def on_sample(self, node: str, gpus: Sequence[GpuReading], t: float) -> None:
        """One node's reading of its GPUs at `t` (GpuSamples calls it for every sample)."""
        flags: list[IdleFlag] = []
        busy: list[tuple[Alloc, GpuKey, float, float]] = []
        acts: list[IdleFlag] = []
        with self._lock:
            for g in gpus:
                key = (node, g.index)
                alloc = self._alloc.get(key)
                if alloc is None:
                    continue
                st = self._gpus.get(key)
                if st is None or st.alloc is not alloc:
                    st = self._gpus[key] = _Gpu(alloc, alloc.since)
                util = g.utilization_pct
                start = st.last_t
                if util is None or t <= start:
                    continue  # no reading, or one older than what was counted
                if t - start > MAX_GAP_S:
                    start = t - MAX_GAP_S
                    if st.flagged_at is None:
                        st.idle_since = None  # a silence breaks an unflagged stretch
                        st.pending.clear()
                st.last_t = t
                self._sample(st, key, max(0.0, min(100.0, util)), start, t, flags, busy, acts)
        self._report(flags, busy, acts)

    def _sample(
        self,
        st: _Gpu,
        key: GpuKey,
        util: float,
        start: float,
        t: float,
        flags: list[IdleFlag],
        busy: list[tuple[Alloc, GpuKey, float, float]],
        acts: list[IdleFlag],
    ) -> None:
        a = st.alloc
        policy = self._policies.get(a.team, DEFAULT_POLICY)
        days = split_days(start, t)
        sums = self._sums
        for day, seconds in days:
            row = sums.get((day, a.user, a.team, a.qos))
            if row is None:
                row = sums[(day, a.user, a.team, a.qos)] = [0.0, 0.0]
            row[0] += util / 100.0 * seconds
        if util > policy.threshold_pct:
            if st.flagged_at is not None:
                busy.append((a, key, st.idle_since or start, t))
            st.idle_since = st.flagged_at = None
            st.pending.clear()
            return
        if st.idle_since is None:
            st.idle_since = start
        for day, seconds in days:
            if st.flagged_at is not None:
                sums[(day, a.user, a.team, a.qos)][1] += seconds
            else:
                st.pending[day] = st.pending.get(day, 0.0) + seconds
        self._judge(st, key, policy, t, flags, acts)

    def _judge(
        self,
        st: _Gpu,
        key: GpuKey,
        policy: IdlePolicy,
        now: float,
        flags: list[IdleFlag],
        acts: list[IdleFlag],
    ) -> None:
        a = st.alloc
        job = (a.job_id, a.epoch)
        verdict = judge(policy, st.idle_since, st.flagged_at, job in self._acted, now)
        if verdict is Verdict.FLAG:
            st.flagged_at = now
            for day, seconds in st.pending.items():
                row = self._sums.setdefault((day, a.user, a.team, a.qos), [0.0, 0.0])
                row[1] += seconds
            st.pending.clear()
            flags.append(self._flag(st, key, policy))
            # A zero grace acts at once.
            verdict = judge(policy, st.idle_since, st.flagged_at, job in self._acted, now)
        if verdict is Verdict.ACT:
            self._acted.add(job)
            acts.append(self._flag(st, key, policy))

    def _flag(self, st: _Gpu, key: GpuKey, policy: IdlePolicy) -> IdleFlag:
        a = st.alloc
        assert st.idle_since is not None and st.flagged_at is not None
        return IdleFlag(
            a.job_id,
            a.epoch,
            key[0],
            key[1],
            a.user,
            a.team,
            st.idle_since,
            st.flagged_at,
            st.last_t,
            policy,
            (a.job_id, a.epoch) in self._acted,
        )

    def tick(self, now: float) -> None:
        """Flag GPUs idle for their window and act on those flagged for their grace, even
        between samples (as long as the last sample is fresh)."""
        flags: list[IdleFlag] = []
        acts: list[IdleFlag] = []
        with self._lock:
            for key, st in self._gpus.items():
                if st.idle_since is None or now - st.last_t > STALE_S:
                    continue
                policy = self._policies.get(st.alloc.team, DEFAULT_POLICY)
                self._judge(st, key, policy, now, flags, acts)
        self._report(flags, [], acts)

    def take_sums(self) -> dict[UsageKey, list[float]]:
        """The utilisation- and idle-weighted GPU-seconds since the last call."""
        with self._lock:
            sums, self._sums = self._sums, {}
            return sums

    def put_back(self, sums: dict[UsageKey, list[float]]) -> None:
        """Sums a failed rollup write could not store: kept for the next."""
        with self._lock:
            for key, (util, idle) in sums.items():
                row = self._sums.setdefault(key, [0.0, 0.0])
                row[0] += util
                row[1] += idle

    # ------------------------------------------------------------------ queries
    def flags(self, visible: Callable[[str, str], bool] | None = None) -> list[IdleFlag]:
        """The flagged GPUs whose job's (user, team) `visible` allows (None: all)."""
        with self._lock:
            out = [
                self._flag(st, key, self._policies.get(st.alloc.team, DEFAULT_POLICY))
                for key, st in self._gpus.items()
                if st.flagged_at is not None
                and (visible is None or visible(st.alloc.user, st.alloc.team))
            ]
        return sorted(out, key=lambda f: (f.job_id, f.node, f.index))

    def idle_gpus(self) -> int:
        with self._lock:
            return sum(1 for st in self._gpus.values() if st.flagged_at is not None)

    # ------------------------------------------------------------------ effects
    def _report(
        self,
        flags: list[IdleFlag],
        busy: list[tuple[Alloc, GpuKey, float, float]],
        acts: list[IdleFlag],
    ) -> None:
        """Write the flags and clears as job events, and apply the policy actions, on the
        control thread (one operation for all of this sample's)."""
        if not (flags or busy or acts):
            return
        events: list[dict[str, Any]] = []
        for f in _by_job(flags):
            gpus = _names(f)
            p = f[0].policy
            then = (
                "notify only"
                if p.action is IdleAction.NOTIFY
                else f"{p.action.value} after {_duration(p.grace_s)} more"
            )
            events.append(
                {
                    "now": f[0].flagged_at,
                    "kind": "gpu_idle",
                    "message": f"GPU {gpus} idle (≤ {p.threshold_pct:g}% utilisation) for "
                    f"{_duration(f[0].flagged_at - f[0].idle_since)}; the idle-GPU policy of "
                    f"team {f[0].team}: {then}",
                    "job_id": f[0].job_id,
                    "node": f[0].node,
                }
            )
        for a, (node, index), idle_since, t in busy:
            events.append(
                {
                    "now": t,
                    "kind": "gpu_busy",
                    "message": f"GPU {node}:{index} busy again after "
                    f"{_duration(t - idle_since)} idle",
                    "job_id": a.job_id,
                    "node": node,
                }
            )
        actions = [(g[0], _names(g)) for g in _by_job(acts)]

        def op(tx: Tx) -> None:
            for e in events:
                tx.event(**e)
            for flag, gpus in actions:
                self._act(tx, flag, gpus)

        try:
            self._run_op(op)
        except Exception:  # a sample must never fail for its effects
            log.exception("idle GPUs: could not record flags or act on them")

    def _act(self, tx: Tx, flag: IdleFlag, gpus: str) -> None:
        rec = self._mirror.jobs.get(flag.job_id)
        if (
            rec is None
            or rec.epoch != flag.epoch
            or rec.stopping is not None
            or rec.state is not JobState.RUNNING
        ):
            return
        p = flag.policy
        why = (
            f"GPU {gpus} idle for {_duration(p.window_s)} and {_duration(p.grace_s)} of grace "
            f"(the idle-GPU policy of team {flag.team})"
        )
        now = tx.now
        tx.event(now, "idle_action", f"{p.action.value}: {why}", rec.id)
        rec.reason, rec.reason_message = "IdleGPU", why
        if p.action is IdleAction.PREEMPT:
            lifecycle.preempt(self._mirror, tx, rec, 0, now, why=f"preempted: {why}")
        elif p.action is IdleAction.CANCEL:
            lifecycle.cancel(self._mirror, tx, rec, now, f"the idle-GPU policy: {why}")


def _by_job(flags: list[IdleFlag]) -> list[list[IdleFlag]]:
    out: dict[int, list[IdleFlag]] = {}
    for f in flags:
        out.setdefault(f.job_id, []).append(f)
    return list(out.values())


def _names(flags: list[IdleFlag]) -> str:
    return ", ".join(f"{f.node}:{f.index}" for f in flags)


def _duration(seconds: float) -> str:
    s = max(0.0, seconds)
    if s >= 3600 and s % 3600 == 0:
        return f"{s / 3600:g} h"
    if s >= 60 and s % 60 == 0:
        return f"{s / 60:g} min"
    return f"{s:.0f} s"
