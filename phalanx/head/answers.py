"""Each node's desired state, serialized once per change (README.md#heartbeats-at-scale).

A heartbeat's answer is the node's DesiredState. Building it (an Assignment per job, each
validated) and serializing it cost far more than the rest of a heartbeat, and at 10,000
nodes most answers say what the last one said. So the head keeps each node's answer as
JSON bytes, keyed by what it is made of: the node's desired-state version (`Mirror.bump`
moves it whenever what the node must run changes), the node's peers and a generation the
head moves on changes no version tracks (a node re-registering under a new address, a
user's Unix account). Only a node whose key moved is rebuilt, on its next answer. The few
fields that differ from one answer to the next (acknowledgements, intervals) are written
in front of the cached bytes.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

# DesiredState fields written per answer, not cached.
PER_ANSWER = frozenset(
    {"heartbeat_s", "lease_s", "health_ack", "report_ack", "full_report", "catching_up"}
)


class DesiredAnswers:
    """The cache: node → (key, the DesiredState's JSON without the PER_ANSWER fields).
    Used under the head's control lock."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[Hashable, bytes]] = {}
        self.generation = 0  # moved by `invalidate_all`; part of every key
        self.builds = 0  # answers built (cache misses), for benchmarks and tests
        self.hits = 0

    def get(self, node: str, key: Hashable) -> bytes | None:
        entry = self._cache.get(node)
        if entry is not None and entry[0] == key:
            self.hits += 1
            return entry[1]
        return None

    def put(self, node: str, key: Hashable, body: bytes) -> None:
        self.builds += 1
        self._cache[node] = (key, body)

    def forget(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            self._cache.pop(node, None)

    def invalidate_all(self) -> None:
        """Something every answer may hold changed (a user's Unix account)."""
        self.generation += 1
        self._cache.clear()


def complete(
    body: bytes,
    *,
    heartbeat_s: float,
    lease_s: float,
    health_ack: int,
    report_ack: int | None,
    full_report: bool,
    catching_up: bool = False,
) -> bytes:
    """A whole DesiredState's JSON: the per-answer fields, then the cached `body` (a JSON
    object without them, never empty: it holds at least `version` and `jobs`)."""
    ack = "null" if report_ack is None else str(int(report_ack))
    head = (
        f'{{"heartbeat_s":{float(heartbeat_s)!r},"lease_s":{float(lease_s)!r},'
        f'"health_ack":{int(health_ack)},"report_ack":{ack},'
        f'"full_report":{"true" if full_report else "false"},'
        f'"catching_up":{"true" if catching_up else "false"},'
    )
    return head.encode() + body[1:]
