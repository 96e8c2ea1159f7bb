"""Real agent API servers (uvicorn in a thread) with hand-made desired states, no head."""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from phalanx.agent.env import job_env
from phalanx.agent.execrun import ExecManager
from phalanx.agent.processes import ProcessManager
from phalanx.agent.reconcile import LaunchContext, Reconciler
from phalanx.agent.server import create_app
from phalanx.agent.slurm_cmds import write_shims
from phalanx.agent.steps import StepManager
from phalanx.api.models import Assignment, DesiredState

from .helpers import wait_for

AGENT_SECRET = "agent-secret-0123456789abcdef"


@dataclass
class Agent:
    """One agent's API on `address`, its reconciler, step and exec managers."""

    address: str
    url: str
    ctx: LaunchContext
    reconciler: Reconciler
    steps: StepManager
    execs: ExecManager
    server: uvicorn.Server
    thread: threading.Thread

    def apply(self, state: DesiredState) -> None:
        self.reconciler.apply(state)

    def job_env(self, a: Assignment) -> dict[str, str]:
        """What a batch script of `a` on this node sees."""
        return job_env(
            a,
            base=self.ctx.base_env,
            bin_dir=self.ctx.bin_dir,
            job_dir=self.ctx.job_dir(a.job_id, a.epoch),
            secrets=self.ctx.secrets,
        )

    def close(self) -> None:
        self.reconciler.shutdown()
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_agent(address: str, state_dir: Path) -> Agent:
    """Serve the agent API on `address` (free port) in a background thread."""
    ctx = LaunchContext(
        state_dir=state_dir,
        base_env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")},
        secrets={AGENT_SECRET},
    )
    write_shims(ctx.bin_dir)
    procs = ProcessManager()
    steps = StepManager(ctx, procs)
    reconciler = Reconciler(ctx, procs, on_stop_job=steps.stop_undesired)
    execs = ExecManager(ctx, procs, reconciler)
    app = create_app(secret=AGENT_SECRET, reconciler=reconciler, steps=steps, execs=execs)
    sock = socket.socket()
    sock.bind((address, 0))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for("the agent API to start", lambda: server.started)
    url = f"http://{address}:{sock.getsockname()[1]}"
    return Agent(address, url, ctx, reconciler, steps, execs, server, thread)
