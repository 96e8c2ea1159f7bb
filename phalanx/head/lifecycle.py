"""Job and node transitions the head makes from what agents report and from the clock."""

from __future__ import annotations

import logging

from phalanx.api.models import REQUEUE_EXIT_CODE, Heartbeat, ProcessStatus
from phalanx.core import JobState
from phalanx.head import store
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import JobRecord, NodeRecord

log = logging.getLogger("phalanx.head")

# Why a job is torn down → the state it ends in.
FINAL_STATE = {
    "complete": "CD",
    "fail": "F",
    "cancel": "CA",
    "timeout": "TO",
    "node_fail": "NF",
}
NO_HEARTBEAT = "no heartbeat"


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
    rec.state = "CG"
    for node, _ in rec.placement:
        mirror.bump(tx, node)
        rec.stop_version[node] = mirror.nodes[node].version if node in mirror.nodes else 0
    tx.update_job(rec)
    tx.event(now, "stopping", message, rec.id)
    settle(mirror, tx, rec, now)


def settle(mirror: Mirror, tx: Tx, rec: JobRecord, now: float) -> None:
    """If every node of a stopping job has confirmed its processes gone, end (or requeue) it."""
    if rec.stopping is None:
        return
    for node, _ in rec.placement:
        if node in rec.stop_version and not _node_gone(mirror, node):
            return
    finalize(mirror, tx, rec, now)


def _node_gone(mirror: Mirror, node: str) -> bool:
    rec = mirror.nodes.get(node)
    return rec is None or rec.state == "down"


def finalize(mirror: Mirror, tx: Tx, rec: JobRecord, now: float) -> None:
    why = rec.stopping or "cancel"
    if rec.progress:  # keep the last training progress the job reported in its history
        last = rec.progress[min(rec.progress)]
        loss = "" if last.loss is None else f", loss {last.loss:.4f}"
        tx.event(now, "progress", f"last report: step {last.step}{loss}", rec.id)
    core = mirror.core
    for node, _ in rec.placement:
        mirror.node_jobs.get(node, set()).discard(rec.id)
    if why in ("preempt", "requeue"):
        if core is not None and rec.id in core.running:
            core.requeue(rec.id, now)
        rec.state = "PD"
        rec.restart_count += 1
        if why == "preempt":
            rec.reason, rec.reason_message = "Preempted", "preempted; requeued to run again"
        else:
            rec.reason, rec.reason_message = "Requeued", "the job asked to be requeued (exit 75)"
        tx.event(now, "requeued", f"{rec.reason_message}; restart {rec.restart_count}", rec.id)
        _reset_allocation(rec)
        tx.update_job(rec)
        tx.kick = True
        return
    final = FINAL_STATE[why]
    if core is not None and rec.in_core and (rec.id in core.running or rec.id in core.pending):
        core.finish(rec.id, now, JobState(final))
    rec.state = final
    rec.end_time = now
    rec.exit_code = rec.pending_exit or ("0:0" if final == "CD" else "0:15")
    if final != "CD" and rec.reason is None:
        rec.reason = why
    tx.event(now, "ended", f"{final} exit {rec.exit_code}", rec.id)
    _reset_allocation(rec, keep_placement=True)
    tx.update_job(rec)
    del mirror.jobs[rec.id]
    _release_array_task(mirror, tx, rec, now)
    tx.kick = True


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


def cancel(mirror: Mirror, tx: Tx, rec: JobRecord, now: float, by: str) -> None:
    if rec.placement:
        begin_stop(mirror, tx, rec, "cancel", "0:15", f"cancelled by {by}", now)
        return
    rec.stopping = "cancel"
    rec.pending_exit = "0:0"
    rec.reason = "cancelled"
    tx.event(now, "cancelled", f"cancelled by {by} while pending", rec.id)
    finalize(mirror, tx, rec, now)


def _release_array_task(mirror: Mirror, tx: Tx, ended: JobRecord, now: float) -> None:
    """An array task ended: let the next throttled task of the same array into the queue."""
    if ended.array_job_id is None or ended.spec.array is None:
        return
    waiting = [
        r
        for r in mirror.jobs.values()
        if r.array_job_id == ended.array_job_id and not r.in_core and r.state == "PD"
    ]
    if waiting:
        nxt = min(waiting, key=lambda r: r.id)
        nxt.in_core = True
        if mirror.core is not None:
            from phalanx.head.scheduling import core_request

            mirror.core.submit(core_request(mirror, nxt), nxt.submit_time)


