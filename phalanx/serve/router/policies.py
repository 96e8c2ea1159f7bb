"""Routing policies: which replica gets a request, decided over a snapshot of the replicas'
loads (and, for kv-aware, the prefix index). No I/O and no clock: the router builds the
snapshot, asks `choose`, and acts on the answer.

- round-robin: each replica in turn.
- least-load: the fewest requests in flight relative to the replica's slots.
- power-of-two: two replicas at random, the less loaded of the two (Mitzenmacher).
- kv-aware: Dynamo's KV router cost — blocks the replica would have to prefill (the
  prompt's blocks not in its prefix cache, as the index predicts) plus the blocks it is
  already working on (the prompts of its requests in flight); the lowest cost wins, ties
  to the fewest in flight.
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
    active_blocks: int = 0  # prompt blocks of those requests


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
    """cost = prompt blocks not cached on the replica + blocks it is already busy with."""

    index: PrefixIndex
    name: Policy = "kv-aware"
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
    }
    return makers[name]()
