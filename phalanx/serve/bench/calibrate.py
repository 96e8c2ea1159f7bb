"""Measure a replica's latency profile (core.planner.LatencyProfile) from a real engine.

- Prefill: `batch` concurrent one-token requests of `length` fresh random words (no
  prefix to reuse); the batch's prefill time is its slowest TTFT (they enter one batch).
- Decode: `batch` concurrent requests of a short prompt and `decode_tokens` tokens; a
  decode step's time is the median inter-token gap while the batch runs together.

Each point is the median of `repeats`; the profile's coefficients are a least-squares fit
(non-negative: a coefficient the fit makes negative is dropped and the rest refitted).
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import numpy as np

from phalanx.core.planner import LatencyProfile
from phalanx.serve.bench.client import BenchConfig, send_one
from phalanx.serve.bench.metrics import RequestRecord
from phalanx.serve.bench.workloads import BenchRequest, WorkloadSpec, words


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    batch: int
    length: int  # prompt tokens per request
    ms: float


@dataclass(frozen=True, slots=True)
class DecodePoint:
    batch: int
    context: int  # tokens in the batch's KV, mid-run
    ms: float  # one decode step


def fit_profile(
    prefill: Sequence[PrefillPoint],
    decode: Sequence[DecodePoint],
    *,
    slots: int,
    gpus: int = 1,
    max_batch_tokens: int = 8192,
    name: str = "replica",
) -> LatencyProfile:
    """The profile whose linear model best fits the points (see core.planner)."""
    if len(prefill) < 2 or len(decode) < 2:
        raise ValueError("fitting needs at least 2 prefill and 2 decode points")
    p = _nnls([[1.0, pt.batch * pt.length, pt.batch] for pt in prefill], [pt.ms for pt in prefill])
    d = _nnls([[1.0, pt.batch, pt.context] for pt in decode], [pt.ms for pt in decode])
    if p[0] + p[1] <= 0:
        p[0] = max(min(pt.ms for pt in prefill), 1e-3)
    if d[0] + d[1] <= 0:
        d[0] = max(min(pt.ms for pt in decode), 1e-3)
    return LatencyProfile(
        prefill_base_ms=p[0],
        prefill_per_token_ms=p[1],
        prefill_per_seq_ms=p[2],
        decode_base_ms=d[0],
        decode_per_seq_ms=d[1],
        decode_per_ctx_ms=d[2],
        slots=slots,
        gpus=gpus,
        max_batch_tokens=max_batch_tokens,
        name=name,
    )


def _nnls(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares with every coefficient >= 0 (drop the negative ones and refit)."""
    a, y = np.asarray(rows, dtype=float), np.asarray(ys, dtype=float)
    active = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active = [c for c, v in zip(active, sol, strict=True) if v >= 0]
    return [float(c) for c in coef]


async def calibrate(
    url: str,
    model: str,
    *,
    token: str | None = None,
    slots: int = 4,
    gpus: int = 1,
    lengths: Sequence[int] = (32, 128, 384),
    batches: Sequence[int] = (1, 2, 4),
    decode_tokens: int = 24,
    repeats: int = 2,
    seed: int = 0,
    name: str = "replica",
) -> tuple[LatencyProfile, list[PrefillPoint], list[DecodePoint]]:
    """Measure the engine at `url` and fit its profile; also the points measured."""
    if any(b < 1 or b > slots for b in batches):
        raise ValueError(f"batch sizes must be in [1, slots={slots}]")
    if any(n < 1 for n in lengths) or decode_tokens < 2 or repeats < 1:
        raise ValueError("lengths >= 1, decode_tokens >= 2 and repeats >= 1")
    config = BenchConfig(url=url, model=model, token=token, workload=WorkloadSpec())
    rng = random.Random(seed)
    prefill: list[PrefillPoint] = []
    decode: list[DecodePoint] = []
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(
        base_url=url.rstrip("/"), headers=headers, timeout=httpx.Timeout(600.0, connect=30.0)
    ) as http:
        for length in lengths:
            for batch in batches:
                samples = []
                for _ in range(repeats):
                    reqs = [BenchRequest(words(rng, length), length, 1, 0.0) for _ in range(batch)]
                    recs = await asyncio.gather(*(send_one(http, config, r) for r in reqs))
                    _check(recs)
                    samples.append(max(r.ttft for r in recs) * 1000.0)
                prefill.append(PrefillPoint(batch, length, statistics.median(samples)))
        prompt = 16
        for batch in batches:
            samples = []
            for _ in range(repeats):
                reqs = [
                    BenchRequest(words(rng, prompt), prompt, decode_tokens, 0.0)
                    for _ in range(batch)
                ]
                recs = await asyncio.gather(*(send_one(http, config, r) for r in reqs))
                _check(recs)
                gaps = [g for r in recs for g in r.itl]
                samples.append(statistics.median(gaps) * 1000.0)
            context = batch * (prompt + decode_tokens // 2)
            decode.append(DecodePoint(batch, context, statistics.median(samples)))
    profile = fit_profile(prefill, decode, slots=slots, gpus=gpus, name=name)
    return profile, prefill, decode


def _check(records: Sequence[RequestRecord]) -> None:
    for r in records:
        if not (r.success and r.chunk_times):
            raise RuntimeError(f"a calibration request failed: {r.error or 'no content'}")
