"""Routing policies: which replica gets a request, decided over a snapshot of the replicas'
loads (and, for kv-aware, the prefix index). No I/O and no clock: the router builds the
snapshot, asks `choose`, and acts on the answer.

- round-robin: each replica in turn.
- least-load: the fewest requests in flight relative to the replica's slots.
- power-of-two: two replicas at random, the less loaded of the two (Mitzenmacher).
- kv-aware: Dynamo's KV router cost over the work still outstanding on each replica —
  overlap weight × (this prompt's blocks not in the replica's prefix cache, as the index
  predicts, + the uncached blocks of its requests still waiting for their first token)
  + decode weight × its requests past their first token (decoding) + a queueing penalty
  per request beyond its free slots; the lowest cost wins, ties to the fewest in flight.
- kv-aware-simple: the first cost, kept for comparison — this prompt's uncached blocks +
  the whole prompts of every request in flight (cached blocks and decoding requests
  counted as if still to prefill).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from phalanx.api.serving import Endpoint, Policy
from phalanx.serve.router.prefix import PrefixIndex

DEFAULT_POLICY: Policy = "kv-aware"


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One routable replica in the snapshot."""

    endpoint: Endpoint
    in_flight: int = 0  # requests sent and not yet answered in full
    active_blocks: int = 0  # prompt blocks of those requests (all of each prompt)
    prefilling: int = 0  # of those, requests whose first token has not come back yet
    prefill_blocks: int = 0  # their prompt blocks the replica had not cached (to prefill)


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What the policies know of a request: its prompt's chained block hashes."""

    hashes: tuple[bytes, ...] = ()


class RoutingPolicy(Protocol):
    name: Policy

    def choose(self, replicas: Sequence[ReplicaLoad], request: RouteRequest) -> Endpoint:
        """The replica to send `request` to; `replicas` is never empty."""
        ...


def _load(r: ReplicaLoad) -> float:
    return r.in_flight / r.endpoint.slots


@dataclass
class RoundRobin:
    name: Policy = "round-robin"
    _next: int = 0

    def choose(self, replicas: Sequence[ReplicaLoad], request: RouteRequest) -> Endpoint:
        i = self._next % len(replicas)
        self._next = i + 1
        return replicas[i].endpoint


@dataclass
class LeastLoad:
    """Fewest in flight per slot; ties go round the replicas so equal ones share."""

    name: Policy = "least-load"
    _tie: int = 0

    def choose(self, replicas: Sequence[ReplicaLoad], request: RouteRequest) -> Endpoint:
        self._tie += 1
        n = len(replicas)
        best = min(range(n), key=lambda i: (_load(replicas[i]), (i - self._tie) % n))
        return replicas[best].endpoint


@dataclass
class PowerOfTwo:
    name: Policy = "power-of-two"
    rng: random.Random = field(default_factory=random.Random)

    def choose(self, replicas: Sequence[ReplicaLoad], request: RouteRequest) -> Endpoint:
        if len(replicas) == 1:
            return replicas[0].endpoint
        a, b = self.rng.sample(range(len(replicas)), 2)
        return replicas[a if _load(replicas[a]) <= _load(replicas[b]) else b].endpoint


@dataclass
class KvAware:
    """Dynamo's KV router cost over the outstanding work of each replica (in blocks):

        overlap_weight × (new + prefill_blocks)      prefill still to do, this request's too
        + decode_weight × (in_flight − prefilling)    sequences generating tokens
        + queue_weight × max(0, in_flight + 1 − slots)  waiting for a slot to free

    `new` is this prompt's blocks the replica has not cached (the prefix index's guess);
    `prefill_blocks` drops a request's uncached blocks once its first token is back. A
    prompt shorter than a block costs only the load terms. Lowest wins; ties go to the
    least loaded, then round the replicas."""

    index: PrefixIndex
    name: Policy = "kv-aware"
    overlap_weight: float = 1.0
    decode_weight: float = 1.0
    queue_weight: float = 4.0
    _tie: int = 0

    def cost(self, r: ReplicaLoad, request: RouteRequest) -> float:
        blocks = len(request.hashes)
        new = blocks - self.index.matched(r.endpoint.url, request.hashes) if blocks else 0
        decoding = max(r.in_flight - r.prefilling, 0)
        waiting = max(r.in_flight + 1 - r.endpoint.slots, 0)
        return (
            self.overlap_weight * (new + r.prefill_blocks)
            + self.decode_weight * decoding
            + self.queue_weight * waiting
        )

    def choose(self, replicas: Sequence[ReplicaLoad], request: RouteRequest) -> Endpoint:
        self._tie += 1
        n = len(replicas)

        def key(i: int) -> tuple[float, float, int]:
            r = replicas[i]
            return self.cost(r, request), _load(r), (i - self._tie) % n

        return replicas[min(range(n), key=key)].endpoint


@dataclass
class KvAwareSimple:
    """The first kv-aware cost: prompt blocks not cached + every prompt block in flight."""

    index: PrefixIndex
    name: Policy = "kv-aware-simple"
    _tie: int = 0

    def choose(self, replicas: Sequence[ReplicaLoad], request: RouteRequest) -> Endpoint:
        self._tie += 1
        n = len(replicas)
        blocks = len(request.hashes)

        def cost(i: int) -> tuple[int, float, int]:
            r = replicas[i]
            uncached = blocks - self.index.matched(r.endpoint.url, request.hashes) if blocks else 0
            return uncached + r.active_blocks, _load(r), (i - self._tie) % n

        return replicas[min(range(n), key=cost)].endpoint


def make_policy(
    name: Policy, index: PrefixIndex, rng: random.Random | None = None
) -> RoutingPolicy:
    """The policy registered under `name`."""
    makers: dict[Policy, Callable[[], RoutingPolicy]] = {
        "round-robin": RoundRobin,
        "least-load": LeastLoad,
        "power-of-two": lambda: PowerOfTwo(rng=rng or random.Random()),
        "kv-aware": lambda: KvAware(index),
        "kv-aware-simple": lambda: KvAwareSimple(index),
    }
    return makers[name]()
