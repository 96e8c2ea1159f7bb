"""Plain data the scheduler reasons about: nodes, teams, job requests, placements."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class JobState(enum.Enum):
    """Slurm-compatible job states; each member knows whether it is terminal."""

    PENDING = "PD"
    RUNNING = "R"
    COMPLETING = "CG"
    COMPLETED = "CD"
    FAILED = "F"
    CANCELLED = "CA"
    TIMEOUT = "TO"
    NODE_FAIL = "NF"
    OUT_OF_MEMORY = "OOM"  # killed by the OOM killer for its --mem limit (Slurm's short form)
    PREEMPTED = "PR"

    @property
    def terminal(self) -> bool:
        """It ended: it never moves again."""
        return self in _TERMINAL

    @property
    def holds_gpus(self) -> bool:
        """Its allocation stands: running, noticed, or being torn down."""
        return self in (JobState.RUNNING, JobState.PREEMPTED, JobState.COMPLETING)

    @property
    def running(self) -> bool:
        """Counts as running: its processes should run (R, or PR until its deadline)."""
        return self in (JobState.RUNNING, JobState.PREEMPTED)


_TERMINAL = frozenset(
    {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.OUT_OF_MEMORY,
    }
)


class DependencyKind(enum.Enum):
    """Slurm `--dependency` types."""

    AFTER = "after"  # the other job has started (or ended / was cancelled)
    AFTEROK = "afterok"  # the other job completed successfully
    AFTERANY = "afterany"  # the other job ended in any way
    AFTERNOTOK = "afternotok"  # the other job ended unsuccessfully


@dataclass(frozen=True, slots=True)
class Dependency:
    kind: DependencyKind
    job_id: int

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.job_id}"


@dataclass(frozen=True, slots=True)
class Node:
    """One server; all its GPUs form one NVLink domain."""

    name: str
    gpus: int
    gpu_model: str = "H100"
    gpu_memory_gb: float = 80.0
    rack: str = "rack0"
    block: str = "block0"

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.gpus > 62:
            raise ValueError(f"node {self.name}: GPU count must be 0..62, got {self.gpus}")


@dataclass(frozen=True, slots=True)
class Team:
    """A team with a nominal GPU quota; teams in one cohort lend each other idle quota.

    `quota=None` means unlimited (no quota enforcement for this team).
    `borrowing_limit` caps how many GPUs above its quota the team may borrow.
    `weight` is the fair-share weight (defaults to the quota, or 1).
    """

    name: str
    quota: int | None = None
    cohort: str | None = None
    borrowing_limit: int | None = None
    weight: float | None = None

    @property
    def share(self) -> float:
        if self.weight is not None:
            return max(self.weight, 1e-9)
        return float(self.quota) if self.quota else 1.0


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What a job asks of the scheduler.

    A job asks for `nodes` × `gpus_per_node` GPUs as one gang. `duration_s` is only known in
    simulation (for the clairvoyant `sjf`/`srtf` policies); `attained_s` is the run time the
    job already received before it was requeued (seconds of wall time). `begin_s`: it may
    not start before this time (`--begin`); `nodelist`: it runs only on these nodes (`-w`;
    empty: anywhere).
    """

    id: int
    team: str
    user: str = ""
    priority: int = 0
    nodes: int = 1
    gpus_per_node: int = 1
    time_limit_s: float | None = None
    submit_s: float = 0.0
    dependencies: tuple[Dependency, ...] = ()
    dependency_any: bool = False  # Slurm's `?` separator: any one dependency suffices
    preemptible: bool = True
    gpu_model: str | None = None
    duration_s: float | None = None
    attained_s: float = 0.0
    exclude_nodes: frozenset[str] = field(default_factory=frozenset)
    begin_s: float | None = None
    nodelist: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"job {self.id}: nodes must be ≥ 1, got {self.nodes}")
        if self.gpus_per_node < 1:
            raise ValueError(f"job {self.id}: gpus_per_node must be ≥ 1, got {self.gpus_per_node}")
        if self.time_limit_s is not None and self.time_limit_s <= 0:
            raise ValueError(f"job {self.id}: time limit must be positive, got {self.time_limit_s}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def shape(self) -> str:
        if self.nodes == 1:
            return f"{self.gpus_per_node} GPU{'s' if self.gpus_per_node != 1 else ''} on one node"
        return f"{self.nodes} nodes × {self.gpus_per_node} GPUs"


PLACEMENT_POLICIES: dict[str, str] = {
    "topology": "best fit on one node; gangs in the tightest rack, then block, then cluster",
    "spread": "most free GPUs first, ignoring racks (like kube-scheduler's LeastAllocated); "
    "a baseline to show what topology-aware placement is worth",
}
DEFAULT_PLACEMENT = "topology"


def gang_shape(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """Turn a plain GPU count into (nodes, GPUs per node) for nodes of `gpus_per_node` GPUs.

    A count that fits one node stays on one node; a larger count is spread evenly over
    the fewest nodes (12 GPUs on 8-GPU nodes → 2 × 6).
    """
    if gpus <= gpus_per_node:
        return 1, gpus
    nodes = -(-gpus // gpus_per_node)
    return nodes, -(-gpus // nodes)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a gang runs: (node index, GPU bitmask) per node, in rank order."""

    slots: tuple[tuple[int, int], ...]

    @property
    def node_indices(self) -> tuple[int, ...]:
        return tuple(n for n, _ in self.slots)

    def gpu_indices(self, slot: int) -> tuple[int, ...]:
        mask = self.slots[slot][1]
        return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


@dataclass(slots=True)
class RunningJob:
    """A job holding GPUs. `checkpoint_s` is when its last checkpoint completed."""

    request: JobRequest
    placement: Placement
    start_s: float
    checkpoint_s: float
    borrowed: int = 0  # GPUs above the team's nominal quota at admission

    @property
    def expected_end_s(self) -> float:
        limit = self.request.time_limit_s
        return float("inf") if limit is None else self.start_s + limit

    def lost_work(self, now: float) -> float:
        """GPU-seconds lost if this job stopped now (progress since its last checkpoint)."""
        return max(0.0, now - max(self.checkpoint_s, self.start_s)) * self.request.gpus
