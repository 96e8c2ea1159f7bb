"""A node's (re)join revokes its own old credential and a spent single-use join token, and
nothing else: the other nodes' credentials keep working (they are no longer all dropped
from the head's cache, which sent every node's next heartbeat to the database per join).
In process: the head's service on a real SQLite store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic_core import to_json

from phalanx.api.models import GpuInfo, GpuTelemetry, JoinTokenCreate, NodeInfo, RegisterRequest
from phalanx.head.auth import AuthError
from phalanx.head.control import HeadError
from phalanx.head.mirror import Settings
from phalanx.head.server import ADMIN_TOKEN_FILE, JOIN_TOKEN_FILE, build
from phalanx.head.service import Head


def _req(name: str) -> RegisterRequest:
    return RegisterRequest(
        name=name,
        address="127.0.0.1",
        agent_url="https://127.0.0.1:1",
        agent_secret="s" * 32,
        cpus=4,
        memory_mb=4096,
        gpus=[GpuInfo(index=0, uuid=f"GPU-{name}", model="H100", memory_mb=81920)],
    )


def test_a_rejoin_revokes_only_that_nodes_old_credential(tmp_path: Path) -> None:
    state = tmp_path / "head"
    head = build(state, None, Settings())
    head.control.start()
    try:
        _scenario(state, head)
    finally:
        head.control.stop()


def _scenario(state: Path, head: Head) -> None:
    join = head.authenticate((state / JOIN_TOKEN_FILE).read_text().strip())
    tokens = {n: head.register(join, _req(n)).node_token for n in ("a", "b", "c")}
    principals = {n: head.authenticate(t) for n, t in tokens.items()}  # cached now
    assert {p.node for p in principals.values()} == {"a", "b", "c"}
    # b's agent restarts and joins again as itself: its old credential stops working.
    again = head.register(principals["b"], _req("b")).node_token
    with pytest.raises(AuthError, match="unknown or revoked"):
        head.authenticate(tokens["b"])
    assert head.authenticate(again).node == "b"
    # The others' credentials are untouched (and still answered from the cache).
    for n in ("a", "c"):
        assert head.authenticate(tokens[n]) is principals[n]
    # A single-use join token is spent by its join.
    admin = head.authenticate((state / ADMIN_TOKEN_FILE).read_text().strip())
    once = head.issue_join_token(admin, JoinTokenCreate(single_use=True)).token
    head.register(head.authenticate(once), _req("d"))
    with pytest.raises((AuthError, HeadError), match=r"used already|unknown or revoked"):
        head.register(head.authenticate(once), _req("e"))
    assert head.authenticate(tokens["a"]) is principals["a"]


def test_the_node_listing_rows_are_node_infos_json(tmp_path: Path) -> None:
    """`GET /v1/nodes` writes plain dicts (built under the control lock, readings added
    after it): each is exactly NodeInfo's JSON, with its jobs, GPUs in use and readings."""
    state = tmp_path / "head"
    head = build(state, None, Settings())
    head.control.start()
    try:
        join = head.authenticate((state / JOIN_TOKEN_FILE).read_text().strip())
        for n in ("b", "a"):
            head.register(join, _req(n))
        head.samples.observe("a", [GpuTelemetry(index=0, utilization_pct=97.0)], head.now())
        rows = head.node_rows()
    finally:
        head.control.stop()
    assert [r["name"] for r in rows] == ["a", "b"]
    for row in rows:
        as_json = json.loads(to_json(row))
        assert NodeInfo.model_validate(row).model_dump(mode="json") == as_json
    assert rows[0]["gpu_telemetry"][0]["utilization_pct"] == 97.0
    assert rows[0]["telemetry_age_s"] is not None and rows[1]["gpu_telemetry"] == []
    assert rows[0]["gpus"][0]["uuid"] == "GPU-a" and rows[0]["state"] == "up"
    assert head.nodes().nodes[0].gpu_telemetry[0].utilization_pct == 97.0
