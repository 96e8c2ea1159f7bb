"""`POST /v1/telemetry` against hostile input and the wrong credentials, and who may read a
job's stats — on a real head process (SQLite and PostgreSQL). Never a 500, never a dead
head."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.head.conftest import HeadProc, head

__all__ = ["head"]

NODE = "127.0.0.2"
_TOKENS: dict[str, str] = {}


def _node_token(h: HeadProc) -> str:
    """Register the 2-GPU node 127.0.0.2 once per head; its node credential."""
    if h.url in _TOKENS:
        return _TOKENS[h.url]
    gpus = [{"index": i, "uuid": f"GPU-{i}", "model": "H100", "memory_mb": 81559} for i in range(2)]
    reg = {
        "name": NODE,
        "address": NODE,
        "agent_url": "http://127.0.0.2:1",
        "agent_secret": "s" * 32,
        "cpus": 4,
        "memory_mb": 4096,
        "gpus": gpus,
    }
    r = h.client(h.join_token).post("/v1/agent/register", json=reg)
    assert r.status_code == 200, r.text
    token: str = r.json()["node_token"]
    _TOKENS[h.url] = token
    return token


def _batch(n: int = 2, node: str = NODE, **change: Any) -> dict[str, Any]:
    base = 1_700_000_000.0
    body: dict[str, Any] = {
        "node": node,
        "sent_at": base + 10 * n,
        "gpus": [0, 1],
        "times": [base + 10 * k for k in range(n)],
        "utilization_pct": [50.0, 0.0] * n,
        "memory_used_mb": [1000, 0] * n,
        "power_w": [300.0, 65.0] * n,
        "temperature_c": [60.0, 32.0] * n,
        "energy_j": [float(k) for k in range(2 * n)],
        "job_id": [None, None] * n,
        "epoch": [None, None] * n,
    }
    body.update(change)
    return body


def _post(h: HeadProc, token: str | None, body: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers["Content-Type"] = "application/json"
    return httpx.post(f"{h.url}/v1/telemetry", content=content, headers=headers, timeout=30)


def test_a_node_ships_a_batch(head: HeadProc) -> None:
    token = _node_token(head)
    r = _post(head, token, _batch(3))
    assert r.status_code == 200, r.text
    assert r.json()["samples"] == 3


def test_wrong_credentials_are_refused(head: HeadProc) -> None:
    token = _node_token(head)
    assert _post(head, None, _batch()).status_code == 401
    assert _post(head, "not-a-token", _batch()).status_code == 401
    user = _post(head, head.admin_token, _batch())  # a user's token, even an admin's
    assert user.status_code == 403 and "node credential" in user.json()["detail"]
    other = _post(head, token, _batch(node="127.0.0.9"))  # another node's name
    assert other.status_code == 403 and "127.0.0.9" in other.json()["detail"]


def test_malformed_batches_are_422(head: HeadProc) -> None:
    token = _node_token(head)
    bad: list[dict[str, Any]] = [
        _batch(times=[1_700_000_010.0, 1_700_000_000.0]),  # not ascending
        _batch(utilization_pct=[50.0, 0.0]),  # 2 values for 2 samples × 2 GPUs
        _batch(utilization_pct=[101.0, 0.0, 0.0, 0.0]),  # over 100%
        _batch(power_w=[-1.0, 0.0, 0.0, 0.0]),
        _batch(job_id=[0, None, None, None]),  # job ids start at 1
        _batch(gpus=[0, 0]),  # an index twice
        _batch(gpus=[0, 99]),  # beyond any node's GPUs
        _batch(node="bad name!"),
        _batch(times=[1_700_000_000.0, 1_700_009_999.0]),  # later than sent_at
        _batch(utilization_pct="50"),
        {"node": NODE},
    ]
    for body in bad:
        r = _post(head, token, body)
        assert r.status_code == 422, (body, r.status_code, r.text)
    # Too many samples for one batch (an hour at 10 s is the most).
    assert _post(head, token, _batch(361)).status_code == 422
    # NaN and Infinity are not numbers here.
    text = json.dumps(_batch()).replace("50.0", "NaN", 1).encode()
    assert _post(head, token, text).status_code == 422
    for raw in (b"{", b"[]", b"null", "ü".encode("latin-1")):
        r = _post(head, token, raw)
        assert r.status_code in (400, 422), (raw, r.status_code)
    # A body over the head's limit is refused before it is read.
    huge = b'{"node": "' + b"x" * (3 * 1024 * 1024) + b'"}'
    assert _post(head, token, huge).status_code == 413
    assert httpx.get(f"{head.url}/healthz", timeout=10).status_code == 200


def test_stats_follow_the_job_detail_access_rules(head: HeadProc) -> None:
    _node_token(head)  # a node with GPUs, so the job can be queued
    admin = head.client()
    assert admin.put("/v1/teams/tele-a", json={"name": "tele-a"}).status_code == 200
    assert admin.put("/v1/teams/tele-b", json={"name": "tele-b"}).status_code == 200
    for name, team in (("tele-ann", "tele-a"), ("tele-bob", "tele-b")):
        r = admin.post("/v1/users", json={"name": name, "teams": [team]})
        assert r.status_code == 201, r.text
    ann = admin.post("/v1/tokens", json={"user": "tele-ann"}).json()["token"]
    bob = admin.post("/v1/tokens", json={"user": "tele-bob"}).json()["token"]
    spec = {"command": ["sleep", "1"], "workdir": "/tmp", "team": "tele-a"}
    r = head.client(ann).post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_ids"][0]
    mine = head.client(ann).get(f"/v1/jobs/{job_id}/stats")
    assert mine.status_code == 200, mine.text
    assert mine.json()["job_id"] == job_id and mine.json()["final"] is False
    assert head.client().get(f"/v1/jobs/{job_id}/stats").status_code == 200  # an admin
    theirs = head.client(bob).get(f"/v1/jobs/{job_id}/stats")
    assert theirs.status_code == 403
    # A node credential is not a user's.
    assert head.client(_node_token(head)).get(f"/v1/jobs/{job_id}/stats").status_code == 403
    assert head.client().get("/v1/jobs/2147483647/stats").status_code == 404
    assert head.client().get("/v1/jobs/0/stats").status_code == 422
    bad = head.client().get(f"/v1/jobs/{job_id}/stats", params={"resolution": "week"})
    assert bad.status_code == 422
    admin.post(f"/v1/jobs/{job_id}/cancel")
