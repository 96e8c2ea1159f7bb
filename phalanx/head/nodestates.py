"""A node's life in the head: up, drained (by whom, why) or down (silent). Every change of
its state goes through `move`, checked against the core's state machine and recorded. Why a
node is drained is kept apart from why it is down, so a drained node that goes silent comes
back drained, and only what drained it (an admin, its health check) puts it back."""

from __future__ import annotations

from phalanx.api.models import RegisterRequest
from phalanx.core import DrainCause, NodeState, NodeTransition, move_node
from phalanx.head import corestate, peers, store
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import NodeRecord

NO_HEARTBEAT = "no heartbeat"
HEALTH_CHECK = "health check failed: "


def move(
    mirror: Mirror, tx: Tx, node: NodeRecord, to: NodeState, kind: str, message: str, now: float
) -> None:
    """The one way a node's state changes: checked, stored, recorded as event `kind`, and
    told to the core (which places on schedulable nodes only)."""
    transition = move_node(node.name, node.state, to, message, now)
    node.state = to
    if to is not NodeState.DOWN:
        node.down_reason = None
    _save(mirror, tx, node, now, kind, message, transition)


def _save(
    mirror: Mirror,
    tx: Tx,
    node: NodeRecord,
    now: float,
    kind: str,
    message: str,
    transition: NodeTransition | None = None,
) -> None:
    store.set_node_state(tx.conn, node)
    tx.event(now, kind, message, node=node.name, move=transition)
    corestate.node_changed(mirror, node)
    tx.kick = True


def register(mirror: Mirror, tx: Tx, req: RegisterRequest, now: float) -> NodeRecord:
    """A node joins, or an agent rejoins as itself (who may was checked by the caller): its
    record made anew from what it reports; a rejoining node keeps its drain and its
    desired-state version, and comes back from down."""
    old = mirror.nodes.get(req.name)
    node = NodeRecord(
        name=req.name,
        address=req.address,
        agent_url=req.agent_url,
        agent_secret=req.agent_secret,
        cpus=req.cpus,
        memory_mb=req.memory_mb,
        gpus=list(req.gpus),
        labels=dict(req.labels),
        confinement=req.confinement,
        state=old.state if old is not None else NodeState.UP,
        down_reason=old.down_reason if old is not None else None,
        drain_cause=old.drain_cause if old is not None else None,
        drain_reason=old.drain_reason if old is not None else None,
        last_heartbeat=now,
        heard_at=now,
        version=old.version if old is not None else 0,
    )
    mirror.nodes[req.name] = node
    store.upsert_node(tx.conn, node, now, new=old is None)
    gpus = f"{len(req.gpus)} × {req.gpus[0].model}" if req.gpus else "no GPUs"
    kind = "node_joined" if old is None else "node_rejoined"
    tx.event(now, kind, f"{req.address}, {gpus}", node=req.name)
    if node.state is NodeState.DOWN:
        heard(mirror, tx, node, now)
    corestate.joined(mirror, old, node)
    # Its peers at once, not at the next tick: a job may be placed before it, and an agent
    # told no peers fences at the lease even through a head restart. While the cluster is
    # small every node's list is short and takes the newcomer at once; past that, the
    # others take it in at the next refresh (every node's anew per join is O(nodes²) in
    # a join storm).
    if len(mirror.nodes) <= peers.PEERS_PER_NODE + 1:
        mirror.peer_lists = peers.pick(mirror)
    else:
        mirror.peer_lists[req.name] = peers.pick_one(mirror, req.name)
    return node


def silent(mirror: Mirror, tx: Tx, node: NodeRecord, silent_s: float, now: float) -> None:
    """No heartbeat for a lease: down (nothing new goes there; its drain, if any, is kept)."""
    node.down_reason = f"{NO_HEARTBEAT} for {silent_s:.0f} s"
    move(mirror, tx, node, NodeState.DOWN, "node_down", node.down_reason, now)


def heard(mirror: Mirror, tx: Tx, node: NodeRecord, now: float) -> None:
    """A down node's heartbeats resumed: back up, or back drained if it was."""
    to = NodeState.UP if node.drain_cause is None else NodeState.DRAIN
    move(mirror, tx, node, to, "node_up", "heartbeats resumed", now)


def drain(
    mirror: Mirror,
    tx: Tx,
    node: NodeRecord,
    cause: DrainCause,
    reason: str,
    now: float,
    kind: str = "node_drain",
) -> None:
    """Take the node out of service (its running jobs stay). A down node stays down and
    comes back drained."""
    node.drain_cause, node.drain_reason = cause, reason
    if node.state is NodeState.UP:
        move(mirror, tx, node, NodeState.DRAIN, kind, reason, now)
    else:
        _save(mirror, tx, node, now, kind, reason)


def resume(mirror: Mirror, tx: Tx, node: NodeRecord, message: str, now: float, kind: str) -> None:
    """Put the node back in service (a down one: once it is heard again)."""
    node.drain_cause = node.drain_reason = None
    if node.state is NodeState.DRAIN:
        move(mirror, tx, node, NodeState.UP, kind, message, now)
    else:
        _save(mirror, tx, node, now, kind, message)


def health_check(mirror: Mirror, tx: Tx, node: NodeRecord, failure: str | None, now: float) -> None:
    """The node's health-check script failed (drain it) or passes again (undo only a drain
    the check itself made)."""
    if failure is not None and node.state is NodeState.UP:
        reason = HEALTH_CHECK + failure
        drain(mirror, tx, node, DrainCause.HEALTH_CHECK, reason, now)
    elif failure is None and node.drain_cause is DrainCause.HEALTH_CHECK:
        resume(mirror, tx, node, "health checks pass", now, "node_resume")
