"""A job's life in the head: started, noticed, torn down, then ended or requeued. Every
change of its state goes through `move`, which checks it against the core's state machine
(core.lifecycle) and records it as a typed event."""

from __future__ import annotations

import logging

from phalanx.api.models import Notice
from phalanx.core import JobState, move_job
from phalanx.head import auth, corestate
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import CANCELLED_BY, JobRecord

log = logging.getLogger("phalanx.head")

# Why a job is torn down → the state it ends in. "preempt" and "requeue" put it back in
# the queue instead (PD).
FINAL_STATE = {
    "complete": JobState.COMPLETED,
    "fail": JobState.FAILED,
    "cancel": JobState.CANCELLED,
    "timeout": JobState.TIMEOUT,
    "node_fail": JobState.NODE_FAIL,
    "oom": JobState.OUT_OF_MEMORY,
}
REQUEUE = ("preempt", "requeue")
LAUNCH_FAILED = "LaunchFailed: "
PREEMPTED_FOR = "preempted for job "  # how a preemption's transition reason begins (metrics)
# A node that failed this many jobs within the window is kept out of the next placement
# of the job it failed (when enough other nodes exist).
BLAME_THRESHOLD = 2
BLAME_WINDOW_S = 3600.0


def move(tx: Tx, rec: JobRecord, to: JobState, kind: str, message: str, now: float) -> None:
    """The one way a job's state changes: checked (IllegalTransition for a move the state
    machine does not allow: a bug, rolled back by the control loop) and recorded as event
    `kind` with its typed transition."""
    transition = move_job(rec.id, rec.state, to, message, rec.epoch, now)
    rec.state = to
    tx.event(now, kind, message, rec.id, move=transition)
    tx.moved_jobs[rec.id] = rec


def start(
    mirror: Mirror,
    tx: Tx,
    rec: JobRecord,
    placement: list[tuple[str, list[int]]],
    now: float,
) -> None:
    """The core started the job on `placement` (node → GPUs, in rank order): a new epoch
    (the fencing token every launch and report carries), sent to each of its nodes."""
    rec.epoch += 1
    rec.start_time = now
    rec.end_time = None
    rec.reason = rec.reason_message = None
    rec.placement = placement
    rec.master_port = None
    rec.step_token = auth.new_step_token()
    rec.ranks = {}
    rec.stop_version = {}
    rec.all_running_at = None
    where = ", ".join(f"{n}[{','.join(map(str, g))}]" for n, g in placement)
    move(tx, rec, JobState.RUNNING, "started", f"allocated {where}; epoch {rec.epoch}", now)
    tx.update_job(rec)
    for node, _ in placement:
        mirror.node_jobs.setdefault(node, set()).add(rec.id)
        mirror.bump(tx, node)


def begin_stop(
    mirror: Mirror,
    tx: Tx,
    rec: JobRecord,
    why: str,
    exit_code: str | None,
    message: str,
    now: float,
) -> None:
    """Take a running job out of every node's desired state; it ends once all report it gone."""
    if rec.stopping is not None:
        return
    rec.stopping = why
    rec.pending_exit = exit_code
    rec.notice_deadline = None
    if rec.state is JobState.PENDING:
        # Never started (a cancel while queued): it ends at once, nothing to stop; queued
        # is where a requeue would put it anyway.
        if why in REQUEUE:
            rec.stopping = rec.pending_exit = None
        else:
            finalize(mirror, tx, rec, now)
        return
    move(tx, rec, JobState.COMPLETING, "stopping", message, now)
    for node, _ in rec.placement:
        mirror.bump(tx, node)
        rec.stop_version[node] = mirror.nodes[node].version if node in mirror.nodes else 0
    tx.update_job(rec)
    settle(mirror, tx, rec, now)


def restart_or_end(
    mirror: Mirror,
    tx: Tx,
    rec: JobRecord,
    code: str,
    message: str,
    now: float,
    *,
    end_as: str = "fail",
    exit_code: str | None = None,
    blame: str | None = None,
) -> None:
    """Something went wrong that a restart may fix: requeue while the job's restart budget
    lasts (and it allows requeueing), else end it as `end_as`. `blame` names the node at
    fault, remembered so a node that keeps failing jobs is avoided next time."""
    if blame is not None:
        _blame(mirror, tx, rec, blame, now)
    if rec.stopping is not None:
        return
    if rec.spec.requeue and rec.restart_count < rec.spec.max_restarts:
        rec.reason, rec.reason_message = code, message
        tx.event(now, code.lower(), message, rec.id, node=blame)
        begin_stop(mirror, tx, rec, "requeue", None, f"{message}; requeueing", now)
        return
    if not rec.spec.requeue:
        why = f"{message}; not requeued (--no-requeue)"
    else:
        why = f"{message}; no restarts left (max_restarts {rec.spec.max_restarts})"
    rec.reason, rec.reason_message = code, why
    tx.event(now, code.lower(), why, rec.id, node=blame)
    begin_stop(mirror, tx, rec, end_as, exit_code, why, now)


