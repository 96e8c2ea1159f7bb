"""Fencing and leftovers with real agent processes against a stand-in head (real HTTP)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.agent.processes import ProcessManager
from phalanx.agent.reconcile import LaunchContext, Reconciler
from phalanx.api.models import Assignment, ProcessStatus
from phalanx.testing.processes import pid_alive

from .helpers import (
    AgentProcess,
    FakeHead,
    assignment,
    desired,
    guards,
    lease_left,
    wait_for,
)

ADDRESS = "127.0.0.4"


def job(tmp_path: Path) -> Assignment:
    """One rank that notes each start and keeps a child in its process group."""
    script = f"echo $$ >> {tmp_path / 'starts'}; sleep 60 & echo $! > {tmp_path / 'child'}; wait"
    return assignment(
        command=["sh", "-c", script],
        workdir=str(tmp_path),
        nodes=[ADDRESS],
        addresses=[ADDRESS],
        agent_urls=[f"http://{ADDRESS}:1"],
        gpus=[0],
        gpus_per_node=1,
        master_addr=ADDRESS,
        master_port=None,
    )


@pytest.fixture
def pids() -> Iterator[list[int]]:
    """Job pids to SIGKILL at the end should a test fail halfway."""
    found: list[int] = []
    yield found
    for pid in found:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def running_rank(head: FakeHead) -> ProcessStatus | None:
    return next((p for p in head.processes() if p.running and p.pid is not None), None)


def start(head: FakeHead, tmp_path: Path, pids: list[int]) -> tuple[AgentProcess, int, int]:
    """An agent running the job's rank: (agent, rank pid, the rank's child pid)."""
    agent = AgentProcess(head.url, ADDRESS, tmp_path / "agent", tmp_path / "agent.log")
    rank = wait_for("the rank to run", lambda: running_rank(head))
    assert rank.pid is not None and not rank.lost
    pids.append(rank.pid)
    child = int(wait_for("the rank's child", lambda: _read(tmp_path / "child")))
    pids.append(child)
    return agent, rank.pid, child


def wait_dead(what: str, *pids: int) -> None:
    # A hanging heartbeat only times out after wait_s + 10 s: a kill well before that
    # comes from the lease (1.5 s), not from a failed request.
    wait_for(what, lambda: not any(pid_alive(p) for p in pids), timeout=8.0)


def assert_reported_lost_and_not_rerun(head: FakeHead, tmp_path: Path, pid: int) -> None:
    """Once the head answers again: the rank is reported lost, its epoch never rerun."""
    seen = head.answered
    wait_for("5 more answered heartbeats", lambda: head.answered >= seen + 5)
    [p] = head.processes()
    assert (p.job_id, p.epoch, p.pid, p.running, p.signal, p.lost) == (7, 1, pid, False, 9, True)
    # The desired state still names epoch 1: this agent never starts it again.
    assert (tmp_path / "starts").read_text() == f"{pid}\n"


def test_fences_when_the_head_stops_answering(tmp_path: Path, pids: list[int]) -> None:
    head = FakeHead(desired(job(tmp_path), lease_s=1.5, heartbeat_s=0.2))
    agent, pid, child = start(head, tmp_path, pids)
    try:
        head.hang()  # requests are accepted and never answered
        wait_dead("fencing to kill the rank's process group", pid, child)
        head.answer()
        assert_reported_lost_and_not_rerun(head, tmp_path, pid)
    finally:
        agent.stop()
        head.close()
    assert guards(tmp_path / "agent") == []  # the agent stops its guard when it exits
    log = (tmp_path / "agent.log").read_text().splitlines()
    [fenced] = [line for line in log if "fenced:" in line]
    assert "killed 1 job process group(s) with SIGKILL" in fenced


def test_a_frozen_agent_is_fenced_by_its_guard(tmp_path: Path, pids: list[int]) -> None:
    head = FakeHead(desired(job(tmp_path), lease_s=1.5, heartbeat_s=0.2))
    agent, pid, child = start(head, tmp_path, pids)
    try:
        os.kill(agent.proc.pid, signal.SIGSTOP)  # the agent only: it cannot fence itself
        try:
            wait_dead("the guard to kill the rank's process group", pid, child)
        finally:
            os.kill(agent.proc.pid, signal.SIGCONT)
        assert_reported_lost_and_not_rerun(head, tmp_path, pid)
    finally:
        agent.stop()
        head.close()


def test_the_guard_fences_the_jobs_of_a_killed_agent(tmp_path: Path, pids: list[int]) -> None:
    head = FakeHead(desired(job(tmp_path), lease_s=1.5, heartbeat_s=0.2))
    agent, pid, child = start(head, tmp_path, pids)
    try:
        [guard] = wait_for("the guard", lambda: guards(tmp_path / "agent"))
        agent.kill()  # and no agent comes back: the guard alone ends the jobs
        wait_dead("the guard to kill the rank's process group", pid, child)
        wait_for("the guard to exit", lambda: not pid_alive(guard))
    finally:
        agent.stop()
        head.close()


def test_a_new_agent_adopts_what_a_killed_agent_left_within_its_lease(
    tmp_path: Path, pids: list[int]
) -> None:
    head = FakeHead(desired(job(tmp_path), lease_s=60.0, heartbeat_s=0.2))  # no guard kill
    first, pid, child = start(head, tmp_path, pids)
    second: AgentProcess | None = None
    try:
        first.kill()
        assert pid_alive(pid) and pid_alive(child)  # orphans: their own process group
        head.beats.clear()
        second = AgentProcess(head.url, ADDRESS, tmp_path / "agent", tmp_path / "agent.log")
        # The head never saw the node silent for a lease: nothing can run elsewhere yet.
        [p] = wait_for("the new agent's report", head.processes)
        assert (p.epoch, p.pid, p.running, p.lost) == (1, pid, True, False)
        assert pid_alive(pid) and pid_alive(child)
        assert (tmp_path / "starts").read_text() == f"{pid}\n"  # not started again
    finally:
        if second is not None:
            second.stop()  # SIGTERM: it stops the jobs it adopted
        first.stop()
        head.close()
    wait_dead("the adopted rank stopped with its agent", pid, child)


def test_a_new_agent_kills_what_a_killed_agent_left_past_its_lease(
    tmp_path: Path, pids: list[int]
) -> None:
    head = FakeHead(desired(job(tmp_path), lease_s=1.5, heartbeat_s=0.2))
    first, pid, child = start(head, tmp_path, pids)
    second: AgentProcess | None = None
    try:
        [guard] = wait_for("the guard", lambda: guards(tmp_path / "agent"))
        first.kill()
        os.kill(guard, signal.SIGKILL)  # nobody left to fence: the orphans outlive the lease
        wait_for("the lease to run out", lambda: lease_left(tmp_path / "agent") < 0)
        assert pid_alive(pid) and pid_alive(child)
        head.beats.clear()
        second = AgentProcess(head.url, ADDRESS, tmp_path / "agent", tmp_path / "agent.log")
        # Killed before the new agent registers (its first heartbeat).
        [p] = wait_for("the new agent's report", head.processes)
        assert not pid_alive(pid) and not pid_alive(child)
        assert (p.epoch, p.pid, p.running, p.signal, p.lost) == (1, None, False, 9, True)
        assert (tmp_path / "starts").read_text() == f"{pid}\n"  # not started again
    finally:
        if second is not None:
            second.stop()
        first.stop()
        head.close()


def _read(path: Path) -> str | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return text.strip() or None


def test_fence_kills_at_once_starts_nothing_and_never_reruns(tmp_path: Path) -> None:
    """In process: what a fence does to the reconciler's ranks, then after resume()."""
    ctx = LaunchContext(state_dir=tmp_path / "state", base_env={"PATH": os.environ["PATH"]})
    rec = Reconciler(ctx, ProcessManager())
    ignores_term = ["sh", "-c", "trap '' TERM; sleep 60 & wait"]
    common = {"workdir": str(tmp_path), "gpus_per_node": 1, "gpus": [0]}
    running = assignment(command=ignores_term, **common)
    # Job 8 on node 1 of 2 waits for the master port when the fence comes.
    waiting = assignment(
        job_id=8,
        step_token="step-token-job-8-xxxxxxxx",
        node_rank=1,
        master_port=None,
        command=["true"],
        **common,
    )
    try:
        rec.apply(desired(running, waiting, kill_grace_s=60.0))
        [rank] = rec.process_statuses()
        assert rank.pid is not None and rank.running
        pid = rank.pid
        assert rec.fence() == 1
        # SIGKILL, not SIGTERM + 60 s grace: the rank that ignores SIGTERM is gone at once.
        wait_for("the fenced rank to end", lambda: not rec.process_statuses()[0].running)
        [rank] = rec.process_statuses()
        assert (rank.pid, rank.signal, rank.lost) == (pid, 9, True)
        assert not pid_alive(pid)

        port = waiting.model_copy(update={"master_port": 29500})
        rec.apply(desired(running, port, version=2, kill_grace_s=60.0))
        assert [p.job_id for p in rec.process_statuses()] == [7]  # fenced: starts nothing

        rec.resume()
        fresh = assignment(
            job_id=9, step_token="step-token-job-9-xxxxxxxx", command=["true"], **common
        )
        rec.apply(desired(running, port, fresh, version=3, kill_grace_s=60.0))
        done = wait_for(
            "job 9 to run and end",
            lambda: [p for p in rec.process_statuses() if p.job_id == 9 and not p.running],
        )
        assert (done[0].exit_code, done[0].lost) == (0, False)
        # Job 8 was desired when the node was fenced: reported lost, never started.
        [eight] = [p for p in rec.process_statuses() if p.job_id == 8]
        assert (eight.pid, eight.signal, eight.lost) == (None, 9, True)
        assert [p.pid for p in rec.process_statuses() if p.job_id == 7] == [pid]
    finally:
        rec.shutdown()
