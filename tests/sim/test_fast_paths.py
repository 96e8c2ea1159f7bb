"""A replay with the fast cycle and the skipped idle cycles gives exactly the outcome of the
straightforward cycle (`tests/core/reference_cycle.py`) run at every instant: the same
decisions in the same order (time, job, nodes and GPUs), the same per-job start and end
times, and the same time series and counters."""

from __future__ import annotations

from typing import Any

import pytest

import phalanx.sim.engine as engine
from phalanx.core import ClusterState, Decisions, SchedulerConfig, apply_decisions
from phalanx.sim.engine import SimConfig, SimResult, simulate
from phalanx.sim.failures import FailureModel
from phalanx.sim.layout import uniform
from phalanx.sim.workload import synthetic
from tests.core.reference_cycle import reference_schedule

CASES = {
    "priority, overloaded, node failures": SimConfig(
        failures=FailureModel(mtbf_gpu_hours=400.0, repair_s=1800.0, seed=3)
    ),
    "strict fifo": SimConfig(
        policy="fifo", scheduler=SchedulerConfig(backfill=False, preemption=False)
    ),
    "las (preemptive)": SimConfig(policy="las"),
    "sjf, no preemption": SimConfig(policy="sjf", scheduler=SchedulerConfig(preemption=False)),
}


def _replay(config: SimConfig, monkeypatch: pytest.MonkeyPatch, reference: bool) -> dict[str, Any]:
    decisions: list[tuple[Any, ...]] = []

    def logged(state: ClusterState, d: Decisions, now: float) -> Any:
        applied = apply_decisions(state, d, now)
        decisions.extend(("start", now, s.job_id, s.placement.slots) for s in applied.starts)
        decisions.extend(("notice", now, victim, job) for victim, job in applied.notices)
        return applied

    with monkeypatch.context() as m:
        m.setattr(engine, "apply_decisions", logged)
        if reference:
            m.setattr(engine, "schedule", reference_schedule)
            m.setattr(engine, "decides_nothing", lambda state, config: False)
        layout = uniform(24, gpus_per_node=8, nodes_per_rack=4, racks_per_block=3)
        workload = synthetic(2500, 24 * 8, load=1.4, seed=11)
        res: SimResult = simulate(layout, workload, config)
    counters = {
        name: getattr(res, name)
        for name in (
            "cycles",
            "preemptions",
            "failures",
            "restarts",
            "alloc_gpu_s",
            "lost_gpu_s",
            "unfinished",
            "spread_jobs",
        )
    }
    series = {
        name: list(getattr(res, name))
        for name in ("submit", "start", "finish", "times", "busy", "queued")
    }
    return {"decisions": decisions, "counters": counters, "series": series, "res": res}


@pytest.mark.parametrize("case", list(CASES))
def test_fast_replay_equals_reference(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _replay(CASES[case], monkeypatch, reference=False)
    ref = _replay(CASES[case], monkeypatch, reference=True)
    assert len(fast["decisions"]) >= 2500  # every job started at least once
    assert fast["decisions"] == ref["decisions"]
    assert fast["series"] == ref["series"]
    assert fast["counters"] == ref["counters"]
    assert ref["res"].idle_cycles == 0
    if case != "las (preemptive)":  # a preemptive policy can always try to preempt
        assert fast["res"].idle_cycles > 0  # cycles were skipped, and it made no difference


def test_replay_makes_no_reference_cycles() -> None:
    """The cyclic GC is paused during a replay (`Simulator.run`): that is only sound while a
    replay drops nothing that reference counting cannot free. Replays with preemption and
    node failures leave no cyclic garbage, and the GC is on again afterwards."""
    import gc

    layout = uniform(24, gpus_per_node=8, nodes_per_rack=4, racks_per_block=3)
    workload = synthetic(1500, 24 * 8, load=1.4, seed=5)
    assert gc.isenabled()
    for config in (CASES["priority, overloaded, node failures"], CASES["las (preemptive)"]):
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            res = simulate(layout, workload, config)
            assert gc.isenabled()
            assert gc.collect() == 0, [type(o).__name__ for o in gc.garbage[:20]]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert res.restarts > 0  # the requeue paths ran
