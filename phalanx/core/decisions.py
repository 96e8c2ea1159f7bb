"""What one scheduling cycle decides: frozen data, applied by the head or the simulator."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from phalanx.core.model import JobRequest, Placement


class ReasonCode(enum.Enum):
    """Why a job is pending; the values are the Slurm-style names shown in `phalanx queue`.

    As in Slurm, the job next in line that waits for GPUs to free up says `Resources` (its
    message tells when its reserved GPUs free up) and the jobs behind it `Priority`;
    `ReqNodeNotAvail` waits for down or drained nodes to come back, while `Infeasible`
    would not fit even with every node of the cluster up.
    """

    DEPENDENCY = "Dependency"
    DEPENDENCY_NEVER_SATISFIED = "DependencyNeverSatisfied"
    QUOTA = "QuotaExceeded"
    RESOURCES = "Resources"
    NODES_UNAVAILABLE = "ReqNodeNotAvail"
    PRIORITY = "Priority"
    BACKFILL_WOULD_DELAY = "WouldDelayReservation"
    PREEMPTING = "WaitingForPreemption"
    INFEASIBLE = "Infeasible"
    NOT_CONSIDERED = "NotConsidered"
    BEGIN_TIME = "BeginTime"  # not before its --begin time


@dataclass(frozen=True, slots=True)
class Reason:
    code: ReasonCode
    message: str

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"


@dataclass(frozen=True, slots=True)
class Start:
    job_id: int
    placement: Placement
    borrowed: int = 0  # GPUs used above the team's nominal quota
    backfilled: bool = False


@dataclass(frozen=True, slots=True)
class Preemption:
    """Ask `victims` to checkpoint and exit so `for_job` can run (a notice, not a kill)."""

    for_job: int
    victims: tuple[int, ...]
    lost_work_gpu_s: float
    message: str


@dataclass(frozen=True, slots=True)
class Reservation:
    """The earliest place the blocked head job can run, from running jobs' time limits."""

    job_id: int
    start_s: float  # inf when some needed GPUs are held by jobs without a time limit
    nodes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Decisions:
    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    reservation: Reservation | None = None
    reasons: Mapping[int, Reason] = field(default_factory=dict)
    team_reasons: Mapping[str, Reason] = field(default_factory=dict)
    default_reason: Reason = Reason(ReasonCode.PRIORITY, "waiting for jobs ahead of it")

    def reason_for(self, job: JobRequest) -> Reason:
        """The reason for any pending job: its own, its team's, or the cycle's default."""
        reason = self.reasons.get(job.id)
        if reason is not None:
            return reason
        return self.team_reasons.get(job.team, self.default_reason)
