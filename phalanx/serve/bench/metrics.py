"""Serving metrics exactly as `vllm bench serve` computes them (its `calculate_metrics`).

Per successful request, from the client's own clock (seconds, perf_counter):

- TTFT: first content chunk − request sent.
- ITL: every gap between two successive content chunks (all requests pooled).
- E2E latency: last content chunk − request sent.
- TPOT: (E2E − TTFT) / (output tokens − 1), only for outputs of more than one token; for
  goodput a one-token output counts as TPOT 0.
- Output tokens: the engine's `usage.completion_tokens` when it sent usage, else the
  number of content chunks (vLLM falls back to a tokenizer; a chunk is a token on vLLM
  and llama.cpp).
- Goodput: requests meeting every SLO given (TTFT ≤, TPOT ≤, E2E ≤) per second of the run.

Each latency reports mean, median, standard deviation, p90 and p99 in ms (numpy's linear
percentiles; 0 when there is nothing to measure, as vLLM reports).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (90.0, 99.0)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What the client saw of one request (times in seconds on one monotonic clock)."""

    start: float
    chunk_times: tuple[float, ...] = ()  # arrival of each chunk that carried content
    success: bool = True
    prompt_tokens: int = 0  # usage.prompt_tokens, else the workload's estimate
    output_tokens: int | None = None  # usage.completion_tokens (None: the engine sent none)
    error: str = ""
    # usage.prompt_tokens_details.cached_tokens: prompt tokens the engine did not compute
    # again (its prefix cache; vLLM and llama.cpp report it). None: not reported.
    cached_tokens: int | None = None

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.start if self.chunk_times else 0.0

    @property
    def latency(self) -> float:
        return self.chunk_times[-1] - self.start if self.chunk_times else 0.0

    @property
    def itl(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def output_len(self) -> int:
        return self.output_tokens if self.output_tokens else len(self.chunk_times)


@dataclass(frozen=True, slots=True)
class Stat:
    """One latency's summary, in ms."""

    mean: float
    median: float
    std: float
    p90: float
    p99: float

    @staticmethod
    def of(seconds: Sequence[float]) -> Stat:
        values = np.asarray(seconds if len(seconds) else [0.0], dtype=float) * 1000.0
        p90, p99 = (float(np.percentile(values, p)) for p in PERCENTILES)
        return Stat(
            mean=float(np.mean(values)),
            median=float(np.median(values)),
            std=float(np.std(values)),
            p90=p90,
            p99=p99,
        )


@dataclass(frozen=True, slots=True)
class Goodput:
    """SLOs in ms (None: not judged)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2el_ms))


@dataclass(frozen=True, slots=True)
class Metrics:
    completed: int
    failed: int
    duration_s: float
    total_input: int
    total_output: int
    request_throughput: float
    request_goodput: float | None  # None: no SLO given
    slo_attainment: float | None  # good / completed (None: no SLO given)
    output_throughput: float
    total_token_throughput: float
    ttft_ms: Stat
    tpot_ms: Stat
    itl_ms: Stat
    e2el_ms: Stat
    max_concurrent_requests: int
    errors: tuple[str, ...] = field(default=())
    # Not vLLM's: prompt tokens served from the engines' prefix caches (None: no engine
    # reported it), and their share of all input tokens — what KV-aware routing raises.
    total_cached_input: int | None = None
    prefix_cache_hit_rate: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def calculate_metrics(
    records: Sequence[RequestRecord], duration_s: float, slo: Goodput = Goodput()
) -> Metrics:
    """vLLM's calculate_metrics over what the client recorded (see the module docstring)."""
    if duration_s <= 0:
        raise ValueError("the run's duration must be positive")
    ok = [r for r in records if r.success and r.chunk_times]
    failed = [r for r in records if not (r.success and r.chunk_times)]
    ttfts, e2els, itls, tpots, all_tpots = [], [], [], [], []
    total_input = total_output = 0
    for r in ok:
        n = r.output_len
        total_input += r.prompt_tokens
        total_output += n
        tpot = 0.0
        if n > 1:
            tpot = (r.latency - r.ttft) / (n - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls += r.itl
        ttfts.append(r.ttft)
        e2els.append(r.latency)
    reported = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    cached = sum(reported) if reported else None
    good = 0
    if slo.any:
        for ttft, tpot, e2el in zip(ttfts, all_tpots, e2els, strict=True):
            if (
                (slo.ttft_ms is None or ttft * 1000.0 <= slo.ttft_ms)
                and (slo.tpot_ms is None or tpot * 1000.0 <= slo.tpot_ms)
                and (slo.e2el_ms is None or e2el * 1000.0 <= slo.e2el_ms)
            ):
                good += 1
    return Metrics(
        completed=len(ok),
        failed=len(failed),
        duration_s=duration_s,
        total_input=total_input,
        total_output=total_output,
        request_throughput=len(ok) / duration_s,
        request_goodput=good / duration_s if slo.any else None,
        slo_attainment=(good / len(ok) if ok else 0.0) if slo.any else None,
        output_throughput=total_output / duration_s,
        total_token_throughput=(total_input + total_output) / duration_s,
        ttft_ms=Stat.of(ttfts),
        tpot_ms=Stat.of(tpots),
        itl_ms=Stat.of(itls),
        e2el_ms=Stat.of(e2els),
        max_concurrent_requests=_peak_concurrency(ok),
        errors=tuple(sorted({r.error or "no content" for r in failed}))[:10],
        total_cached_input=cached,
        prefix_cache_hit_rate=(cached / total_input if total_input else 0.0)
        if cached is not None
        else None,
    )


def _peak_concurrency(records: Sequence[RequestRecord]) -> int:
    """Most requests in flight at once, over half-open [start, end) intervals."""
    events = sorted([(r.start, 1) for r in records] + [(r.start + r.latency, -1) for r in records])
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak
