"""An overloaded head kills no live work (head/overload.py, README.md#an-overloaded-head).

A real head process capped to a few percent of one CPU (a cgroup: phalanx/testing/
overload.py), 250 simulated nodes long-polling over real HTTP, jobs ending and starting,
users submitting: the head falls seconds behind, and a head judging leases on its wall
clock marks live nodes down and requeues their running jobs (bench/fleet.py --overload
shows it side by side). This head requeues none of their jobs, and a node that really died
meanwhile is still found and its job requeued, with the head still capped (the grace
bounds how long that takes)."""

from __future__ import annotations

from pathlib import Path

from phalanx.testing.overload import Scenario, run


def test_an_overloaded_head_requeues_the_dead_nodes_job_and_no_live_nodes(tmp_path: Path) -> None:
    scenario = Scenario()
    out = run(scenario, tmp_path)
    summary = out.summary()
    # The head really was behind, by more than it sheds users at (else this shows nothing).
    assert out.shed > 0, summary
    assert out.live_requeued == [], summary
    assert out.live_jobs_taken == [], summary
    assert out.victim_requeued, summary
    assert out.errors == [], summary
