"""The benchmark's HTTP side: stream OpenAI requests at their send times, record chunk times.

One asyncio task per request, sent at its arrival time whether earlier ones have ended or
not (an open-loop client, as `vllm bench serve` is), optionally capped at
`max_concurrency` in flight. Output tokens come from the engine's `usage` (asked for with
`stream_options: {include_usage: true}`), else from the count of content chunks.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import httpx

from phalanx.serve.bench.metrics import Goodput, Metrics, RequestRecord, calculate_metrics
from phalanx.serve.bench.workloads import BenchRequest, WorkloadSpec, build

Endpoint = Literal["completions", "chat"]
MAX_LINE = 1 << 20  # one SSE line; an engine sending more is misbehaving


@dataclass(frozen=True, slots=True)
class BenchConfig:
    url: str  # the router's or a replica's base URL (http://host:port)
    model: str
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    token: str | None = None  # Bearer token (a Phalanx token for the router, an engine key)
    endpoint: Endpoint = "completions"
    slo: Goodput = field(default_factory=Goodput)
    max_concurrency: int | None = None
    ignore_eos: bool = True  # generate exactly max_tokens, as the workload asks
    timeout_s: float = 600.0  # one request, end to end

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, not {self.url!r}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if not 0 < self.timeout_s <= 86_400:
            raise ValueError("timeout_s must be in (0, 86400]")


@dataclass(frozen=True, slots=True)
class Result:
    """One run: what was asked and what was measured (`to_json()` is the CLI's output)."""

    url: str
    model: str
    endpoint: str
    workload: dict[str, Any]
    slo: dict[str, Any]
    metrics: Metrics
    records: tuple[RequestRecord, ...] = field(repr=False, default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "model": self.model,
            "endpoint": self.endpoint,
            "workload": self.workload,
            "slo": self.slo,
            **self.metrics.to_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def run(config: BenchConfig) -> Result:
    """Run the benchmark to the end (a fresh event loop): for bench/ scripts and the CLI."""
    return asyncio.run(run_async(config))


async def run_async(config: BenchConfig, requests: list[BenchRequest] | None = None) -> Result:
    """Send the workload's requests (or `requests`) and compute vLLM's metrics."""
    reqs = build(config.workload) if requests is None else requests
    headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
    limits = httpx.Limits(
        max_connections=config.max_concurrency or 1000, max_keepalive_connections=64
    )
    gate = asyncio.Semaphore(config.max_concurrency or len(reqs) or 1)
    async with httpx.AsyncClient(
        base_url=config.url.rstrip("/"),
        headers=headers,
        limits=limits,
        timeout=httpx.Timeout(config.timeout_s, connect=30.0),
    ) as http:
        t0 = time.perf_counter()

        async def one(req: BenchRequest) -> RequestRecord:
            delay = t0 + req.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                return await send_one(http, config, req)

        records = await asyncio.gather(*(one(r) for r in reqs))
        duration = max(time.perf_counter() - t0, 1e-9)
    workload = asdict(config.workload)
    return Result(
        url=config.url,
        model=config.model,
        endpoint=config.endpoint,
        workload=workload,
        slo=asdict(config.slo),
        metrics=calculate_metrics(records, duration, config.slo),
        records=tuple(records),
    )


def request_body(config: BenchConfig, req: BenchRequest) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {
        "model": config.model,
        "max_tokens": req.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.ignore_eos:
        body["ignore_eos"] = True
    if config.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
        return "/v1/chat/completions", body
    body["prompt"] = req.prompt
    return "/v1/completions", body


async def send_one(
    http: httpx.AsyncClient, config: BenchConfig, req: BenchRequest
) -> RequestRecord:
    """Stream one request; never raises for what the server or network does."""
    path, body = request_body(config, req)
    chunks: list[float] = []
    prompt_tokens, output_tokens, cached = req.prompt_len, None, None
    start = time.perf_counter()
    try:
        async with http.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread())[:300].decode("utf-8", "replace")
                return RequestRecord(
                    start,
                    success=False,
                    prompt_tokens=req.prompt_len,
                    error=f"HTTP {response.status_code}: {text}",
                )
            async for line in response.aiter_lines():
                if len(line) > MAX_LINE:
                    raise ValueError("an SSE line over 1 MiB")
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                event = json.loads(data)
                if not isinstance(event, dict):
                    continue
                if "error" in event:  # the engine gave up mid-stream
                    raise ValueError(f"the engine sent an error: {str(event['error'])[:200]}")
                if _content(event, config.endpoint):
                    chunks.append(now)
                usage = event.get("usage")
                if isinstance(usage, dict):
                    prompt_tokens = _count(usage.get("prompt_tokens")) or prompt_tokens
                    output_tokens = _count(usage.get("completion_tokens")) or output_tokens
                    details = usage.get("prompt_tokens_details")
                    if isinstance(details, dict):
                        cached = _count(details.get("cached_tokens"))
    except (httpx.HTTPError, ValueError) as exc:
        return RequestRecord(
            start,
            tuple(chunks),
            success=False,
            prompt_tokens=req.prompt_len,
            error=f"{type(exc).__name__}: {str(exc)[:200]}",
        )
    return RequestRecord(start, tuple(chunks), True, prompt_tokens, output_tokens, "", cached)


def _content(event: dict[str, Any], endpoint: Endpoint) -> bool:
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    if endpoint == "chat":
        delta = choices[0].get("delta")
        return isinstance(delta, dict) and bool(delta.get("content"))
    return bool(choices[0].get("text"))


def _count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None
