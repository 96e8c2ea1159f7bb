"""`phalanx agent --on-sigterm leave` on a real local cluster: SIGTERM to one agent of a
2-node job drains its node, notices the job, which checkpoints and is requeued onto other
nodes, resuming from its checkpoint; the agent then exits by itself."""

from __future__ import annotations

import signal
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from phalanx.api.models import JobInfo, JobSpec
from phalanx.local import LocalCluster
from phalanx.testing import workload
from phalanx.testing.invariants import check_never_twice
from tests.e2e.helpers import describe, submit, wait_for, wait_state

HEAD_ARGS = ["--heartbeat", "0.5", "--lease", "2", "--requeue-margin", "1", "--kill-grace", "2"]
AGENT_ARGS = ["--on-sigterm", "leave", "--leave-grace", "20"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state = tmp_path_factory.mktemp("leave")
    with LocalCluster(
        state, nodes=3, gpus_per_node=1, head_args=HEAD_ARGS, agent_args=AGENT_ARGS
    ) as running:
        yield running


def test_sigterm_to_a_leaving_agent_requeues_its_job_from_the_checkpoint(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    spec = JobSpec(
        command=workload.command(400, 0.05, "--exit-on-notice"),
        workdir=str(tmp_path),
        env={"LEDGER": str(ledger), "OMP_NUM_THREADS": "1"},
        nodes=2,
        gpus_per_node=1,
        preempt_grace_s=30,
    )
    with cluster.client() as api:
        job_id = submit(api, spec)
        first = wait_state(api, job_id, "R")
        wait_for(
            "both ranks stepping",
            lambda: (
                {e["rank"] for e in workload.read_ledger(ledger) if e["event"] == "step"} == {0, 1}
                or None
            ),
        )
        leaving = first.placement[1].node
        address = next(n.address for n in api.nodes().nodes if n.name == leaving)

        cluster.signal_agent(address, signal.SIGTERM)

        wait_for("the agent to exit", lambda: not cluster.agent_alive(address) or None, 30)
        again = wait_state(api, job_id, "R", timeout=30)
        assert again.restart_count == 1, describe(api, job_id)
        assert leaving not in {p.node for p in again.placement}
        node = next(n for n in api.nodes().nodes if n.name == leaving)
        assert node.state in ("drain", "down") and "leaving" in (node.reason or ""), node
        events = [(e.kind, e.message) for e in api.job(job_id).events]
        assert any(k == "preempting" and f"node {leaving} is leaving" in m for k, m in events)
        wait_for(
            "the requeued run's steps",
            lambda: (
                [
                    e
                    for e in workload.read_ledger(ledger)
                    if e["epoch"] == again.epoch and e["event"] == "step"
                ]
                or None
            ),
        )
        entries = workload.read_ledger(ledger)
        signals = {
            e["rank"] for e in entries if e["event"] == "signal" and e["epoch"] == first.epoch
        }
        assert signals == {0, 1}  # both ranks got the notice, and exited on it
        begins = [e for e in entries if e["event"] == "begin" and e["epoch"] == again.epoch]
        assert begins and all(b["step"] > 0 for b in begins)  # resumed from the checkpoint
        verdict = check_never_twice(workload.lives(entries))
        assert verdict.ok, verdict.violations
        api.cancel(job_id)


def test_only_the_node_itself_or_an_admin_may_make_it_leave(cluster: LocalCluster) -> None:
    with cluster.client() as api:
        nodes = {n.address: n.name for n in api.nodes().nodes}
    first, second = sorted(nodes)[:2]
    verify = ssl.create_default_context(cafile=str(cluster.ca_file))
    body = {"reason": "test", "grace_s": 5}

    def post(node: str, token: str, payload: object = body) -> int:
        url = f"{cluster.url}/v1/nodes/{node}/leave"
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.post(url, json=payload, headers=headers, verify=verify).status_code

    other_node = (cluster.state_dir / f"agent-{second}" / "node.token").read_text().strip()
    assert post(nodes[first], other_node) == 403  # another node's credential
    assert post(nodes[first], cluster.join_token) == 403
    assert post(nodes[first], cluster.admin_token, {"reason": "", "grace_s": -1}) == 422
    assert post(nodes[first], cluster.admin_token, {"reason": "x", "grace_s": 1e9}) == 422
    assert post("nosuch", cluster.admin_token) == 404


def test_a_leaving_agent_that_cannot_reach_the_head_stops_its_jobs_and_exits(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    with cluster.client() as api:
        job_id = submit(
            api,
            JobSpec(command=["sleep", "300"], workdir=str(tmp_path), nodes=1, gpus_per_node=1),
        )
        info = wait_state(api, job_id, "R")
        address = next(n.address for n in api.nodes().nodes if n.name == info.placement[0].node)
    cluster.kill_head()
    try:
        cluster.signal_agent(address, signal.SIGTERM)
        # Not the 20 s of --leave-grace: nobody to requeue the job, so no reason to wait.
        wait_for("the agent to exit", lambda: not cluster.agent_alive(address) or None, 15)
    finally:
        for stopped in [a for a in cluster.addresses if not cluster.agent_alive(a)]:
            cluster.start_agent(stopped)  # the head's start checks every agent is alive
        cluster.restart_head()
    log = (cluster.log_dir / f"agent-{address}.log").read_text()
    assert "leaving: the head did not take the notice" in log
    with cluster.client() as api:
        # Its job is requeued (its processes were stopped; the agent on the node reports
        # them lost), not failed.
        def requeued() -> JobInfo | None:
            info = api.job(job_id).job
            return info if info.restart_count >= 1 and info.state != "CG" else None

        again = wait_for("the job requeued", requeued, timeout=30)
        assert again.state in ("PD", "R"), describe(api, job_id)
        api.cancel(job_id)
