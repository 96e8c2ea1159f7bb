"""The job and node state machines: which moves are allowed, and the typed record of each.

The head (and anything else that keeps jobs or nodes) changes a state only through
`move_job` / `move_node`, which refuse a move the machine does not allow and return the
transition as data: the event log `phalanx show`, the dashboard and metrics read.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from phalanx.core.model import JobState

PD, R, CG, PR = JobState.PENDING, JobState.RUNNING, JobState.COMPLETING, JobState.PREEMPTED
ENDS = frozenset(s for s in JobState if s.terminal)

# From → the states a job may move to. A job starts (PD → R), may get a preemption notice
# (R → PR), is torn down (R/PR → CG) and then ends or is queued again (CG → an end, or PD);
# a pending job may be cancelled without running. An ended job never moves again.
JOB_MOVES: Mapping[JobState, frozenset[JobState]] = {
    PD: frozenset({R, JobState.CANCELLED}),
    R: frozenset({PR, CG}),
    PR: frozenset({CG}),
    CG: frozenset({PD} | ENDS),
    **{end: frozenset() for end in ENDS},
}


class NodeState(enum.Enum):
    """A node as the scheduler sees it: `up` takes jobs; `drain` keeps its running jobs
    but takes no new ones; `down` is silent (no heartbeat for a lease)."""

    UP = "up"
    DRAIN = "drain"
    DOWN = "down"

    @property
    def schedulable(self) -> bool:
        """New jobs may be placed on it."""
        return self is NodeState.UP

    @property
    def heard(self) -> bool:
        """Its agent answers (its jobs' reports count)."""
        return self is not NodeState.DOWN


# Every move between different node states is allowed; a move to the same state is not
# (it would record an event that changed nothing).
NODE_MOVES: Mapping[NodeState, frozenset[NodeState]] = {
    s: frozenset(NodeState) - {s} for s in NodeState
}


class DrainCause(enum.Enum):
    """Who took a node out of service: it decides who may put it back."""

    ADMIN = "admin"  # `phalanx admin drain`: only an admin's resume undoes it
    HEALTH_CHECK = "health_check"  # the node's health-check script: undone when it passes
    GPU_FAULT = "gpu_fault"  # a critical GPU fault (XID): an admin resumes it once fixed


class IllegalTransition(ValueError):
    """A move the state machine does not allow: a bug in the caller, never user input."""


@dataclass(frozen=True, slots=True)
class JobTransition:
    """One move of a job: at `time` (seconds), from → to, why, in allocation `epoch`."""

    time: float
    job_id: int
    from_state: JobState
    to_state: JobState
    reason: str
    epoch: int


@dataclass(frozen=True, slots=True)
class NodeTransition:
    """One move of a node: at `time`, from → to, why."""

    time: float
    node: str
    from_state: NodeState
    to_state: NodeState
    reason: str


def move_job(
    job_id: int, current: JobState, to: JobState, reason: str, epoch: int, now: float
) -> JobTransition:
    """The transition current → to of job `job_id`; IllegalTransition if not allowed."""
    if to not in JOB_MOVES[current]:
        raise IllegalTransition(f"job {job_id}: {current.value} → {to.value} is not a job move")
    return JobTransition(now, job_id, current, to, reason, epoch)


def move_node(
    node: str, current: NodeState, to: NodeState, reason: str, now: float
) -> NodeTransition:
    """The transition current → to of `node`; IllegalTransition if not allowed."""
    if to not in NODE_MOVES[current]:
        raise IllegalTransition(f"node {node}: {current.value} → {to.value} is not a node move")
    return NodeTransition(now, node, current, to, reason)
