"""The agent API under a flood of junk: unauthenticated or oversized requests are refused
(401/413) before their bodies are read, so the agent's memory stays bounded, its heartbeat
keeps going and its job keeps running (a real head, agent and job; a short lease, so a
stalled agent would fence its job within seconds)."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from phalanx.agent.server import MAX_BODY_BYTES
from phalanx.api.models import JobSpec
from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from phalanx.testing.processes import pid_alive
from tests.head.heads import wait_for

HUGE = 65 * 1024 * 1024  # the body that once stalled an agent for 8.5 s at ~1 GB RSS
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state = tmp_path_factory.mktemp("agent-api")
    flags = ["--heartbeat", "0.5", "--lease", "2", "--requeue-margin", "1"]
    # Plain HTTP on loopback: the raw-socket probes below speak HTTP/1.1 by hand, and the
    # checks under test sit in front of the app whatever the transport (test_tls.py covers
    # the agents' TLS).
    with LocalCluster(state, nodes=1, gpus_per_node=1, head_args=flags, tls=False) as running:
        yield running


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.is_file() else None


def _memory_kib(pid: int, field: str) -> int:
    """VmRSS (now) or VmHWM (the peak so far) of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def _raw(url: str, head: bytes, body: bytes) -> int:
    """Send a request's head and the start of its body on a raw socket; the answer's status
    (the server must answer without waiting for the rest of the body)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head + body)
        answer = sock.recv(4096)
    return int(answer.split(b" ", 2)[1])


def _junk(agent_url: str, client: httpx.Client, n: int) -> int:
    """One unauthenticated or wrongly authenticated request, varied by `n`; its status."""
    paths = ["/v1/steps", "/v1/logs/1", "/v1/faults", "/v1/steps/1/0", "/nope", "/docs"]
    auths = [{}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic eDp5"}]
    auths += [{"Authorization": "Bearer"}, {"Authorization": "x" * 2000}]
    path, auth = paths[n % len(paths)], auths[n % len(auths)]
    if n % 2:
        r = client.post(agent_url + path, content=b"{" * (n * 97 % 50_000), headers=auth)
    else:
        r = client.get(agent_url + path, headers=auth)
    return r.status_code


def test_a_flood_of_junk_is_refused_and_the_job_keeps_running(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    with cluster.client() as client:
        script = (
            f"echo $PHALANX_STEP_TOKEN > {tmp_path}/token; echo $$ > {tmp_path}/pid.tmp; "
            f"mv {tmp_path}/pid.tmp {tmp_path}/pid; exec sleep 600"
        )
        spec = JobSpec(command=["sh", "-c", script], workdir=str(tmp_path))
        [job_id] = client.submit(spec).job_ids
        pid = int(wait_for("the job's pid", lambda: _read(tmp_path / "pid")))
        token = wait_for("the job's step token", lambda: _read(tmp_path / "token"))
        [node] = client.nodes().nodes
        agent_url = node.agent_url
        agent_pid = cluster.processes()[1].pid
        peak_before = _memory_kib(agent_pid, "VmHWM")
        _flood(agent_url, token, job_id)
        peak_after = _memory_kib(agent_pid, "VmHWM")
        # Not one of the huge bodies was held in memory (the peak includes any spike).
        assert peak_after - peak_before < 64 * 1024, (peak_before, peak_after)
        _assert_unharmed(client, cluster, job_id, pid)
        # Its own callers are still served: the job's token reads its logs.
        r = httpx.get(f"{agent_url}/v1/logs/{job_id}", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and r.json()["job_id"] == job_id
        client.cancel(job_id)


def _flood(agent_url: str, token: str, job_id: int) -> None:
    host = urlsplit(agent_url).netloc.encode()
    start = b"POST /v1/steps HTTP/1.1\r\nHost: " + host + b"\r\nContent-Type: application/json\r\n"
    declared = b"Content-Length: %d\r\n" % HUGE
    chunked = b"Transfer-Encoding: chunked\r\n"
    bearer = b"Authorization: Bearer " + token.encode() + b"\r\n"
    piece = b"[" * (64 * 1024)
    first_chunk = b"%x\r\n" % len(piece) + piece + b"\r\n"
    # Huge bodies: no token (401) or the job's own token (413), declared or chunked; each
    # answered after at most the first 64 KiB was sent.
    for _ in range(3):
        assert _raw(agent_url, start + declared + b"\r\n", piece) == 401
        assert _raw(agent_url, start + chunked + b"\r\n", first_chunk) == 401
        assert _raw(agent_url, start + declared + bearer + b"\r\n", piece) == 413
    # A chunked body the job's token streams past the limit: 413 once past it.
    body = itertools.repeat(piece, (MAX_BODY_BYTES + 2 * MIB) // len(piece))
    r = httpx.post(
        agent_url + "/v1/steps",
        content=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    assert r.status_code == 413 and "larger than" in r.json()["detail"]
    # Hundreds of small junk requests from 8 threads at once.
    with httpx.Client(timeout=30) as http, ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda n: _junk(agent_url, http, n), range(400)))
    assert set(statuses) == {401}, sorted(set(statuses))


def _assert_unharmed(client: PhalanxClient, cluster: LocalCluster, job_id: int, pid: int) -> None:
    """The job runs on as it was: the same pid, never restarted, its node up and not
    fenced (a few more heartbeats came in after the flood)."""
    [node] = client.nodes().nodes
    assert node.last_heartbeat is not None
    since = node.last_heartbeat
    wait_for("more heartbeats", lambda: (client.nodes().nodes[0].last_heartbeat or 0) > since + 1)
    info = client.job(job_id).job
    [node] = client.nodes().nodes
    assert (info.state, info.restart_count, node.state) == ("R", 0, "up")
    assert pid_alive(pid)
    assert all(p.poll() is None for p in cluster.processes())
    log = (cluster.log_dir / f"agent-{node.name}.log").read_text()
    assert "fenced" not in log, log[-2000:]
