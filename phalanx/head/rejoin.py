"""A restarted head catching up with its fleet (README.md#a-restart-kills-no-live-work).

A head that starts on its database gives every node a fresh lease (ControlThread.start).
At 10,000 nodes that is not enough: every agent reconnects at once, and the head must take
10,000 connections, look up 10,000 node tokens and apply 10,000 first reports (a delta on a
base it no longer holds is refused, so each agent sends a full report: two round trips).
On 2 cores that took longer than the 8 s lease, and nodes the head had simply not got to
yet were marked down and their running jobs requeued — 324 running jobs stopped by one
restart (bench/fleet.py). Their heartbeats were queued at the head's own door (the kernel's
accept queue, where the head's backlog measure cannot see them), not missing.

So, after a restart, the head catches up before it judges silence:

- a node is *waiting* while the head has not heard it since it started (`heard_at` is in
  memory only, None after a load);
- the head is *catching up* while some node is waiting and it keeps hearing nodes back:
  the last one heard back less than `quiet_s` ago (twice the heartbeat interval the head
  gives, at least QUIET_MIN_S; a live agent retries at least every heartbeat interval);
- meanwhile it judges no node's silence: every lease stays fresh (`last_heartbeat` =
  now), as for a head that was paused. Not only the waiting nodes': a node heard once may
  wait again behind the storm (its full report, the second round trip), and its agent,
  told by its peers that the head is catching up, rides on rather than fences (below) —
  the head must not requeue its jobs meanwhile;
- it stops when no node is waiting, when no node came back for `quiet_s` (those left are
  silent: their lease runs from then), or at `Settings.overload_grace_s` after the start
  at the latest (the same bound as the head's other slowness: head/overload.py), so a node
  that died with the head is down `overload_grace_s + lease_s` after the start at worst.
  `overload_grace_s = 0`: no catching up, leases run from the start as before.

Every answer says whether the head is catching up (`DesiredState.catching_up`), and an
agent passes it on to its peers (`PeerHeadView.head_catching_up`): an agent the head has
not answered yet, whose peers it has answered, then knows the head is still working
through the reconnects rather than cut off from it alone, and rides on instead of fencing
(agent/headlink.py). That is safe for the same reason riding out an outage is: the head
requeues any node's jobs only `lease_s + requeue_margin_s` after it stopped catching up, and
the agent's ride ends half a lease after its peer last heard "catching up".
"""

from __future__ import annotations

import logging

from phalanx.head import intervals
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import NodeRecord

log = logging.getLogger("phalanx.head")

QUIET_MIN_S = 2.0  # catching up ends once no node came back for this long, at least


class Rejoin:
    """Whether the head is still hearing its nodes back after a start (control thread)."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.active = False  # read by the event loop for each answer (one bool: no lock)
        self.waiting = 0  # nodes not heard since the start, as of the last tick
        self.known = 0  # nodes with a lease at the start
        self._last_back: float = 0.0

    def begin(self, mirror: Mirror, now: float) -> None:
        """The head starts (after its load): from now, it hears its nodes back."""
        self.started = self._last_back = now
        self.known = self.waiting = len(_waiting(mirror))
        self.active = mirror.settings.overload_grace_s > 0 and self.waiting > 0

    def tick(self, mirror: Mirror, tx: Tx, now: float) -> None:
        """On each clock tick, before leases are judged: keep every lease fresh while the
        head is catching up; record when it is done."""
        if not self.active or self.started is None:
            return
        waiting = _waiting(mirror)
        if len(waiting) < self.waiting:
            self._last_back = now
        self.waiting = len(waiting)
        s = mirror.settings
        quiet_s = max(QUIET_MIN_S, 2 * intervals.heartbeat_s(s, len(mirror.nodes)))
        took = now - self.started
        if waiting and now - self._last_back < quiet_s and took < s.overload_grace_s:
            for node in mirror.nodes.values():
                if node.last_heartbeat is not None:
                    node.last_heartbeat = max(node.last_heartbeat, now)
            return
        self.active = False
        heard = self.known - len(waiting)
        message = f"caught up after the start: {heard} of {self.known} nodes heard back"
        message += f" in {took:.1f} s"
        if waiting:
            why = "none came back for" if took < s.overload_grace_s else "the grace of"
            limit = quiet_s if took < s.overload_grace_s else s.overload_grace_s
            message += f"; {len(waiting)} not heard ({why} {limit:g} s): their lease runs from now"
        log.info("%s", message)
        tx.event(now, "head_caught_up", message)


def _waiting(mirror: Mirror) -> list[NodeRecord]:
    """Nodes holding a lease that the head has not heard from since it started."""
    return [n for n in mirror.nodes.values() if n.last_heartbeat is not None and n.heard_at is None]
