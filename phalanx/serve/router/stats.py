"""What the router measured, per pool, for the autoscaler: `RouterStats.window(pool,
seconds)` over the requests that ended in the last `seconds`.

TTFT = request received → first content byte sent to the client; TPOT = (E2E − TTFT) /
(output tokens − 1), the tokens from the engine's `usage` or, streamed, the chunks counted.
A disaggregated request counts in the prefill pool (its TTFT) and in the decode pool (its
TTFT and TPOT).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

MAX_RECORDS = 100_000  # per pool: the oldest fall out first


@dataclass(frozen=True, slots=True)
class PoolWindow:
    requests: int  # ended in the window (answered or failed)
    errors: int  # of those, failed (5xx from the router: no replica could answer)
    ttft_ms: tuple[float, ...]
    tpot_ms: tuple[float, ...]
    in_flight: int  # now: sent to a replica and not yet answered in full
    queued: int  # now: received and waiting (for a replica, a hand-off slot)
    replicas_ready: int  # now: routable replicas of the pool


@dataclass(frozen=True, slots=True)
class _Record:
    at: float
    ok: bool
    ttft_ms: float | None
    tpot_ms: float | None


class RouterStats:
    """Counts and latencies per pool, in memory (bounded), read by the autoscaler."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._records: dict[str, deque[_Record]] = {}
        self._in_flight: dict[str, int] = {}
        self._queued: dict[str, int] = {}
        self._ready: dict[str, int] = {}

    def set_ready(self, pool: str, replicas: int) -> None:
        self._ready[pool] = replicas

    def queued(self, pool: str, delta: int) -> None:
        self._queued[pool] = self._queued.get(pool, 0) + delta

    def started(self, pool: str) -> None:
        self._in_flight[pool] = self._in_flight.get(pool, 0) + 1

    def ended(
        self,
        pool: str,
        ok: bool,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        *,
        was_in_flight: bool = True,
    ) -> None:
        """A request of `pool` ended (`started` was called for it if `was_in_flight`)."""
        if was_in_flight:
            self._in_flight[pool] = self._in_flight.get(pool, 0) - 1
        records = self._records.get(pool)
        if records is None:
            records = self._records[pool] = deque(maxlen=MAX_RECORDS)
        records.append(
            _Record(
                self.clock(),
                ok,
                None if ttft_s is None else ttft_s * 1000.0,
                None if tpot_s is None else tpot_s * 1000.0,
            )
        )

    def in_flight(self, pool: str) -> int:
        return self._in_flight.get(pool, 0)

    def window(self, pool: str, seconds: float) -> PoolWindow:
        """The requests of `pool` that ended in the last `seconds`, and its state now."""
        since = self.clock() - seconds
        requests = errors = 0
        ttft: list[float] = []
        tpot: list[float] = []
        for r in reversed(self._records.get(pool, ())):
            if r.at < since:
                break
            requests += 1
            if not r.ok:
                errors += 1
            if r.ttft_ms is not None:
                ttft.append(r.ttft_ms)
            if r.tpot_ms is not None:
                tpot.append(r.tpot_ms)
        ttft.reverse()
        tpot.reverse()
        return PoolWindow(
            requests=requests,
            errors=errors,
            ttft_ms=tuple(ttft),
            tpot_ms=tuple(tpot),
            in_flight=self._in_flight.get(pool, 0),
            queued=self._queued.get(pool, 0),
            replicas_ready=self._ready.get(pool, 0),
        )

    def attainment(
        self, pool: str, seconds: float, ttft_ms: float | None, tpot_ms: float | None
    ) -> float | None:
        """The share of the requests of `pool` that ended in the last `seconds` answered
        within both targets (a failed request misses; a request without a TPOT — one
        token — is judged by its TTFT). None without a target or a request."""
        if ttft_ms is None and tpot_ms is None:
            return None
        since = self.clock() - seconds
        total = met = 0
        for r in reversed(self._records.get(pool, ())):
            if r.at < since:
                break
            total += 1
            if not r.ok:
                continue
            if ttft_ms is not None and (r.ttft_ms is None or r.ttft_ms > ttft_ms):
                continue
            if tpot_ms is not None and r.tpot_ms is not None and r.tpot_ms > tpot_ms:
                continue
            met += 1
        return met / total if total else None


def engine_tpot(data: bytes) -> float | None:
    """TPOT of a whole answer from the engine's own timings (llama.cpp reports them), in s."""
    if b'"timings"' not in data:
        return None
    try:
        timings = json.loads(data).get("timings") or {}
        value = timings.get("predicted_per_token_ms")
        return float(value) / 1000.0 if isinstance(value, int | float) and value > 0 else None
    except (ValueError, AttributeError, TypeError):
        return None


def stream_tokens(tail: bytes, events: int) -> int:
    """A stream's output tokens: the engine's count in its last event (`usage` when the
    client asked for it, llama.cpp's `timings`), else the `data:` events but `[DONE]`."""
    at = tail.rfind(b"data: {")
    if at >= 0 and (b'"completion_tokens"' in tail or b'"predicted_n"' in tail):
        try:
            event = json.loads(tail[at + 6 :].split(b"\n\n", 1)[0])
            usage = event.get("usage") or {}
            count = usage.get("completion_tokens") or (event.get("timings") or {}).get(
                "predicted_n"
            )
            if isinstance(count, int) and count >= 0:
                return count
        except (ValueError, AttributeError):
            pass
    return events - 1
