"""Node identity, token lifetimes and roles, and state at rest, against a real head over
real HTTP (issue 11; docs/security-tokens.md).

Node tests come first: their victim node has the only GPU, so the jobs later tests queue
(and leave pending) cannot take it."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import httpx

from tests.head.conftest import HeadProc, start_head, stop_head

JOB: dict[str, Any] = {"command": ["sleep", "1000"], "workdir": "/tmp"}
GPU = {"index": 0, "uuid": "GPU-victim-0", "model": "H100", "memory_mb": 81920}


def _register(
    head: HeadProc, token: str, name: str, address: str = "127.0.0.2", gpus: int = 0
) -> httpx.Response:
    body = {
        "name": name,
        "address": address,
        "agent_url": f"http://{address}:9",
        "agent_secret": "agent-secret-0123456789",
        "cpus": 4,
        "memory_mb": 4096,
        "gpus": [GPU] * gpus,
    }
    return httpx.post(
        head.url + "/v1/agent/register", json=body, headers=_bearer(token), timeout=30
    )


def _beat(
    head: HeadProc, token: str, name: str, processes: list[dict[str, Any]] | None = None
) -> httpx.Response:
    body = {"name": name, "version": 0, "processes": processes or []}
    return httpx.post(
        head.url + "/v1/agent/heartbeat", json=body, headers=_bearer(token), timeout=30
    )


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _running(job_id: int, epoch: int) -> list[dict[str, Any]]:
    now = time.time()
    proc = {"job_id": job_id, "epoch": epoch, "rank": 0, "local_rank": 0, "pid": 4242}
    return [{**proc, "running": True, "started_at": now}]


def _wait(what: str, probe: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _join_token(head: HeadProc, **spec: Any) -> str:
    r = head.client().post("/v1/join-tokens", json=spec)
    assert r.status_code == 201, r.text
    token: str = r.json()["token"]
    return token


def _user(admin: httpx.Client, name: str, teams: list[str], **token: Any) -> str:
    r = admin.post("/v1/users", json={"name": name, "teams": teams})
    assert r.status_code == 201, r.text
    r = admin.post("/v1/tokens", json={"user": name, **token})
    assert r.status_code == 201, r.text
    value: str = r.json()["token"]
    return value


# ----------------------------------------------------------------------------- nodes
def test_join_token_cannot_take_over_a_live_node_or_forge_its_heartbeats(head: HeadProc) -> None:
    r = _register(head, head.join_token, "n1", gpus=1)
    assert r.status_code == 200, r.text
    victim = r.json()["node_token"]
    assert _beat(head, victim, "n1").status_code == 200
    admin = head.client()
    r = admin.post("/v1/jobs", json={**JOB, "env": {"SECRET": "victim-secret"}})
    assert r.status_code == 201, r.text
    job = r.json()["job_ids"][0]

    def assigned() -> int | None:
        desired = _beat(head, victim, "n1").json()
        return next((a["epoch"] for a in desired["jobs"] if a["job_id"] == job), None)

    epoch = _wait("the job to be assigned to n1", assigned)
    assert _beat(head, victim, "n1", _running(job, epoch)).status_code == 200

    # The join token under the live node's name: refused, and nothing of n1's leaks.
    r = _register(head, head.join_token, "n1", address="127.0.0.66", gpus=1)
    assert r.status_code == 409, r.text
    assert "alive" in r.json()["detail"] and "node_token" not in r.json()
    assert "victim-secret" not in r.text

    # A credential of its own (node "evil") cannot speak for n1: not its heartbeats, not
    # its reports (a forged exit of n1's job), not a re-registration as n1.
    r = _register(head, head.join_token, "evil", address="127.0.0.66")
    assert r.status_code == 200, r.text
    evil = r.json()["node_token"]
    exited = [{**_running(job, epoch)[0], "running": False, "exit_code": 1}]
    for processes in (None, exited):
        r = _beat(head, evil, "n1", processes)
        assert r.status_code == 403, r.text
        assert "victim-secret" not in r.text
    assert _register(head, evil, "n1", gpus=1).status_code == 403
    assert _beat(head, evil, "evil").status_code == 200  # as itself it may

    # The victim is untouched: still its credential, its job still running there.
    desired = _beat(head, victim, "n1", _running(job, epoch)).json()
    assert [a["job_id"] for a in desired["jobs"]] == [job]
    assert desired["jobs"][0]["env"]["SECRET"] == "victim-secret"
    detail = admin.get(f"/v1/jobs/{job}").json()
    assert detail["job"]["state"] == "R", detail

    # The node re-registers as itself with its own credential (an agent restart).
    r = _register(head, victim, "n1", gpus=1)
    assert r.status_code == 200, r.text
    victim = r.json()["node_token"]
    assert _beat(head, victim, "n1", _running(job, epoch)).status_code == 200

    # An admin replaces the node: its credential dies and the name is free at once.
    r = admin.post("/v1/nodes/n1/replace")
    assert r.status_code == 200, r.text
    assert _beat(head, victim, "n1").status_code == 401
    assert head.client(victim).post("/v1/nodes/n1/replace").status_code == 401
    r = _register(head, head.join_token, "n1", gpus=1)
    assert r.status_code == 200, r.text
    assert head.client(head.join_token).post("/v1/nodes/n1/replace").status_code == 403


def test_single_use_and_expired_join_tokens_are_refused(head: HeadProc) -> None:
    once = _join_token(head, single_use=True)
    assert _register(head, once, "once-a").status_code == 200
    r = _register(head, once, "once-b")
    assert r.status_code == 401, r.text
    short = _join_token(head, expires_s=1)
    listed = head.client().get("/v1/tokens").json()["tokens"]
    assert any(t["kind"] == "join" and t["single_use"] and t["revoked"] for t in listed)
    time.sleep(1.2)
    r = _register(head, short, "late")
    assert r.status_code == 401, r.text
    assert "expired" in r.json()["detail"]
    # The join token the head wrote at first start expires too (after a day by default).
    first = [t for t in listed if t["kind"] == "join" and t["description"] == "bootstrap"]
    assert first and all(0 < t["expires"] - time.time() <= 86400 for t in first)


def test_join_token_bound_to_names_and_addresses(head: HeadProc) -> None:
    named = _join_token(head, nodes=["gpu-*", "login1"])
    r = _register(head, named, "cpu-1")
    assert r.status_code == 403 and "only for nodes" in r.json()["detail"], r.text
    assert _register(head, named, "gpu-7").status_code == 200
    assert _register(head, named, "login1").status_code == 200
    # The test's connection comes from 127.0.0.1: a 10/8 binding refuses it even when the
    # node claims an address inside the range.
    remote = _join_token(head, addresses=["10.0.0.0/8"])
    r = _register(head, remote, "gpu-8", address="10.0.0.5")
    assert r.status_code == 403 and "connection" in r.json()["detail"], r.text
    local = _join_token(head, addresses=["127.0.0.0/8"])
    assert _register(head, local, "gpu-9", address="10.1.1.1").status_code == 403
    assert _register(head, local, "gpu-9", address="127.0.0.9").status_code == 200
    r = head.client().post("/v1/join-tokens", json={"addresses": ["not-a-range"]})
    assert r.status_code == 422, r.text


# ----------------------------------------------------------------------------- tokens
def test_token_cannot_mint_a_longer_lived_token(head: HeadProc) -> None:
    admin = head.client()
    short = _user(admin, "minter", ["default"], expires_s=600)
    c = head.client(short)
    expires = c.get("/v1/tokens").json()["tokens"][0]["expires"]
    r = c.post("/v1/tokens", json={"user": "minter", "expires_s": 3600})
    assert r.status_code == 403 and "outlives" in r.json()["detail"], r.text
    r = c.post("/v1/tokens", json={"user": "minter", "expires_s": 60})
    assert r.status_code == 201, r.text
    child = r.json()
    r = c.post("/v1/tokens", json={"user": "minter"})  # the 90-day default: capped
    assert r.status_code == 201 and r.json()["expires"] == expires, r.text
    # A token minted by a token dies with it.
    minted = c.get("/v1/tokens").json()["tokens"]
    parent = next(t["id"] for t in minted if t["expires"] == expires and t["id"] < child["id"])
    assert c.delete(f"/v1/tokens/{parent}").status_code == 204
    assert head.client(child["token"]).get("/v1/whoami").status_code == 401
    # Admins' default tokens for users expire (90 days).
    issued = admin.post("/v1/tokens", json={"user": "minter"}).json()
    assert 89 * 86400 < issued["expires"] - time.time() <= 90 * 86400


def test_expired_token_is_refused(head: HeadProc) -> None:
    admin = head.client()
    issued = admin.post("/v1/tokens", json={"user": "admin", "expires_s": 1}).json()
    c = head.client(issued["token"])
    assert c.get("/v1/whoami").status_code == 200
    time.sleep(1.2)
    r = c.get("/v1/whoami")
    assert r.status_code == 401 and "expired" in r.json()["detail"], r.text


def test_users_list_and_revoke_their_own_tokens_only(head: HeadProc) -> None:
    admin = head.client()
    alice = head.client(_user(admin, "tok-alice", ["default"]))
    bob = head.client(_user(admin, "tok-bob", ["default"]))
    extra = alice.post("/v1/tokens", json={"user": "tok-alice", "description": "ci"}).json()
    mine = alice.get("/v1/tokens").json()["tokens"]
    assert {t["user"] for t in mine} == {"tok-alice"} and len(mine) == 2
    bobs = bob.get("/v1/tokens").json()["tokens"]
    assert [t["user"] for t in bobs] == ["tok-bob"]
    assert bob.delete(f"/v1/tokens/{extra['id']}").status_code == 403
    assert bob.delete(f"/v1/tokens/{bobs[0]['id'] + 10**6}").status_code == 404
    assert bob.post("/v1/tokens", json={"user": "tok-alice"}).status_code == 403
    assert alice.delete(f"/v1/tokens/{extra['id']}").status_code == 204
    assert head.client(extra["token"]).get("/v1/whoami").status_code == 401
    assert alice.get("/v1/whoami").status_code == 200
    own = admin.get("/v1/tokens?all=false").json()["tokens"]
    assert {t["user"] for t in own} == {"admin"}
    assert len(admin.get("/v1/tokens").json()["tokens"]) > len(own)


# ----------------------------------------------------------------------------- jobs
def test_teammate_sees_job_metadata_but_not_env_or_logs(head: HeadProc) -> None:
    admin = head.client()
    assert admin.put("/v1/teams/env-team", json={"name": "env-team"}).status_code == 200
    alice = head.client(_user(admin, "env-alice", ["env-team"]))
    carol = head.client(_user(admin, "env-carol", ["env-team"]))
    r = alice.post("/v1/jobs", json={**JOB, "team": "env-team", "env": {"API_KEY": "k3y"}})
    assert r.status_code == 201, r.text
    job = r.json()["job_ids"][0]
    seen = carol.get(f"/v1/jobs/{job}")
    assert seen.status_code == 200, seen.text
    assert seen.json()["job"]["user"] == "env-alice" and seen.json()["spec"]["env"] == {}
    assert seen.json()["env_hidden"] is True and "k3y" not in seen.text
    assert job in [j["id"] for j in carol.get("/v1/jobs?active=true").json()["jobs"]]
    r = carol.get(f"/v1/jobs/{job}/logs")
    assert r.status_code == 403 and "metadata" in r.json()["detail"], r.text
    own = alice.get(f"/v1/jobs/{job}").json()
    assert own["spec"]["env"] == {"API_KEY": "k3y"} and own["env_hidden"] is False
    assert admin.get(f"/v1/jobs/{job}").json()["spec"]["env"] == {"API_KEY": "k3y"}
    assert alice.get(f"/v1/jobs/{job}/logs").status_code == 409  # hers: not started yet


def test_qos_above_allowance_is_refused(head: HeadProc) -> None:
    admin = head.client()
    assert admin.put("/v1/teams/qos-team", json={"name": "qos-team"}).status_code == 200
    dora = head.client(_user(admin, "qos-dora", ["qos-team"]))
    job = {**JOB, "team": "qos-team"}
    r = dora.post("/v1/jobs", json={**job, "qos": "high"})
    assert r.status_code == 403, r.text
    assert "qos 'high' is above your allowance" in r.json()["detail"]
    assert "allowed: low, normal" in r.json()["detail"]
    assert dora.post("/v1/jobs", json={**job, "qos": "low"}).status_code == 201
    assert dora.post("/v1/jobs", json=job).status_code == 201  # normal
    r = admin.put("/v1/teams/qos-team", json={"name": "qos-team", "qos": ["normal", "high"]})
    assert r.status_code == 200 and r.json()["qos"] == ["normal", "high"], r.text
    assert dora.post("/v1/jobs", json={**job, "qos": "high"}).status_code == 201
    # The user's own allowance wins over the team's.
    r = admin.patch("/v1/users/qos-dora", json={"qos": ["low"]})
    assert r.status_code == 200 and r.json()["qos"] == ["low"], r.text
    assert dora.post("/v1/jobs", json=job).status_code == 403
    assert admin.patch("/v1/users/qos-dora", json={"qos": ["urgent"]}).status_code == 422
    assert dora.patch("/v1/users/qos-dora", json={"qos": ["high"]}).status_code == 403
    assert admin.post("/v1/jobs", json={**job, "qos": "high"}).status_code == 201  # admins


def test_queued_jobs_per_user_are_limited(head: HeadProc) -> None:
    admin = head.client()
    q = head.client(_user(admin, "queue-user", ["default"]))
    ids = []
    for _ in range(4):
        r = q.post("/v1/jobs", json=JOB)
        assert r.status_code == 201, r.text
        ids += r.json()["job_ids"]
    r = q.post("/v1/jobs", json={**JOB, "array": {"indices": [0, 1]}})
    assert r.status_code == 429 and "limit of 5 per user" in r.json()["detail"], r.text
    assert q.post("/v1/jobs", json=JOB).status_code == 201
    assert q.post("/v1/jobs", json=JOB).status_code == 429
    assert q.post(f"/v1/jobs/{ids[0]}/cancel").status_code == 200  # an ended job frees one
    _wait("a slot", lambda: q.post("/v1/jobs", json=JOB).status_code == 201)


def test_oversized_spec_is_refused(head: HeadProc) -> None:
    r = head.client().post("/v1/jobs", json={**JOB, "env": {"BIG": "x" * 10_000}})
    assert r.status_code == 413, r.text
    assert "job spec of" in r.json()["detail"] and "8192" in r.json()["detail"]


# ----------------------------------------------------------------------------- at rest
def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_state_dir_database_and_token_files_are_private(tmp_path: Path) -> None:
    state = tmp_path / "head"
    files = ("admin.token", "join.token", "phalanx.db", "phalanx.db-wal", "phalanx.db-shm")
    h = start_head(state, None)
    try:
        assert h.client().post("/v1/jobs", json=JOB).status_code == 201  # writes the WAL
        assert _mode(state) == 0o700
        for name in files:
            assert _mode(state / name) == 0o600, name
    finally:
        stop_head(h.proc)
    # An install from before: modes as a umask of 022 left them. A start fixes them.
    state.chmod(0o755)
    for name in files:
        if (state / name).exists():
            (state / name).chmod(0o644)
    h = start_head(state, None)
    try:
        assert _mode(state) == 0o700
        for name in files:
            if (state / name).exists():
                assert _mode(state / name) == 0o600, name
    finally:
        stop_head(h.proc)


# ----------------------------------------------------------------------------- passing tokens
def test_agent_refuses_a_token_on_its_command_line(tmp_path: Path) -> None:
    from tests.cli.conftest import invoke

    base = ["agent", "--head", "http://127.0.0.1:9", "--address", "127.0.0.2"]
    result = invoke(*base, "--token", "phxj_visible-in-ps")
    assert result.exit_code == 2
    assert "--token is refused" in result.stderr and "--token-file" in result.stderr
    assert "PHALANX_JOIN_TOKEN" in result.stderr
    result = invoke(*base, env={"PHALANX_JOIN_TOKEN": ""})
    assert result.exit_code == 2 and "no join token" in result.stderr
    result = invoke(*base, "--token-file", str(tmp_path / "missing"))
    assert result.exit_code == 2 and "cannot read the join token file" in result.stderr
