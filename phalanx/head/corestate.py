"""The head's one owner of the core's ClusterState: every change the head makes to it (jobs
queued, started, requeued, ended; nodes in or out of service) goes through here."""

from __future__ import annotations

from dataclasses import replace

from phalanx.core import (
    Applied,
    ClusterState,
    Decisions,
    Dependency,
    DependencyKind,
    JobRequest,
    JobState,
    Node,
    Placement,
    apply_decisions,
)
from phalanx.core.grow import add_node, fits
from phalanx.head import store
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import JobRecord, NodeRecord


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
        begin_s=spec.begin_time,
        nodelist=frozenset(spec.nodelist),
    )


def _avoid(mirror: Mirror, rec: JobRecord) -> frozenset[str]:
    """Nodes that failed this job repeatedly, while enough other nodes remain to run it.
    O(avoided nodes) when the core is live (it counts the nodes in service), not
    O(nodes): a rebuild asks this of every job that avoids some."""
    if not rec.avoid:
        return frozenset()
    avoid = frozenset(rec.avoid)
    core = live(mirror)
    if core is not None:
        up = sum(core.up)
        avoided_up = sum(
            1 for n in avoid if (node := mirror.nodes.get(n)) is not None and node.schedulable
        )
        others = up - avoided_up
    else:
        others = sum(1 for n in mirror.nodes.values() if n.name not in avoid and n.schedulable)
    return avoid if others >= rec.spec.nodes else frozenset()


def core_node(n: NodeRecord) -> Node:
    """What the core sees of a node (one with GPUs)."""
    return Node(
        name=n.name,
        gpus=len(n.gpus),
        gpu_model=n.gpus[0].model,
        gpu_memory_gb=n.gpus[0].memory_mb / 1024,
        rack=n.labels.get("rack", "rack0"),
        block=n.labels.get("block", "block0"),
    )


def rebuild(mirror: Mirror, tx: Tx, now: float) -> None:
    """Build the core's state afresh from the mirror (at start-up, and when a node joins
    that cannot be added incrementally: see `joined`)."""
    mirror.core_dirty = False
    usable = [n for n in mirror.nodes.values() if n.gpus]
    if not usable:
        mirror.core = None
        return
    core = ClusterState([core_node(n) for n in usable], mirror.teams.values())
    for n in usable:
        if not n.schedulable:
            core.set_node_up(n.name, False, n.reason or n.state.value)
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
        if not rec.placement:
            core.submit(core_request(mirror, rec), rec.submit_time)
            if not _queued(rec):  # known to its dependents (they wait), not queued
                core.withdraw(rec.id)
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


def live(mirror: Mirror) -> ClusterState | None:
    """The core's state, when it is current (None: none yet, or a rebuild is due)."""
    return None if mirror.core_dirty else mirror.core


def queue(mirror: Mirror, tx: Tx, records: list[JobRecord], now: float) -> None:
    """New (or released) jobs join the core's queue; the ended jobs they depend on are
    looked up in the store first, so their dependencies resolve."""
    core = live(mirror)
    if core is None:
        return  # the next rebuild queues them
    deps = {j for rec in records for d in rec.spec.dependencies for j in d.job_ids}
    unknown = [j for j in sorted(deps) if core.lookup(j) is None]
    for job_id, (started, final) in store.outcomes(tx.conn, unknown).items():
        core.remember(job_id, started, JobState(final))
    for rec in records:
        if rec.id in core.withdrawn:
            if _queued(rec):
                core.submit(core_request(mirror, rec), now)
            continue
        core.submit(core_request(mirror, rec), now)
        if not _queued(rec):
            core.withdraw(rec.id)


def _queued(rec: JobRecord) -> bool:
    """Whether a pending job is in the core's queue; a held job, or an array task behind
    its array's `%N` limit, is known to the core (jobs that depend on it wait) but not
    queued."""
    return rec.in_core and rec.hold is None


def withdraw(mirror: Mirror, rec: JobRecord) -> None:
    """A pending job leaves the core's queue without ending (held, or to be changed)."""
    core = live(mirror)
    if core is not None and rec.id in core.pending:
        core.withdraw(rec.id)


def resubmit(mirror: Mirror, tx: Tx, rec: JobRecord, now: float) -> None:
    """A withdrawn job (released, or changed) joins the core's queue again as it is now."""
    core = live(mirror)
    if core is None:
        return  # the next rebuild queues it
    if rec.id in core.withdrawn:
        core.submit(core_request(mirror, rec), now)
    else:
        queue(mirror, tx, [rec], now)


def apply(mirror: Mirror, decisions: Decisions, now: float) -> Applied:
    """A cycle's decisions, applied to the core's state (core.apply_decisions)."""
    core = mirror.core
    assert core is not None, "decisions come from a cycle over the core's state"
    mirror.decisions = decisions
    return apply_decisions(core, decisions, now)


def requeue(mirror: Mirror, rec: JobRecord, now: float) -> None:
    """A running job goes back to the queue (its GPUs are free again)."""
    core = mirror.core
    if core is None or rec.id not in core.running:
        if rec.avoid:
            mirror.core_dirty = True  # not in the core as running: the rebuild places it
        return
    queued = core.requeue(rec.id, now)
    if rec.avoid and live(mirror) is core:
        # The core queued it with its old request: queue it again asking to avoid the
        # nodes that failed it (not a rebuild of every node and job: with nodes flapping
        # under load, each requeue rebuilding 100,000 jobs stalled the loop for seconds,
        # which silenced more nodes).
        core.withdraw(rec.id)
        fresh = replace(
            core_request(mirror, rec),
            attained_s=queued.attained_s,
            dependencies=queued.dependencies,  # as the core knew them (met: it ran)
            dependency_any=queued.dependency_any,
        )
        core.submit(fresh, now)
    elif rec.avoid:
        mirror.core_dirty = True


def finish(mirror: Mirror, rec: JobRecord, final: JobState, now: float) -> None:
    """A job ended (its dependents may now run)."""
    core = mirror.core
    if core is not None and (
        rec.id in core.running or rec.id in core.pending or rec.id in core.withdrawn
    ):
        core.finish(rec.id, now, final)


def node_changed(mirror: Mirror, node: NodeRecord) -> None:
    """A node went in or out of service: the core places on it, or no longer."""
    core = mirror.core
    if core is not None and node.name in core.node_index:
        core.set_node_up(node.name, node.schedulable, node.reason or node.state.value)


def joined(mirror: Mirror, old: NodeRecord | None, node: NodeRecord) -> None:
    """A node registered (`old`: its record before, if it rejoined). The core's state takes
    it without a rebuild when it can: a new node no larger than the largest one is appended
    (core/grow.py); a node rejoining with the same shape keeps its entry. Anything else (a
    new shape, a larger node) rebuilds at the next cycle, as every join once did. (A job's
    avoided nodes are left as they were queued, as when a node comes back up.)"""
    core = live(mirror)
    if core is None:
        mirror.core_dirty = True
        return
    if old is not None and node.name in core.node_index:
        same = old.gpus and node.gpus and core_node(old) == core_node(node)
        if not same:
            mirror.core_dirty = True
        else:
            node_changed(mirror, node)
        return
    if old is not None and old.gpus:
        mirror.core_dirty = True  # it had GPUs and the core does not know it: rebuild
        return
    if not node.gpus:
        return  # the core places on nodes with GPUs only
    shape = core_node(node)
    if not fits(core, shape):
        mirror.core_dirty = True
        return
    add_node(core, shape)
    node_changed(mirror, node)
