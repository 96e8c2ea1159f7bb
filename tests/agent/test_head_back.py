"""A head back from an outage (a restart, a standby taking over) is reached by some agents
before others. An agent whose peer already heard from it must try the head at once rather
than fence at its lease while it still waits on a request to the old head: a real agent
process against a stand-in head and peer (real HTTP)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from phalanx.api.models import (
    DesiredState,
    Heartbeat,
    Peer,
    PeerHeadView,
    RegisterResponse,
)
from phalanx.testing.processes import pid_alive

from .helpers import NODE_TOKEN, AgentProcess, assignment, wait_for

ADDRESS = "127.0.0.6"
LEASE_S = 3.0


class OutageHead:
    """Register and heartbeat for one agent, and `GET /v1/peer/head` as its one peer, on one
    server. `out()`: heartbeats are held unanswered and the peer never heard the head.
    `back()`: new heartbeats are answered and the peer heard the head just now, while those
    held during the outage stay unanswered, as a request to a head that has gone away."""

    def __init__(self, desired: DesiredState) -> None:
        self.answered = 0
        self._out = threading.Event()  # set: the head is out
        # The head, restarted, answers the peer (saying so when `busy`) but has not got to
        # this agent yet: its heartbeats are held unanswered.
        self.busy = False
        self._unheard = threading.Event()
        self._closed = threading.Event()
        head = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with contextlib.suppress(OSError):  # the agent may drop a request it gave up
                    head._post(self, body)

            def do_GET(self) -> None:
                age = None if head._out.is_set() else 0.0
                view = PeerHeadView(name="peer-1", head_age_s=age, head_catching_up=head.busy)
                with contextlib.suppress(OSError):
                    _reply(self, 200, view.model_dump_json().encode())

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        peers = [Peer(name="peer-1", agent_url=self.url)]
        self.desired = desired.model_copy(update={"peers": peers})
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _post(self, req: BaseHTTPRequestHandler, body: bytes) -> None:
        if self._out.is_set() or self._unheard.is_set():
            self._closed.wait()  # never answered, also after back()
            return
        if req.path == "/v1/agent/register":
            d = self.desired
            out = RegisterResponse(
                node_token=NODE_TOKEN, heartbeat_s=d.heartbeat_s, lease_s=d.lease_s
            )
            return _reply(req, 200, out.model_dump_json().encode())
        beat = Heartbeat.model_validate_json(body)
        if beat.version == self.desired.version:
            self._closed.wait(beat.wait_s)  # nothing new: hold the long poll
        _reply(req, 200, self.desired.model_dump_json().encode())
        self.answered += 1

    def out(self) -> None:
        self._out.set()

    def back(self) -> None:
        self._out.clear()

    def catching_up(self, busy: bool) -> None:
        """Back for the peer, which heard the head now (`busy`: the head said it is still
        hearing its nodes back); this agent's heartbeats stay unanswered."""
        self.busy = busy
        self._unheard.set()
        self._out.clear()

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


def _job_and_state(tmp_path: Path) -> tuple[Any, DesiredState]:
    """A job that writes its pid and sleeps, and the desired state that runs it."""
    script = f"echo $$ > {tmp_path / 'pid'}; exec sleep 120"
    job = assignment(
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
    desired = DesiredState(
        version=1,
        jobs=[job],
        heartbeat_s=0.5,
        lease_s=LEASE_S,
        kill_grace_s=1.0,
        peer_secret="peer-secret-for-agent-tests-89ab",
        requeue_margin_s=1.0,
        max_outage_s=60.0,
    )
    return job, desired


@contextlib.contextmanager
def _agent_running(tmp_path: Path) -> Iterator[tuple[OutageHead, Path, int]]:
    """A real agent against the stand-in head and peer, running one job: (head, the
    agent's log, the job's pid). Stopped, with its job, afterwards."""
    _, desired = _job_and_state(tmp_path)
    head = OutageHead(desired)
    log = tmp_path / "agent.log"
    agent = AgentProcess(head.url, ADDRESS, tmp_path / "agent", log)
    pid = 0
    try:
        pid = int(wait_for("the rank", lambda: _read(tmp_path / "pid")))
        yield head, log, pid
    finally:
        agent.stop()
        head.close()
        if pid and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_an_agent_whose_peer_heard_the_head_tries_it_at_once_and_keeps_its_job(
    tmp_path: Path,
) -> None:
    with _agent_running(tmp_path) as (head, log, pid):
        head.out()
        wait_for("the agent to ride the outage out", lambda: "the head is out" in log.read_text())
        answered = head.answered
        # Back: the peer heard the head now. The agent's heartbeat sent during the outage
        # will never be answered (its timeout is 10 s away, its lease < 2 s).
        head.back()

        wait_for("a heartbeat answered after the outage", lambda: head.answered > answered)
        wait_for("two more leases", lambda: head.answered > answered + 4 * LEASE_S / 0.5, 30)
        text = log.read_text()
        assert "fenced" not in text, text
        assert "trying the head again now" in text, text
        assert pid_alive(pid)


def _read(path: Path) -> str | None:
    return (path.read_text().strip() or None) if path.is_file() else None


def test_an_agent_rides_on_while_its_peer_hears_the_head_catching_up_and_fences_after(
    tmp_path: Path,
) -> None:
    """A restarted head answers some agents long before others (10,000 reconnecting at
    once). An agent whose peer was answered, but which the head has not got to yet, keeps
    its job while the peer hears the head say it is still catching up (head/rejoin.py);
    once the peer hears that the head caught up, the agent is alone in being unanswered
    and fences at its lease, as before."""
    with _agent_running(tmp_path) as (head, log, pid):
        head.catching_up(True)
        wait_for("the agent to hear of it", lambda: "hearing its nodes back" in log.read_text())
        answered = head.answered
        time.sleep(4 * LEASE_S)  # four leases unanswered
        text = log.read_text()
        assert "fenced" not in text, text
        assert pid_alive(pid)
        assert head.answered == answered  # never answered meanwhile: it rode on
        head.catching_up(False)  # caught up, and still not answering this agent
        wait_for("the agent to fence", lambda: "fenced" in log.read_text(), 3 * LEASE_S)
        wait_for("the rank killed", lambda: not pid_alive(pid), 10)
