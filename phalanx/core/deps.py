"""Slurm dependency semantics (`after`, `afterok`, `afterany`, `afternotok`), as pure functions."""

from __future__ import annotations

import enum
from collections.abc import Callable

from phalanx.core.model import Dependency, DependencyKind, JobRequest, JobState


class DepStatus(enum.Enum):
    SATISFIED = "satisfied"
    WAITING = "waiting"
    NEVER = "never"


# What the scheduler knows of another job: None if unknown, else (started, final state or None).
JobLookup = Callable[[int], tuple[bool, JobState | None] | None]


def evaluate_one(dep: Dependency, lookup: JobLookup) -> DepStatus:
    info = lookup(dep.job_id)
    if info is None:
        return DepStatus.NEVER  # an unknown job can never satisfy anything
    started, final = info
    kind = dep.kind
    if kind is DependencyKind.AFTER:
        return DepStatus.SATISFIED if started or final is not None else DepStatus.WAITING
    if final is None:
        return DepStatus.WAITING
    if kind is DependencyKind.AFTERANY:
        return DepStatus.SATISFIED
    ok = final is JobState.COMPLETED
    if kind is DependencyKind.AFTEROK:
        return DepStatus.SATISFIED if ok else DepStatus.NEVER
    return DepStatus.NEVER if ok else DepStatus.SATISFIED  # AFTERNOTOK


def evaluate(job: JobRequest, lookup: JobLookup) -> tuple[DepStatus, Dependency | None]:
    """Overall status of a job's dependencies and the dependency that decides it.

    With `dependency_any` one satisfied dependency suffices and only all-never is never;
    otherwise all must be satisfied and any never makes the whole never.
    """
    if not job.dependencies:
        return DepStatus.SATISFIED, None
    statuses = [(evaluate_one(d, lookup), d) for d in job.dependencies]
    if job.dependency_any:
        for status, dep in statuses:
            if status is DepStatus.SATISFIED:
                return status, dep
        waiting = [d for s, d in statuses if s is DepStatus.WAITING]
        if waiting:
            return DepStatus.WAITING, waiting[0]
        return DepStatus.NEVER, statuses[0][1]
    for status, dep in statuses:
        if status is DepStatus.NEVER:
            return status, dep
    for status, dep in statuses:
        if status is DepStatus.WAITING:
            return status, dep
    return DepStatus.SATISFIED, None
