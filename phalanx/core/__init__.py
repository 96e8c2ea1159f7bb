"""The scheduling core: pure functions and plain data (no I/O, no wall clock, no threads)."""

from phalanx.core.apply import Applied, apply_decisions
from phalanx.core.cycle import DEFAULT_CONFIG, SchedulerConfig, queue_order, schedule
from phalanx.core.decisions import (
    Decisions,
    Preemption,
    Reason,
    ReasonCode,
    Reservation,
    Start,
)
from phalanx.core.lifecycle import (
    JOB_MOVES,
    NODE_MOVES,
    DrainCause,
    IllegalTransition,
    JobTransition,
    NodeState,
    NodeTransition,
    move_job,
    move_node,
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
    "JOB_MOVES",
    "NODE_MOVES",
    "PLACEMENT_POLICIES",
    "POLICIES",
    "Applied",
    "ClusterState",
    "Decisions",
    "Dependency",
    "DependencyKind",
    "DrainCause",
    "IllegalTransition",
    "JobRequest",
    "JobState",
    "JobTransition",
    "Node",
    "NodeState",
    "NodeTransition",
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
    "apply_decisions",
    "gang_shape",
    "get_policy",
    "move_job",
    "move_node",
    "queue_order",
    "schedule",
]
