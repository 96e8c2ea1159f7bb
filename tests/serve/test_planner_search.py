"""core.planner: the engine simulation against queueing theory, and the sizing search."""

from __future__ import annotations

import math

import pytest

from phalanx.core.planner import (
    LatencyProfile,
    SearchConfig,
    Slo,
    Workload,
    joint_attainment,
    plan,
    profile_from_dict,
    profile_to_dict,
    replicas_for,
    simulate,
)

D_MS = 100.0  # one request's whole service time in the hand-computable cases
# One slot, one-token outputs: every request is exactly one prefill of D_MS.
DETERMINISTIC = LatencyProfile(
    prefill_base_ms=D_MS,
    prefill_per_token_ms=0.0,
    decode_base_ms=1.0,
    decode_per_seq_ms=0.0,
    slots=1,
)
LLM = LatencyProfile(
    prefill_base_ms=20,
    prefill_per_token_ms=0.05,
    decode_base_ms=15,
    decode_per_seq_ms=0.5,
    decode_per_ctx_ms=0.0001,
    slots=16,
)
LENGTHS = tuple((200 + (37 * i) % 900, 20 + (13 * i) % 150) for i in range(200))
FAST = SearchConfig(requests=300, bisections=10)


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_single_slot_poisson_is_m_d_1(rho: float) -> None:
    """Poisson arrivals on one deterministic server: mean time in system is
    D + ρ·D / (2(1 − ρ)) (Pollaczek–Khinchine for M/D/1)."""
    workload = Workload(rate=rho * 1000.0 / D_MS, lengths=((10, 1),))
    outcomes = simulate(DETERMINISTIC, workload, replicas=1, requests=20_000, seed=3)
    mean = sum(o.ttft_ms for o in outcomes) / len(outcomes)
    expected = D_MS + rho * D_MS / (2 * (1 - rho))
    assert mean == pytest.approx(expected, rel=0.05)
    assert all(o.tpot_ms == 0.0 for o in outcomes)  # one-token outputs: TPOT 0 (vLLM's rule)


@pytest.mark.parametrize(
    ("rate", "replicas"),
    [(5.0, 1), (9.5, 1), (10.5, 2), (19.5, 2), (20.5, 3), (95.0, 10), (1005.0, 101)],
)
def test_evenly_spaced_arrivals_need_rate_times_service_time(rate: float, replicas: int) -> None:
    """D/D/n: n servers of service time D hold any rate below n / D without queueing, and
    none above it (the queue grows without bound), so the plan is ⌈rate·D⌉ replicas."""
    workload = Workload(rate=rate, lengths=((10, 1),), arrivals="uniform")
    result = plan(DETERMINISTIC, workload, Slo(ttft_ms=1.5 * D_MS), config=FAST)
    assert result.aggregated_replicas == replicas
    assert result.best == "aggregated"
    assert result.gpus == replicas


def test_more_load_never_needs_fewer_replicas() -> None:
    slo = Slo(ttft_ms=400, tpot_ms=60)
    plans = [
        plan(LLM, Workload(rate=r, lengths=LENGTHS), slo, config=FAST)
        for r in (1, 7, 20, 60, 500, 5000)
    ]
    for key in ("aggregated_replicas", "prefill_replicas", "decode_replicas", "gpus"):
        counts = [getattr(p, key) for p in plans]
        assert None not in counts
        assert counts == sorted(counts), key
    assert plans[-1].gpus is not None and plans[-1].gpus > plans[0].gpus  # type: ignore[operator]


