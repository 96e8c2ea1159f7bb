"""How often agents heartbeat, scaled with the fleet (README.md#heartbeats-at-scale).

An idle agent holds one long poll of `heartbeat_s` at a time: the head answers a change at
once, so the interval bounds only how often each node renews its lease, i.e. the head's
load when nothing happens (`nodes / heartbeat_s` requests per second). Failure detection
does not depend on it: a node is down once silent for `lease_s` (head/clock.py), which
stays as configured. So:

    heartbeat_s = min(max(H, nodes / R), max(H, lease_s / 3))

with H the configured interval (`--heartbeat`), R the head's heartbeat budget per second
(`Settings.heartbeat_rate`). Below H × R nodes nothing changes; above, the interval grows
so the fleet sends about R heartbeats a second, until an agent would get fewer than three
tries per lease (one lost long poll must not fence a node's jobs). Past that point the load
grows with the fleet again (nodes × 3 / lease_s a second): detection within the lease is
kept, not traded for load. With the defaults (2 s, 8 s, 1,500/s): 2 s up to 3,000 nodes,
2.67 s from 4,000; 10,000 nodes send 3,750 heartbeats a second, and a dead node is seen
down 8 s after its last heartbeat (plus at most one control-loop tick).
"""

from __future__ import annotations

from phalanx.head.mirror import Settings


def heartbeat_s(settings: Settings, nodes: int) -> float:
    """The interval the head gives agents when `nodes` are registered."""
    floor = settings.heartbeat_s
    ceiling = max(floor, settings.lease_s / 3)
    rate = settings.heartbeat_rate
    wanted = nodes / rate if rate > 0 else floor
    return round(min(max(floor, wanted), ceiling), 3)
