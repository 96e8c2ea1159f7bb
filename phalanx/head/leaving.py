"""A node leaving on purpose (`POST /v1/nodes/{name}/leave`): drained, its jobs noticed.

The agent of a node that is about to go away (its Slurm allocation ends or is preempted:
`phalanx agent --on-sigterm leave`) calls it with its own node credential; an admin may
call it for any node. The node is drained at once (nothing new lands there) and each of
its running jobs gets the cooperative-preemption notice, as a preemption victim does: its
preemption signal, `PHALANX_PREEMPT_DEADLINE`, state PR, and a deadline that is the
sooner of its own preemption grace and the node's `grace_s`; once its ranks exit (or the
deadline passes) it is requeued and resumes from its checkpoint elsewhere. Calling it
again changes nothing but may bring the deadlines closer.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from phalanx.api.leaving import LeaveAnswer, LeaveRequest, LeavingJob
from phalanx.api.models import ErrorBody
from phalanx.api.states import JobStateCode
from phalanx.core import JobState
from phalanx.core.lifecycle import DrainCause
from phalanx.head import lifecycle, nodestates
from phalanx.head.auth import Forbidden, Principal
from phalanx.head.control import HeadError
from phalanx.head.mirror import Tx
from phalanx.head.records import JobRecord
from phalanx.head.service import Head

_bearer = HTTPBearer(auto_error=False)
NodeName = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@+-]+$")]
LEAVING = "leaving: "  # how the drain reason of a leaving node begins


def _err(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


async def _principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    head: Head = request.app.state.head
    return head.authenticate(creds.credentials if creds else None)


Who = Annotated[Principal, Depends(_principal)]
router = APIRouter()


@router.post(
    "/v1/nodes/{name}/leave",
    response_model=LeaveAnswer,
    responses={
        403: _err("neither this node's own credential nor an admin's token"),
        404: _err("no such node"),
    },
)
def leave(name: NodeName, body: LeaveRequest, request: Request, who: Who) -> LeaveAnswer:
    """The node leaves soon: drain it and give its jobs the preemption notice (the
    sooner of their own grace and `grace_s`), so they checkpoint and requeue. Its own
    node credential or an admin's token."""
    if who.kind == "node":
        if who.node != name:
            raise Forbidden(f"this node credential is node {who.node!r}'s, not {name!r}")
    elif not (who.kind == "api" and who.admin):
        raise Forbidden("a node leaves with its own node credential, or an admin's token")
    head: Head = request.app.state.head
    return head.control.call(lambda tx: _leave(head, tx, name, body))


def _leave(head: Head, tx: Tx, name: str, body: LeaveRequest) -> LeaveAnswer:
    mirror = head.mirror
    node = mirror.nodes.get(name)
    if node is None:
        raise HeadError(404, f"no node {name!r}")
    now = tx.now
    reason = f"{LEAVING}{body.reason}"
    if node.drain_reason != reason:
        nodestates.drain(mirror, tx, node, DrainCause.ADMIN, reason, now, "node_leave")
    answer = []
    for job_id in sorted(mirror.node_jobs.get(name, ())):
        rec = mirror.jobs.get(job_id)
        if rec is None or not rec.state.running:
            continue
        if rec.stopping is None:
            _notice(head, tx, rec, name, body, now)
        left = None
        if rec.state is JobState.PREEMPTED and rec.notice_deadline is not None:
            left = max(0.0, rec.notice_deadline - now)
        state: JobStateCode = "CG" if rec.stopping is not None else rec.state.value
        answer.append(LeavingJob(id=rec.id, state=state, deadline_in_s=left))
    return LeaveAnswer(node=name, jobs=answer)


def _notice(head: Head, tx: Tx, rec: JobRecord, name: str, body: LeaveRequest, now: float) -> None:
    """A running job gets the preemption notice; one noticed already, a deadline no later
    than the node's."""
    own = rec.spec.preempt_grace_s
    grace = min(head.mirror.settings.preempt_grace_s if own is None else float(own), body.grace_s)
    cause = f"node {name} is leaving ({body.reason})"
    if rec.state is JobState.PREEMPTED:
        deadline = now + grace
        if rec.notice_deadline is None or deadline < rec.notice_deadline:
            rec.notice_deadline = deadline
            tx.update_job(rec)
            tx.event(now, "node_leave", f"{cause}: deadline now in {grace:g} s", rec.id)
        return
    if grace <= 0:
        lifecycle.begin_stop(head.mirror, tx, rec, "preempt", None, cause, now)
        return
    rec.notice_deadline = now + grace
    why = f"{cause}: checkpoint and exit within {grace:g} s"
    lifecycle.move(tx, rec, JobState.PREEMPTED, "preempting", why, now)
    lifecycle.notify(head.mirror, tx, rec, rec.spec.preempt_signal, why, now)
