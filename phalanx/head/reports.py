"""What agents report, applied: liveness, master ports, each rank's status, GPU health."""

from __future__ import annotations

from phalanx.api.models import REQUEUE_EXIT_CODE, Heartbeat, NodeHealth, ProcessStatus
from phalanx.api.xid import classify
from phalanx.core import DrainCause, JobState, NodeState
from phalanx.head import nodestates
from phalanx.head.lifecycle import LAUNCH_FAILED, begin_stop, launch_failed, restart_or_end, settle
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import JobRecord, NodeRecord


def heartbeat(mirror: Mirror, tx: Tx, node: NodeRecord, hb: Heartbeat, now: float) -> None:
    """Apply one agent report (a full one: head/deltas.py turns a delta into one):
    liveness, master ports, GPU health and every rank's status."""
    renew(mirror, tx, node, now)
    _master_ports(mirror, tx, node, hb)
    reports: dict[int, list[ProcessStatus]] = {}
    for p in hb.processes or ():
        reports.setdefault(p.job_id, []).append(p)
    for job_id in sorted(mirror.node_jobs.get(node.name, set())):
        rec = mirror.jobs.get(job_id)
        if rec is None:
            continue
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
        _evaluate(mirror, tx, rec, node.name, now)
    if hb.health is not None:
        _health(mirror, tx, node, hb.health, now)


def renew(mirror: Mirror, tx: Tx, node: NodeRecord, now: float) -> None:
    """The node was heard: its lease runs from now (a down node comes back up)."""
    node.last_heartbeat = node.heard_at = now
    if node.state is NodeState.DOWN:
        nodestates.heard(mirror, tx, node, now)


def _master_ports(mirror: Mirror, tx: Tx, node: NodeRecord, hb: Heartbeat) -> None:
    for key, port in (hb.master_ports or {}).items():
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
            # Every node's assignment names the port, the reporter's too: its cached
            # answer (head/answers.py) is keyed by its version and must move with it.
            for each, _ in rec.placement:
                mirror.bump(tx, each)


def _evaluate(mirror: Mirror, tx: Tx, rec: JobRecord, reporter: str, now: float) -> None:
    """Decide from its ranks' statuses whether a job runs, completed, failed or must restart.

    One rank that fails tears the whole gang down at once (its peers would otherwise block
    in a collective until its timeout, 10–30 minutes).
    """
    statuses = {rank: p for ranks in rec.ranks.values() for rank, p in ranks.items()}
    expected = [r for i in range(len(rec.placement)) for r in rec.expected_ranks(i)]
    if rec.state is JobState.PREEMPTED:
        # Preempted: each rank checkpoints and exits in its own time (a rank that exits
        # first must not cut the others' saves short); the deadline bounds the wait.
        if all(r in statuses and not statuses[r].running for r in expected):
            message = "every rank exited after the preemption notice"
            begin_stop(mirror, tx, rec, "preempt", None, message, now)
        return
    for rank in sorted(statuses):
        p = statuses[rank]
        if p.running or (p.exit_code == 0 and p.signal is None and not p.lost):
            continue
        node = _node_of(rec, rank) or reporter
        if p.oom and not p.lost:
            # As Slurm: a job the OOM killer hit for its --mem ends OUT_OF_MEMORY, not
            # requeued (it would run out of memory again).
            code, sig = p.exit_code or 0, p.signal or 0
            what = "the batch script" if rec.spec.launcher == "batch" else f"rank {rank}"
            limit = f"its --mem limit ({rec.spec.mem_mb} MiB per node)"
            message = f"{what} on {node} ran out of memory: the OOM killer enforced {limit}"
            rec.reason, rec.reason_message = "OutOfMemory", message
            tx.event(now, "oom", message, rec.id, node=node)
            begin_stop(mirror, tx, rec, "oom", f"{code}:{sig}", message, now)
            return
        if p.launch_error is not None:
            # The agent could not launch it (an unusable `-o` path, an assignment it cannot
            # read): the same spec fails on any node, so fail the job, never requeue it.
            what = "the batch script" if rec.spec.launcher == "batch" else f"rank {rank}"
            detail = f"{what} on {node}: {p.launch_error.removeprefix(LAUNCH_FAILED)}"
            code = p.exit_code if p.exit_code is not None else 1
            launch_failed(mirror, tx, rec, detail, now, node=node, exit_code=f"{code}:0")
            return
        if p.lost:
            message = f"rank {rank} on {node} was stopped by its agent (no head, or restarted)"
            restart_or_end(
                mirror, tx, rec, "NodeFail", message, now, end_as="node_fail", blame=node
            )
            return
        code = p.exit_code if p.exit_code is not None else 0
        sig = p.signal or 0
        wants_requeue = code == REQUEUE_EXIT_CODE and not sig and rec.spec.requeue
        if wants_requeue and rec.restart_count < rec.spec.max_restarts:
            message = f"rank {rank} exited {code}: checkpointed, asks to be requeued"
            rec.reason, rec.reason_message = "Requeued", "the job asked to be requeued (exit 75)"
            begin_stop(mirror, tx, rec, "requeue", None, message, now)
            return
        how = f"exited with code {code}" if not sig else f"was killed by signal {sig}"
        what = "the batch script" if rec.spec.launcher == "batch" else f"rank {rank}"
        message = f"{what} on {node} {how}"
        if rec.spec.restart_on_failure:
            restart_or_end(
                mirror, tx, rec, "RankFailed", message, now, exit_code=f"{code}:{sig}", blame=node
            )
        else:
            begin_stop(mirror, tx, rec, "fail", f"{code}:{sig}", message, now)
        return
    if rec.all_running_at is None and all(r in statuses for r in expected):
        # Every rank was started (a fast one may already have exited): the job is running.
        rec.all_running_at = now
        tx.event(now, "running", f"all {len(expected)} processes started", rec.id)
    if all(r in statuses and not statuses[r].running for r in expected):
        begin_stop(mirror, tx, rec, "complete", "0:0", "all ranks exited with code 0", now)


