"""The bridge to the scheduling core: mirror → ClusterState, and Decisions → mirror + store."""

from __future__ import annotations

import logging
import re
from dataclasses import replace

from phalanx.core import (
    ClusterState,
    Dependency,
    DependencyKind,
    JobRequest,
    JobState,
    Node,
    Placement,
    Reason,
    ReasonCode,
    schedule,
)
from phalanx.head import auth, lifecycle, store
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import JobRecord

log = logging.getLogger("phalanx.head")

NO_NODES = Reason(ReasonCode.RESOURCES, "no nodes have joined the cluster yet")


def core_request(mirror: Mirror, rec: JobRecord) -> JobRequest:
    """What the core sees of a job. `--exclusive` asks for whole nodes: every GPU of the
    largest node shape (the job's ranks still number `gpus_per_node` per node)."""
    spec = rec.spec
    gpn = spec.gpus_per_node
    if spec.exclusive and mirror.nodes:
        gpn = max(gpn, max(len(n.gpus) for n in mirror.nodes.values()))
    return JobRequest(
        id=rec.id,
        team=rec.team,
        user=rec.user,
        priority=rec.priority,
        nodes=spec.nodes,
        gpus_per_node=gpn,
        time_limit_s=spec.time_limit_s,
        submit_s=rec.submit_time,
        dependencies=tuple(
            Dependency(DependencyKind(d.type), j) for d in spec.dependencies for j in d.job_ids
        ),
        dependency_any=spec.dependency_any,
        preemptible=spec.preemptible,
        gpu_model=spec.gpu_model,
        exclude_nodes=frozenset(spec.exclude_nodes) | _avoid(mirror, rec),
    )


def _avoid(mirror: Mirror, rec: JobRecord) -> frozenset[str]:
    """Nodes that failed this job repeatedly, while enough other nodes remain to run it."""
    if not rec.avoid:
        return frozenset()
    avoid = frozenset(rec.avoid)
    others = [n for n in mirror.nodes.values() if n.name not in avoid and n.schedulable]
    return avoid if len(others) >= rec.spec.nodes else frozenset()


def rebuild(mirror: Mirror, tx: Tx, now: float) -> None:
    """Build the core's state afresh from the mirror (at start-up and when nodes join)."""
    mirror.core_dirty = False
    usable = [n for n in mirror.nodes.values() if n.gpus]
    if not usable:
        mirror.core = None
        return
    core = ClusterState(
        [
            Node(
                name=n.name,
                gpus=len(n.gpus),
                gpu_model=n.gpus[0].model,
                gpu_memory_gb=n.gpus[0].memory_mb / 1024,
                rack=n.labels.get("rack", "rack0"),
                block=n.labels.get("block", "block0"),
            )
            for n in usable
        ],
        mirror.teams.values(),
    )
    for n in usable:
        if not n.schedulable:
            core.set_node_up(n.name, False, n.reason or n.state)
    live = mirror.jobs
    referenced = {
        j for rec in live.values() for d in rec.spec.dependencies for j in d.job_ids
    } - set(live)
    for job_id, (started, final) in store.outcomes(tx.conn, referenced).items():
        core.remember(job_id, started, JobState(final))
    running = [r for r in live.values() if r.placement]
    for rec in sorted(running, key=lambda r: r.start_time or 0.0):
        request = core_request(mirror, rec)
        core.submit(_without_dependencies(request), rec.start_time or now)
        core.start(rec.id, _placement(core, rec), rec.start_time or now)
    for rec in sorted(live.values(), key=lambda r: r.id):
        if not rec.placement and rec.in_core:
            core.submit(core_request(mirror, rec), rec.submit_time)
    mirror.core = core


def _without_dependencies(request: JobRequest) -> JobRequest:
    return replace(request, dependencies=(), dependency_any=False)


def _placement(core: ClusterState, rec: JobRecord) -> Placement:
    slots = []
    for node, gpus in rec.placement:
        mask = 0
        for g in gpus:
            mask |= 1 << g
        slots.append((core.node_index[node], mask))
    return Placement(tuple(slots))


def cycle(mirror: Mirror, tx: Tx, now: float) -> None:
    """One scheduling cycle: core decides, the head applies, all in the caller's transaction."""
    if mirror.core_dirty:
        rebuild(mirror, tx, now)
    core = mirror.core
    if core is None:
        return
    decisions = schedule(core, now)
    for start in decisions.starts:
        _start(mirror, tx, core, start.job_id, start.placement, start.borrowed, now)
    for preemption in decisions.preemptions:
        for victim in preemption.victims:
            victim_rec = mirror.jobs.get(victim)
            if victim_rec is None or victim_rec.stopping is not None:
                continue
            core.mark_preempting(victim, preemption.for_job)
            lifecycle.preempt(mirror, tx, victim_rec, preemption.for_job, now)
    mirror.decisions = decisions


def _start(
    mirror: Mirror,
    tx: Tx,
    core: ClusterState,
    job_id: int,
    placement: Placement,
    borrowed: int,
    now: float,
) -> None:
    rec = mirror.jobs[job_id]
    core.start(job_id, placement, now, borrowed)
    rec.state = "R"
    rec.epoch += 1
    rec.start_time = now
    rec.end_time = None
    rec.reason = rec.reason_message = None
    # Ranks follow the host-list order of the nodes, as in Slurm: node 0 is the first name
    # of SLURM_JOB_NODELIST, which compresses (`n[1-4]`), whatever order the core chose.
    rec.placement = sorted(
        (
            (core.nodes[n].name, list(placement.gpu_indices(slot)))
            for slot, (n, _mask) in enumerate(placement.slots)
        ),
        key=lambda node_gpus: _host_order(node_gpus[0]),
    )
    rec.master_port = None
    rec.step_token = auth.new_step_token()
    rec.ranks = {}
    rec.stop_version = {}
    rec.all_running_at = None
    tx.update_job(rec)
    where = ", ".join(f"{n}[{','.join(map(str, g))}]" for n, g in rec.placement)
    tx.event(now, "started", f"allocated {where}; epoch {rec.epoch}", job_id)
    for node, _ in rec.placement:
        mirror.node_jobs.setdefault(node, set()).add(job_id)
        mirror.bump(tx, node)


def pending_reason(mirror: Mirror, rec: JobRecord) -> tuple[str | None, str | None]:
    """Why a queued job waits, from the last cycle's decisions (computed when asked, so a
    cycle costs nothing per pending job it did not look at)."""
    core, decisions = mirror.core, mirror.decisions
    if rec.state != "PD" or not rec.in_core:
        return rec.reason, rec.reason_message
    if core is None:
        return NO_NODES.code.value, NO_NODES.message
    request = core.pending.get(rec.id)
    if request is None or decisions is None:
        return rec.reason, rec.reason_message
    reason = decisions.reason_for(request)
    return reason.code.value, reason.message


def _host_order(name: str) -> list[tuple[int, str]]:
    """Sort key of a host name whose numbers compare as numbers (`n9` before `n10`)."""
    parts = re.split(r"(\d+)", name)
    return [(int(p), "") if i % 2 else (0, p) for i, p in enumerate(parts)]
