"""Auth against a real head: every endpoint refuses a missing or wrong token; roles hold."""

from __future__ import annotations

import os
import re
import stat

import httpx

from tests.head.conftest import HeadProc

JOB = {"command": ["true"], "workdir": "/tmp"}


def _endpoints(head: HeadProc) -> list[tuple[str, str]]:
    schema = httpx.get(head.url + "/openapi.json").json()
    out = []
    for path, ops in schema["paths"].items():
        for method in ops:
            concrete = re.sub(r"\{[^}]+\}", "1", path)
            out.append((method.upper(), concrete))
    return out


def test_every_endpoint_but_health_refuses_missing_and_wrong_tokens(head: HeadProc) -> None:
    endpoints = _endpoints(head)
    assert len(endpoints) >= 15
    for method, path in endpoints:
        if path == "/healthz":
            assert httpx.request(method, head.url + path).status_code == 200
            continue
        for headers in ({}, {"Authorization": "Bearer phx_wrong"}, {"Authorization": "Basic x"}):
            r = httpx.request(method, head.url + path, headers=headers, json={})
            assert r.status_code == 401, (method, path, headers, r.status_code, r.text)
            assert r.json()["detail"]


def test_token_files_are_private_and_tokens_are_stored_hashed(head: HeadProc) -> None:
    assert stat.S_IMODE(os.stat(head.state_dir).st_mode) == 0o700
    for name in ("admin.token", "join.token", "phalanx.db"):
        if name == "phalanx.db" and not (head.state_dir / name).exists():
            continue  # PostgreSQL
        mode = stat.S_IMODE(os.stat(head.state_dir / name).st_mode)
        assert mode == 0o600, oct(mode)
    log = b"".join(p.read_bytes() for p in head.state_dir.parent.glob("head-*.log"))
    assert head.admin_token.encode() not in log
    if (head.state_dir / "phalanx.db").exists():  # SQLite: the token itself is not in the file
        assert head.admin_token.encode() not in (head.state_dir / "phalanx.db").read_bytes()


def _user(admin: httpx.Client, name: str, teams: list[str], team_admin_of: list[str]) -> str:
    r = admin.post("/v1/users", json={"name": name, "teams": teams, "team_admin_of": team_admin_of})
    assert r.status_code == 201, r.text
    r = admin.post("/v1/tokens", json={"user": name})
    assert r.status_code == 201, r.text
    token: str = r.json()["token"]
    return token


def test_users_cannot_touch_other_teams_jobs(head: HeadProc) -> None:
    admin = head.client()
    for team in ("vision", "speech"):
        assert admin.put(f"/v1/teams/{team}", json={"name": team}).status_code == 200
    alice = head.client(_user(admin, "alice", ["vision"], []))
    bob = head.client(_user(admin, "bob", ["speech"], []))
    carol = head.client(_user(admin, "carol", ["vision"], []))
    vera = head.client(_user(admin, "vera", [], ["vision"]))  # team admin of vision

    r = alice.post("/v1/jobs", json={**JOB, "team": "vision", "env": {"TOKEN": "s3cret"}})
    assert r.status_code == 201, r.text
    job = r.json()["job_ids"][0]
    assert bob.post("/v1/jobs", json={**JOB, "team": "vision"}).status_code == 403

    assert bob.get(f"/v1/jobs/{job}").status_code == 403
    assert bob.get(f"/v1/jobs/{job}/logs").status_code == 403
    assert bob.post(f"/v1/jobs/{job}/cancel").status_code == 403
    assert job not in [j["id"] for j in bob.get("/v1/jobs?active=true").json()["jobs"]]
    assert bob.get("/v1/jobs?active=true&format=table").json()["rows"] == []
    # A teammate sees it (not its environment, not its logs) but may not cancel it; the
    # team's admin may do all three.
    seen = carol.get(f"/v1/jobs/{job}")
    assert seen.status_code == 200 and seen.json()["spec"]["env"] == {}, seen.text
    assert carol.get(f"/v1/jobs/{job}/logs").status_code == 403
    assert carol.post(f"/v1/jobs/{job}/cancel").status_code == 403
    assert vera.get(f"/v1/jobs/{job}").json()["spec"]["env"] == {"TOKEN": "s3cret"}
    # Users are not admins.
    assert alice.post("/v1/users", json={"name": "mallory"}).status_code == 403
    assert alice.post("/v1/nodes/x/drain", json={"reason": "x"}).status_code == 403
    assert (
        alice.put("/v1/teams/vision", json={"name": "vision", "quota_gpus": 99}).status_code == 403
    )
    assert alice.post("/v1/tokens", json={"user": "bob"}).status_code == 403
    assert alice.post("/v1/join-tokens").status_code == 403
    assert alice.patch("/v1/users/alice", json={"qos": ["high"]}).status_code == 403
    assert alice.post("/v1/nodes/x/replace").status_code == 403
    # A user lists their own tokens only, and may not revoke another's.
    assert [t["user"] for t in alice.get("/v1/tokens").json()["tokens"]] == ["alice"]
    bobs = bob.get("/v1/tokens").json()["tokens"][0]["id"]
    assert alice.delete(f"/v1/tokens/{bobs}").status_code == 403
    # An agent's join token is not a user token.
    assert head.client(head.join_token).get("/v1/jobs").status_code == 403

    r = vera.post(f"/v1/jobs/{job}/cancel")
    assert r.status_code == 200, r.text
    assert head.client().get(f"/v1/jobs/{job}").json()["job"]["state"] == "CA"
    assert alice.get("/v1/whoami").json() == {
        "user": "alice",
        "role": "user",
        "teams": ["vision"],
        "admin_of": [],
        "default_team": "vision",
    }


def test_revoked_token_is_refused(head: HeadProc) -> None:
    admin = head.client()
    issued = admin.post("/v1/tokens", json={"user": "admin", "description": "ci"}).json()
    c = head.client(issued["token"])
    assert c.get("/v1/whoami").status_code == 200
    assert admin.delete(f"/v1/tokens/{issued['id']}").status_code == 204
    assert c.get("/v1/whoami").status_code == 401
    listed = admin.get("/v1/tokens").json()["tokens"]
    assert any(t["id"] == issued["id"] and t["revoked"] for t in listed)
    assert issued["expires"] is not None  # API tokens expire (90 days by default)
    assert all("token" not in t and "hash" not in t for t in listed)
