"""The pool's loop: look at Slurm and at Phalanx, decide (policy.py), act, report.

What the pool owns is found again on every pass, from Slurm itself: its Slurm jobs are
this user's jobs named `phalanx-pool-<pool>` (squeue), and each one's Phalanx node is
`<prefix><slurm job id>`. Nothing else is kept, so a restarted pool carries on where the
last one stopped, and never submits a job twice for the same need.

A pass that cannot see Slurm or the head changes nothing (it cannot know what it owns or
what is wanted) and says why; the next pass tries again. sbatch refusing the job (a bad
partition, an account it may not use) is reported with Slurm's words and retried with a
growing pause, since the same request fails the same way until someone fixes it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from phalanx.api.models import NodeInfo
from phalanx.client.api import ApiError, HeadUnreachable, PhalanxClient

from .payload import AgentJob
from .policy import PREEMPTED, Decision, Member, PendingJob, PoolLimits, decide
from .slurm import Slurm, SlurmError, SlurmJob, SlurmUnreachable, SubmitRefused

log = logging.getLogger("phalanx.slurmpool")

LEAVING = "leaving: "  # the head's drain reason for a node that leaves (head/leaving.py)
RELEASE_REASON = "slurm-pool: idle, giving the node back to Slurm"
MAX_SUBMIT_BACKOFF_S = 300.0


@dataclass
class PassReport:
    """What one pass saw and did (logged; `phalanx slurm-pool --once` prints it)."""

    ok: bool = True
    problem: str | None = None  # why this pass did nothing, or what failed
    slurm_jobs: dict[str, str] = field(default_factory=dict)  # slurm id -> state
    slurm_waiting: dict[str, str] = field(default_factory=dict)  # pending slurm id -> reason
    failed_starts: list[str] = field(default_factory=list)  # ended before their agent joined
    members: int = 0
    joined: int = 0
    busy: int = 0
    target: int = 0
    demand_nodes: int = 0
    demanding: list[int] = field(default_factory=list)
    too_big: list[int] = field(default_factory=list)
    submitted: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if not self.ok:
            return f"pool: {self.problem}"
        parts = [
            f"{self.members} node(s) ({self.joined} joined, {self.busy} busy)",
            f"target {self.target}",
            f"demand {self.demand_nodes} node(s) for job(s) {self.demanding or '-'}",
        ]
        if self.submitted:
            parts.append(f"submitted Slurm job(s) {', '.join(self.submitted)}")
        if self.released:
            parts.append(f"released {', '.join(self.released)}")
        if self.forgotten:
            parts.append(f"forgot node(s) {', '.join(self.forgotten)}")
        if self.slurm_waiting:
            waits = ", ".join(f"{i} ({r})" for i, r in sorted(self.slurm_waiting.items()))
            parts.append(f"waiting in Slurm: {waits}")
        if self.failed_starts:
            parts.append(
                f"Slurm job(s) {', '.join(self.failed_starts)} ended before their agent "
                "joined (see their --output)"
            )
        if self.too_big:
            parts.append(f"job(s) {self.too_big} want more GPUs per node than a pool node has")
        if self.problem:
            parts.append(self.problem)
        return "pool: " + "; ".join(parts)


class SlurmPool:
    """One pool: `job` says what its Slurm jobs look like, `limits` how many it keeps."""

    def __init__(
        self,
        job: AgentJob,
        limits: PoolLimits,
        client: PhalanxClient,
        slurm: Slurm,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job = job
        self.limits = limits
        self.client = client
        self.slurm = slurm
        self.clock = clock
        self._idle_since: dict[str, float] = {}  # node -> when it was first seen idle
        self._submit_after = 0.0  # after a refusal: no sbatch before this (monotonic)
        self._submit_backoff = 0.0
        self._last_summary = ""
        # Slurm jobs submitted whose agent has not joined yet: one that ends first is a
        # failed start (a wrong head URL, token or command), and submits back off.
        self._unjoined: set[str] = set()

    # ------------------------------------------------------------------ one pass
    def step(self) -> PassReport:
        report = PassReport()
        try:
            slurm_jobs = self.slurm.jobs(self.job.job_name)
        except SlurmError as e:
            kind = "Slurm unreachable" if isinstance(e, SlurmUnreachable) else "Slurm failed"
            return self._fail(report, f"{kind} ({e}); nothing changed, retrying")
        report.slurm_jobs = {j.job_id: j.state for j in slurm_jobs}
        report.slurm_waiting = {j.job_id: j.reason for j in slurm_jobs if j.state == "PENDING"}
        try:
            # The queue first: a job placed between the two answers then shows as busy.
            pending = self.client.jobs(active=True, states=["PD", "PR"]).jobs
            nodes = {n.name: n for n in self.client.nodes().nodes}
        except HeadUnreachable as e:
            return self._fail(report, f"the head did not answer ({e}); nothing changed, retrying")
        except ApiError as e:
            return self._fail(report, f"the head refused ({e}); nothing changed, retrying")
        preempting = {j.id for j in pending if j.state == "PR"}
        members = self._members(slurm_jobs, nodes, preempting)
        self._check_starts(report, slurm_jobs, members)
        jobs = [
            PendingJob(
                j.id,
                j.nodes,
                j.gpus_per_node,
                PREEMPTED if j.state == "PR" else j.reason,
                held=j.hold is not None,
            )
            for j in pending
        ]
        decision = decide(members, jobs, self.limits)
        self._fill(report, members, decision)
        self._release(report, decision)
        self._submit(report, decision)
        self._forget(report, slurm_jobs, nodes)
        self._log(report)
        return report

    def _fail(self, report: PassReport, problem: str) -> PassReport:
        report.ok, report.problem = False, problem
        self._log(report)
        return report

    def _members(
        self, slurm_jobs: list[SlurmJob], nodes: dict[str, NodeInfo], preempting: set[int]
    ) -> list[Member]:
        """The pool's live Slurm jobs with their nodes. A job being preempted counts as
        demand (it is requeued in a moment), so its nodes count neither as busy with it
        nor as idle."""
        now = self.clock()
        members = []
        seen = set()
        for sj in slurm_jobs:
            if not sj.live:
                continue  # ending (COMPLETING…): its node is gone or going
            name = self.job.node_name(sj.job_id)
            info = nodes.get(name)
            if info is not None and (info.reason or "").startswith(LEAVING):
                continue  # its agent is leaving (Slurm is taking the node back)
            joined = info is not None and info.state in ("up", "drain", "draining")
            held = info.jobs if info is not None and joined else []
            jobs = sum(1 for j in held if j not in preempting)
            idle_s = None
            if joined and not held:
                since = self._idle_since.setdefault(name, now)
                idle_s = now - since
                seen.add(name)
            members.append(Member(sj.job_id, sj.state, name, joined, jobs, idle_s))
        self._idle_since = {n: t for n, t in self._idle_since.items() if n in seen}
        return members

    def _check_starts(
        self, report: PassReport, slurm_jobs: list[SlurmJob], members: list[Member]
    ) -> None:
        listed = {j.job_id for j in slurm_jobs if j.live}
        joined = {m.slurm_id for m in members if m.joined}
        failed = sorted(self._unjoined - listed - joined, key=int)
        started = self._unjoined & joined
        self._unjoined = self._unjoined & (listed - joined)
        if failed:
            report.failed_starts = failed
            self._back_off()
        elif started:
            self._submit_backoff = 0.0  # agents start fine (again)

    def _back_off(self) -> None:
        self._submit_backoff = min(MAX_SUBMIT_BACKOFF_S, max(5.0, self._submit_backoff * 2))
        self._submit_after = self.clock() + self._submit_backoff

    def _fill(self, report: PassReport, members: list[Member], d: Decision) -> None:
        report.members = len(members)
        report.joined = sum(1 for m in members if m.joined)
        report.busy = sum(1 for m in members if m.jobs > 0)
        report.target = d.target
        report.demand_nodes = d.demand_nodes
        report.demanding = list(d.demanding)
        report.too_big = list(d.too_big)

    def _release(self, report: PassReport, d: Decision) -> None:
        for m in d.release:
            if m.joined:
                try:  # nothing new lands there while Slurm takes it back
                    self.client.drain(m.node, RELEASE_REASON)
                except ApiError as e:
                    report.problem = f"cannot drain {m.node} before releasing it: {e}"
                    continue
            try:
                self.slurm.cancel([m.slurm_id])
            except SlurmError as e:
                report.problem = f"cannot scancel Slurm job {m.slurm_id}: {e}"
                if m.joined:  # still the pool's: usable until the next try
                    with contextlib.suppress(ApiError):
                        self.client.resume(m.node)
                continue
            report.released.append(f"{m.node} (Slurm job {m.slurm_id})")

    def _submit(self, report: PassReport, d: Decision) -> None:
        if d.submit <= 0:
            return
        if self.clock() < self._submit_after:
            wait = self._submit_after - self.clock()
            later = (
                f"not submitting for {wait:.0f} s more (the last sbatch was refused or "
                "its agent did not start)"
            )
            report.problem = report.problem or later
            return
        script, options = self.job.script(), self.job.sbatch_options()
        for _ in range(d.submit):
            try:
                job_id = self.slurm.submit(script, options)
            except SubmitRefused as e:
                self._back_off()
                report.problem = (
                    f"{e} (check --partition and --sbatch-arg; next try in "
                    f"{self._submit_backoff:.0f} s)"
                )
                return
            except SlurmError as e:
                report.problem = f"sbatch failed: {e}; retrying next pass"
                return
            report.submitted.append(job_id)
            self._unjoined.add(job_id)

    def _forget(
        self, report: PassReport, slurm_jobs: list[SlurmJob], nodes: dict[str, NodeInfo]
    ) -> None:
        """Remove from Phalanx the pool's nodes whose Slurm job is over (down, no jobs)."""
        live = {self.job.node_name(j.job_id) for j in slurm_jobs}
        prefix = self.job.node_prefix
        for name, info in nodes.items():
            suffix = name[len(prefix) :]
            if not name.startswith(prefix) or not suffix.isdigit() or name in live:
                continue
            if info.state != "down" or info.jobs:
                continue
            try:
                self.client.remove_node(name)
            except ApiError as e:
                if e.status not in (404, 409):
                    report.problem = f"cannot remove node {name}: {e}"
                continue
            report.forgotten.append(name)

    def _log(self, report: PassReport) -> None:
        text = report.summary()
        acted = report.submitted or report.released or report.forgotten
        if text != self._last_summary or acted:
            level = logging.WARNING if (not report.ok or report.problem) else logging.INFO
            log.log(level, "%s", text)
        self._last_summary = text

    # ------------------------------------------------------------------ the loop
    def run(self, stop: threading.Event, interval_s: float = 10.0) -> None:
        """Pass after pass until `stop` is set; a pass that fails in an unexpected way is
        logged and the loop goes on."""
        while not stop.is_set():
            try:
                self.step()
            except Exception:  # the pool must outlive a bug in one pass
                log.exception("pool: unexpected error in a pass; carrying on")
            stop.wait(interval_s)
