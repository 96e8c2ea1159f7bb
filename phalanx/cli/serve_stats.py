"""`phalanx serve show`'s lines for the routers' latest summaries (DeploymentInfo.stats)."""

from __future__ import annotations

import time

from phalanx.api.serving import DeploymentInfo, PoolStats


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g} ms" if value < 1000 else f"{value / 1000:.3g} s"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


def pool_lines(p: PoolStats, window_s: float) -> list[str]:
    return [
        f"    pool {p.role}: {p.requests_per_s:.3g} req/s ({p.requests} in {window_s:g} s), "
        f"errors {_pct(p.error_rate)}, in flight {p.in_flight}, queued {p.queued}",
        f"      TTFT p50 {_ms(p.ttft_p50_ms)} p90 {_ms(p.ttft_p90_ms)} · "
        f"TPOT p50 {_ms(p.tpot_p50_ms)} p90 {_ms(p.tpot_p90_ms)} · "
        f"SLO attained {_pct(p.slo_attainment)}",
        f"      engines: KV {_pct(p.kv_usage)} · running {_num(p.engine_running)} · "
        f"waiting {_num(p.engine_waiting)} · cache hit {_pct(p.cache_hit_rate)}",
    ]


def stats_lines(info: DeploymentInfo, now: float | None = None) -> list[str]:
    """Each router's latest summary (newest first); a line saying none when none came."""
    if not info.stats:
        return ["  no router has reported (phalanx serve router sends a summary every 5 s)"]
    now = time.time() if now is None else now
    lines = []
    for s in info.stats:
        age = max(0.0, now - s.reported_at)
        stale = "  STALE" if s.stale else ""
        predicted = s.report.predicted_hit_rate
        lines.append(
            f"  router {s.report.router}: reported {age:.0f} s ago{stale}"
            + (f", prefix hit rate (predicted) {_pct(predicted)}" if predicted is not None else "")
        )
        for p in s.report.pools:
            lines.extend(pool_lines(p, s.report.window_s))
    return lines
