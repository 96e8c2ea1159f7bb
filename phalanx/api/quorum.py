"""The head-outage quorums that agents and the head share (docs/fault-tolerance.md#head-outages).

An agent whose lease runs out asks its n peers whether they heard from the head. It keeps its
jobs only if at least `ride_quorum(n)` of them answer and none heard from the head since it
did; the head requeues a silent node's jobs after the usual lease + margin only if at least
`fresh_quorum(n)` of that node's peers are still heard from. The two add up to more than n,
so they always share a peer: a node cut off together with some of its peers either hears of
the head from that shared peer and fences, or the head waits for it to fence by itself.
"""

from __future__ import annotations


def tolerance(n: int) -> int:
    """How many of n peers may be dead or unreachable while a node rides out an outage."""
    return min(2, (n - 1) // 2) if n > 0 else 0


def ride_quorum(n: int) -> int:
    """Peers that must answer (none having heard the head) for a node to keep its jobs."""
    return n - tolerance(n)


def fresh_quorum(n: int) -> int:
    """Peers the head must still hear from to requeue a silent node's jobs after the lease."""
    return tolerance(n) + 1
