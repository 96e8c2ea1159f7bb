"""Fault tolerance on a real cluster with a short lease: node crashes, failing and hung ranks,
cooperative preemption, signals, GPU faults. Jobs keep a ledger of their lives
(phalanx.testing.workload)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phalanx.api.models import FaultInjection, JobSpec, SignalSpec
from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from phalanx.testing import workload
from phalanx.testing.invariants import check_never_twice
from tests.e2e.helpers import cancel_all, describe, submit, wait_for, wait_state

HEAD_ARGS = ["--heartbeat", "0.5", "--lease", "2", "--requeue-margin", "1"]
HEAD_ARGS += ["--kill-grace", "2", "--preempt-grace", "5", "--hang-timeout", "0"]
NODES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nodes × 2 fake GPUs, a 2 s lease (a node is down 2 s after its last heartbeat
    and its jobs requeued 1 s later)."""
    state = tmp_path_factory.mktemp("ft")
    with LocalCluster(state, nodes=3, gpus_per_node=2, head_args=HEAD_ARGS) as running:
        yield running


@pytest.fixture
def api(cluster: LocalCluster) -> Iterator[PhalanxClient]:
    with cluster.client() as client:
        yield client
        cancel_all(client)
        for node in client.nodes().nodes:  # a test that drained or crashed a node restores it
            if node.state != "up":
                restore(cluster, client, node.name)


def restore(cluster: LocalCluster, client: PhalanxClient, name: str) -> None:
    if not cluster.agent_alive(name):
        cluster.start_agent(name)
    wait_for(f"{name} to come back", lambda: _state(client, name) in ("up", "drain") or None, 30)
    if _state(client, name) == "drain":
        client.resume(name)


def _state(client: PhalanxClient, name: str) -> str:
    return next(n.state for n in client.nodes().nodes if n.name == name)


def ft_spec(workdir: Path, steps: int, delay: float, *flags: str, **fields: Any) -> JobSpec:
    env = {"LEDGER": str(workdir / "ledger.jsonl"), "OMP_NUM_THREADS": "1"}
    command = workload.command(steps, delay, *flags)
    return JobSpec(command=command, workdir=str(workdir), env=env, **fields)


def ledger(workdir: Path) -> list[dict[str, Any]]:
    return workload.read_ledger(workdir / "ledger.jsonl")


def assert_never_twice(workdir: Path) -> None:
    """No two epochs of the job were ever alive at the same time (from the ranks' ledger)."""
    verdict = check_never_twice(workload.lives(ledger(workdir)))
    assert verdict.ok, verdict.violations


def ranks_stepping(workdir: Path) -> set[int]:
    return {e["rank"] for e in ledger(workdir) if e["event"] == "step"}


def steps_seen(workdir: Path, epoch: int) -> list[int]:
    return [e["step"] for e in ledger(workdir) if e["epoch"] == epoch and e["event"] == "step"]


def test_a_crashed_node_is_marked_down_and_its_job_resumes_elsewhere(
    cluster: LocalCluster, api: PhalanxClient, workdir: Path
) -> None:
    job_id = submit(api, ft_spec(workdir, 40, 0.1))
    info = wait_state(api, job_id, "R")
    first_epoch, node = info.epoch, info.placement[0].node
    wait_for("a few steps", lambda: len(steps_seen(workdir, first_epoch)) >= 5 or None)

    cluster.crash_node(node)

    wait_for(f"{node} down", lambda: _state(api, node) == "down" or None, 30)
    done = wait_state(api, job_id, "CD", timeout=60)
    assert done.restart_count == 1, describe(api, job_id)
    assert done.placement[0].node != node
    second = steps_seen(workdir, done.epoch)
    last_checkpoint = max(steps_seen(workdir, first_epoch))
    # Resumed from its last checkpoint: the ledger line follows the checkpoint, so a crash
    # between the two leaves the checkpoint one step ahead of the ledger.
    assert second[0] - 1 in (last_checkpoint, last_checkpoint + 1)
    assert second[-1] == 40
    begin = [e for e in ledger(workdir) if e["event"] == "begin" and e["epoch"] == done.epoch]
    assert begin[0]["restart"] == 1  # PHALANX_RESTART_COUNT
    assert_never_twice(workdir)
    kinds = [(e.kind, e.message) for e in api.job(job_id).events]
    assert any(k == "nodefail" and node in m for k, m in kinds), kinds
    assert any(k == "requeued" for k, _ in kinds), kinds


