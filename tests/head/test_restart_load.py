"""A restarted head loads its live jobs with each distinct spec parsed once (an array's
tasks share one frozen JobSpec: 100,000 queued tasks of large arrays loaded in seconds, not
a minute), and nothing about them changes. In process, on a fake clock."""

from __future__ import annotations

import time
from pathlib import Path

from phalanx.api.models import ArraySpec, JobSpec
from phalanx.core import JobState, NodeState
from phalanx.head.control import ControlThread
from phalanx.head.mirror import Settings
from phalanx.testing.headloop import HeadLoop

SETTINGS = Settings(heartbeat_s=1.0, lease_s=8.0, tick_s=0.5, hang_timeout_s=0.0)


def test_array_tasks_share_their_spec_after_a_restart_and_keep_their_places(
    tmp_path: Path,
) -> None:
    loop = HeadLoop(tmp_path, SETTINGS)
    try:
        loop.join("n1", gpus=2)
        first = loop.submit(gpus_per_node=1, array=ArraySpec(indices=list(range(50))))
        other = loop.submit(gpus_per_node=2, name="solo")
        loop.advance(2)
        before = {
            j: (r.state, r.spec, r.placement, r.array_task_id) for j, r in loop.mirror.jobs.items()
        }
        assert sum(s is JobState.RUNNING for s, *_ in before.values()) == 2
        loop.restart()
        jobs = loop.mirror.jobs
        after = {j: (r.state, r.spec, r.placement, r.array_task_id) for j, r in jobs.items()}
        assert after == before
        tasks = [r for r in jobs.values() if r.array_job_id == first]
        assert len(tasks) == 50
        assert all(t.spec is tasks[0].spec for t in tasks)  # parsed once
        assert isinstance(tasks[0].spec, JobSpec) and tasks[0].spec.array is not None
        assert jobs[other].spec is not tasks[0].spec and jobs[other].spec.gpus_per_node == 2
        loop.advance(2)  # and the loop goes on from there
        assert sum(r.state is JobState.RUNNING for r in loop.mirror.jobs.values()) == 2
    finally:
        loop.close()


def test_a_slow_load_does_not_cost_the_nodes_their_lease(tmp_path: Path) -> None:
    """The head restarts on a database whose load takes longer than a lease (100,000 live
    jobs on a busy machine): its loop, once running, must not find every node silent since
    before the load began (marking them down and requeuing their running jobs)."""
    loop = HeadLoop(tmp_path, SETTINGS)
    try:
        loop.join("n1", gpus=8)
        loop.join("n2", gpus=8)
        jobs = [loop.submit(gpus_per_node=8) for _ in range(2)]
        loop.advance(2)
        assert all(loop.mirror.jobs[j].state is JobState.RUNNING for j in jobs)
        control = ControlThread(loop.engine, SETTINGS, loop.clock)
        control.load()
        loop.clock.advance(SETTINGS.lease_s + SETTINGS.requeue_margin_s + 5)  # a slow load
        control.start()
        try:
            for _ in range(3):  # a few ticks of the real loop (the fake clock stands still)
                assert control.call(lambda tx: tx.now) == loop.clock.time()
                time.sleep(SETTINGS.tick_s)
            nodes = control.call(
                lambda tx: {n.name: n.state for n in control.mirror.nodes.values()}
            )
            states = control.call(lambda tx: [control.mirror.jobs[j].state for j in jobs])
        finally:
            control.stop()
        assert nodes == {"n1": NodeState.UP, "n2": NodeState.UP}
        assert states == [JobState.RUNNING, JobState.RUNNING]
    finally:
        loop.close()