def launch_failed(
    mirror: Mirror,
    tx: Tx,
    rec: JobRecord,
    detail: str,
    now: float,
    *,
    node: str | None = None,
    exit_code: str = "1:0",
) -> None:
    """The job cannot be launched as specified (an unusable `-o` path, a field no agent
    accepts): fail it with reason LaunchFailed. Never requeued: it would fail the same way
    on the next node, and crash-looping nodes is how a poisoned job used to spread."""
    if rec.stopping is not None:
        return
    rec.reason, rec.reason_message = "LaunchFailed", detail
    message = LAUNCH_FAILED + detail
    tx.event(now, "launch_failed", message, rec.id, node=node)
    begin_stop(mirror, tx, rec, "fail", exit_code, message, now)


def _blame(mirror: Mirror, tx: Tx, rec: JobRecord, node: str, now: float) -> None:
    recent = [t for t in mirror.node_failures.get(node, []) if now - t < BLAME_WINDOW_S]
    recent.append(now)
    mirror.node_failures[node] = recent
    if len(recent) >= BLAME_THRESHOLD and node not in rec.avoid:
        rec.avoid.append(node)
        message = f"node {node} failed {len(recent)} jobs within the hour: placed elsewhere"
        tx.event(now, "avoid_node", message, rec.id, node=node)


def settle(mirror: Mirror, tx: Tx, rec: JobRecord, now: float) -> None:
    """If every node of a stopping job has confirmed its processes gone, end (or requeue) it."""
    if rec.stopping is None:
        return
    for node, _ in rec.placement:
        if node in rec.stop_version and not fenced(mirror, node, now):
            return
    finalize(mirror, tx, rec, now)


def fenced(mirror: Mirror, node: str, now: float) -> bool:
    """True once a silent node's agent has certainly stopped its jobs: it fences itself
    after `lease_s` without an answer, and the margin covers the kill and clock drift."""
    rec = mirror.nodes.get(node)
    if rec is None:
        return True
    if rec.state.heard or rec.last_heartbeat is None:
        return False
    s = mirror.settings
    return now - rec.last_heartbeat > s.lease_s + s.requeue_margin_s


def finalize(mirror: Mirror, tx: Tx, rec: JobRecord, now: float) -> None:
    why = rec.stopping or "cancel"
    if why == "fail":
        why = _failed_with_its_node(mirror, tx, rec, now)
    if rec.progress:  # keep the last training progress the job reported in its history
        last = rec.progress[min(rec.progress)]
        loss = "" if last.loss is None else f", loss {last.loss:.4f}"
        tx.event(now, "progress", f"last report: step {last.step}{loss}", rec.id)
    for node, _ in rec.placement:
        mirror.node_jobs.get(node, set()).discard(rec.id)
    if why in REQUEUE:
        corestate.requeue(mirror, rec, now)
        rec.restart_count += 1
        if why == "preempt":
            rec.reason, rec.reason_message = "Preempted", "preempted; requeued to run again"
        message = rec.reason_message or "requeued"
        max_restarts = rec.spec.max_restarts
        restart = f"restart {rec.restart_count} (max {max_restarts})"
        move(tx, rec, JobState.PENDING, "requeued", f"{message}; {restart}", now)
        _reset_allocation(rec)
        tx.update_job(rec)
        tx.kick = True
        return
    final = FINAL_STATE[why]
    corestate.finish(mirror, rec, final, now)
    rec.end_time = now
    rec.exit_code = rec.pending_exit or ("0:0" if final is JobState.COMPLETED else "0:15")
    if final is not JobState.COMPLETED and rec.reason is None:
        rec.reason = why
    move(tx, rec, final, "ended", f"{final.value} exit {rec.exit_code}", now)
    _reset_allocation(rec, keep_placement=True)
    tx.update_job(rec)
    del mirror.jobs[rec.id]
    mirror.live_per_user[rec.user] = mirror.live_per_user.get(rec.user, 1) - 1
    release_array_slot(mirror, tx, rec)
    tx.kick = True


