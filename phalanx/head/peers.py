"""Head outages: which agents each node asks "did you hear from the head?" during an outage
(the quorums they use are in phalanx.api.quorum)."""

from __future__ import annotations

from phalanx.head.mirror import Mirror

PEERS_PER_NODE = 8
REFRESH_S = 5.0  # peer lists are recomputed this often (and on the head's first tick)


def pick(mirror: Mirror) -> dict[str, list[str]]:
    """Every node's peers: the nodes it shares a job with first (a gang's nodes see the same
    head), then others spread evenly around the sorted ring of names (so that one rack or one
    switch is unlikely to hold them all); never a node that is down. Pure; O(nodes × 8)."""
    ring = sorted(name for name, n in mirror.nodes.items() if n.state.heard)
    where = {name: i for i, name in enumerate(ring)}
    out: dict[str, list[str]] = {}
    for name in mirror.nodes:
        chosen: list[str] = []
        for job_id in sorted(mirror.node_jobs.get(name, ())):
            rec = mirror.jobs.get(job_id)
            for other, _ in rec.placement if rec is not None else ():
                if other != name and other in where and other not in chosen:
                    chosen.append(other)
        chosen = chosen[:PEERS_PER_NODE]
        want = PEERS_PER_NODE - len(chosen)
        start = where.get(name, -1)
        rest = [ring[(start + 1 + k) % len(ring)] for k in range(len(ring))] if ring else []
        rest = [r for r in rest if r != name and r not in chosen]
        if want > 0 and rest:
            step = max(1.0, len(rest) / want)
            picked = {int(k * step) for k in range(want) if int(k * step) < len(rest)}
            chosen += [rest[i] for i in sorted(picked)]
        out[name] = chosen
    return out
