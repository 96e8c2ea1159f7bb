"""Builders, waiting helpers, a stand-in head and real agent processes for the agent tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

from phalanx.agent.guard import LEASE_NAME, read_lease
from phalanx.api.models import (
    Assignment,
    DesiredState,
    Heartbeat,
    ProcessStatus,
    RegisterResponse,
)
from phalanx.testing.processes import pid_alive

T = TypeVar("T")

STEP_TOKEN = "step-token-job-7-0123456789"


def assignment(**changes: Any) -> Assignment:
    """A 2-node torchrun assignment of job 7 on node 0, with `changes` applied."""
    fields: dict[str, Any] = {
        "job_id": 7,
        "epoch": 1,
        "name": "train",
        "user": "alice",
        # The agent under test runs it as its own account (tests/security: as others).
        "uid": os.getuid(),
        "gid": os.getgid(),
        "launcher": "torchrun",
        "command": ["true"],
        "script": None,
        "workdir": "/tmp",
        "env": {},
        "gpus": [0, 1],
        "node_rank": 0,
        "nodes": ["n1", "n2"],
        "addresses": ["127.0.0.2", "127.0.0.3"],
        "agent_urls": ["http://127.0.0.2:9001", "http://127.0.0.3:9001"],
        "gpus_per_node": 2,
        "ntasks_per_node": None,
        "cpus_per_task": None,
        "master_addr": "127.0.0.2",
        "master_port": 29500,
        "restart_count": 0,
        "submit_dir": "/home/alice",
        "output": None,
        "error": None,
        "array_job_id": None,
        "array_task_id": None,
        "time_limit_s": None,
        "step_token": STEP_TOKEN,
        "account": None,
        "team": "default",
        "checkpoint_dir": "",  # none: tests that need one set it (the agent creates it)
        "preempt_signal": "SIGUSR1",
        "preempt_grace_s": 30.0,
        "notices": [],
    }
    fields.update(changes)
    return Assignment(**fields)


def desired(
    *jobs: Assignment,
    version: int = 1,
    kill_grace_s: float = 5.0,
    heartbeat_s: float = 1.0,
    lease_s: float = 10.0,
) -> DesiredState:
    """A desired state holding `jobs`."""
    return DesiredState(
        version=version,
        jobs=list(jobs),
        heartbeat_s=heartbeat_s,
        lease_s=lease_s,
        kill_grace_s=kill_grace_s,
    )


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 20.0) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


JOIN_TOKEN = "join-token-for-agent-tests-0123"
NODE_TOKEN = "node-token-for-agent-tests-4567"


class FakeHead:
    """The head's side of register + heartbeat, and nothing else (stdlib HTTP on 127.0.0.1):
    answers every heartbeat with `desired` (holding the long poll when nothing changed) and
    records the beats. `hang()` makes it accept requests and never answer, like a head
    that is stopped or stuck; `answer()` lets them through again."""

    def __init__(self, desired: DesiredState) -> None:
        self.desired = desired
        self.beats: list[Heartbeat] = []  # in arrival order, answered or not
        self.answered = 0  # heartbeats answered
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._closed = threading.Event()
        head = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with contextlib.suppress(OSError):  # the agent may drop a request it gave up
                    head._handle(self, body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _handle(self, req: BaseHTTPRequestHandler, body: bytes) -> None:
        while not self._open.wait(0.05):
            if self._closed.is_set():
                return
        auth = req.headers.get("Authorization", "")
        if req.path == "/v1/agent/register" and auth == f"Bearer {JOIN_TOKEN}":
            s = self.desired
            out = RegisterResponse(
                node_token=NODE_TOKEN, heartbeat_s=s.heartbeat_s, lease_s=s.lease_s
            )
            return _reply(req, 200, out.model_dump_json().encode())
        if req.path != "/v1/agent/heartbeat" or auth != f"Bearer {NODE_TOKEN}":
            return _reply(req, 401, b'{"detail": "invalid token"}')
        beat = Heartbeat.model_validate_json(body)
        with self._lock:
            self.beats.append(beat)
        if beat.version == self.desired.version:
            self._closed.wait(beat.wait_s)  # nothing new: hold the long poll
        if not self._open.is_set():
            return self._handle(req, body)  # hung meanwhile: wait again, record once more
        _reply(req, 200, self.desired.model_dump_json().encode())
        with self._lock:
            self.answered += 1

    def hang(self) -> None:
        """Accept requests, answer none (until `answer()`)."""
        self._open.clear()

    def answer(self) -> None:
        """Answer again, the requests held meanwhile included."""
        self._open.set()

    def processes(self) -> list[ProcessStatus]:
        """The processes of the last heartbeat, or []."""
        with self._lock:
            return list(self.beats[-1].processes or []) if self.beats else []

    def close(self) -> None:
        self._closed.set()
        self._server.shutdown()
        self._server.server_close()


def _reply(req: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    req.send_response(status)
    req.send_header("Content-Type", "application/json")
    req.send_header("Content-Length", str(len(body)))
    req.end_headers()
    req.wfile.write(body)


class AgentProcess:
    """`phalanx agent` as a real process with fake GPUs, logging to `log`."""

    def __init__(
        self, head_url: str, address: str, state_dir: Path, log: Path, extra: Sequence[str] = ()
    ) -> None:
        self.log = log
        argv = [sys.executable, "-m", "phalanx", "agent", "--head", head_url]
        argv += ["--address", address, "--name", address, "--fake-gpus", "1"]
        argv += ["--state-dir", str(state_dir), *extra]
        env = {**os.environ, "PHALANX_JOIN_TOKEN": JOIN_TOKEN}  # never an argument (`ps`)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    def kill(self) -> None:
        """SIGKILL: the agent gets no chance to stop its jobs."""
        self.proc.kill()
        self.proc.wait(timeout=30)

    def leave(self) -> int:
        """SIGUSR2: the agent exits for an upgrade, leaving its jobs running; its status."""
        self.proc.send_signal(signal.SIGUSR2)
        return self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM (the agent stops its jobs), SIGKILL if it does not exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def guards(state_dir: Path) -> list[int]:
    """Pids of the lease guards watching `state_dir`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"phalanx.agent.guard" in argv and str(state_dir).encode() in argv:
            found.append(int(entry.name))
    return [pid for pid in found if pid_alive(pid)]


def lease_left(state_dir: Path) -> float:
    """Seconds until the lease published in `state_dir` runs out (negative: past it)."""
    lease = read_lease(state_dir / LEASE_NAME)
    assert lease is not None
    return lease[1] - time.monotonic()
