"""Lease renewals off the control lock (README.md#heartbeats-at-scale).

A heartbeat with no news only renews its node's lease. That must not wait for the control
thread: while it holds the control lock through a long batch (a requeue storm, a core
rebuild, a tick over 100,000 jobs), a renewal that waited for it would leave every node
unanswered, leases would run out, more nodes would go down, more jobs would be requeued —
the feedback loop that collapsed a head at 5,000 and 10,000 simulated nodes
(bench/fleet.py). So the event loop renews a lease under this small lock only, and the
clock takes the same lock for each down decision:

- a renewal that lands before the clock looks again under the lock is seen (the node stays
  up);
- one that comes after sees the node down and is not a renewal: it goes to the control
  thread as a report, which brings the node back up as any heartbeat of a down node does
  (and a node whose jobs were requeued is never told its lease was renewed by a shortcut).

Nothing else is done under this lock: a renewal writes two floats, the clock re-reads one
and marks the node down. Lock order: HeldReports' lock, then this one (a renewal); the
control lock, then this one (the clock); nothing takes another lock while holding this.
"""

from __future__ import annotations

import threading

from phalanx.core import NodeState
from phalanx.head.records import NodeRecord


class Leases:
    """The lock that orders lease renewals against the clock's down decisions."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


def renew(leases: Leases, node: NodeRecord | None, now: float) -> bool:
    """Renew `node`'s lease from the event loop: True when renewed; False when the node is
    gone or down (its heartbeat goes to the control thread, which brings it back)."""
    if node is None:
        return False
    with leases.lock:
        if node.state is NodeState.DOWN:
            return False
        node.last_heartbeat = node.heard_at = now
        return True
