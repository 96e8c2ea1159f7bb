"""Job efficiency from known samples: exact means, p95, energy, CPU, and the notes."""

from __future__ import annotations

import numpy as np

from phalanx.head.jobstats import JobFacts, ProgressRow, compute, progress_series
from phalanx.head.tsblocks import RawBlock, pack_raw, unpack_raw

JOB = 3
H100 = 81559


def _block(util: list[list[float]], jobs: list[int], cores: float, cpus: int) -> RawBlock:
    """GPUs 0..G-1 of one node, 10 samples 10 s apart; GPU g at util[g][k] held by jobs[g];
    the job's CPU at `cores` of `cpus`, memory 2048 MiB."""
    g, n = len(util), len(util[0])
    times = 1000.0 + 10.0 * np.arange(n)
    return RawBlock(
        times,
        np.arange(g, dtype=np.int32),
        np.array(util, dtype=np.float64),
        np.full((g, n), 4000.0),
        np.full((g, n), 300.0),
        np.full((g, n), 60.0),
        np.cumsum(np.full((g, n), 3000.0), axis=1),  # 3 kJ a sample
        np.array([[j] * n for j in jobs], dtype=np.int32),
        np.array([[1 if j else -1] * n for j in jobs], dtype=np.int32),
        np.full(n, JOB, dtype=np.int32),
        np.full(n, 1, dtype=np.int32),
        times.copy(),
        np.full(n, cores),
        np.full(n, cpus, dtype=np.int32),
        np.full(n, 2048.0),
    )


FACTS = JobFacts(JOB, "R", False, 900.0, None, 1100.0)


def test_data_loader_bound_and_unused_gpus() -> None:
    ramp = [float(v) for v in range(10, 30, 2)]  # 10, 12, …, 28: mean 19, p95 27.1
    block = _block([ramp, ramp, [0.0] * 10, [50.0] * 10], [JOB, JOB, JOB, 99], 7.6, 8)
    block = unpack_raw(pack_raw(block))  # as stored
    s = compute(FACTS, {"n1": [block]}, {("n1", i): H100 for i in range(4)}, [])
    assert [(g.index, g.mean_util_pct, g.p95_util_pct) for g in s.per_gpu] == [
        (0, 19.0, 27.1),
        (1, 19.0, 27.1),
        (2, 0.0, 0.0),
    ]  # GPU 3 is another job's
    assert s.gpus_total == 3 and s.gpus_idle == 1
    assert s.energy_j == 3 * 9 * 3000.0  # 9 steps of 3 kJ on each of its GPUs
    assert (s.cpu_cores_mean, s.cpu_cores_max, s.cpus, s.memory_peak_mb) == (7.6, 7.6, 8, 2048)
    assert s.notes == [
        "1 of 3 GPUs unused (~0% utilisation the whole time: n1:2); ask for fewer GPUs",
        "data-loader bound? the GPUs in use average 19% while the job's CPUs are saturated "
        "(7.6 of 8 cores busy): use more data-loader workers or CPUs, or preprocess the "
        "data ahead",
        "GPU memory far below what the GPUs have: peak 3.9 GiB of 80 GiB (5%): a larger "
        "batch, or a smaller GPU, would do",
    ]


def test_low_utilisation_without_cpu_saturation_and_well_used_gpus() -> None:
    low = compute(FACTS, {"n1": [_block([[30.0] * 10], [JOB], 1.0, 8)]}, {}, [])
    assert low.notes == ["low GPU utilisation: the GPUs in use average 30% (aim for 50% or more)"]
    busy = _block([[95.0] * 10, [85.0] * 10], [JOB, JOB], 1.0, 8)
    busy.memory[:] = 60_000.0
    good = compute(FACTS, {"n1": [busy]}, {("n1", 0): H100, ("n1", 1): H100}, [])
    assert good.notes == ["GPUs well used: 90% on average"] and good.mean_util_pct == 90.0


def test_progress_history() -> None:
    mfus = [0.4, 0.41, 0.42]
    rows = [ProgressRow(1000.0 + i, i, 2.0, 1000.0 * (i + 1), mfus[i]) for i in range(3)]
    s = compute(FACTS, {}, {}, rows)
    assert s.mfu_mean == 0.41 and s.tokens_per_s_mean == 2000.0
    assert s.notes == ["no GPU samples for this job yet"]
    mfu, tps = progress_series(rows)
    assert [p.value for p in mfu] == mfus
    assert [p.value for p in tps] == [1000.0, 2000.0, 3000.0]


def test_memory_far_below_the_request() -> None:
    facts = JobFacts(JOB, "R", False, 900.0, None, 1100.0, memory_request_mb=64 * 1024)
    busy = _block([[90.0] * 10], [JOB], 1.0, 8)  # 2048 MiB of CPU memory at most
    busy.memory[:] = 60_000.0
    s = compute(facts, {"n1": [busy]}, {("n1", 0): H100}, [])
    assert s.memory_request_mb == 64 * 1024
    assert s.notes == [
        "memory far below the request: peak 2.0 GiB of 64.0 GiB asked for (--mem); ask for less"
    ]
