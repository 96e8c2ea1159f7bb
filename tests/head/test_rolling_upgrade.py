"""Rolling upgrades (docs/control-plane.md): a real head, and agents and clients of other
releases. One minor version apart they talk (unknown fields ignored); another major is
refused with a message naming both versions; what users write stays strict."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from phalanx.api import version
from phalanx.api.models import JobDetail, JobSpec
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.testing import newer_agent
from phalanx.testing.processes import pid_alive
from tests.head.heads import PHALANX, Proc, wait_for

LEASE_S = 2.0
HEAD_FLAGS = [
    "--plain-http",
    "--users-map-to-self",
    "--heartbeat",
    "0.5",
    "--lease",
    str(LEASE_S),
    "--requeue-margin",
    "1",
]


class Head:
    def __init__(self, proc: Proc, url: str, state_dir: Path) -> None:
        self.proc, self.url, self.state_dir = proc, url, state_dir

    def token(self, name: str) -> str:
        return (self.state_dir / f"{name}.token").read_text().strip()

    def client(self) -> PhalanxClient:
        return PhalanxClient(self.url, self.token("admin"))


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    """`phalanx head --port 0` (a short lease: a refused heartbeat shows within seconds)."""
    state = tmp_path_factory.mktemp("upgrade") / "head"
    argv = [*PHALANX, "head", "--state-dir", str(state), "--port", "0", *HEAD_FLAGS]
    proc = Proc(argv, state.parent / "head.log")

    def announced() -> str | None:
        if not proc.alive():
            raise AssertionError(f"the head exited:\n{proc.tail()}")
        found = re.search(r"head listening on (http://\S+)", proc.log.read_text())
        return found.group(1) if found else None

    try:
        yield Head(proc, wait_for("the head to announce its URL", announced), state)
    finally:
        proc.stop()


def release_agent(head: Head, api: str, address: str, workdir: Path) -> Proc:
    """An agent of another release: API version `api`, and new fields in what it sends."""
    argv = [*newer_agent.argv_prefix(api), "agent", "--head", head.url]
    argv += ["--address", address, "--name", address, "--port", "0", "--fake-gpus", "1"]
    argv += ["--state-dir", str(workdir / f"agent-{address}")]
    env = {"PHALANX_JOIN_TOKEN": head.token("join")}
    return Proc(argv, workdir / f"agent-{address}.log", env)


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def test_a_head_on_port_0_announces_the_port_it_listens_on(head: Head) -> None:
    port = int(head.url.rsplit(":", 1)[1])
    assert port != 0
    r = httpx.get(head.url + "/healthz", timeout=10)
    assert r.status_code == 200 and r.headers[version.HEADER] == version.API_VERSION


def test_an_agent_one_minor_version_ahead_keeps_its_job_running(head: Head, tmp_path: Path) -> None:
    agent = release_agent(head, "1.99", "127.0.0.2", tmp_path)
    try:
        with head.client() as client:

            def node_up() -> bool:
                if not agent.alive():
                    raise AssertionError(f"the agent exited:\n{agent.tail()}")
                return any(n.name == "127.0.0.2" and n.state == "up" for n in client.nodes().nodes)

            wait_for("the newer agent's node to be up", node_up)
            pid_file = tmp_path / "pid"
            spec = JobSpec(
                command=[
                    "sh",
                    "-c",
                    f"echo $$ > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}; exec sleep 600",
                ],
                workdir=str(tmp_path),
            )
            [job_id] = client.submit(spec).job_ids
            pid = int(wait_for("the job's pid", lambda: _read(pid_file)))

            def heartbeat() -> float:
                [node] = [n for n in client.nodes().nodes if n.name == "127.0.0.2"]
                assert node.last_heartbeat is not None
                return node.last_heartbeat

            # Heartbeats (with fields and a version this head does not know) keep being
            # taken for two leases: a refused one would have fenced the job by then.
            first = heartbeat()
            wait_for("two leases of heartbeats", lambda: heartbeat() > first + 2 * LEASE_S)
            info = client.job(job_id).job
            assert (info.state, info.restart_count) == ("R", 0)
            assert pid_alive(pid)
            client.cancel(job_id)
    finally:
        agent.stop()
    assert "fenced" not in agent.tail()


def test_an_agent_of_another_major_version_is_refused_by_name(head: Head, tmp_path: Path) -> None:
    agent = release_agent(head, "2.0", "127.0.0.3", tmp_path)
    try:
        status = agent.popen.wait(timeout=60)
    finally:
        agent.stop()
    out = agent.tail()
    assert status == 2, out  # the CLI's usage error: nothing to retry
    assert (
        f"the head refused to register this agent: Phalanx API version mismatch: this agent "
        f"speaks API 2.0 and the head at {head.url} speaks {version.API_VERSION}"
    ) in out
    assert "Traceback" not in out


def test_the_head_refuses_another_major_version_and_serves_a_newer_minor(head: Head) -> None:
    auth = {"Authorization": f"Bearer {head.token('admin')}"}
    refused = httpx.get(head.url + "/v1/whoami", headers={**auth, version.HEADER: "2.3"})
    assert refused.status_code == 400
    assert refused.headers[version.HEADER] == version.API_VERSION
    assert refused.json()["detail"].startswith(
        f"Phalanx API version mismatch: this head speaks API {version.API_VERSION} and the "
        "caller speaks 2.3"
    )
    bad = httpx.get(head.url + "/v1/whoami", headers={**auth, version.HEADER: "banana"})
    assert bad.status_code == 400 and "expected MAJOR.MINOR" in bad.json()["detail"]
    for sent in ({version.HEADER: "1.42"}, {}):  # a newer minor; or no header (curl)
        r = httpx.get(head.url + "/v1/whoami", headers={**auth, **sent})
        assert r.status_code == 200 and r.json()["user"] == "admin"


def test_a_misspelt_field_in_a_job_spec_is_still_an_error(head: Head, tmp_path: Path) -> None:
    spec = JobSpec(command=["true"], workdir=str(tmp_path)).model_dump(mode="json")
    spec["gpus_per_nod"] = 8
    r = httpx.post(
        head.url + "/v1/jobs",
        json=spec,
        headers={"Authorization": f"Bearer {head.token('admin')}"},
    )
    assert r.status_code == 422 and "gpus_per_nod" in r.text


# ----------------------------------------------------------------------------- the client
def _detail(extra: dict[str, Any]) -> dict[str, Any]:
    """A JobDetail's JSON with `extra` fields added at every level (a newer head's)."""
    spec = {**JobSpec(command=["true"], workdir="/w").model_dump(mode="json"), **extra}
    info = {
        "id": 1, "name": "job", "user": "u", "team": "default", "account": None, "qos": "normal",
        "priority": 1, "state": "R", "reason": None, "reason_message": None, "nodes": 1,
        "gpus_per_node": 1, "launcher": "torchrun", "time_limit_s": None, "submit_time": 1.0,
        "start_time": 2.0, "end_time": None, "exit_code": None, "restart_count": 0, "epoch": 1,
        "array_job_id": None, "array_task_id": None, "workdir": "/w",
        "placement": [{"node": "n1", "address": "a", "gpus": [0], **extra}],
    }  # fmt: skip
    event = {"time": 1.0, "kind": "submitted", "message": "m", **extra}
    return {"job": {**info, **extra}, "spec": spec, "events": [event], **extra}


class OneAnswer:
    """A stand-in head on loopback answering every GET with `body` and `headers`."""

    def __init__(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(body).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                for name, value in {**headers, "Content-Type": "application/json"}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_client_ignores_fields_it_does_not_know_in_answers() -> None:
    stub = OneAnswer(_detail({"from_the_future": [1, 2]}), {version.HEADER: "1.7"})
    try:
        with PhalanxClient(stub.url, "token") as client:
            detail = client.job(1)
    finally:
        stub.close()
    assert detail == JobDetail.model_validate_json(json.dumps(_detail({})))


def test_the_client_refuses_a_head_of_another_major_version_by_name() -> None:
    stub = OneAnswer(_detail({}), {version.HEADER: "2.0"})
    try:
        with PhalanxClient(stub.url, "token") as client, pytest.raises(ApiError) as caught:
            client.job(1)
    finally:
        stub.close()
    assert caught.value.detail.startswith(
        f"Phalanx API version mismatch: this client speaks API {version.API_VERSION} and the "
        f"head at {stub.url} speaks 2.0"
    )
