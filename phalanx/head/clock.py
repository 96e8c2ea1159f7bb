"""What the head does as time passes: time limits and their warning signal, silent nodes,
preemption deadlines, hung jobs."""

from __future__ import annotations

import logging

from phalanx.api.quorum import fresh_quorum
from phalanx.core import JobState, NodeState
from phalanx.head import nodestates, peers
from phalanx.head.lifecycle import begin_stop, notify, restart_or_end, settle
from phalanx.head.mirror import Mirror, Settings, Tx
from phalanx.head.nodestates import NO_HEARTBEAT
from phalanx.head.records import JobRecord

TIME_LIMIT_NOTICE = "time limit in "


log = logging.getLogger("phalanx.head")


def pause_threshold_s(settings: Settings) -> float:
    """A gap between two ticks of the control loop longer than this means the head itself
    was stopped (SIGSTOP, a long GC pause, a frozen VM), not that the nodes went quiet."""
    return max(3 * settings.tick_s, min(settings.heartbeat_s, settings.lease_s / 4))


# A gap in which the head's process used less CPU than this share of it was a freeze
# (SIGSTOP, a stopped VM: nothing ran); one with more was the head busy or starved of CPU
# (overloaded), which its backlog accounts for, bounded (head/overload.py).
FROZEN_CPU_SHARE = 0.02


class PauseWatch:
    """Notices the control loop itself not running: fed the monotonic time of each tick
    (and the process's CPU time, `time.process_time()`), it returns how long the loop stood
    still beyond its tick (0.0 when it did not). A gap in which the process kept using CPU
    is not a pause but the head behind on its work: a pause gives every node a fresh lease,
    without bound, and a head overloaded for good, stalling again and again, must still
    find its dead nodes (the overload grace bounds that: head/overload.py)."""

    def __init__(self, settings: Settings, start: float, cpu: float | None = None) -> None:
        self.settings = settings
        self.last = start
        self.cpu = cpu

    def paused(self, mono: float, cpu: float | None = None) -> float:
        gap, self.last = mono - self.last, mono
        used, self.cpu = (None if cpu is None or self.cpu is None else cpu - self.cpu), cpu
        late = gap - self.settings.tick_s
        if late <= pause_threshold_s(self.settings):
            return 0.0
        grace = self.settings.overload_grace_s
        busy = grace > 0 and used is not None and used > FROZEN_CPU_SHARE * gap
        return 0.0 if busy else late


def tick(
    mirror: Mirror, tx: Tx, now: float, paused_s: float = 0.0, heard_until: float | None = None
) -> None:
    """Everything time decides. `paused_s`: how long the control loop itself did not run
    (its own monotonic clock jumped by more than `pause_threshold_s`): nobody is blamed
    for silence the head could not hear. `heard_until`: the time up to which the head
    could hear every heartbeat sent (head/overload.py; default now): a lease is judged
    against it, so a head behind on its work does not hold late heartbeats against nodes."""
    if paused_s > 0:
        resume_after_pause(mirror, tx, now, paused_s)
    stale = mirror.peers_at is None or not 0 <= now - mirror.peers_at < peers.REFRESH_S
    if stale or len(mirror.peer_lists) != len(mirror.nodes):  # also as soon as a node joins
        mirror.peer_lists = peers.pick(mirror)
        mirror.peers_at = now
    # Only placed jobs can be running: at 10,000 nodes with 100,000 queued, walking every
    # job twice a second was a tenth of an idle head's CPU (bench/fleet.py).
    for job_id in sorted({j for placed in mirror.node_jobs.values() for j in placed}):
        rec = mirror.jobs.get(job_id)
        if rec is None or rec.stopping is not None or not rec.state.running:
            continue
        if rec.start_time is not None:
            _time_limit(mirror, tx, rec, now)
        deadline = rec.notice_deadline
        noticed = rec.state is JobState.PREEMPTED
        if rec.stopping is None and noticed and deadline is not None and now >= deadline:
            message = "preemption deadline passed: stopping it"
            begin_stop(mirror, tx, rec, "preempt", None, message, now)
        if rec.stopping is None and rec.state is JobState.RUNNING:
            _hang(mirror, tx, rec, now)
    _nodes(mirror, tx, now, now if heard_until is None else min(now, heard_until))


def resume_after_pause(mirror: Mirror, tx: Tx, now: float, paused_s: float) -> None:
    """The head was frozen for `paused_s`: like a head restarted on its database, it counts
    no node's silence from before it ran again (every node gets a fresh lease: its agent
    kept its jobs, or fenced them by itself), and no job's progress silence either."""
    for node in mirror.nodes.values():
        if node.last_heartbeat is not None:
            node.last_heartbeat = max(node.last_heartbeat, now)
    for rec in mirror.jobs.values():
        for rank, at in rec.progress_at.items():
            rec.progress_at[rank] = min(now, at + paused_s)
    message = f"the head did not run for {paused_s:.1f} s; every node gets a fresh lease"
    log.warning("%s", message)
    tx.event(now, "head_paused", message)


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
    # As Slurm's --signal: the batch shell only with B:, else the job's steps only (the
    # agent gives a job without a batch script to its ranks, which are its tasks).
    notify(
        mirror,
        tx,
        rec,
        sig.signal,
        reason,
        now,
        batch_only=sig.batch_only,
        steps_only=not sig.batch_only,
    )


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


def _nodes(mirror: Mirror, tx: Tx, now: float, heard_until: float) -> None:
    """A node silent for the lease is down (nothing new goes there); once its agent has
    certainly fenced itself (lease + margin), its jobs are restarted elsewhere. Silence is
    counted up to `heard_until`, not now: what the head has not been able to hear yet (it
    is behind on its work: head/overload.py) is not the node's silence."""
    s = mirror.settings
    for node in mirror.nodes.values():
        if node.last_heartbeat is None:
            continue
        silent = heard_until - node.last_heartbeat
        if silent > s.lease_s and node.state is not NodeState.DOWN:
            # The event loop renews leases without the control lock (head/leases.py): look
            # again under the leases' lock, and mark it down while holding it, so that a
            # renewal either lands before (seen here) or sees the node down (and goes to
            # this thread as a report, which brings the node back).
            with mirror.leases.lock:
                silent = heard_until - node.last_heartbeat
                if silent > s.lease_s:
                    nodestates.silent(mirror, tx, node, now - node.last_heartbeat, now)
        if node.state is not NodeState.DOWN or silent <= s.lease_s + s.requeue_margin_s:
            continue
        # Too few of its peers are heard either: it may be cut off with them, riding out
        # what looks like a head outage to it; it fences by itself by the longest outage.
        latest = max(s.lease_s, s.max_outage_s) + s.requeue_margin_s
        if silent <= latest and not _peers_hear_head(mirror, node.name, heard_until):
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


def _peers_hear_head(mirror: Mirror, name: str, now: float) -> bool:
    """Whether enough of `name`'s peers (as last sent to it) are heard from now that it
    would have heard of the head from one of them and fenced (head/peers.py). `now`: the
    time up to which the head could hear (head/overload.py): a peer whose heartbeat waits
    in the head's queues is not silent."""
    sent = mirror.peers_sent.get(name)
    names = sent if sent is not None else mirror.peer_lists.get(name, [])
    if not names:
        return True  # it has no peers to ask: it fenced at its lease, as before
    window = 2 * mirror.settings.heartbeat_s
    fresh = 0
    for other in names:
        node = mirror.nodes.get(other)
        last = node.last_heartbeat if node is not None else None
        if node is not None and node.state.heard and last is not None and now - last <= window:
            fresh += 1
    return fresh >= fresh_quorum(len(names))
