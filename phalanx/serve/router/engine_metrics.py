"""The engines' own Prometheus metrics, polled by the router from each replica's `/metrics`
every few seconds and re-exported per pool and replica (KV usage, running, waiting, the
engine's prefix-cache hit rate, prompt/generated token totals).

Known series (summed over label sets; a ratio takes the largest) are in `_NAMES`: llama.cpp
(`--metrics`) `llamacpp:*` and vLLM `vllm:*`; the table is in docs/serving-metrics.md.
llama.cpp's cache hit rate is `prompt_tokens_cached_total` / (that + `prompt_tokens_total`),
vLLM's `prefix_cache_hits_total` / `prefix_cache_queries_total` (prompt tokens).

The parse is bounded — an engine is not trusted to be well-behaved: at most MAX_BYTES of
body, read within TIMEOUT_S, at most MAX_LINES lines of at most MAX_LINE characters, only
the names above kept, non-finite or negative values dropped. A replica whose scrape fails
keeps no numbers (its series say `up 0`); the poller never raises.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from phalanx.serve.router.replicas import ReplicaSet
from phalanx.serve.router.upstream import Upstream, UpstreamError

log = logging.getLogger("phalanx.serve.router")

POLL_S = 3.0  # each replica's /metrics, this often
TIMEOUT_S = 2.0  # the whole scrape (connect, head, body) of one replica
MAX_BYTES = 512 * 1024  # a body larger than this is refused (vLLM's is ~60 KiB)
INLINE_BYTES = 128 * 1024  # larger bodies are parsed in a worker thread
MAX_LINES = 20_000
MAX_LINE = 4096
PARALLEL = 16  # replicas scraped at once

# name → field; a name in RATIOS takes the largest value, any other the sum.
_NAMES = {
    "llamacpp:kv_cache_usage_ratio": "kv_usage",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",
    "llamacpp:requests_processing": "running",
    "vllm:num_requests_running": "running",
    "llamacpp:requests_deferred": "waiting",
    "vllm:num_requests_waiting": "waiting",
    "llamacpp:prompt_tokens_cached_total": "cached_tokens",
    "llamacpp:prompt_tokens_total": "prompt_tokens",
    "llamacpp:tokens_predicted_total": "generated_tokens",
    "vllm:prefix_cache_hits_total": "hits",
    "vllm:prefix_cache_queries_total": "queries",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generated_tokens",
}
_NAMES_B = {name.encode(): field for name, field in _NAMES.items()}
_RATIOS = frozenset({"kv_usage"})
_PREFIXES = (b"llamacpp:", b"vllm:")  # every known name starts so (comments do not)
_MAX_VALUE = 1e18


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One scrape's numbers (None: the engine does not export it)."""

    kv_usage: float | None = None  # 0..1
    running: float | None = None
    waiting: float | None = None
    cache_hits: float | None = None  # prompt tokens found in the prefix cache (since start)
    cache_lookups: float | None = None  # prompt tokens looked up
    prompt_tokens: float | None = None  # prompt tokens computed (not cached)
    generated_tokens: float | None = None

    @property
    def cache_hit_rate(self) -> float | None:
        if self.cache_hits is None or not self.cache_lookups:
            return None
        return min(1.0, self.cache_hits / self.cache_lookups)


def parse(body: bytes) -> EngineSample:
    """The known series of a Prometheus text exposition (bounded; never raises)."""
    found: dict[str, float] = {}
    for n, raw in enumerate(body.split(b"\n")):
        if n >= MAX_LINES:
            break
        if len(raw) > MAX_LINE or not raw.startswith(_PREFIXES):
            continue
        brace, space = raw.find(b"{"), raw.find(b" ")
        name_end = min((i for i in (brace, space) if i >= 0), default=-1)
        field = _NAMES_B.get(raw[:name_end]) if name_end > 0 else None
        if field is None:
            continue
        # The value follows the labels (which may hold spaces inside quotes): the text
        # after the last '}' if any, else after the name; an optional timestamp follows.
        rest = raw[raw.rfind(b"}") + 1 :] if name_end == brace else raw[name_end:]
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        if not math.isfinite(value) or value < 0 or value > _MAX_VALUE:
            continue
        if field in _RATIOS:
            found[field] = max(found.get(field, 0.0), min(value, 1.0))
        else:
            found[field] = found.get(field, 0.0) + value
    hits, lookups = found.get("hits"), found.get("queries")
    cached = found.get("cached_tokens")
    if hits is None and cached is not None:  # llama.cpp: cached vs computed prompt tokens
        hits, lookups = cached, cached + found.get("prompt_tokens", 0.0)
    return EngineSample(
        kv_usage=found.get("kv_usage"),
        running=found.get("running"),
        waiting=found.get("waiting"),
        cache_hits=hits,
        cache_lookups=lookups,
        prompt_tokens=found.get("prompt_tokens"),
        generated_tokens=found.get("generated_tokens"),
    )


