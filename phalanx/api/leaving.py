"""Wire models of a node leaving the cluster on purpose (`POST /v1/nodes/{name}/leave`).

An agent whose server is being taken away (a Slurm allocation ending or preempted, a cloud
instance reclaimed) asks the head, before it goes, to drain its node and give each of its
jobs the preemption notice, so they checkpoint and are requeued instead of failing.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from phalanx.api.models import JobId, Lenient, Name, NoNul, Wire
from phalanx.api.states import JobStateCode

MAX_LEAVE_GRACE_S = 86400.0  # a day: no allocation warns further ahead
MAX_LEAVING_JOBS = 4096  # jobs one node can hold (one per GPU, with room for CPU-only jobs)


class LeaveRequest(Wire):
    """Why the node leaves, and how long its jobs have to checkpoint and exit."""

    reason: Annotated[str, StringConstraints(min_length=1, max_length=500), NoNul]
    grace_s: Annotated[float, Field(ge=0, le=MAX_LEAVE_GRACE_S, allow_inf_nan=False)]


class LeavingJob(Lenient):
    """A job of the leaving node: noticed (PR, with the seconds it has left), or already
    stopping (CG)."""

    id: JobId
    state: JobStateCode
    deadline_in_s: Annotated[float, Field(ge=0, le=MAX_LEAVE_GRACE_S)] | None = None


class LeaveAnswer(Lenient):
    node: Name
    jobs: list[LeavingJob] = Field(max_length=MAX_LEAVING_JOBS)
