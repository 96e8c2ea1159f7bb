"""The simulator on small hand-made workloads whose outcome can be worked out by hand."""

from __future__ import annotations

import pytest

from phalanx.core import Node, SchedulerConfig, Team
from phalanx.sim.engine import SimConfig, SimResult, simulate
from phalanx.sim.failures import FailureModel
from phalanx.sim.layout import ClusterLayout, uniform
from phalanx.sim.metrics import jain_index, summarize
from phalanx.sim.stepmodel import StepModel
from phalanx.sim.workload import TraceJob, Workload


def _workload(*jobs: tuple[float, float, int, str, int]) -> Workload:
    """Jobs as (submit, duration, GPUs, team, priority)."""
    return Workload(
        tuple(TraceJob(i, s, d, g, team, prio) for i, (s, d, g, team, prio) in enumerate(jobs)),
        "hand-made",
    )


def _jct(result: SimResult, job: int) -> float:
    return float(result.finish[job] - result.submit[job])


def test_fifo_gang_waits_for_whole_cluster() -> None:
    layout = uniform(2, gpus_per_node=4)
    wl = _workload((0, 100, 4, "t", 0), (0, 50, 8, "t", 0), (10, 10, 1, "t", 0))
    res = simulate(layout, wl, SimConfig(policy="fifo", scheduler=SchedulerConfig(backfill=False)))
    assert _jct(res, 0) == 100
    assert res.start[1] == 0 or res.start[1] == 100
    # The 8-GPU gang needs both nodes: it starts when job 0 ends at t=100.
    assert res.start[1] == 100 and _jct(res, 1) == 150
    # Without backfill the 1-GPU job waits behind the gang.
    assert res.start[2] == 150


def test_backfill_lets_short_job_pass_without_delaying_the_gang() -> None:
    layout = uniform(2, gpus_per_node=4)
    wl = _workload(
        (0, 100, 4, "t", 0), (1, 50, 8, "t", 0), (10, 10, 1, "t", 0), (10, 500, 1, "t", 0)
    )
    res = simulate(layout, wl, SimConfig(policy="fifo"))
    assert res.start[2] == 10  # fits before the reservation at t=100
    assert res.start[1] == 100  # the gang is not delayed
    assert res.start[3] >= 150  # a long job would have delayed it, so it waits


def test_spread_gang_runs_slower_than_rack_local() -> None:
    model = StepModel()
    racked = ClusterLayout(
        "racked", tuple(Node(f"n{i}", 8, rack="r0", block="b0") for i in range(2))
    )
    spread = ClusterLayout(
        "spread", tuple(Node(f"n{i}", 8, rack=f"r{i}", block=f"b{i}") for i in range(2))
    )
    wl = _workload((0, 1000, 16, "t", 0))
    fast = simulate(racked, wl, SimConfig(step_model=model))
    slow = simulate(spread, wl, SimConfig(step_model=model))
    assert _jct(fast, 0) == pytest.approx(1000)
    expected = 1000 * model.slowdown(16, 2, "cluster")
    assert expected > 1000
    assert _jct(slow, 0) == pytest.approx(expected)
    assert slow.spread_jobs == 1


def test_priority_preemption_requeues_victim_and_resumes_it() -> None:
    layout = uniform(1, gpus_per_node=4)
    wl = _workload((0, 1000, 4, "t", 0), (100, 100, 4, "t", 10))
    config = SimConfig(policy="priority", preemption_grace_s=30)
    res = simulate(layout, wl, config)
    assert res.preemptions == 1
    assert res.start[1] == pytest.approx(130)  # after the victim's 30 s notice
    # The victim checkpointed at the notice: it keeps its 100 s of work, pays a restart.
    restart = config.failures.restart_cost_s
    assert res.finish[0] == pytest.approx(230 + restart + 900)


def test_failures_lose_work_and_everything_still_finishes() -> None:
    layout = uniform(4, gpus_per_node=8)
    wl = _workload(*[(i * 60.0, 20_000.0, 8, "t", 0) for i in range(8)])
    failures = FailureModel(
        mtbf_gpu_hours=40.0,
        repair_s=600,
        checkpoint_interval_s=600,
        checkpoint_cost_s=20,
        restart_cost_s=60,
        seed=3,
    )
    res = simulate(layout, wl, SimConfig(failures=failures))
    summary = summarize([res], failures)
    assert res.failures > 0 and res.restarts > 0
    assert summary["jobs"] == 8 and summary["unfinished"] == 0
    assert summary["lost_gpu_hours"] > 0
    assert 0 < summary["goodput"] < 1
    assert summary["young_daly_s_8gpu"] == pytest.approx((2 * 20 * 40 * 3600 / 8) ** 0.5)


def test_quota_borrowing_in_simulation() -> None:
    teams = (Team("a", quota=4, cohort="c"), Team("b", quota=4, cohort="c"))
    layout = ClusterLayout("q", uniform(1, gpus_per_node=8).nodes, teams)
    wl = _workload((0, 100, 8, "a", 0), (10, 100, 4, "b", 0))
    res = simulate(layout, wl, SimConfig())
    assert res.start[0] == 0  # a borrows b's idle quota
    assert res.preemptions == 1  # b reclaims its nominal quota
    assert res.start[1] == pytest.approx(40)


def test_jain_index() -> None:
    assert jain_index([1, 1, 1]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)


def test_topology_placement_beats_spread_on_fragmentation() -> None:
    # Four 1-GPU jobs, then a 2 × 8 gang. Best fit packs the small jobs on one node and the
    # gang starts at once in the other rack; spreading them blocks every node.
    layout = uniform(4, gpus_per_node=8, nodes_per_rack=2)
    small = [(0.0, 1000.0, 1, "t", 0)] * 4
    wl = _workload(*small, (1.0, 100.0, 16, "t", 0))
    packed = simulate(layout, wl, SimConfig(placement="topology"))
    spread = simulate(layout, wl, SimConfig(placement="spread"))
    assert packed.start[4] == 1.0
    assert spread.start[4] == 1000.0
    assert _jct(spread, 4) > _jct(packed, 4)