def test_a_failing_rank_restarts_the_gang_until_its_restarts_run_out(
    api: PhalanxClient, workdir: Path
) -> None:
    spec = ft_spec(
        workdir, 50, 0.1, "--fail-rank", "1", nodes=2, restart_on_failure=True, max_restarts=1
    )
    job_id = submit(api, spec)

    info = wait_state(api, job_id, ["F"], timeout=60)

    assert (info.restart_count, info.exit_code, info.reason) == (1, "3:0", "RankFailed")
    detail = api.job(job_id)
    assert any("no restarts left (max_restarts 1)" in e.message for e in detail.events)
    # Each run stopped rank 0 soon after rank 1 failed, rather than running all 50 steps.
    for epoch in {e["epoch"] for e in ledger(workdir)}:
        assert max(steps_seen(workdir, epoch)) < 40
    assert_never_twice(workdir)


def test_a_job_that_stops_reporting_progress_is_restarted_naming_the_silent_rank(
    api: PhalanxClient, workdir: Path
) -> None:
    spec = ft_spec(workdir, 400, 0.1, "--report-steps", "2", hang_timeout_s=2, max_restarts=1)
    job_id = submit(api, spec)

    info = wait_state(api, job_id, ["F"], timeout=60)

    assert (info.restart_count, info.reason) == (1, "Hang")
    messages = [e.message for e in api.job(job_id).events]
    assert any("hang: rank 0 reported no progress for 2 s" in m for m in messages), messages


def test_preemption_sends_a_notice_and_the_job_checkpoints_and_requeues(
    api: PhalanxClient, workdir: Path, tmp_path: Path
) -> None:
    victim = submit(
        api, ft_spec(workdir, 400, 0.1, "--exit-on-notice", nodes=3, gpus_per_node=2, qos="low")
    )
    # Every rank runs its handler before the notice (one that has not yet installed it dies
    # of the signal, as documented, and logs nothing).
    wait_for("every rank's steps", lambda: ranks_stepping(workdir) == set(range(6)) or None)
    urgent_dir = tmp_path / "urgent"
    urgent_dir.mkdir()
    urgent = submit(api, ft_spec(urgent_dir, 3, 0.05, qos="high"))

    wait_state(api, urgent, "CD", timeout=60)
    requeued = wait_state(api, victim, ["PD", "R"], timeout=30)

    assert requeued.restart_count == 1, describe(api, victim)
    signals = [e for e in ledger(workdir) if e["event"] == "signal"]
    assert {e["rank"] for e in signals} == set(range(6))
    assert {e["signal"] for e in signals} == {"SIGUSR1"}
    ends = [e for e in ledger(workdir) if e["event"] == "end"]
    assert {e["code"] for e in ends} == {75}
    begin = next(e for e in ledger(workdir) if e["event"] == "begin")
    assert begin["deadline"] == "5"  # PHALANX_PREEMPT_DEADLINE: seconds after the notice
    kinds = [e.kind for e in api.job(victim).events]
    assert "signal" in kinds and "requeued" in kinds


def test_a_preempted_job_that_ignores_the_notice_is_stopped_at_its_deadline(
    api: PhalanxClient, workdir: Path, tmp_path: Path
) -> None:
    victim = submit(
        api, ft_spec(workdir, 4000, 0.1, nodes=3, gpus_per_node=2, qos="low", preempt_grace_s=2)
    )
    wait_for("the victim's steps", lambda: len(ledger(workdir)) >= 6 or None)
    urgent_dir = tmp_path / "urgent"
    urgent_dir.mkdir()
    urgent = submit(api, ft_spec(urgent_dir, 3, 0.05, qos="high"))

    wait_state(api, victim, "PR", timeout=30)
    wait_state(api, urgent, "CD", timeout=60)

    messages = [e.message for e in api.job(victim).events]
    assert any("preemption deadline passed" in m for m in messages), messages
    assert any(e["event"] == "signal" for e in ledger(workdir))
    assert not any(e["event"] == "end" for e in ledger(workdir))  # it never exited itself


def test_a_time_limit_signal_arrives_before_the_limit(api: PhalanxClient, workdir: Path) -> None:
    spec = ft_spec(
        workdir, 4000, 0.1, time_limit_s=4, signal=SignalSpec(signal="SIGUSR2", seconds_before=2)
    )
    job_id = submit(api, spec)

    info = wait_state(api, job_id, ["TO"], timeout=30)

    signals = [e for e in ledger(workdir) if e["event"] == "signal"]
    assert [e["signal"] for e in signals] == ["SIGUSR2"]
    assert info.start_time is not None and signals[0]["t"] < info.start_time + 4


def test_cancel_with_a_signal_only_delivers_it(api: PhalanxClient, workdir: Path) -> None:
    job_id = submit(api, ft_spec(workdir, 4000, 0.1, nodes=2))
    wait_for("both ranks", lambda: len({e["rank"] for e in ledger(workdir)}) == 2 or None)

    api.cancel(job_id, signal="SIGUSR2")

    def signalled() -> bool | None:
        return len([e for e in ledger(workdir) if e["event"] == "signal"]) == 2 or None

    wait_for("the signal to reach both ranks", signalled)
    assert api.job(job_id).job.state == "R"


