"""The fault-tolerance invariants a chaos run checks (docs/fault-tolerance.md): no accepted
job lost or duplicated, never two live copies, no step lost past a checkpoint, no GPU held
by two jobs at once; and the one routine operations must keep: no job killed at all. Pure
functions over the head's answers and the jobs' ledgers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from phalanx.api.models import JobInfo
from phalanx.api.states import TERMINAL_JOB_STATES
from phalanx.testing.workload import Life

TERMINAL = TERMINAL_JOB_STATES

MAX_LISTED = 20  # violations listed in a verdict (all are counted)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one invariant: how many things it `checked`, and what broke."""

    name: str
    checked: int
    violations: tuple[str, ...]
    count: int  # violations found (only the first MAX_LISTED are in `violations`)

    @property
    def ok(self) -> bool:
        """No violation."""
        return self.count == 0

    @staticmethod
    def of(name: str, checked: int, violations: list[str]) -> Verdict:
        """A verdict keeping the first MAX_LISTED violations."""
        return Verdict(name, checked, tuple(violations[:MAX_LISTED]), len(violations))

    def to_json(self) -> dict[str, Any]:
        """`{"ok", "checked", "violations", "count"}` for a JSON report."""
        return {
            "ok": self.ok,
            "checked": self.checked,
            "count": self.count,
            "violations": list(self.violations),
        }


def _describe(group: list[Life]) -> str:
    ranks = ",".join(f"r{x.rank}@{x.node}/pid{x.pid}" for x in group)
    return f"[{ranks}] {min(x.first for x in group):.3f}–{max(x.last for x in group):.3f}"


def check_never_twice(all_lives: list[Life]) -> Verdict:
    """No job ever ran as two live copies: the time ranges (first to last ledger line, over
    all ranks) of two different epochs of a job never overlap, and no rank of an epoch
    ever had two processes alive at once. No slack: touching ranges count as overlapping."""
    by_job: dict[int, dict[int, list[Life]]] = {}
    for life in all_lives:
        by_job.setdefault(life.job, {}).setdefault(life.epoch, []).append(life)
    bad = []
    for job, epochs in sorted(by_job.items()):
        spans = sorted(
            (min(x.first for x in g), max(x.last for x in g), e, g) for e, g in epochs.items()
        )
        for i, (_, a_last, a_epoch, a_group) in enumerate(spans):
            for b_first, b_last, b_epoch, b_group in spans[i + 1 :]:
                if b_first <= a_last:
                    overlap = min(a_last, b_last) - b_first
                    bad.append(
                        f"job {job}: epoch {a_epoch} {_describe(a_group)} and epoch {b_epoch} "
                        f"{_describe(b_group)} were alive together for {overlap:.3f} s"
                    )
        for epoch, group in sorted(epochs.items()):
            for i, a in enumerate(group):
                for b in group[i + 1 :]:
                    if a.rank == b.rank and b.first <= a.last and a.first <= b.last:
                        bad.append(
                            f"job {job} epoch {epoch} rank {a.rank}: two processes alive "
                            f"together: pid {a.pid} on {a.node} and pid {b.pid} on {b.node}"
                        )
    return Verdict.of("never_twice", len(by_job), bad)


def check_no_step_back(
    all_lives: list[Life], completed: dict[int, tuple[int, int, int]]
) -> Verdict:
    """Steps never went backwards past a checkpoint: every run of a rank begins at the
    last step an earlier run of it logged (the ledger line follows the checkpoint, so at
    most one step more), never before. `completed` maps each job that ended CD to (its
    final epoch, its ranks, its steps): each of those ranks logged the end at that step."""
    by_rank: dict[tuple[int, int], list[Life]] = {}
    for life in all_lives:
        by_rank.setdefault((life.job, life.rank), []).append(life)
    bad = []
    for (job, rank), runs in sorted(by_rank.items()):
        reached: int | None = None  # the furthest step earlier runs logged
        for run in sorted(runs, key=lambda x: x.first):
            if run.begin_step is not None and reached is not None:
                if run.begin_step < reached:
                    bad.append(
                        f"job {job} rank {rank}: epoch {run.epoch} (pid {run.pid} on "
                        f"{run.node}) began at step {run.begin_step}, behind step {reached} "
                        "an earlier run had checkpointed"
                    )
                elif run.begin_step > reached + 1:
                    bad.append(
                        f"job {job} rank {rank}: epoch {run.epoch} began at step "
                        f"{run.begin_step}, ahead of step {reached} + 1 (a checkpoint no "
                        "logged run wrote)"
                    )
            marks = [s for s in (run.begin_step, run.last_step) if s is not None]
            if marks:
                reached = max([*marks, *([] if reached is None else [reached])])
    for job, (epoch, ranks, steps) in sorted(completed.items()):
        for rank in range(ranks):
            final = [x for x in by_rank.get((job, rank), []) if x.epoch == epoch]
            ended = [x for x in final if x.end_code == 0]
            if not ended or max(x.last_step or x.begin_step or 0 for x in ended) != steps:
                bad.append(
                    f"job {job} completed (CD) but rank {rank} of its final epoch {epoch} "
                    f"logged no end at step {steps}"
                )
    return Verdict.of("no_step_back", len(by_rank), bad)


