"""The whole agent (run_agent) against a minimal stand-in head speaking the wire protocol."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Header, HTTPException

from phalanx.agent.main import AgentConfig, AgentError, run_agent
from phalanx.api.models import (
    DesiredState,
    Heartbeat,
    RegisterRequest,
    RegisterResponse,
)

from .helpers import assignment, wait_for

JOIN = "join-token-abcdefghijklmnop"
NODE = "node-token-qrstuvwxyz012345"


@dataclass
class StubHead:
    """Records what the agent sends; answers one fixed desired state (long poll honoured)."""

    desired: DesiredState
    registered: list[RegisterRequest] = field(default_factory=list)
    beats: list[Heartbeat] = field(default_factory=list)
    url: str = ""

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/agent/register")
        def register(req: RegisterRequest, authorization: str = Header("")) -> RegisterResponse:
            if authorization != f"Bearer {JOIN}":
                raise HTTPException(401, "invalid join token")
            self.registered.append(req)
            return RegisterResponse(node_token=NODE, heartbeat_s=0.5, lease_s=5.0)

        @app.post("/v1/agent/heartbeat")
        async def heartbeat(beat: Heartbeat, authorization: str = Header("")) -> DesiredState:
            if authorization != f"Bearer {NODE}":
                raise HTTPException(401, "invalid node token")
            self.beats.append(beat)
            if beat.version == self.desired.version:
                await asyncio.sleep(beat.wait_s)  # nothing will change: hold the long poll
            return self.desired

        return app


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
    stub = StubHead(
        DesiredState(version=3, jobs=[job], heartbeat_s=0.5, lease_s=5.0, kill_grace_s=1.0)
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(stub.app(), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for("the stub head", lambda: server.started)
    stub.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    yield stub
    server.should_exit = True
    thread.join(timeout=10)


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