def test_the_plan_meets_the_slo_in_its_own_simulation() -> None:
    slo = Slo(ttft_ms=400, tpot_ms=60, attainment=0.9)
    workload = Workload(rate=9.0, lengths=LENGTHS)
    result = plan(LLM, workload, slo, config=FAST)
    n, p, d = result.aggregated_replicas, result.prefill_replicas, result.decode_replicas
    assert n is not None and p is not None and d is not None
    requests = 16 * 4 * max(n, p, d)
    agg = simulate(LLM, workload, replicas=n, requests=requests)
    assert joint_attainment(agg[len(agg) // 4 :], slo) >= slo.attainment
    disagg = simulate(LLM, workload, prefill=p, decode=d, requests=requests)
    assert joint_attainment(disagg[len(disagg) // 4 :], slo) >= slo.attainment
    # One replica fewer than planned misses it (the search is tight, not just safe).
    if n > 1:
        fewer = simulate(LLM, workload, replicas=n - 1, requests=requests)
        assert joint_attainment(fewer[len(fewer) // 4 :], slo) < slo.attainment


def test_an_open_target_still_keeps_the_pool_stable() -> None:
    """A TPOT-only SLO says nothing of queueing before the first token, a TTFT-only one
    nothing of decoding: each pool must still keep up with its load."""
    light, heavy = (Workload(rate=r, lengths=LENGTHS) for r in (2.0, 40.0))
    tpot_only, ttft_only = Slo(tpot_ms=60), Slo(ttft_ms=400)
    a, b = (plan(LLM, w, tpot_only, config=FAST) for w in (light, heavy))
    assert a.aggregated_replicas is not None and b.aggregated_replicas is not None
    assert b.aggregated_replicas > a.aggregated_replicas
    c, d = (plan(LLM, w, ttft_only, config=FAST) for w in (light, heavy))
    assert c.decode_replicas is not None and d.decode_replicas is not None
    assert d.decode_replicas > c.decode_replicas


def test_a_hundred_thousand_gpu_cluster() -> None:
    """Plans for traffic a 100k-GPU cluster serves cost the same search as small ones, and
    say 'none' once no layout fits under max_gpus."""
    profile = LatencyProfile(**{**profile_to_dict(LLM), "gpus": 8})  # type: ignore[arg-type]
    slo = Slo(ttft_ms=400, tpot_ms=60)
    big = plan(profile, Workload(rate=20_000, lengths=LENGTHS), slo, config=FAST)
    assert big.gpus is not None and 10_000 < big.gpus <= 100_000
    assert big.gpus % 8 == 0
    too_big = plan(profile, Workload(rate=1e7, lengths=LENGTHS), slo, config=FAST)
    assert (too_big.best, too_big.gpus, too_big.aggregated_replicas) == ("none", None, None)


def test_capacity_between_measured_sizes_is_interpolated_conservatively() -> None:
    curve = ((1, 2.0), (2, 5.0), (4, 12.0), (8, 30.0))
    assert replicas_for(curve, 1.5, 100) == 1
    assert replicas_for(curve, 6.0, 100) == 3  # 2 replicas hold 5: 3 hold at least 7.5
    assert replicas_for(curve, 300.0, 100) == 80  # cells of 8 holding 30 each
    assert replicas_for(curve, 300.0, 79) is None
    assert replicas_for(((1, math.inf),), 1e9, 1) == 1


def test_profiles_round_trip_and_bad_ones_are_named() -> None:
    assert profile_from_dict(profile_to_dict(LLM)) == LLM
    with pytest.raises(ValueError, match="unknown profile fields: bogus"):
        profile_from_dict({**profile_to_dict(LLM), "bogus": 1})
    with pytest.raises(ValueError, match="slots must be an integer"):
        profile_from_dict({**profile_to_dict(LLM), "slots": 0})
    with pytest.raises(ValueError, match="decode_base_ms"):
        profile_from_dict({"prefill_base_ms": 1, "prefill_per_token_ms": 1})
    with pytest.raises(ValueError, match="must be a finite number"):
        profile_from_dict({**profile_to_dict(LLM), "decode_base_ms": -1})
    with pytest.raises(ValueError, match="an SLO needs"):
        Slo()
    with pytest.raises(ValueError, match="rate must be > 0"):
        Workload(rate=0, lengths=((1, 1),))
