"""The router's engine side of serving metrics: each replica's Prometheus /metrics parsed
(a real llama-server, vLLM's series names, hostile engines over real HTTP that must not
hurt the router), the per-pool summary it reports to the head, and the head's in-memory
book of those summaries (latest per router, stale after 30 s)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import httpx
import numpy as np
import pytest

from phalanx.api.serving import MAX_ROUTERS, SLO, Endpoint, Endpoints, PoolStats, RouterStatsReport
from phalanx.head.serving_metrics import STALE_S, StatsBook
from phalanx.serve.router import engine_metrics as em
from phalanx.serve.router.metrics import RouterMetrics
from phalanx.serve.router.prefix import PrefixIndex
from phalanx.serve.router.replicas import ReplicaSet
from phalanx.serve.router.report import percentile, summarize
from phalanx.serve.router.server import RouterOptions, RouterSetupError, build
from phalanx.serve.router.stats import RouterStats
from phalanx.serve.router.upstream import Upstream, UpstreamError
from tests.serve.test_router_llama import KEY, MODEL, Proc, _wait_ready, start_replica

VLLM = b"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smol"} 3.0
vllm:num_requests_waiting{engine="0",model_name="smol"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="smol"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="smol"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="smol"} 400.0
vllm:prompt_tokens_total{engine="0",model_name="smol"} 600.0
vllm:generation_tokens_total{engine="0",model_name="smol"} 90.0
vllm:num_requests_waiting{engine="1",model_name="a } b"} 2.0 1712345678000
vllm:iteration_tokens_total_bucket{le="1.0",model_name="smol"} 5.0
"""


def test_vllm_series_are_read_and_summed_over_label_sets() -> None:
    s = em.parse(VLLM)
    assert (s.running, s.waiting, s.kv_usage) == (3.0, 9.0, 0.25)
    assert (s.cache_hits, s.cache_lookups, s.cache_hit_rate) == (400.0, 1000.0, 0.4)
    assert (s.prompt_tokens, s.generated_tokens) == (600.0, 90.0)
    # The older name of KV usage too; a ratio takes the largest, never above 1.
    old = em.parse(b'vllm:gpu_cache_usage_perc 0.5\nvllm:gpu_cache_usage_perc{x="1"} 7\n')
    assert old.kv_usage == 1.0


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\xff\xfe garbage\n{}}}{{ 1\n",
        b"vllm:num_requests_waiting NaN\nvllm:num_requests_running +Inf\n",
        b"vllm:num_requests_waiting -5\nvllm:kv_cache_usage_perc -0.1\n",
        b"vllm:num_requests_waiting 1e300\n",
        b'vllm:num_requests_waiting{model_name="' + b"x" * 10_000 + b'"} 4\n',
        b"vllm:num_requests_waiting\nvllm:num_requests_running notanumber\n",
        b"# vllm:num_requests_waiting 3\n",
    ],
)
def test_hostile_or_broken_lines_are_dropped_not_fatal(body: bytes) -> None:
    assert em.parse(body) == em.EngineSample()


def test_the_parse_stops_after_max_lines() -> None:
    body = b"x 1\n" * em.MAX_LINES + b"vllm:num_requests_waiting 3\n"
    assert em.parse(body).waiting is None
    assert em.parse(b"x 1\n" * 10 + b"vllm:num_requests_waiting 3\n").waiting == 3.0


# ----------------------------------------------------------------- over real HTTP
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n" + b"x" * 65536)
    await writer.drain()
    await asyncio.sleep(10)


async def _endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    line = b"vllm:num_requests_waiting 1\n" * 2000
    while True:
        writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
        await writer.drain()


async def _drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    for _ in range(1000):
        writer.write(b"#")
        await writer.drain()
        await asyncio.sleep(0.05)


