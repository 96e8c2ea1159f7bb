"""Rolling agent upgrades on a real cluster (docs/fault-tolerance.md#agent-restarts-and-
upgrades): agents restarted one by one as a newer release adopt their jobs — nothing is
killed — and a job's exit while its agent is away is still reported; an agent kept away
past the lease has its jobs fenced, and they run elsewhere exactly once. Jobs keep a
ledger of their lives (phalanx.testing.workload)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from phalanx.api.models import JobInfo, JobSpec
from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from phalanx.testing import newer_agent, workload
from phalanx.testing.invariants import check_never_twice
from phalanx.testing.processes import pid_alive
from tests.e2e.helpers import cancel_all, describe, sh, submit, wait_for, wait_state

NEWER = newer_agent.argv_prefix("1.99")  # another minor release, with fields 1.0 lacks


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nodes × 2 fake GPUs with the default lease (8 s) and requeue margin (2 s)."""
    with LocalCluster(tmp_path_factory.mktemp("upgrade"), nodes=3, gpus_per_node=2) as c:
        yield c


@pytest.fixture
def api(cluster: LocalCluster) -> Iterator[PhalanxClient]:
    with cluster.client() as client:
        yield client
        cancel_all(client)
        for address in cluster.addresses:  # a test that failed halfway left an agent down
            if not cluster.agent_alive(address):
                cluster.start_agent(address)
        cluster.check()


def ledger_job(workdir: Path, hold: Path, **fields: Any) -> JobSpec:
    """A ledger job stepping every 0.1 s until `hold` exists (LEDGER_DEADLINE: a net)."""
    env = {"LEDGER": str(workdir / "ledger.jsonl"), "LEDGER_DEADLINE": f"{time.time() + 300:.0f}"}
    command = workload.command(5, 0.1, "--hold", str(hold))
    return JobSpec(command=command, workdir=str(workdir), env=env, **fields)


def lives(workdir: Path) -> list[workload.Life]:
    return workload.lives(workload.read_ledger(workdir / "ledger.jsonl"))


def stepped_since(workdir: Path, t: float, ranks: int) -> bool | None:
    """Whether every one of the job's `ranks` ranks logged a step after unix time `t`."""
    entries = workload.read_ledger(workdir / "ledger.jsonl")
    seen = {e["rank"] for e in entries if e["event"] == "step" and e["t"] > t}
    return True if len(seen) == ranks else None


def read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def running_after(api: PhalanxClient, job_id: int, epoch: int) -> JobInfo | None:
    """The job's info once it runs in an epoch after `epoch`."""
    info = api.job(job_id).job
    return info if info.state == "R" and info.epoch > epoch else None


def node_up(api: PhalanxClient, name: str) -> bool | None:
    return True if any(n.name == name and n.state == "up" for n in api.nodes().nodes) else None


def stop_agent(cluster: LocalCluster, address: str) -> None:
    """SIGUSR2: the agent exits for an upgrade, leaving its jobs running."""
    os.kill(cluster.agent_pid(address), signal.SIGUSR2)
    wait_for(f"the agent of {address} to exit", lambda: not cluster.agent_alive(address) or None)


