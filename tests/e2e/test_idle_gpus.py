"""Idle GPUs on a real cluster: the fake GPUs of a node where a job holds GPUs but runs no
process read 0%, and are flagged, acted on and counted.

A batch job on two nodes runs its script on the first node only: the fake provider shows
the first node's GPUs busy (a process of the job holds them) and the second's idle.
"""

from __future__ import annotations

from pathlib import Path

from phalanx.api.models import JobSpec, TeamSpec
from phalanx.api.usage import IdlePolicySpec, UsageReport
from phalanx.client.api import PhalanxClient
from tests.e2e.helpers import submit, wait_for, wait_state


def test_an_idle_node_of_a_job_is_flagged_then_cancelled_and_counted(
    api: PhalanxClient, workdir: Path
) -> None:
    api.set_team(TeamSpec(name="idlers"))
    api.set_idle_policy("idlers", IdlePolicySpec(action="notify", window_s=10.0))
    spec = JobSpec(
        script="#!/bin/bash\nsleep 300\n",
        workdir=str(workdir),
        nodes=2,
        gpus_per_node=2,
        launcher="batch",
        team="idlers",
    )
    job_id = submit(api, spec)
    running = wait_state(api, job_id, "R")
    first, second = (p.node for p in running.placement)

    flagged = wait_for(
        "the second node's GPUs to be flagged idle",
        lambda: (lambda gpus: gpus if len(gpus) == 2 else None)(api.idle_gpus(job_id).gpus),
        timeout=60,
    )
    assert {(g.node, g.index) for g in flagged} == {(second, 0), (second, 1)}
    assert all(g.flagged_at - g.idle_since >= 10.0 for g in flagged)
    assert all(g.action == "notify" and g.action_at is None for g in flagged)
    events = api.job(job_id).events
    idle_events = [e for e in events if e.kind == "gpu_idle"]
    assert idle_events and idle_events[0].node == second
    assert [e for e in events if e.kind == "idle_action"] == []
    assert job_id in {g.job_id for g in api.idle_gpus().gpus}
    assert first not in {g.node for g in api.idle_gpus(job_id).gpus}

    # The team's policy turns to cancel with no grace: the flagged job is cancelled.
    api.set_idle_policy("idlers", IdlePolicySpec(action="cancel", window_s=10.0, grace_s=0.0))
    info = wait_state(api, job_id, "CA", timeout=60)
    assert info.reason == "IdleGPU"
    assert any(e.kind == "idle_action" for e in api.job(job_id).events)

    answer = api.usage_report({"by": "team", "per": "month"})
    assert isinstance(answer, UsageReport)
    (row,) = [r for r in answer.rows if r.key == "idlers"]
    assert row.jobs == 1 and row.failures == 0
    assert row.alloc_gpu_hours > 0
    # Half the GPUs worked (the first node's, at 100%), half were idle.
    assert 0 < row.util_gpu_hours < row.alloc_gpu_hours
    assert 0 < row.idle_gpu_hours < row.alloc_gpu_hours
    assert row.utilization_pct is not None and 10 < row.utilization_pct < 90