async def _fat(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A valid page of 300 KiB (parsed off the event loop), the known series at its end."""
    await reader.readuntil(b"\r\n\r\n")
    body = b'vllm:iteration_tokens_total_bucket{le="1.0"} 5.0\n' * 6000
    body += b"vllm:num_requests_waiting 4\n"
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()


async def _error(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n")
    await writer.drain()


async def _not_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
    await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def hostile_engines() -> AsyncIterator[dict[str, str]]:
    """One real TCP server per misbehaviour, on 127.0.0.1."""
    servers = {}
    for name, handler in (
        ("big", _big), ("endless", _endless), ("drip", _drip), ("error", _error),
        ("not-http", _not_http), ("fat", _fat),
    ):  # fmt: skip
        servers[name] = await asyncio.start_server(_swallow(handler), "127.0.0.1", 0)
    urls = {n: f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for n, s in servers.items()}
    yield urls
    for s in servers.values():
        s.close()


def _swallow(handler: Handler) -> Handler:
    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    return run


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start_replica(tmp_path_factory.mktemp("engine-metrics"))
    try:
        _wait_ready(proc, "/health")
        yield proc
    finally:
        proc.stop()


def test_each_hostile_engine_fails_its_scrape_within_the_bounds() -> None:
    asyncio.run(_each_hostile())


async def _each_hostile() -> None:
    async with hostile_engines() as hostile:
        fat = await em.scrape(Upstream(hostile.pop("fat"), "k"), timeout_s=5.0)
        assert fat == em.EngineSample(waiting=4.0)
        for name, url in hostile.items():
            with pytest.raises(UpstreamError) as caught:
                await em.scrape(Upstream(url, "k"), timeout_s=1.0)
            reason = str(caught.value)
            expected = {
                "big": "larger than",
                "endless": "larger than",
                "drip": "longer than 1 s",
                "error": "answered 500",
                "not-http": "not HTTP",
            }[name]
            assert expected in reason, (name, reason)


def test_the_poller_reads_a_real_llama_server_beside_hostile_ones(replica: Proc) -> None:
    asyncio.run(_poll_real_and_hostile(replica))


async def _poll_real_and_hostile(replica: Proc) -> None:
    async with hostile_engines() as hostile:
        prompt = {"model": MODEL, "prompt": "Once upon a time there was a cat", "max_tokens": 2}
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as client:
            for _ in range(2):  # the second finds the prompt in the slot's cache
                r = await client.post(replica.url + "/v1/completions", json=prompt, timeout=60)
                assert r.status_code == 200
        urls = [replica.url, *hostile.values()]
        replicas = ReplicaSet(PrefixIndex())
        replicas.update(
        Endpoints(
            name="d", served_model_name=MODEL, engine="llama.cpp", policy="round-robin",
            block_chars=256, generation=1, engine_key=KEY,
            endpoints=[
                Endpoint(job_id=i + 1, pool="aggregated", url=u, slots=2, generation=1)
                for i, u in enumerate(urls)
            ],
        )
    )  # fmt: skip
        poller = em.EnginePoller(replicas, timeout_s=1.0)
        await poller.poll_once()
        real = poller.latest[replica.url].sample
        assert real is not None
        assert real.running == 0 and real.waiting == 0
        assert real.prompt_tokens is not None and real.prompt_tokens > 0
        assert real.generated_tokens == 4
        assert real.cache_hit_rate is not None and 0 < real.cache_hit_rate < 1
        others = {u: s.sample for u, s in poller.latest.items() if u != replica.url}
        assert others.pop(hostile["fat"]) == em.EngineSample(waiting=4.0)
        assert list(others.values()) == [None] * 5
        assert poller.pool("aggregated") == [real, em.EngineSample(waiting=4.0)]
        # Re-exported per pool and replica on the router's /metrics.
        metrics = RouterMetrics(lambda: ())
        metrics.registry.register(em.EngineCollector(lambda: poller))
        text = metrics.exposition().decode()
        assert 'phalanx_router_engine_up{pool="aggregated",replica="1"} 1.0' in text
        assert 'phalanx_router_engine_up{pool="aggregated",replica="2"} 0.0' in text
        assert 'phalanx_router_engine_waiting{pool="aggregated",replica="1"} 0.0' in text
        assert 'phalanx_router_engine_generated_tokens{pool="aggregated",replica="1"} 4.0' in text
        hit = 'phalanx_router_engine_cache_hit_rate{pool="aggregated",replica="1"}'
        assert f"{hit} {real.cache_hit_rate}" in text
        # A replica that leaves the endpoints leaves the scrape results.
        assert replicas.endpoints is not None
        replicas.update(replicas.endpoints.model_copy(update={"endpoints": []}))
        await poller.poll_once()
        assert poller.latest == {}


# ----------------------------------------------------------------- the summary
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_percentiles_match_numpy() -> None:
    values = [5.0, 1.0, 9.0, 3.0, 7.5, 2.25]
    for q in (0.0, 0.5, 0.9, 1.0):
        assert math.isclose(percentile(values, q) or 0.0, float(np.percentile(values, q * 100)))
    assert percentile([], 0.5) is None


def test_summary_of_a_pool_window_with_slo_attainment_and_engine_numbers() -> None:
    clock = Clock()
    stats = RouterStats(clock)
    stats.set_ready("aggregated", 2)
    stats.ended("aggregated", True, 0.50, 0.010, was_in_flight=False)  # too slow a TTFT
    clock.now += 40  # the first ends outside the 30 s window
    for ttft, tpot in ((0.1, 0.01), (0.2, 0.02), (0.3, 0.05), (0.4, None)):
        stats.ended("aggregated", True, ttft, tpot, was_in_flight=False)
    stats.ended("aggregated", False, was_in_flight=False)
    stats.started("aggregated")
    stats.queued("aggregated", 2)

    class Poller:
        def pool(self, pool: str) -> list[em.EngineSample]:
            return [
                em.EngineSample(
                    kv_usage=0.2, running=1, waiting=3, cache_hits=10, cache_lookups=40
                ),
                em.EngineSample(
                    kv_usage=0.4, running=2, waiting=0, cache_hits=30, cache_lookups=60
                ),
                em.EngineSample(),  # an engine that exports none of them
            ]

    slo = SLO(ttft_ms=350, tpot_ms=30)
    report = summarize(
        "r1",
        stats,
        Poller(),
        ["aggregated"],
        {"aggregated": slo},
        30.0,
        0.5,
    )
    (p,) = report.pools
    assert (p.requests, p.errors, p.error_rate) == (5, 1, 0.2)
    assert math.isclose(p.requests_per_s, 5 / 30)
    assert math.isclose(p.ttft_p50_ms or 0, 250.0) and math.isclose(p.ttft_p90_ms or 0, 370.0)
    assert math.isclose(p.tpot_p50_ms or 0, 20.0)
    assert (p.in_flight, p.queued, p.replicas_ready) == (1, 2, 2)
    assert (p.engine_running, p.engine_waiting) == (3, 3)
    assert p.kv_usage is not None and math.isclose(p.kv_usage, 0.3)
    assert p.cache_hit_rate == 0.4
    # Within both: 0.1/10 and 0.2/20; 0.3 has TPOT 50 > 30; 0.4 TTFT > 350; one failed.
    assert p.slo_attainment == 2 / 5
    assert report.predicted_hit_rate == 0.5
    empty = summarize("r1", RouterStats(clock), None, ["aggregated"], {"aggregated": slo})
    assert empty.pools[0].slo_attainment is None and empty.pools[0].kv_usage is None


# ----------------------------------------------------------------- the head's book
def _report(router: str, rps: float = 1.0) -> RouterStatsReport:
    pool = PoolStats(role="aggregated", requests=1, requests_per_s=rps, errors=0, error_rate=0)
    return RouterStatsReport(router=router, window_s=30, pools=[pool])


def test_the_head_keeps_each_routers_latest_report_stale_after_30_s() -> None:
    clock = Clock()
    book = StatsBook(clock)
    book.record("d", _report("a", 1.0))
    clock.now += 10
    book.record("d", _report("b"))
    book.record("d", _report("a", 2.0))  # replaces a's first
    shown = book.shown("d")
    assert [(s.report.router, s.report.pools[0].requests_per_s) for s in shown] == [
        ("a", 2.0), ("b", 1.0)
    ]  # fmt: skip
    assert not any(s.stale for s in shown)
    clock.now += STALE_S + 1
    assert all(s.stale for s in book.shown("d")) and book.fresh("d") == []
    for i in range(MAX_ROUTERS + 5):
        clock.now += 1
        book.record("d", _report(f"r{i}"))
    shown = book.shown("d")
    assert len(shown) == MAX_ROUTERS and shown[-1].report.router == "r5"
    book.forget("d")
    assert book.shown("d") == []


@pytest.mark.parametrize(("poll", "report"), [(0.01, 5.0), (3.0, 0.1)])
def test_a_router_refuses_to_hammer_engines_or_the_head(poll: float, report: float) -> None:
    options = RouterOptions(
        replicas=["http://127.0.0.1:9"], no_auth=True, engine_poll_s=poll, report_s=report
    )
    with pytest.raises(RouterSetupError, match="--engine-poll takes 0"):
        build(options)