def _node_of(rec: JobRecord, rank: int) -> str | None:
    for node, ranks in rec.ranks.items():
        if rank in ranks:
            return node
    return None


# ----------------------------------------------------------------------------- GPU health
def _health(mirror: Mirror, tx: Tx, node: NodeRecord, health: NodeHealth, now: float) -> None:
    """GPU faults: critical ones drain the node and restart the job on that GPU elsewhere;
    application ones fail only that job. A failing health-check script drains the node
    (its jobs keep running) until the check passes again."""
    for ev in health.events:
        if ev.seq <= node.health_seq:
            continue
        node.health_seq = ev.seq
        action = classify(ev.kind, ev.code)
        if action == "ignore":
            continue
        what = f"XID {ev.code}" if ev.kind == "xid" else ev.kind.replace("_", " ")
        where = "node" if ev.gpu is None else f"GPU {ev.gpu}"
        message = f"{where}: {what}: {ev.message}"
        if action == "drain" and node.drain_cause in (None, DrainCause.HEALTH_CHECK):
            # Stronger than a health check's drain: the check passing does not undo it.
            nodestates.drain(mirror, tx, node, DrainCause.GPU_FAULT, message, now)
        for rec in _jobs_on_gpu(mirror, node.name, ev.gpu, ev.time):
            if action == "drain":
                restart_or_end(
                    mirror, tx, rec, "GpuFault", f"{node.name} {message}", now, blame=node.name
                )
            else:
                begin_stop(mirror, tx, rec, "fail", None, f"{node.name} {message}", now)
    nodestates.health_check(mirror, tx, node, health.check_failure, now)


def _jobs_on_gpu(mirror: Mirror, node: str, gpu: int | None, since: float) -> list[JobRecord]:
    """Running jobs that use `gpu` on `node` (any GPU when None), started before `since`
    (an event reported again after a head restart must not hit the job's next run)."""
    out = []
    for job_id in sorted(mirror.node_jobs.get(node, set())):
        rec = mirror.jobs.get(job_id)
        if rec is None or rec.stopping is not None or (rec.start_time or 0.0) > since:
            continue
        gpus = next((g for n, g in rec.placement if n == node), [])
        if gpu is None or gpu in gpus:
            out.append(rec)
    return out
