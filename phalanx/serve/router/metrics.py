"""The router's Prometheus series (`GET /metrics`), in a registry of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

# Seconds: from a millisecond (a cached prefix on a GPU) to minutes (a long generation).
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)

# A replica's row: (pool, replica id, url, in flight, requests sent, failures, down now)
ReplicaRow = tuple[str, str, str, int, int, int, bool]


class _Replicas(Collector):
    def __init__(self, rows: Callable[[], Iterable[ReplicaRow]]) -> None:
        self.rows = rows

    def collect(self) -> Iterator[Metric]:
        labels = ["pool", "replica", "url"]
        in_flight = GaugeMetricFamily(
            "phalanx_router_replica_in_flight", "Requests in flight per replica", labels=labels
        )
        sent = GaugeMetricFamily(
            "phalanx_router_replica_requests", "Requests sent to the replica", labels=labels
        )
        failed = GaugeMetricFamily(
            "phalanx_router_replica_failures", "Requests the replica failed", labels=labels
        )
        down = GaugeMetricFamily(
            "phalanx_router_replica_down", "1 while the replica is skipped", labels=labels
        )
        for pool, replica, url, flying, requests, failures, is_down in self.rows():
            key = [pool, replica, url]
            in_flight.add_metric(key, flying)
            sent.add_metric(key, requests)
            failed.add_metric(key, failures)
            down.add_metric(key, 1.0 if is_down else 0.0)
        yield from (in_flight, sent, failed, down)


class RouterMetrics:
    def __init__(self, replicas: Callable[[], Iterable[ReplicaRow]]) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "phalanx_router_requests",
            "Requests answered, by route and HTTP status",
            ["route", "code"],
            registry=r,
        )
        self.errors = Counter(
            "phalanx_router_errors",
            "Replica failures seen by the router (each retried or answered 5xx)",
            ["reason"],
            registry=r,
        )
        self.retries = Counter(
            "phalanx_router_retries", "Requests sent again to another replica", registry=r
        )
        self.ttft = Histogram(
            "phalanx_router_ttft_seconds",
            "Request received to first content byte sent",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "phalanx_router_tpot_seconds",
            "Time per output token after the first",
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "phalanx_router_e2e_seconds",
            "Request received to last byte sent",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.handoff = Histogram(
            "phalanx_router_handoff_seconds",
            "Prefill → decode hand-off (slot waits, prefill, KV save and restore)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "phalanx_router_in_flight", "Requests being answered now", registry=r
        )
        self.prompt_blocks = Counter(
            "phalanx_router_prompt_blocks",
            "Whole prompt blocks routed (block_chars characters each)",
            registry=r,
        )
        self.cached_blocks = Counter(
            "phalanx_router_cached_blocks",
            "Of those, blocks the prefix index predicted cached on the chosen replica",
            registry=r,
        )
        self.hit_rate = Gauge(
            "phalanx_router_prefix_cache_hit_rate",
            "cached_blocks / prompt_blocks since start, as the prefix index predicts",
            registry=r,
        )
        self.hit_rate.set_function(self._hit_rate)
        r.register(_Replicas(replicas))
        self._blocks = 0
        self._cached = 0

    def blocks(self, prompt: int, cached: int) -> None:
        if prompt:
            self._blocks += prompt
            self._cached += cached
            self.prompt_blocks.inc(prompt)
            if cached:
                self.cached_blocks.inc(cached)

    def predicted_hit_rate(self) -> float | None:
        """cached / prompt blocks since start (None before the first whole block)."""
        return self._cached / self._blocks if self._blocks else None

    def _hit_rate(self) -> float:
        return self._cached / self._blocks if self._blocks else 0.0

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