def _failed_with_its_node(mirror: Mirror, tx: Tx, rec: JobRecord, now: float) -> str:
    """A rank failed and one of the job's nodes went down meanwhile: when a node dies, its
    peers' collectives fail first (seconds before the lease runs out), so the node, not
    the job, is to blame: requeue it as a node failure while its restarts last."""
    nodes = mirror.nodes
    dead = [n for n, _ in rec.placement if n in nodes and not nodes[n].state.heard]
    if not dead or not rec.spec.requeue or rec.restart_count >= rec.spec.max_restarts:
        return "fail"
    message = f"node {', '.join(dead)} stopped answering while the job ran"
    rec.reason, rec.reason_message = "NodeFail", message
    tx.event(now, "nodefail", message, rec.id, node=dead[0])
    return "requeue"


def _reset_allocation(rec: JobRecord, keep_placement: bool = False) -> None:
    if not keep_placement:
        rec.placement = []
    rec.stopping = None
    rec.pending_exit = None
    rec.master_port = None
    rec.step_token = None
    rec.ranks = {}
    rec.stop_version = {}
    rec.all_running_at = None
    rec.progress = {}
    rec.progress_at = {}
    rec.notices = []
    rec.notice_deadline = None


def cancel(mirror: Mirror, tx: Tx, rec: JobRecord, now: float, by: str) -> None:
    if rec.stopping is None:  # who cancelled it, kept with the job (sacct's `CANCELLED by`)
        rec.reason_message = f"{CANCELLED_BY}{by}"
    if rec.placement:
        begin_stop(mirror, tx, rec, "cancel", "0:15", f"cancelled by {by}", now)
        return
    rec.reason = "cancelled"
    tx.event(now, "cancelled", f"cancelled by {by} while pending", rec.id)
    begin_stop(mirror, tx, rec, "cancel", "0:0", f"cancelled by {by} while pending", now)


def notify(
    mirror: Mirror,
    tx: Tx,
    rec: JobRecord,
    signal: str,
    reason: str,
    now: float,
    *,
    batch_only: bool = False,
    steps_only: bool = False,
) -> None:
    """Have the job's agents deliver `signal` to its processes once (this epoch)."""
    notice = Notice(
        id=len(rec.notices) + 1,
        signal=signal,
        batch_only=batch_only,
        steps_only=steps_only,
        reason=reason,
    )
    rec.notices.append(notice)
    for node, _ in rec.placement:
        mirror.bump(tx, node)
    tx.update_job(rec)
    tx.event(now, "signal", f"{signal}: {reason}", rec.id)


def preempt(
    mirror: Mirror, tx: Tx, rec: JobRecord, for_job: int, now: float, *, why: str | None = None
) -> None:
    """Cooperative preemption: a notice first; the job may checkpoint and exit (any exit
    then requeues it); past the deadline it is stopped (SIGTERM, then SIGKILL). `why`:
    the reason when it is not to make room for job `for_job` (the idle-GPU policy)."""
    if rec.stopping is not None or rec.state is not JobState.RUNNING:
        return
    grace = rec.spec.preempt_grace_s
    grace_s = mirror.settings.preempt_grace_s if grace is None else float(grace)
    cause = why or f"{PREEMPTED_FOR}{for_job}"
    if grace_s <= 0:
        begin_stop(mirror, tx, rec, "preempt", None, cause, now)
        return
    rec.notice_deadline = now + grace_s
    why = f"{cause}: checkpoint and exit within {grace_s:g} s"
    move(tx, rec, JobState.PREEMPTED, "preempting", why, now)
    notify(mirror, tx, rec, rec.spec.preempt_signal, why, now)


def release_array_slot(mirror: Mirror, tx: Tx, ended: JobRecord) -> None:
    """An array task ended (or was held): let the next throttled task of the same array
    into the queue (a held task waits for its release)."""
    if ended.array_job_id is None or ended.spec.array is None:
        return
    waiting = [
        r
        for r in mirror.jobs.values()
        if r.array_job_id == ended.array_job_id
        and not r.in_core
        and r.hold is None
        and r.state is JobState.PENDING
    ]
    if waiting:
        nxt = min(waiting, key=lambda r: r.id)
        nxt.in_core = True
        corestate.queue(mirror, tx, [nxt], nxt.submit_time)
