"""What the head does as time passes: time limits and their warning signal, silent nodes,
preemption deadlines, hung jobs."""

from __future__ import annotations

from phalanx.head.lifecycle import begin_stop, notify, restart_or_end, settle
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import JobRecord
from phalanx.head.reports import NO_HEARTBEAT, WAS_DRAINED, set_node_state

TIME_LIMIT_NOTICE = "time limit in "


def tick(mirror: Mirror, tx: Tx, now: float) -> None:
    for rec in list(mirror.jobs.values()):
        if rec.stopping is None and rec.start_time is not None and rec.state in ("R", "PR"):
            _time_limit(mirror, tx, rec, now)
        deadline = rec.notice_deadline
        if rec.stopping is None and rec.state == "PR" and deadline is not None and now >= deadline:
            message = "preemption deadline passed: stopping it"
            begin_stop(mirror, tx, rec, "preempt", None, message, now)
        if rec.stopping is None and rec.state == "R":
            _hang(mirror, tx, rec, now)
    _nodes(mirror, tx, now)


def _time_limit(mirror: Mirror, tx: Tx, rec: JobRecord, now: float) -> None:
    limit = rec.spec.time_limit_s
    if limit is None:
        return
    started = rec.start_time or 0.0
    if now > started + limit:
        begin_stop(mirror, tx, rec, "timeout", "0:15", f"time limit of {limit} s reached", now)
        return
    sig = rec.spec.signal
    if sig is None or now < started + limit - sig.seconds_before:
        return
    if any(n.reason.startswith(TIME_LIMIT_NOTICE) for n in rec.notices):
        return
    left = max(0.0, started + limit - now)
    reason = f"{TIME_LIMIT_NOTICE}{left:.0f} s (--signal)"
    notify(mirror, tx, rec, sig.signal, reason, now, batch_only=sig.batch_only)


def _hang(mirror: Mirror, tx: Tx, rec: JobRecord, now: float) -> None:
    """A job that reported progress and then went silent for its window is restarted."""
    if not rec.progress_at:
        return
    window = rec.spec.hang_timeout_s
    window_s = mirror.settings.hang_timeout_s if window is None else float(window)
    if window_s <= 0:
        return
    silent = sorted(r for r, at in rec.progress_at.items() if now - at > window_s)
    if not silent:
        return
    ranks = ", ".join(map(str, silent))
    noun = "rank" if len(silent) == 1 else "ranks"
    message = f"hang: {noun} {ranks} reported no progress for {window_s:g} s"
    restart_or_end(mirror, tx, rec, "Hang", message, now)


def _nodes(mirror: Mirror, tx: Tx, now: float) -> None:
    """A node silent for the lease is down (nothing new goes there); once its agent has
    certainly fenced itself (lease + margin), its jobs are restarted elsewhere."""
    s = mirror.settings
    for node in mirror.nodes.values():
        if node.last_heartbeat is None:
            continue
        silent = now - node.last_heartbeat
        if silent > s.lease_s and node.state != "down":
            reason = f"{NO_HEARTBEAT} for {silent:.0f} s"
            if node.state == "drain":  # remembered: it comes back drained
                reason += f"{WAS_DRAINED}{node.reason or 'drained'}"
            set_node_state(mirror, tx, node, "down", reason, now, "node_down", reason)
        if node.state != "down" or silent <= s.lease_s + s.requeue_margin_s:
            continue
        for job_id in sorted(mirror.node_jobs.get(node.name, set())):
            rec = mirror.jobs.get(job_id)
            if rec is None:
                continue
            if rec.stopping is not None:
                settle(mirror, tx, rec, now)
                continue
            message = f"node {node.name} stopped answering ({NO_HEARTBEAT} for {silent:.0f} s)"
            restart_or_end(
                mirror, tx, rec, "NodeFail", message, now, end_as="node_fail", blame=node.name
            )
