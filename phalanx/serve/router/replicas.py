"""The replicas the router may route to, as the latest Endpoints lists them, with what the
router knows of each: requests in flight, blocks they hold, failures (passive health)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from phalanx.api.serving import Endpoint, Endpoints
from phalanx.serve.router.policies import ReplicaLoad
from phalanx.serve.router.prefix import PrefixIndex
from phalanx.serve.router.upstream import Upstream

log = logging.getLogger("phalanx.serve.router")

DOWN_FIRST_S = 1.0  # a failed replica is skipped this long, doubling per failure in a row
DOWN_MAX_S = 30.0


@dataclass(eq=False)
class Replica:
    endpoint: Endpoint
    upstream: Upstream
    in_flight: int = 0
    active_blocks: int = 0
    prefilling: int = 0  # in flight, first token not back yet
    prefill_blocks: int = 0  # their uncached prompt blocks
    requests: int = 0
    failures: int = 0
    failed_in_a_row: int = 0
    down_until: float = 0.0
    name: str = field(default="")

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(
            self.endpoint, self.in_flight, self.active_blocks, self.prefilling, self.prefill_blocks
        )


class ReplicaSet:
    """The routable replicas per pool. `update` takes a new Endpoints; replicas it no
    longer lists are dropped (requests in flight on them finish on their own)."""

    def __init__(
        self,
        index: PrefixIndex,
        clock: Callable[[], float] = time.monotonic,
        read_timeout_s: float = 600.0,
    ) -> None:
        self.index = index
        self.clock = clock
        self.read_timeout_s = read_timeout_s
        self.endpoints: Endpoints | None = None
        self._by_url: dict[str, Replica] = {}
        self.pools: dict[str, list[Replica]] = {}

    def update(self, endpoints: Endpoints) -> None:
        old = self._by_url
        fresh: dict[str, Replica] = {}
        key_changed = (
            self.endpoints is not None and self.endpoints.engine_key != endpoints.engine_key
        )
        for ep in endpoints.endpoints:
            replica = old.get(ep.url)
            if replica is None or replica.endpoint.job_id != ep.job_id or key_changed:
                # A new replica (or a new job at an old address: its cache starts empty).
                self.index.forget(ep.url)
                try:
                    upstream = Upstream(
                        ep.url, endpoints.engine_key, read_timeout_s=self.read_timeout_s
                    )
                except ValueError as e:  # not http://HOST:PORT: never routable
                    log.warning("replica %s skipped: %s", ep.job_id, e)
                    continue
                replica = Replica(ep, upstream, name=str(ep.job_id))
            else:
                replica.endpoint = ep
            fresh[ep.url] = replica
        for url, replica in old.items():
            if fresh.get(url) is not replica:
                replica.upstream.close()
                if url not in fresh:
                    self.index.forget(url)
        self._by_url = fresh
        pools: dict[str, list[Replica]] = {}
        for replica in fresh.values():
            pools.setdefault(replica.endpoint.pool, []).append(replica)
        self.pools = pools
        self.endpoints = endpoints

    def routable(
        self, pool: str, exclude: set[str] | frozenset[str] = frozenset()
    ) -> list[Replica]:
        """The pool's replicas not down and not in `exclude` (urls); when all are down, the
        ones down (a last try beats refusing outright)."""
        replicas = [r for r in self.pools.get(pool, ()) if r.endpoint.url not in exclude]
        now = self.clock()
        up = [r for r in replicas if r.down_until <= now]
        return up or replicas

    def by_url(self, url: str) -> Replica | None:
        return self._by_url.get(url)

    def ready(self, pool: str) -> int:
        now = self.clock()
        return sum(1 for r in self.pools.get(pool, ()) if r.down_until <= now)

    def failed(self, replica: Replica) -> None:
        replica.failures += 1
        replica.failed_in_a_row += 1
        pause = min(DOWN_MAX_S, DOWN_FIRST_S * 2 ** (replica.failed_in_a_row - 1))
        replica.down_until = self.clock() + pause

    @staticmethod
    def succeeded(replica: Replica) -> None:
        if replica.failed_in_a_row:
            replica.failed_in_a_row = 0
            replica.down_until = 0.0

    def __iter__(self) -> Iterator[Replica]:
        return iter(list(self._by_url.values()))

    def close(self) -> None:
        for replica in self._by_url.values():
            replica.upstream.close()
