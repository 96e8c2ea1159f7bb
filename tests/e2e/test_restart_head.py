"""A head restarted on its state and database while jobs run: nothing lost, all still in hand."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from phalanx.api.models import DependencySpec
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.local import LocalCluster
from phalanx.testing.postgres import PostgresServer
from phalanx.testing.processes import pid_alive
from tests.e2e.helpers import (
    all_gone,
    cancel_all,
    database,
    job,
    printed_pids,
    sh,
    submit,
    wait_for,
    wait_reason,
    wait_state,
)


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphan head


class Restarts:
    """A LocalCluster whose head can be stopped and started again in its place."""

    def __init__(self, cluster: LocalCluster, db_url: str | None) -> None:
        self.cluster = cluster
        self.db_url = db_url
        self.head: subprocess.Popen[bytes] = cluster.processes()[0]  # the cluster's own
        self.replacements: list[subprocess.Popen[bytes]] = []

    def stop_head(self) -> int:
        """SIGTERM the running head and wait for it; its exit status."""
        self.head.send_signal(signal.SIGTERM)
        return self.head.wait(timeout=20)

    def start_head(self) -> None:
        """A new head process with the same state dir, database, address and port."""
        port = urlsplit(self.cluster.url).port
        argv = [sys.executable, "-m", "phalanx.cli.main", "head"]
        argv += ["--state-dir", str(self.cluster.head_dir), "--host", "127.0.0.1"]
        argv += ["--port", str(port)] + (["--db", self.db_url] if self.db_url else [])
        with (self.cluster.log_dir / "head-restarted.log").open("ab") as log:
            self.head = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.replacements.append(self.head)
        with PhalanxClient(self.cluster.url, None, timeout=5) as anonymous:
            wait_for("the new head to answer", lambda: _healthy(anonymous, self.head), 60)

    def close(self) -> None:
        self.cluster.stop()  # the agents first (they stop their jobs)
        for proc in self.replacements:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _healthy(client: PhalanxClient, proc: subprocess.Popen[bytes]) -> bool | None:
    assert proc.poll() is None, f"the new head exited with {proc.returncode}"
    try:
        client.health()
    except ApiError:
        return None
    return True


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def restarts(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Restarts]:
    """A cluster of its own (the shared one must keep its head), on a database of its own."""
    db_url = None
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        db_url = database(pg, "phalanx_restart")
    cluster = LocalCluster(
        tmp_path_factory.mktemp("e2e-restart"), nodes=2, gpus_per_node=2, db_url=db_url
    )
    cluster.start()
    r = Restarts(cluster, db_url)
    try:
        yield r
    finally:
        r.close()


def test_a_restarted_head_keeps_every_job_and_its_control(
    restarts: Restarts, tmp_path: Path
) -> None:
    cluster = restarts.cluster
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
        assert restarts.stop_head() in (0, -signal.SIGTERM)
        with pytest.raises(ApiError):
            api.health()
        restarts.start_head()

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
    agents = cluster.processes()[1:]  # [0] is the head this test stopped
    assert [a.poll() for a in agents] == [None, None]
    assert restarts.head.poll() is None
