"""serve.bench.metrics: vLLM's serving metrics, from first principles on recorded times."""

from __future__ import annotations

import pytest

from phalanx.serve.bench.metrics import Goodput, RequestRecord, Stat, calculate_metrics

# A: 4 tokens (usage says so) at 0.10, 0.15, 0.25, 0.30 s after it was sent at t=0.
A = RequestRecord(
    start=0.0, chunk_times=(0.10, 0.15, 0.25, 0.30), prompt_tokens=10, output_tokens=4
)
# B: one token, no usage: counted from its one chunk, 0.5 s after it was sent at t=1.
B = RequestRecord(start=1.0, chunk_times=(1.5,), prompt_tokens=7)
# C: failed.
C = RequestRecord(start=0.2, success=False, prompt_tokens=5, error="HTTP 503: busy")
# D: overlaps A; usage counted 6 tokens in 3 chunks (an engine bundling tokens).
D = RequestRecord(start=0.05, chunk_times=(0.25, 0.35, 0.45), prompt_tokens=3, output_tokens=6)


def test_latencies_follow_vllm_definitions() -> None:
    m = calculate_metrics([A, B, C], duration_s=2.0)
    assert (m.completed, m.failed) == (2, 1)
    assert (m.total_input, m.total_output) == (17, 5)  # a failed request counts for nothing
    assert m.errors == ("HTTP 503: busy",)
    # TTFT: first chunk − sent: 100 ms and 500 ms.
    assert m.ttft_ms.mean == pytest.approx(300.0)
    assert m.ttft_ms.median == pytest.approx(300.0)
    assert m.ttft_ms.std == pytest.approx(200.0)
    assert m.ttft_ms.p90 == pytest.approx(100 + 0.9 * 400)  # numpy's linear percentile
    assert m.ttft_ms.p99 == pytest.approx(100 + 0.99 * 400)
    # TPOT only for outputs of more than one token: A's (300 − 100) / (4 − 1).
    assert m.tpot_ms.mean == pytest.approx(200.0 / 3)
    # ITL: every gap between chunks, pooled: 50, 100, 50 ms.
    assert m.itl_ms.mean == pytest.approx(200.0 / 3)
    assert m.itl_ms.median == pytest.approx(50.0)
    assert m.itl_ms.p90 == pytest.approx(90.0)
    # E2E: last chunk − sent: 300 and 500 ms.
    assert m.e2el_ms.mean == pytest.approx(400.0)
    assert m.request_throughput == pytest.approx(1.0)
    assert m.output_throughput == pytest.approx(2.5)
    assert m.total_token_throughput == pytest.approx(11.0)
    assert (m.request_goodput, m.slo_attainment) == (None, None)


def test_tokens_come_from_usage_when_the_engine_sent_it() -> None:
    m = calculate_metrics([D], duration_s=1.0)
    assert m.total_output == 6
    assert m.tpot_ms.mean == pytest.approx((450 - 250) / 5)  # usage's 6 tokens, not 3 chunks
    assert m.itl_ms.mean == pytest.approx(100.0)  # ITL stays per chunk, as vLLM's


@pytest.mark.parametrize(
    ("slo", "good"),
    [
        (Goodput(ttft_ms=200), 1),  # A (100 ms) yes, B (500 ms) no
        (Goodput(ttft_ms=600), 2),
        (Goodput(tpot_ms=50), 1),  # A's TPOT 66.7 misses; B's one token counts as TPOT 0
        (Goodput(ttft_ms=600, tpot_ms=70), 2),
        (Goodput(ttft_ms=200, tpot_ms=70), 1),
        (Goodput(e2el_ms=400), 1),
        (Goodput(ttft_ms=50), 0),
    ],
)
def test_goodput_counts_requests_meeting_every_slo(slo: Goodput, good: int) -> None:
    m = calculate_metrics([A, B, C], duration_s=4.0, slo=slo)
    assert m.request_goodput == pytest.approx(good / 4.0)
    assert m.slo_attainment == pytest.approx(good / 2)


def test_peak_concurrency_and_empty_runs() -> None:
    assert calculate_metrics([A, B, D], duration_s=2.0).max_concurrent_requests == 2
    empty = calculate_metrics([C], duration_s=1.0, slo=Goodput(ttft_ms=1))
    assert (empty.completed, empty.failed, empty.slo_attainment) == (0, 1, 0.0)
    assert empty.ttft_ms == Stat(0.0, 0.0, 0.0, 0.0, 0.0)  # vLLM reports 0 when nothing ran
    with pytest.raises(ValueError, match="duration"):
        calculate_metrics([A], duration_s=0.0)


def test_a_request_without_content_is_a_failure() -> None:
    m = calculate_metrics([RequestRecord(start=0.0)], duration_s=1.0)
    assert (m.completed, m.failed, m.errors) == (0, 1, ("no content",))


def test_prefix_cache_hit_rate_from_usage() -> None:
    hit = RequestRecord(start=0.0, chunk_times=(0.1,), prompt_tokens=100, cached_tokens=75)
    miss = RequestRecord(start=0.0, chunk_times=(0.1,), prompt_tokens=100, cached_tokens=0)
    m = calculate_metrics([hit, miss, B], duration_s=1.0)  # B reported nothing
    assert m.total_cached_input == 75
    assert m.prefix_cache_hit_rate == pytest.approx(75 / 207)
    none = calculate_metrics([A, B], duration_s=1.0)
    assert (none.total_cached_input, none.prefix_cache_hit_rate) == (None, None)