def check_gpu_exclusive(all_lives: list[Life]) -> Verdict:
    """No GPU was held by two jobs at once: per node and GPU index, the time ranges of the
    processes of different jobs (CUDA_VISIBLE_DEVICES) never overlap. No slack."""
    holders: dict[tuple[str, int], list[Life]] = {}
    for life in all_lives:
        for gpu in life.gpus:
            holders.setdefault((life.node, gpu), []).append(life)
    bad = []
    for (node, gpu), users in sorted(holders.items()):
        users.sort(key=lambda x: x.first)
        for i, a in enumerate(users):
            for b in users[i + 1 :]:
                if b.first > a.last:
                    break  # sorted by start: no later process overlaps `a` either
                if b.job != a.job:
                    bad.append(
                        f"{node} GPU {gpu}: job {a.job} (epoch {a.epoch}, pid {a.pid}, "
                        f"{a.first:.3f}–{a.last:.3f}) and job {b.job} (epoch {b.epoch}, pid "
                        f"{b.pid}, {b.first:.3f}–{b.last:.3f}) held it together"
                    )
    return Verdict.of("gpu_exclusive", len(holders), bad)


def check_accounted(
    submits: Sequence[tuple[str, int | None]], head: Mapping[int, JobInfo], names: Counter[str]
) -> Verdict:
    """(a) Every accepted job is known to the head, is the job its submit created, and is
    terminal or still queued; no submit made two jobs. `submits`: (unique job name, the id
    the head answered, None if it did not); `head`: what the head says of each accepted id;
    `names`: how many jobs of each name the head has."""
    bad = []
    ids = Counter(job_id for _, job_id in submits if job_id is not None)
    for name, job_id in submits:
        if names[name] > 1:
            bad.append(f"{name} exists {names[name]} times in the head (one submit)")
        if job_id is None:
            continue
        info = head.get(job_id)
        if info is None:
            bad.append(f"job {job_id} ({name}) was accepted; the head does not know it")
            continue
        if info.name != name:
            bad.append(f"job {job_id} was accepted for {name}; the head has {info.name}")
        if ids[job_id] > 1:
            bad.append(f"job {job_id} was the answer to {ids[job_id]} different submits")
        if info.state not in TERMINAL and info.state != "PD":
            bad.append(f"job {job_id} is still {info.state} at the end (not ended or queued)")
    return Verdict.of("accounted", len(ids), bad)


def check_none_killed(
    all_lives: list[Life], head: Mapping[int, JobInfo], ranks: Mapping[int, int]
) -> Verdict:
    """No job was killed, requeued or restarted: each job of `head` (accepted id → the
    head's answer; `ranks`: id → its processes per run) ended CD with restart_count 0, and
    its ledger shows one epoch in which every rank ran as exactly one process that logged
    its end with code 0."""
    by_job: dict[int, list[Life]] = {}
    for life in all_lives:
        by_job.setdefault(life.job, []).append(life)
    bad = []
    for job, info in sorted(head.items()):
        if info.state != "CD" or info.restart_count:
            bad.append(f"job {job} ended {info.state} after {info.restart_count} restart(s)")
        runs = by_job.get(job, [])
        epochs = sorted({x.epoch for x in runs})
        if len(epochs) > 1:
            bad.append(f"job {job} ran in {len(epochs)} epochs {epochs} (restarted)")
        per_rank = Counter(x.rank for x in runs)
        for rank in range(ranks.get(job, 0)):
            if per_rank[rank] != 1:
                bad.append(f"job {job} rank {rank} ran as {per_rank[rank]} processes (not 1)")
        for x in runs:
            if x.end_code != 0:
                how = "without an end line" if x.end_code is None else f"with code {x.end_code}"
                bad.append(
                    f"job {job} epoch {x.epoch} rank {x.rank} (pid {x.pid} on {x.node}) "
                    f"stopped {how} at step {x.last_step}"
                )
    return Verdict.of("none_killed", len(head), bad)