def test_a_critical_xid_drains_the_node_and_restarts_the_job_elsewhere(
    api: PhalanxClient, workdir: Path
) -> None:
    job_id = submit(api, ft_spec(workdir, 4000, 0.1))
    info = wait_state(api, job_id, "R")
    node, gpu = info.placement[0].node, info.placement[0].gpus[0]
    wait_for("a step", lambda: steps_seen(workdir, info.epoch) or None)

    api.inject_fault(node, FaultInjection(gpu=gpu, kind="xid", code=79))

    wait_for("the restart", lambda: api.job(job_id).job.restart_count == 1 or None, 30)
    assert _state(api, node) in ("drain", "draining")
    reason = next(n.reason for n in api.nodes().nodes if n.name == node) or ""
    assert f"GPU {gpu}: XID 79" in reason
    rerun = wait_state(api, job_id, "R")
    assert rerun.placement[0].node != node


def test_an_application_xid_fails_only_the_job(api: PhalanxClient, workdir: Path) -> None:
    job_id = submit(api, ft_spec(workdir, 4000, 0.1, restart_on_failure=False))
    info = wait_state(api, job_id, "R")
    node, gpu = info.placement[0].node, info.placement[0].gpus[0]

    api.inject_fault(node, FaultInjection(gpu=gpu, kind="xid", code=13))

    ended = wait_state(api, job_id, ["F"], timeout=30)
    assert ended.restart_count == 0
    assert _state(api, node) == "up"
    assert any("XID 13" in e.message for e in api.job(job_id).events)


def test_a_frozen_agent_never_lets_its_job_run_twice(
    cluster: LocalCluster, api: PhalanxClient, workdir: Path
) -> None:
    job_id = submit(api, ft_spec(workdir, 60, 0.1))
    info = wait_state(api, job_id, "R")
    node = info.placement[0].node
    wait_for("a few steps", lambda: len(steps_seen(workdir, info.epoch)) >= 3 or None)

    cluster.signal_agent(node, signal.SIGSTOP)
    try:
        wait_for("the restart", lambda: api.job(job_id).job.restart_count == 1 or None, 30)
        wait_for("steps of the new run", lambda: steps_seen(workdir, info.epoch + 1) or None)
    finally:
        cluster.signal_agent(node, signal.SIGCONT)

    done = wait_state(api, job_id, "CD", timeout=60)
    assert done.restart_count == 1
    assert_never_twice(workdir)
    wait_for(f"{node} back", lambda: _state(api, node) == "up" or None, 30)


def test_a_node_that_keeps_failing_jobs_is_avoided_in_the_next_placement(
    api: PhalanxClient, workdir: Path
) -> None:
    # Five runs of a job that always fails, on three nodes: by the fourth run some node has
    # failed it twice, so at least one run follows an avoidance.
    spec = ft_spec(workdir, 50, 0.05, "--fail-rank", "0", restart_on_failure=True, max_restarts=4)
    job_id = submit(api, spec)

    wait_state(api, job_id, ["F"], timeout=90)

    events = api.job(job_id).events
    avoided = [(e.time, e.node) for e in events if e.kind == "avoid_node"]
    begins = [e for e in ledger(workdir) if e["event"] == "begin"]
    assert len(begins) == 5
    assert avoided, describe(api, job_id)
    # Each run keeps off the nodes avoided before it, unless every node was (blames from
    # earlier tests count too): then the job may run anywhere rather than never.
    for run in begins:
        before = {node for when, node in avoided if when < run["t"]}
        if before != set(NODES):
            assert run["node"] not in before, (run, avoided)


def test_a_rank_failing_because_its_peers_node_died_is_a_node_failure(
    cluster: LocalCluster, api: PhalanxClient, workdir: Path
) -> None:
    # Rank 0 exits 1 once rank 1 is gone, as a collective would fail when a peer's node
    # dies: seconds before the head can know the node is down.
    script = (
        '[ "$PHALANX_RESTART_COUNT" != 0 ] && exit 0\n'
        '[ "$RANK" = 1 ] && { echo $$ > rank1.pid; exec sleep 300; }\n'
        "until [ -s rank1.pid ]; do sleep 0.05; done\n"
        'p=$(cat rank1.pid); while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; exit 1\n'
    )
    spec = JobSpec(command=["bash", "-c", script], workdir=str(workdir), nodes=2)
    job_id = submit(api, spec)
    info = wait_state(api, job_id, "R")
    wait_for("rank 1", lambda: (workdir / "rank1.pid").exists() or None)

    cluster.crash_node(info.placement[1].node)

    done = wait_state(api, job_id, "CD", timeout=60)
    assert done.restart_count == 1, describe(api, job_id)
    assert any(e.kind == "nodefail" for e in api.job(job_id).events), describe(api, job_id)