async def scrape(upstream: Upstream, timeout_s: float = TIMEOUT_S) -> EngineSample:
    """One replica's /metrics, parsed. UpstreamError when it cannot be read in time,
    answers other than 200, or sends more than MAX_BYTES."""
    try:
        async with asyncio.timeout(timeout_s):
            answer = await upstream.request("GET", "/metrics", accept=b"text/plain")
            try:
                if answer.status != 200:
                    raise UpstreamError(f"/metrics answered {answer.status}")
                length = answer.headers.get(b"content-length")
                if length is not None and length.isdigit() and int(length) > MAX_BYTES:
                    raise UpstreamError(f"/metrics is larger than {MAX_BYTES} bytes")
                body = await answer.read(MAX_BYTES)
            finally:
                answer.close()
    except TimeoutError:
        raise UpstreamError(f"/metrics took longer than {timeout_s:g} s") from None
    if len(body) > INLINE_BYTES:  # a big page is parsed off the event loop
        return await asyncio.to_thread(parse, body)
    return parse(body)


@dataclass(frozen=True, slots=True)
class Scraped:
    pool: str
    replica: str  # job id
    at: float  # monotonic
    sample: EngineSample | None  # None: the last scrape failed


class EnginePoller:
    """Scrapes every routable replica's /metrics each `interval_s` (`run`, a background
    task of the router); `latest` holds the last result per replica URL."""

    def __init__(
        self,
        replicas: ReplicaSet,
        interval_s: float = POLL_S,
        timeout_s: float = TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.replicas = replicas
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.latest: dict[str, Scraped] = {}
        self._gate = asyncio.Semaphore(PARALLEL)

    async def poll_once(self) -> None:
        current = list(self.replicas)
        results = await asyncio.gather(
            *(self._one(r.upstream) for r in current), return_exceptions=True
        )
        now = self.clock()
        latest: dict[str, Scraped] = {}
        for replica, result in zip(current, results, strict=True):
            sample = result if isinstance(result, EngineSample) else None
            if isinstance(result, BaseException) and not isinstance(result, UpstreamError):
                log.warning("scraping %s failed: %r", replica.endpoint.url, result)
            latest[replica.endpoint.url] = Scraped(replica.endpoint.pool, replica.name, now, sample)
        self.latest = latest  # replicas gone since are dropped with the old dict

    async def _one(self, upstream: Upstream) -> EngineSample:
        async with self._gate:
            return await scrape(upstream, self.timeout_s)

    async def run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # never fatal: the next round tries again
                log.exception("polling the engines' metrics failed")
            await asyncio.sleep(self.interval_s)

    def pool(self, pool: str) -> list[EngineSample]:
        """The pool's replicas' latest good samples."""
        return [s.sample for s in self.latest.values() if s.pool == pool and s.sample is not None]


class EngineCollector(Collector):
    """`phalanx_router_engine_*{pool,replica}`: the latest scrape of each replica."""

    def __init__(self, poller: Callable[[], EnginePoller | None]) -> None:
        self.poller = poller

    def collect(self) -> Iterator[Metric]:
        poller = self.poller()
        rows: Iterable[Scraped] = poller.latest.values() if poller is not None else ()
        labels = ["pool", "replica"]
        up = GaugeMetricFamily(
            "phalanx_router_engine_up", "1 if the replica's /metrics was read", labels=labels
        )
        families = {
            "kv_usage": GaugeMetricFamily(
                "phalanx_router_engine_kv_usage", "KV cache in use (0-1)", labels=labels
            ),
            "running": GaugeMetricFamily(
                "phalanx_router_engine_running", "Requests the engine is running", labels=labels
            ),
            "waiting": GaugeMetricFamily(
                "phalanx_router_engine_waiting", "Requests queued in the engine", labels=labels
            ),
            "cache_hit_rate": GaugeMetricFamily(
                "phalanx_router_engine_cache_hit_rate",
                "Prompt tokens found in the engine's prefix cache / looked up, since it started",
                labels=labels,
            ),
            "prompt_tokens": GaugeMetricFamily(
                "phalanx_router_engine_prompt_tokens",
                "Prompt tokens the engine computed, since it started",
                labels=labels,
            ),
            "generated_tokens": GaugeMetricFamily(
                "phalanx_router_engine_generated_tokens",
                "Tokens the engine generated, since it started",
                labels=labels,
            ),
        }
        for row in rows:
            key = [row.pool, row.replica]
            up.add_metric(key, 0.0 if row.sample is None else 1.0)
            if row.sample is None:
                continue
            for field, family in families.items():
                value = getattr(row.sample, field)
                if value is not None:
                    family.add_metric(key, float(value))
        yield up
        yield from families.values()
