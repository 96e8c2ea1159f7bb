"""Fuzz the head's agent routes (register, heartbeat) with hypothesis: hostile bodies get a
4xx, never a 5xx; the head lives on and a job on the fuzzed node keeps running (issue 12:
one heartbeat with a master port of 2**70 once stopped the head)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.head.conftest import HeadProc

FUZZ_NODE = "fuzz-node"
JSON = {"content-type": "application/json"}
NASTY = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 65536, 2**31, 2**63, 2**70]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(["\x00", "a\x00b", "", "x" * 5000, "1", "SIGKILL"]),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
PROCESS = {
    # A job id and epoch the head does not run: valid reports of it change nothing.
    "job_id": 10_000,
    "epoch": 999,
    "rank": 0,
    "local_rank": 0,
    "pid": 123,
    "running": True,
    "started_at": 1.0,
}
EVENT = {"seq": 1, "time": 1.0, "gpu": None, "kind": "not-a-kind", "message": "m"}


@st.composite
def heartbeats(draw: st.DrawFn) -> bytes:
    """A heartbeat of the fuzz node with one to three fields set to hostile values (some
    bodies are not even JSON)."""
    beat: dict[str, Any] = {
        "name": FUZZ_NODE,
        "version": 0,
        "wait_s": 0,
        "processes": [dict(PROCESS)],
        "master_ports": {"10000": 29500},
        "gpus": [{"index": 0, "utilization_pct": 50.0}],
        "health": {"events": [], "check_failure": None},
    }
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["top", "process", "port", "gpu", "event", "raw"]))
        value = draw(NASTY)
        if where == "top":
            beat[draw(st.sampled_from([*beat, "extra"]))] = value
        elif where == "process":
            beat["processes"] = [{**PROCESS, draw(st.sampled_from([*PROCESS, "x"])): value}]
        elif where == "port":
            beat["master_ports"] = {draw(st.sampled_from(["10000", "x", "-1", ""])): value}
        elif where == "gpu":
            beat["gpus"] = [{"index": 0, draw(st.sampled_from(["index", "power_w"])): value}]
        elif where == "event":
            event = {**EVENT, draw(st.sampled_from(sorted(EVENT))): value}
            beat["health"] = {"events": [event], "check_failure": None}
        else:
            return draw(st.sampled_from([b"", b"{", b"[]", b"null", b'{"name": NaN}']))
    wait = beat.get("wait_s")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and 0 < wait <= 30:
        beat["wait_s"] = 0.05  # a valid long poll: keep the fuzzing quick
    return json.dumps(beat).encode()


@st.composite
def registrations(draw: st.DrawFn) -> bytes:
    reg: dict[str, Any] = {
        "name": "fuzz-other",
        "address": "127.0.0.9",
        "agent_url": "http://127.0.0.9:1",
        "agent_secret": "s" * 32,
        "cpus": 4,
        "memory_mb": 4096,
        "gpus": [{"index": 0, "uuid": "GPU-0", "model": "H100", "memory_mb": 80000}],
        "labels": {},
    }
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from([*reg, "extra", "gpu"]))
        if key == "gpu":
            gpu: dict[str, Any] = {"index": 0, "uuid": "GPU-0", "model": "H100", "memory_mb": 1}
            gpu[draw(st.sampled_from([*gpu, "extra"]))] = draw(NASTY)
            reg["gpus"] = [gpu]
        else:
            reg[key] = draw(NASTY)
    if reg.get("name") == FUZZ_NODE:
        reg["name"] = "fuzz-other"  # keep the fuzz node's token valid
    return json.dumps(reg).encode()


def test_hostile_agent_requests_get_4xx_and_the_head_and_its_job_live_on(head: HeadProc) -> None:
    admin = head.client()
    join = head.client(head.join_token)
    gpus = [{"index": i, "uuid": f"GPU-{i}", "model": "H100", "memory_mb": 80000} for i in (0, 1)]
    reg = {
        "name": FUZZ_NODE,
        "address": "127.0.0.8",
        "agent_url": "http://127.0.0.8:1",
        "agent_secret": "s" * 32,
        "cpus": 4,
        "memory_mb": 4096,
        "gpus": gpus,
    }
    r = join.post("/v1/agent/register", json=reg)
    assert r.status_code == 200, r.text
    node = head.client(r.json()["node_token"])
    spec = {"command": ["true"], "workdir": "/tmp", "exclude_nodes": ["fuzz-other"]}
    job_id = admin.post("/v1/jobs", json=spec).json()["job_ids"][0]
    ok = {"name": FUZZ_NODE, "version": 0, "wait_s": 0}

    def state() -> str:
        s: str = admin.get(f"/v1/jobs/{job_id}").json()["job"]["state"]
        return s

    deadline = time.monotonic() + 30
    while state() != "R":
        assert time.monotonic() < deadline, "the job was never placed on the fuzz node"
        assert node.post("/v1/agent/heartbeat", json=ok).status_code == 200
        time.sleep(0.1)
    statuses: set[int] = set()

    @settings(max_examples=150, derandomize=True, deadline=None, database=None)
    @given(body=heartbeats())
    def beat(body: bytes) -> None:
        r = node.post("/v1/agent/heartbeat", content=body, headers=JSON)
        statuses.add(r.status_code)
        assert r.status_code in (200, 400, 403, 404, 422), (r.status_code, r.text, body[:500])

    @settings(max_examples=60, derandomize=True, deadline=None, database=None)
    @given(body=registrations())
    def register(body: bytes) -> None:
        r = join.post("/v1/agent/register", content=body, headers=JSON)
        statuses.add(r.status_code)
        # 409: a join token may not take over a name whose node is alive (docs/security.md).
        assert r.status_code in (200, 400, 403, 404, 409, 422), (r.status_code, r.text, body[:500])

    beat()
    register()
    assert {200, 422} <= statuses  # both valid and refused requests got through
    assert head.proc.poll() is None
    health = httpx.get(head.url + "/healthz", timeout=10).json()
    assert health["status"] == "ok" and health["loop_errors"] == 0, health
    assert node.post("/v1/agent/heartbeat", json=ok).status_code == 200
    assert state() == "R"  # its job runs on: no hostile report reached it
