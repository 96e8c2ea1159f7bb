"""A running job acting on itself with its own credential (PHALANX_STEP_TOKEN), as Slurm
lets a job script run `scontrol requeue $SLURM_JOB_ID` (submitit's checkpoint path: on
USR2 it checkpoints, then requeues itself). The step token names one job while it runs;
it may requeue only that job, as the job's owner would."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from phalanx.api import models as m
from phalanx.head import jobcontrol
from phalanx.head.auth import Principal
from phalanx.head.control import HeadError
from phalanx.head.service import Head

_bearer = HTTPBearer(auto_error=False)
JobId = Annotated[int, Path(ge=1, le=2**31 - 1)]


def router(head: Head) -> APIRouter:
    routes = APIRouter()

    @routes.post(
        "/v1/jobs/{job_id}/self/requeue",
        response_model=m.JobList,
        responses={
            401: {"model": m.ErrorBody, "description": "not this running job's step token"},
            409: {"model": m.ErrorBody, "description": "it is not running, or --no-requeue"},
        },
    )
    def requeue_self(
        job_id: JobId,
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> m.JobList:
        """The running job requeues itself (`scontrol requeue` inside it): stopped and
        queued again under the same id, its restart count (SLURM_RESTART_COUNT) one up."""
        head.check_step_token(job_id, creds.credentials if creds else None)
        with head.control.lock:
            rec = head.mirror.jobs.get(job_id)
            if rec is None:
                raise HeadError(404, f"no job {job_id}")
            user, team = rec.user, rec.team
            # Itself only: task 0 of an array has the array's id, which names every task.
            ref = str(job_id)
            if rec.array_job_id is not None and rec.array_task_id is not None:
                ref = f"{rec.array_job_id}_{rec.array_task_id}"
        # The job acts as its owner would.
        who = Principal(kind="api", token_id=0, user=user, teams=frozenset({team}))
        return head.control_jobs(lambda tx: jobcontrol.requeue(head.mirror, tx, who, ref))

    return routes
