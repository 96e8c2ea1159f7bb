"""The whole agent (run_agent) against a minimal stand-in head speaking the wire protocol."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.agent.main import AgentConfig, AgentError, run_agent
from phalanx.api.models import (
    DesiredState,
    Heartbeat,
)

from .helpers import assignment, wait_for
from .stubhead import JOIN, NODE, StubHead, serve


@pytest.fixture
def head(tmp_path: Path) -> Iterator[StubHead]:
    marker = tmp_path / "env.txt"
    job = assignment(
        command=["sh", "-c", f"env > {marker}; echo $MASTER_PORT"],
        workdir=str(tmp_path),
        nodes=["127.0.0.2"],
        addresses=["127.0.0.2"],
        gpus_per_node=1,
        gpus=[0],
        master_port=None,
    )
    desired = DesiredState(version=3, jobs=[job], heartbeat_s=0.5, lease_s=5.0, kill_grace_s=1.0)
    with serve(StubHead(desired)) as stub:
        yield stub


def config(head: StubHead, tmp_path: Path, token: str = JOIN) -> AgentConfig:
    return AgentConfig(
        head_url=head.url,
        token=token,
        address="127.0.0.2",
        name="127.0.0.2",
        state_dir=tmp_path / "agent",
        fake_gpus=2,
        labels={"rack": "r1"},
        heartbeat_s=0.5,
    )


def test_agent_registers_runs_and_reports(head: StubHead, tmp_path: Path) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run_agent(config(head, tmp_path), stop)
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    agent = threading.Thread(target=target)
    agent.start()
    try:

        def exited() -> Heartbeat | None:
            done = [b for b in head.beats if b.processes and not b.processes[0].running]
            return done[-1] if done else None

        beat = wait_for("a heartbeat reporting the rank's exit", exited)
    finally:
        stop.set()
        agent.join(timeout=30)
    assert errors == [] and not agent.is_alive()
    [reg] = head.registered
    assert (reg.name, reg.address, reg.labels, len(reg.gpus)) == (
        "127.0.0.2",
        "127.0.0.2",
        {"rack": "r1"},
        2,
    )
    assert reg.agent_url.startswith("http://127.0.0.2:")
    assert beat.version == 3
    assert beat.master_ports is not None and beat.processes is not None  # full report
    port = beat.master_ports["7"]
    [p] = beat.processes
    assert (p.job_id, p.epoch, p.rank, p.exit_code) == (7, 1, 0, 0)
    assert (tmp_path / "agent" / "logs" / "7" / "e1" / "rank-0.out").read_text() == f"{port}\n"
    env = (tmp_path / "env.txt").read_text()
    for secret in (JOIN, NODE, reg.agent_secret):
        assert secret not in env
    assert f"PATH={tmp_path / 'agent' / 'bin'}:" in env
    assert (tmp_path / "agent" / "bin" / "srun").stat().st_mode & 0o111


def test_bad_join_token_is_a_clear_error(head: StubHead, tmp_path: Path) -> None:
    with pytest.raises(AgentError, match="refused to register this agent: invalid join token"):
        run_agent(config(head, tmp_path, token="wrong-join-token"))
