"""The scheduling core: pure functions and plain data (no I/O, no wall clock, no threads)."""

from phalanx.core.cycle import DEFAULT_CONFIG, SchedulerConfig, schedule
from phalanx.core.decisions import (
    Decisions,
    Preemption,
    Reason,
    ReasonCode,
    Reservation,
    Start,
)
from phalanx.core.model import (
    DEFAULT_PLACEMENT,
    PLACEMENT_POLICIES,
    Dependency,
    DependencyKind,
    JobRequest,
    JobState,
    Node,
    Placement,
    RunningJob,
    Team,
    gang_shape,
)
from phalanx.core.policies import DEFAULT_POLICY, POLICIES, get_policy
from phalanx.core.state import ClusterState, StateError

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_PLACEMENT",
    "DEFAULT_POLICY",
    "PLACEMENT_POLICIES",
    "POLICIES",
    "ClusterState",
    "Decisions",
    "Dependency",
    "DependencyKind",
    "JobRequest",
    "JobState",
    "Node",
    "Placement",
    "Preemption",
    "Reason",
    "ReasonCode",
    "Reservation",
    "RunningJob",
    "SchedulerConfig",
    "Start",
    "StateError",
    "Team",
    "gang_shape",
    "get_policy",
    "schedule",
]