def test_agents_upgraded_one_by_one_to_a_newer_release_kill_no_job(
    cluster: LocalCluster, api: PhalanxClient, tmp_path: Path
) -> None:
    hold = tmp_path / "release"
    shapes = {"wide": (3, 1), "pair": (2, 1), "single": (1, 1)}  # 6 GPUs: the whole cluster
    dirs = {name: tmp_path / name for name in shapes}
    jobs: dict[str, int] = {}
    for name, (nodes, gpus) in shapes.items():
        dirs[name].mkdir()
        spec = ledger_job(dirs[name], hold, name=name, nodes=nodes, gpus_per_node=gpus)
        jobs[name] = submit(api, spec)
    before = {name: wait_state(api, job_id, "R") for name, job_id in jobs.items()}
    for name, (nodes, gpus) in shapes.items():
        wait_for(f"{name} to step", partial(stepped_since, dirs[name], 0.0, nodes * gpus))
    urls = {n.name: n.agent_url for n in api.nodes().nodes}

    for address in cluster.addresses:
        cluster.upgrade_agent(address, NEWER)
        for name, job_id in jobs.items():
            info = api.job(job_id).job
            assert (info.state, info.epoch, info.restart_count) == (
                "R",
                before[name].epoch,
                0,
            ), describe(api, job_id)
    upgraded = time.time()
    agents = [Path(f"/proc/{p.pid}/cmdline").read_bytes() for p in cluster.processes()[1:]]
    assert all(b"phalanx.testing.newer_agent" in argv for argv in agents), agents
    # Every rank of every job steps on, in the process it had before the upgrades.
    for name, (nodes, gpus) in shapes.items():
        wait_for(f"{name} to step on", partial(stepped_since, dirs[name], upgraded, nodes * gpus))
    # The restarted agents serve on the URLs the jobs were given (srun reaches them there).
    assert {n.name: n.agent_url for n in api.nodes().nodes} == urls

    hold.touch()
    for name, job_id in jobs.items():
        done = wait_state(api, job_id, "CD", timeout=60)
        assert (done.exit_code, done.epoch, done.restart_count) == ("0:0", before[name].epoch, 0)
        nodes, gpus = shapes[name]
        ranks = lives(dirs[name])
        # One process per rank, start to end: none was killed, none started again.
        assert sorted(r.rank for r in ranks) == list(range(nodes * gpus)), ranks
        assert all(r.epoch == done.epoch and r.end_code == 0 for r in ranks), ranks
        assert all(r.first < upgraded - 1 for r in ranks), ranks  # alive before the upgrades
        verdict = check_never_twice(ranks)
        assert verdict.ok, verdict.violations
        kinds = {e.kind for e in api.job(job_id).events}
        assert not kinds & {"nodefail", "rankfailed"}, describe(api, job_id)


def test_a_job_that_fails_while_its_agent_restarts_ends_f_with_its_code(
    cluster: LocalCluster, api: PhalanxClient, tmp_path: Path
) -> None:
    go, pid_file = tmp_path / "go", tmp_path / "pid"
    script = f"echo $$ > {pid_file}; while [ ! -e {go} ]; do sleep 0.1; done; exit 7"
    job_id = submit(api, JobSpec(command=sh(script), workdir=str(tmp_path)))
    node = wait_state(api, job_id, "R").placement[0].node
    pid = int(wait_for("the job's pid", lambda: read(pid_file)))

    stop_agent(cluster, node)
    go.touch()  # it fails while no agent runs on its node
    wait_for("the job to exit", lambda: not pid_alive(pid) or None)
    cluster.start_agent(node)

    done = wait_state(api, job_id, "F", timeout=30)
    assert (done.exit_code, done.restart_count) == ("7:0", 0), describe(api, job_id)


def test_an_agent_kept_away_past_the_lease_is_fenced_and_the_job_runs_once(
    cluster: LocalCluster, api: PhalanxClient, tmp_path: Path
) -> None:
    hold = tmp_path / "release"
    job_id = submit(api, ledger_job(tmp_path, hold, nodes=1, gpus_per_node=1))
    first = wait_state(api, job_id, "R")
    node = first.placement[0].node
    wait_for("the job to step", lambda: stepped_since(tmp_path, 0.0, 1))
    [old] = [life.pid for life in lives(tmp_path)]

    stop_agent(cluster, node)  # and it does not come back within the lease
    # The head requeues the job after lease + margin; the old agent's guard has killed it
    # by then (the lease ran out first).
    second = wait_for("the job to run again", lambda: running_after(api, job_id, first.epoch), 60)
    assert second.placement[0].node != node
    assert not pid_alive(old)
    cluster.start_agent(node)  # late: it finds nothing to adopt
    wait_for(f"{node} back", lambda: node_up(api, node))

    hold.touch()
    done = wait_state(api, job_id, "CD", timeout=60)
    assert done.restart_count == 1, describe(api, job_id)
    verdict = check_never_twice(lives(tmp_path))
    assert verdict.ok, verdict.violations
    assert {life.epoch for life in lives(tmp_path)} == {first.epoch, second.epoch}
