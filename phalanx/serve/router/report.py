"""The router's summary for the head: per pool, what it measured over the last window
(requests/s, TTFT/TPOT p50/p90, error rate, SLO attainment), what is in flight and queued
now, and the engines' KV usage, queue and cache hit rate (engine_metrics.py); sent every
REPORT_S to `POST /v1/serve/deployments/{name}/stats` with the router's token."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from typing import Protocol

from pydantic import ValidationError

from phalanx.api.serving import SLO, PoolRole, PoolStats, RouterStatsReport
from phalanx.serve.router.access import HeadUnreachable
from phalanx.serve.router.engine_metrics import EngineSample
from phalanx.serve.router.headlink import HeadError, HeadLink
from phalanx.serve.router.stats import RouterStats

log = logging.getLogger("phalanx.serve.router")

REPORT_S = 5.0
WINDOW_S = 30.0  # the requests a report summarizes: those that ended this long ago or less
SLO_REFRESH_S = 30.0  # the pools' SLOs from the head, this often
POOLS: tuple[PoolRole, ...] = ("aggregated", "prefill", "decode")


class PoolSamples(Protocol):
    """The engines' latest numbers per pool (engine_metrics.EnginePoller)."""

    def pool(self, pool: str) -> list[EngineSample]: ...


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation between closest ranks (numpy's
    default, as `vllm bench serve` reports); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    at = (len(ordered) - 1) * q
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def _cap(value: float | None, top: float) -> float | None:
    return None if value is None else min(max(value, 0.0), top)


def summarize(
    router_id: str,
    stats: RouterStats,
    poller: PoolSamples | None,
    pools: Sequence[str],
    slos: dict[str, SLO],
    window_s: float = WINDOW_S,
    predicted_hit_rate: float | None = None,
) -> RouterStatsReport:
    """The report for `pools` (the deployment's pools) over the last `window_s`."""
    out = []
    for pool in pools:
        if pool not in POOLS:
            continue
        w = stats.window(pool, window_s)
        samples = poller.pool(pool) if poller is not None else []
        kv = [s.kv_usage for s in samples if s.kv_usage is not None]
        running = [s.running for s in samples if s.running is not None]
        waiting = [s.waiting for s in samples if s.waiting is not None]
        hits = [s.cache_hits for s in samples if s.cache_hits is not None and s.cache_lookups]
        lookups = [s.cache_lookups for s in samples if s.cache_hits is not None and s.cache_lookups]
        slo = slos.get(pool)
        attained = (
            stats.attainment(pool, window_s, slo.ttft_ms, slo.tpot_ms) if slo is not None else None
        )
        out.append(
            PoolStats(
                role=pool,
                requests=min(w.requests, 2**31 - 1),
                requests_per_s=w.requests / window_s,
                errors=min(w.errors, 2**31 - 1),
                error_rate=w.errors / w.requests if w.requests else 0.0,
                ttft_p50_ms=_cap(percentile(w.ttft_ms, 0.5), 3_600_000),
                ttft_p90_ms=_cap(percentile(w.ttft_ms, 0.9), 3_600_000),
                tpot_p50_ms=_cap(percentile(w.tpot_ms, 0.5), 3_600_000),
                tpot_p90_ms=_cap(percentile(w.tpot_ms, 0.9), 3_600_000),
                in_flight=max(0, min(w.in_flight, 2**31 - 1)),
                queued=max(0, min(w.queued, 2**31 - 1)),
                replicas_ready=max(0, min(w.replicas_ready, 2**31 - 1)),
                engine_running=_cap(sum(running), 1e12) if running else None,
                engine_waiting=_cap(sum(waiting), 1e12) if waiting else None,
                kv_usage=_cap(sum(kv) / len(kv), 1.0) if kv else None,
                cache_hit_rate=_cap(sum(hits) / sum(lookups), 1.0) if lookups else None,
                slo_attainment=attained,
            )
        )
    return RouterStatsReport(
        router=router_id[:128] or "router",
        window_s=window_s,
        pools=out,
        predicted_hit_rate=_cap(predicted_hit_rate, 1.0),
    )


class Reporter:
    """Sends `summarize(...)` to the head every `interval_s` (a router background task);
    learns the pools and their SLOs from the head's deployment. Never raises: a refused or
    failed report is logged and the next one tries again."""

    def __init__(
        self,
        link: HeadLink,
        name: str,
        router_id: str,
        stats: RouterStats,
        poller: PoolSamples | None,
        predicted_hit_rate: Callable[[], float | None],
        interval_s: float = REPORT_S,
        window_s: float = WINDOW_S,
    ) -> None:
        self.link = link
        self.name = name
        self.router_id = router_id
        self.stats = stats
        self.poller = poller
        self.predicted_hit_rate = predicted_hit_rate
        self.interval_s = interval_s
        self.window_s = window_s
        self.pools: list[str] = []
        self.slos: dict[str, SLO] = {}
        self.sent = 0

    async def _learn(self) -> None:
        info = await self.link.deployment(self.name)
        self.pools = [p.role for p in info.spec.pools]
        self.slos = {p.role: p.slo for p in info.spec.pools if p.slo is not None}

    async def report_once(self) -> None:
        report = summarize(
            self.router_id,
            self.stats,
            self.poller,
            self.pools,
            self.slos,
            self.window_s,
            self.predicted_hit_rate(),
        )
        await self.link.post_stats(self.name, report)
        self.sent += 1

    async def run(self) -> None:
        learned_at = -math.inf
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                if loop.time() - learned_at >= SLO_REFRESH_S or not self.pools:
                    await self._learn()
                    learned_at = loop.time()
                await self.report_once()
            except (HeadError, HeadUnreachable, ValidationError) as e:
                log.warning("cannot report to the head: %s", e)
            except Exception:
                log.exception("reporting to the head failed")