# ----------------------------------------------------------------------------- heartbeats
def heartbeat(mirror: Mirror, tx: Tx, node: NodeRecord, hb: Heartbeat, now: float) -> None:
    """Apply one agent report: liveness, master ports, and every rank's status."""
    node.last_heartbeat = now
    if node.state == "down" and (node.reason or "").startswith(NO_HEARTBEAT):
        node.state, node.reason = "up", None
        store.set_node_state(tx.conn, node)
        tx.event(now, "node_up", "heartbeats resumed", node=node.name)
        if mirror.core is not None and node.name in mirror.core.node_index:
            mirror.core.set_node_up(node.name, True)
        tx.kick = True
    for key, port in hb.master_ports.items():
        rec = mirror.jobs.get(int(key)) if key.isdigit() else None
        if (
            rec is not None
            and rec.placement
            and rec.placement[0][0] == node.name
            and rec.master_port is None
            and rec.stopping is None
        ):
            rec.master_port = port
            tx.update_job(rec)
            for other, _ in rec.placement[1:]:
                mirror.bump(tx, other)
    reports: dict[int, list[ProcessStatus]] = {}
    for p in hb.processes:
        reports.setdefault(p.job_id, []).append(p)
    for job_id in sorted(mirror.node_jobs.get(node.name, set())):
        live = mirror.jobs.get(job_id)
        if live is None:
            continue
        rec = live
        procs = [p for p in reports.get(job_id, []) if p.epoch == rec.epoch]
        if rec.stopping is not None:
            gone = hb.version >= rec.stop_version.get(node.name, 0) and not any(
                p.running for p in procs
            )
            if gone:
                rec.stop_version.pop(node.name, None)
                settle(mirror, tx, rec, now)
            continue
        rec.ranks[node.name] = {p.rank: p for p in procs}
        _evaluate(mirror, tx, rec, now)


def _evaluate(mirror: Mirror, tx: Tx, rec: JobRecord, now: float) -> None:
    statuses = {rank: p for ranks in rec.ranks.values() for rank, p in ranks.items()}
    for rank in sorted(statuses):
        p = statuses[rank]
        if p.running or (p.exit_code == 0 and p.signal is None):
            continue
        code = p.exit_code if p.exit_code is not None else 0
        sig = p.signal or 0
        wants_requeue = code == REQUEUE_EXIT_CODE and not sig and rec.spec.requeue
        if wants_requeue and rec.restart_count < rec.spec.max_restarts:
            message = f"rank {rank} exited {code}: checkpointed, asks to be requeued"
            begin_stop(mirror, tx, rec, "requeue", None, message, now)
            return
        how = f"exited with code {code}" if not sig else f"was killed by signal {sig}"
        what = "the batch script" if rec.spec.launcher == "batch" else f"rank {rank}"
        begin_stop(mirror, tx, rec, "fail", f"{code}:{sig}", f"{what} {how}", now)
        return
    expected = [r for i in range(len(rec.placement)) for r in rec.expected_ranks(i)]
    if rec.all_running_at is None and all(r in statuses for r in expected):
        # Every rank was started (a fast one may already have exited): the job is running.
        rec.all_running_at = now
        tx.event(now, "running", f"all {len(expected)} processes started", rec.id)
    if all(r in statuses and not statuses[r].running for r in expected):
        begin_stop(mirror, tx, rec, "complete", "0:0", "all ranks exited with code 0", now)


# ----------------------------------------------------------------------------- the clock
def tick(mirror: Mirror, tx: Tx, now: float) -> None:
    """Time limits and node liveness."""
    for rec in list(mirror.jobs.values()):
        limit = rec.spec.time_limit_s
        running = rec.state == "R" and rec.stopping is None and rec.start_time is not None
        if running and limit is not None and now > (rec.start_time or 0.0) + limit:
            begin_stop(mirror, tx, rec, "timeout", "0:15", f"time limit of {limit} s reached", now)
    lease = mirror.settings.lease_s
    for node in mirror.nodes.values():
        if node.state != "up" or node.last_heartbeat is None:
            continue
        silent = now - node.last_heartbeat
        if silent > lease:
            node.state, node.reason = "down", f"{NO_HEARTBEAT} for {silent:.0f} s"
            store.set_node_state(tx.conn, node)
            tx.event(now, "node_down", node.reason, node=node.name)
            if mirror.core is not None and node.name in mirror.core.node_index:
                mirror.core.set_node_up(node.name, False, node.reason)
            for job_id in mirror.node_jobs.get(node.name, set()).copy():
                stopping = mirror.jobs.get(job_id)
                if stopping is not None and stopping.stopping is not None:
                    settle(mirror, tx, stopping, now)
