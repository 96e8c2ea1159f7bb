"""One agent per --state-dir: a second is refused, naming the first, which runs on untouched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from phalanx.testing.processes import pid_alive

from .helpers import JOIN_TOKEN, AgentProcess, FakeHead, assignment, desired, wait_for

ADDRESS = "127.0.0.5"


def test_a_second_agent_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    job = assignment(
        command=["sleep", "600"],
        workdir=str(tmp_path),
        nodes=[ADDRESS],
        addresses=[ADDRESS],
        agent_urls=[f"http://{ADDRESS}:1"],
        gpus=[0],
        gpus_per_node=1,
        master_addr=ADDRESS,
        master_port=None,
    )
    head = FakeHead(desired(job, heartbeat_s=0.2, lease_s=5.0))
    state_dir = tmp_path / "agent"
    first = AgentProcess(head.url, ADDRESS, state_dir, tmp_path / "first.log")
    rank_pid = None
    try:
        rank = wait_for(
            "the first agent's rank to run",
            lambda: next((p for p in head.processes() if p.running and p.pid), None),
        )
        rank_pid = rank.pid
        assert rank_pid is not None
        argv = [sys.executable, "-m", "phalanx", "agent", "--head", head.url]
        argv += ["--address", ADDRESS, "--name", ADDRESS, "--fake-gpus", "1"]
        argv += ["--state-dir", str(state_dir)]
        second = subprocess.run(
            argv,
            env={**os.environ, "PHALANX_JOIN_TOKEN": JOIN_TOKEN},  # never an argument (`ps`)
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2, second.stdout + second.stderr
        message = (
            f"another agent is running on this state directory (pid {first.proc.pid}): "
            f"{state_dir.resolve()}"
        )
        assert message in second.stderr and "Traceback" not in second.stderr
        # The first agent and its job are untouched, and it keeps heartbeating.
        seen = head.answered
        wait_for("3 more answered heartbeats", lambda: head.answered >= seen + 3)
        assert first.proc.poll() is None and pid_alive(rank_pid)
        [p] = head.processes()
        assert (p.pid, p.running, p.lost) == (rank_pid, True, False)
    finally:
        first.stop()
        head.close()
        if rank_pid is not None and pid_alive(rank_pid):
            os.kill(rank_pid, signal.SIGKILL)
    # Stopped, it let go of the lock: an agent can start on that state dir again.
    head = FakeHead(desired())
    again = AgentProcess(head.url, ADDRESS, state_dir, tmp_path / "again.log")
    try:
        wait_for("a heartbeat of the agent started again", lambda: head.beats)
    finally:
        again.stop()
        head.close()
