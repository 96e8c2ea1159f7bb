"""Head outages: which agents each node asks "did you hear from the head?" during an outage
(the quorums they use are in phalanx.api.quorum)."""

from __future__ import annotations

from phalanx.head.mirror import Mirror

PEERS_PER_NODE = 8
REFRESH_S = 5.0  # peer lists are recomputed this often (and on the head's first tick)


def pick(mirror: Mirror) -> dict[str, list[str]]:
    """Every node's peers: the nodes it shares a job with first (a gang's nodes see the same
    head), then others spread evenly around the sorted ring of names (so that one rack or one
    switch is unlikely to hold them all); never a node that is down. Pure; O(nodes × 8)
    once the ring is sorted."""
    ring, where = _ring(mirror)
    return {name: _one(mirror, ring, where, name) for name in mirror.nodes}


def pick_one(mirror: Mirror, name: str) -> list[str]:
    """One node's peers, as `pick` chooses them (a node that just joined): O(nodes log
    nodes) for the ring, not the O(nodes²) of picking every node's anew."""
    ring, where = _ring(mirror)
    return _one(mirror, ring, where, name)


def _ring(mirror: Mirror) -> tuple[list[str], dict[str, int]]:
    ring = sorted(name for name, n in mirror.nodes.items() if n.state.heard)
    return ring, {name: i for i, name in enumerate(ring)}


def _one(mirror: Mirror, ring: list[str], where: dict[str, int], name: str) -> list[str]:
    chosen: list[str] = []
    for job_id in sorted(mirror.node_jobs.get(name, ())):
        rec = mirror.jobs.get(job_id)
        for other, _ in rec.placement if rec is not None else ():
            if other != name and other in where and other not in chosen:
                chosen.append(other)
    chosen = chosen[:PEERS_PER_NODE]
    want = PEERS_PER_NODE - len(chosen)
    size = len(ring)
    if want <= 0 or not size:
        return chosen
    # The ring read from just after `name` (from its start if `name` is not on it), less
    # `name` and the peers already chosen: `rest`, never built. Its k-th item is the ring's
    # item at rotated position k plus the skipped positions at or before it.
    start = where.get(name, -1)
    skipped = sorted({(where[s] - start - 1) % size for s in [*chosen, name] if s in where})
    length = size - len(skipped)
    if length <= 0:
        return chosen
    step = max(1.0, length / want)
    for k in sorted({int(j * step) for j in range(want) if int(j * step) < length}):
        position = k
        for s in skipped:
            if s <= position:
                position += 1
        chosen.append(ring[(start + 1 + position) % size])
    return chosen
