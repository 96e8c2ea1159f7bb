"""How far behind the head is, and the lease clock that does not count that against nodes.

An overloaded head (its event loop saturated, its control thread in a long batch) hears
heartbeats late: ones the agents did send wait in its socket buffers, its event loop's
queue or its control thread's queue. Judged on the wall clock, such a node looks silent and
is marked down, and after the margin its running jobs are requeued: live work killed for
the head's own slowness (bench/fleet.py at 10,000 nodes: 1,347 running jobs requeued in
60 s). DESIGN.md's "never killed for nothing": detecting a dead node fast and fencing a
silent one are separate decisions, and the head's overload must never count as a node's
silence. So the head measures its own backlog (`Backlog.behind_s`):

- event-loop lag: a timer that should fire every PROBE_S, how late it fires (the largest
  lateness of the last LAG_WINDOW_S), and how long it is overdue now (a loop stuck in one
  long step cannot report its own lateness). A heartbeat needs a few passes of the loop
  from its bytes arriving to its lease being renewed, so the lag counts LOOP_PASSES times;
- heartbeats accepted but not yet handled: from a heartbeat's body read until its lease is
  renewed or its report applied by the control thread, and from the end of its long poll
  until its answer is built (an agent sends its next heartbeat only once answered), the age
  of the oldest such;
- the control thread's queue: how long the operations of its current batch have waited
  since they were queued.

The lease is then judged against the time up to which the head could hear
(`Horizon.heard_until`): now minus twice the largest backlog measured over the last lease
(a heartbeat's answer waits in the same queues as its request, and an agent sends the next
one only once answered: a live node's heartbeats reach an overloaded head up to two
backlogs apart), never moving backwards. A heartbeat sent before that point has been
handled, so a node not heard since `last_heartbeat` sent nothing between then and the
horizon. While the head falls further behind the horizon stands still; a node is marked
down only once the head has been able to hear it for a full lease and did not. Bounded:
the horizon never falls more than `Settings.overload_grace_s` behind now, so a head
overloaded for good still marks a dead node down `lease_s + overload_grace_s` after its
last heartbeat at the latest (plus however late its own clock ticks run), and requeues its
jobs `requeue_margin_s` later, as ever.
`overload_grace_s = 0` judges leases on the head's wall clock alone, as before.

Waiting longer never makes a job run twice: an agent fences its jobs by itself once it has
not heard from the head for its lease (docs/fault-tolerance.md), whatever the head decides,
and the head only ever requeues later than before.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
from collections.abc import Callable

# The event loop's probe: a timer every PROBE_S; its lateness over the last LAG_WINDOW_S.
PROBE_S = 0.1
LAG_WINDOW_S = 2.0
# Passes of the event loop a heartbeat needs, from its bytes read to its lease renewed
# (the read, the request's task starting, a body that comes in a later read): the loop's
# lag counts this many times in the backlog.
LOOP_PASSES = 3
# A node's heartbeats reach the head up to this many backlogs apart: its answer waits as
# its request did, and an agent sends the next heartbeat only once answered.
ROUND_TRIP = 2


class Backlog:
    """The head's own backlog, in seconds, measured from the event loop and the control
    thread (both write here; any thread reads). Monotonic seconds throughout."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._lags: collections.deque[tuple[float, float]] = collections.deque()  # (at, s)
        self._probe_due: float | None = None  # when the loop's probe should fire next
        self._busy: collections.OrderedDict[int, float] = collections.OrderedDict()
        self._ids = itertools.count()
        self._control_since: float | None = None  # the running batch's oldest op, queued at

    # ------------------------------------------------------------------ the event loop
    async def probe(self) -> None:
        """Run on the event loop (until cancelled): how late its timer fires."""
        while True:
            due = self.monotonic() + PROBE_S
            self._probe_due = due
            await asyncio.sleep(PROBE_S)
            now = self.monotonic()
            self.loop_lag(max(0.0, now - due), now)

    def loop_lag(self, lag_s: float, at: float) -> None:
        """One measurement of the event loop's lateness (the probe's, or a test's)."""
        with self._lock:
            lags = self._lags
            while lags and lags[0][0] < at - LAG_WINDOW_S:
                lags.popleft()
            # Only the window's largest counts: drop the smaller ones before it.
            while lags and lags[-1][1] <= lag_s:
                lags.pop()
            lags.append((at, lag_s))

    def handling(self) -> Handling:
        """`with backlog.handling():` around handling a heartbeat (its lease not renewed
        yet, or its answer not built): its age counts in the backlog meanwhile."""
        return Handling(self)

    def began(self) -> int:
        token = next(self._ids)
        at = self.monotonic()
        with self._lock:
            self._busy[token] = at
        return token

    def done(self, token: int) -> None:
        with self._lock:
            self._busy.pop(token, None)

    # ------------------------------------------------------------------ the control thread
    def control_batch(self, oldest_queued: float | None) -> None:
        """The control thread starts a batch whose oldest operation was queued at
        `oldest_queued` (None: an idle tick); `control_idle` when it is done."""
        self._control_since = oldest_queued

    def control_idle(self) -> None:
        self._control_since = None

    # ------------------------------------------------------------------ reading
    def parts(self) -> dict[str, float]:
        """Each measure, seconds: the event loop's recent lag (×LOOP_PASSES) or how long its
        probe is overdue, the oldest heartbeat being handled, the control batch's wait."""
        now = self.monotonic()
        with self._lock:
            lags = self._lags
            while lags and lags[0][0] < now - LAG_WINDOW_S:
                lags.popleft()
            lag = lags[0][1] if lags else 0.0
            oldest = next(iter(self._busy.values()), None)
        due = self._probe_due
        overdue = max(0.0, now - due) if due is not None else 0.0
        since = self._control_since
        return {
            "loop": max(LOOP_PASSES * lag, overdue),
            "heartbeats": max(0.0, now - oldest) if oldest is not None else 0.0,
            "control": max(0.0, now - since) if since is not None else 0.0,
        }

    def behind_s(self) -> float:
        """How late the head may hear a heartbeat sent now: the largest of `parts`."""
        return max(self.parts().values())


class Horizon:
    """The time (the head's wall clock) up to which the head has been able to hear every
    heartbeat sent: now minus ROUND_TRIP times the largest backlog measured over the last
    lease (a heartbeat may have been sent at the worst of it), never moving back, never
    more than the grace behind now. Fed by the control thread's clock tick."""

    def __init__(self) -> None:
        self.at: float | None = None
        self._worst: collections.deque[tuple[float, float]] = collections.deque()  # (at, s)

    def heard_until(self, now: float, behind_s: float, grace_s: float, window_s: float) -> float:
        if grace_s <= 0:
            self._worst.clear()
            self.at = now
            return now
        worst = self._worst
        while worst and not now - window_s <= worst[0][0] <= now:
            worst.popleft()
        while worst and worst[-1][1] <= behind_s:
            worst.pop()
        worst.append((now, max(0.0, behind_s)))
        horizon = now - min(ROUND_TRIP * worst[0][1], grace_s)
        if self.at is not None and self.at <= now:
            horizon = max(horizon, self.at)
        self.at = horizon
        return horizon


class Handling:
    """A heartbeat being handled, while in its `with` block (Backlog.handling)."""

    __slots__ = ("_backlog", "_token")

    def __init__(self, backlog: Backlog) -> None:
        self._backlog = backlog
        self._token = -1

    def __enter__(self) -> None:
        self._token = self._backlog.began()

    def __exit__(self, *_: object) -> None:
        self._backlog.done(self._token)
