"""A head restarted on its state and database while jobs run: nothing lost, all still in hand."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.api.models import DependencySpec
from phalanx.client.api import ApiError
from phalanx.local import LocalCluster
from phalanx.testing.postgres import PostgresServer
from phalanx.testing.processes import pid_alive
from tests.e2e.helpers import (
    all_gone,
    cancel_all,
    job,
    printed_pids,
    sh,
    submit,
    wait_for,
    wait_reason,
    wait_state,
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def restarts(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """A cluster of its own (the shared one must keep its head), on a database of its own."""
    db_url = None
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        db_url = pg.new_database("phalanx_restart")
    with LocalCluster(
        tmp_path_factory.mktemp("e2e-restart"), nodes=2, gpus_per_node=2, db_url=db_url
    ) as cluster:
        yield cluster


def test_a_restarted_head_keeps_every_job_and_its_control(
    restarts: LocalCluster, tmp_path: Path
) -> None:
    cluster = restarts
    workdir = tmp_path.resolve()
    with cluster.client() as api:
        long = submit(
            api, job(workdir, sh('sleep 60 & echo "pids $$ $!"; wait'), nodes=2, gpus_per_node=1)
        )
        before = wait_state(api, long, "R")
        then = submit(
            api,
            job(workdir, sh("true"), dependencies=[DependencySpec(type="afterok", job_ids=[long])]),
        )
        wait_state(api, then, "PD")
        pids = [p for rank in range(2) for p in printed_pids(api, long, rank)]

        # uvicorn shuts down, then re-raises SIGTERM so the exit status tells why it ended.
        assert cluster.kill_head(signal.SIGTERM) in (0, -signal.SIGTERM)
        with pytest.raises(ApiError):
            api.health()
        cluster.restart_head()

        after = api.job(long).job
        assert after.state == "R"
        assert (after.epoch, after.start_time) == (before.epoch, before.start_time)
        assert after.placement == before.placement
        assert api.job(then).job.state == "PD"
        assert {j.id for j in api.jobs(active=True).jobs} == {long, then}
        assert all(pid_alive(p) for p in pids)  # the job ran on through the restart

        api.cancel(long)
        wait_state(api, long, "CA", timeout=60)  # needs the agents to report to the new head
        wait_for("the job's processes to be gone", lambda: all_gone(pids), 10)
        wait_reason(api, then, "DependencyNeverSatisfied")
        fresh = submit(api, job(workdir, sh("true"), nodes=2, gpus_per_node=2))
        assert fresh > then  # job ids are never reused
        wait_state(api, fresh, "CD", timeout=60)
        cancel_all(api)
    assert [p.poll() for p in cluster.processes()] == [None, None, None]  # head, agents
