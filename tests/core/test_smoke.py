"""A first end-to-end pass through one scheduling cycle."""

from phalanx.core import ClusterState, JobState, schedule
from phalanx.testing import cluster_nodes, job


def test_cycle_places_and_leaves_state_unchanged() -> None:
    state = ClusterState(cluster_nodes(2, gpus_per_node=4))
    state.submit(job(1, gpus=4), 0.0)
    state.submit(job(2, gpus=2), 0.0)
    state.submit(job(3, gpus=4), 0.0)
    decisions = schedule(state, 1.0)
    assert [s.job_id for s in decisions.starts] == [1, 2]
    assert state.free_total == 8  # the cycle undid its trial placements
    for start in decisions.starts:
        state.start(start.job_id, start.placement, 1.0)
    assert state.free_total == 2
    pending = state.pending[3]
    assert decisions.reason_for(pending).code.value == "Resources"
    state.finish(1, 5.0, JobState.COMPLETED)
    again = schedule(state, 5.0)
    assert [s.job_id for s in again.starts] == [3]
