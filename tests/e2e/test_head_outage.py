"""Head outages cost nothing: jobs run on through a head killed and restarted or frozen for
several leases, while a node that really died, or one cut off from the head alone, is still
fenced and its job resumed elsewhere, never as two copies (docs/fault-tolerance.md)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from phalanx.api.models import JobSpec
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.local import LocalCluster
from phalanx.testing import workload
from phalanx.testing.invariants import check_never_twice
from phalanx.testing.processes import pid_alive
from phalanx.testing.proxy import TcpProxy
from tests.e2e.helpers import cancel_all, describe, submit, wait_for, wait_state

LEASE_S = 2.0
HEAD_ARGS = ["--heartbeat", "0.5", "--lease", str(LEASE_S), "--requeue-margin", "1"]
HEAD_ARGS += ["--kill-grace", "2", "--hang-timeout", "0", "--max-outage", "120"]
OUTAGE_S = 3 * LEASE_S


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nodes × 2 fake GPUs, a 2 s lease, outages of up to 120 s ridden out."""
    state = tmp_path_factory.mktemp("outage")
    with LocalCluster(state, nodes=3, gpus_per_node=2, head_args=HEAD_ARGS) as running:
        yield running


@pytest.fixture
def api(cluster: LocalCluster) -> Iterator[PhalanxClient]:
    with cluster.client() as client:
        yield client
        cancel_all(client)
        for node in client.nodes().nodes:
            if node.state == "drain":
                client.resume(node.name)


def spec(workdir: Path, steps: int, **fields: Any) -> JobSpec:
    env = {"LEDGER": str(workdir / "ledger.jsonl"), "OMP_NUM_THREADS": "1"}
    return JobSpec(command=workload.command(steps, 0.2), workdir=str(workdir), env=env, **fields)


def lives(workdir: Path) -> list[workload.Life]:
    return workload.lives(workload.read_ledger(workdir / "ledger.jsonl"))


def rank_pids(workdir: Path, epoch: int) -> set[int]:
    return {life.pid for life in lives(workdir) if life.epoch == epoch}


def running(workdir: Path, epoch: int, ranks: int) -> set[int] | None:
    pids = rank_pids(workdir, epoch)
    return pids if len(pids) == ranks else None


def assert_never_twice(workdir: Path) -> None:
    verdict = check_never_twice(lives(workdir))
    assert verdict.ok, verdict.violations


def assert_ran_through(
    api: PhalanxClient, job_id: int, epoch: int, pids: set[int], workdir: Path
) -> None:
    """Still its first run, on the same processes, and it finishes."""
    assert all(pid_alive(p) for p in pids), describe(api, job_id)
    done = wait_state(api, job_id, "CD", timeout=90)
    assert (done.restart_count, done.epoch) == (0, epoch), describe(api, job_id)
    assert {life.epoch for life in lives(workdir)} == {epoch}  # no rank was ever restarted
    assert rank_pids(workdir, epoch) == pids


def test_a_head_killed_and_restarted_after_three_leases_kills_no_job(
    cluster: LocalCluster, api: PhalanxClient, workdir: Path
) -> None:
    job_id = submit(api, spec(workdir, 100, nodes=3))
    epoch = wait_state(api, job_id, "R").epoch
    pids = wait_for("every rank", lambda: running(workdir, epoch, 3))

    cluster.kill_head(signal.SIGKILL)
    time.sleep(OUTAGE_S)
    assert all(pid_alive(p) for p in pids)
    cluster.restart_head()

    time.sleep(2 * LEASE_S)  # the new head's lease, had it counted the outage against them
    assert api.job(job_id).job.state == "R", describe(api, job_id)
    assert_ran_through(api, job_id, epoch, pids, workdir)


def test_a_head_frozen_for_three_leases_kills_no_job(
    cluster: LocalCluster, api: PhalanxClient, workdir: Path
) -> None:
    job_id = submit(api, spec(workdir, 100, nodes=3))
    epoch = wait_state(api, job_id, "R").epoch
    pids = wait_for("every rank", lambda: running(workdir, epoch, 3))

    cluster.signal_head(signal.SIGSTOP)
    try:
        time.sleep(OUTAGE_S)
        assert all(pid_alive(p) for p in pids)
    finally:
        cluster.signal_head(signal.SIGCONT)

    time.sleep(2 * LEASE_S)  # a head that blamed the nodes for its pause would requeue now
    assert api.job(job_id).job.state == "R", describe(api, job_id)
    assert_ran_through(api, job_id, epoch, pids, workdir)
    assert "did not run for" in (cluster.log_dir / "head.log").read_text()


def test_a_crashed_node_is_still_fenced_and_its_job_resumed(
    cluster: LocalCluster, api: PhalanxClient, workdir: Path
) -> None:
    job_id = submit(api, spec(workdir, 60))
    info = wait_state(api, job_id, "R")
    node = info.placement[0].node
    wait_for("the rank", lambda: running(workdir, info.epoch, 1))

    cluster.signal_agent(node, signal.SIGKILL)  # the agent dies; its guard fences
    try:
        wait_for("the restart", lambda: api.job(job_id).job.restart_count == 1 or None, 30)
        done = wait_state(api, job_id, "CD", timeout=60)
        assert done.placement[0].node != node
        assert_never_twice(workdir)
    finally:
        cluster.start_agent(node)


def test_a_node_cut_off_from_the_head_alone_fences_before_its_job_is_requeued(
    cluster: LocalCluster, api: PhalanxClient, workdir: Path
) -> None:
    node, others = cluster.addresses[0], cluster.addresses[1:]
    head = urlsplit(cluster.url)
    assert head.hostname is not None and head.port is not None
    proxy = TcpProxy((head.hostname, head.port), scheme=head.scheme)
    try:
        cluster.signal_agent(node, signal.SIGTERM)
        wait_for("the agent to stop", lambda: not cluster.agent_alive(node) or None, 30)
        cluster.start_agent(node, head_url=proxy.url)
        wait_for("it to rejoin", lambda: _heard(api, node) or None, 30)
        for other in others:  # the job starts on `node`, then may move anywhere
            api.drain(other, "test: place the job on the cut-off node")
        job_id = submit(api, spec(workdir, 80))
        info = wait_state(api, job_id, "R")
        assert info.placement[0].node == node
        pids = wait_for("the rank", lambda: running(workdir, info.epoch, 1))
        for other in others:
            api.resume(other)

        proxy.cut()  # its peers still reach the head, and tell it so

        wait_for("the rank to be fenced", lambda: not any(map(pid_alive, pids)) or None, 30)
        done = wait_state(api, job_id, "CD", timeout=90)
        assert done.restart_count == 1 and done.placement[0].node != node, describe(api, job_id)
        assert_never_twice(workdir)
    finally:
        proxy.close()
        cluster.signal_agent(node, signal.SIGTERM)
        wait_for("the agent to stop", lambda: not cluster.agent_alive(node) or None, 30)
        cluster.start_agent(node)


def _heard(api: PhalanxClient, name: str) -> bool:
    try:
        node = next(n for n in api.nodes().nodes if n.name == name)
    except (ApiError, StopIteration):
        return False
    return node.state == "up" and (node.heartbeat_age_s or 99) < 1.0
