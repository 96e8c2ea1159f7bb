"""Serving in the head's metrics: the routers' latest summaries per deployment, in memory
(`StatsBook`: head/serving_stats.py takes them in, head/serving.py shows them in
DeploymentInfo.stats), and the per-deployment gauges of the head's /metrics
(`ServingCollector`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from phalanx.api.serving import MAX_ROUTERS, PoolStats, RouterStatsInfo, RouterStatsReport

if TYPE_CHECKING:
    from phalanx.head.serving import Serving

STALE_S = 30.0  # a summary older than this is shown as stale and left out of /metrics
MAX_DEPLOYMENT_LABELS = 1000  # /metrics: the first this many deployments by name


class StatsBook:
    """The latest report of each router per deployment (at most MAX_ROUTERS: a new router
    pushes out the one that reported least recently)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._by_name: dict[str, dict[str, tuple[float, RouterStatsReport]]] = {}

    def record(self, name: str, report: RouterStatsReport) -> RouterStatsInfo:
        now = self.clock()
        with self._lock:
            routers = self._by_name.setdefault(name, {})
            routers.pop(report.router, None)
            while len(routers) >= MAX_ROUTERS:
                oldest = min(routers, key=lambda r: routers[r][0])
                del routers[oldest]
            routers[report.router] = (now, report)
        return RouterStatsInfo(report=report, reported_at=now)

    def shown(self, name: str) -> list[RouterStatsInfo]:
        """Every router's latest report, newest first, stale ones marked."""
        now = self.clock()
        with self._lock:
            rows = list(self._by_name.get(name, {}).values())
        rows.sort(key=lambda row: (-row[0], row[1].router))
        return [
            RouterStatsInfo(report=r, reported_at=at, stale=now - at > STALE_S) for at, r in rows
        ]

    def fresh(self, name: str) -> list[RouterStatsReport]:
        return [s.report for s in self.shown(name) if not s.stale]

    def forget(self, name: str) -> None:
        with self._lock:
            self._by_name.pop(name, None)

    def keep_only(self, names: set[str]) -> None:
        """Drop the reports of deployments that no longer exist."""
        with self._lock:
            for name in [n for n in self._by_name if n not in names]:
                del self._by_name[name]


# ----------------------------------------------------------------------------- /metrics
_POOL_GAUGES: tuple[tuple[str, str, Callable[[PoolStats], float | None], bool], ...] = (
    # (name, help, value, summed over routers: else the largest)
    ("requests_per_second", "Requests ended per second (routers' last window)",
     lambda p: p.requests_per_s, True),
    ("error_rate", "Share of the window's requests that failed", lambda p: p.error_rate, False),
    ("ttft_p50_seconds", "TTFT median over the routers' window",
     lambda p: _s(p.ttft_p50_ms), False),
    ("ttft_p90_seconds", "TTFT p90 over the routers' window", lambda p: _s(p.ttft_p90_ms), False),
    ("tpot_p50_seconds", "TPOT median over the routers' window",
     lambda p: _s(p.tpot_p50_ms), False),
    ("tpot_p90_seconds", "TPOT p90 over the routers' window", lambda p: _s(p.tpot_p90_ms), False),
    ("in_flight", "Requests being answered (routers)", lambda p: p.in_flight, True),
    ("queued", "Requests waiting in the routers", lambda p: p.queued, True),
    ("engine_waiting", "Requests waiting inside the engines", lambda p: p.engine_waiting, False),
    ("kv_usage", "Engines' KV cache in use (0-1, mean over replicas)", lambda p: p.kv_usage,
     False),
    ("cache_hit_rate", "Engines' prefix-cache hits / lookups (prompt tokens)",
     lambda p: p.cache_hit_rate, False),
    ("slo_attainment", "Share of the window's requests within the pool's SLO",
     lambda p: p.slo_attainment, False),
)  # fmt: skip


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


class ServingCollector(Collector):
    """`phalanx_serve_*{deployment,pool}`: replicas desired/ready and failures from the
    controller; the routers' fresh summaries (rates and counts summed over routers; the
    rest the largest — the worst — any router reported)."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving

    def collect(self) -> Iterator[Metric]:
        serving = self.serving
        labels = ("deployment", "pool")
        desired = GaugeMetricFamily(
            "phalanx_serve_replicas_desired", "Replicas a pool should have", labels=labels
        )
        ready = GaugeMetricFamily(
            "phalanx_serve_replicas_ready", "Replicas of the pool ready", labels=labels
        )
        failures = GaugeMetricFamily(
            "phalanx_serve_replica_failures",
            "Replicas of the pool that ended on their own since one was last ready",
            labels=labels,
        )
        with serving.control.lock:
            deps = sorted(serving.deployments.values(), key=lambda d: d.name)
            deps = deps[:MAX_DEPLOYMENT_LABELS]
            rows = []
            for dep in deps:
                for p in dep.spec.pools:
                    h = dep.health.get(p.role)
                    n_ready = serving.controller.ready(dep, p.role, dep.generation)
                    rows.append((dep.name, p.role, p.replicas, n_ready, h.failures if h else 0))
        for name, role, want, have, failed in rows:
            desired.add_metric((name, role), want)
            ready.add_metric((name, role), have)
            failures.add_metric((name, role), failed)
        yield from (desired, ready, failures)
        families = [
            (GaugeMetricFamily(f"phalanx_serve_{n}", h, labels=labels), value, summed)
            for n, h, value, summed in _POOL_GAUGES
        ]
        reporting = GaugeMetricFamily(
            "phalanx_serve_routers_reporting",
            f"Routers whose summary is under {STALE_S:g} s old",
            labels=("deployment",),
        )
        for dep in deps:
            reports = serving.stats.fresh(dep.name)
            reporting.add_metric((dep.name,), len(reports))
            by_pool: dict[str, list[PoolStats]] = {}
            for r in reports:
                for ps in r.pools:
                    by_pool.setdefault(ps.role, []).append(ps)
            for pool, stats in sorted(by_pool.items()):
                for family, value, summed in families:
                    values = [v for v in (value(ps) for ps in stats) if v is not None]
                    if values:
                        family.add_metric((dep.name, pool), sum(values) if summed else max(values))
        yield reporting
        yield from (family for family, _, _ in families)
