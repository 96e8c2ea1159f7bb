"""Delta heartbeats against a real head over HTTP (README.md#heartbeats-at-scale): numbered
reports acknowledged, deltas applied on the acknowledged base, a full report asked for when
the head does not hold it (a lost answer too far back, a head restart), exit statuses never
lost, old agents' full reports served as before, hostile deltas refused with a 4xx while
the head and the node's job live on. The agent side is the real one (agent/reportdelta.py,
driven through testing/fleet.py's SimNode)."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from phalanx.api.models import (
    MAX_LIST,
    DesiredState,
    Heartbeat,
    NodeHealth,
    ProcessStatus,
    RankRef,
    RegisterRequest,
    RegisterResponse,
    ReportDelta,
)
from phalanx.head import intervals
from phalanx.head.deltas import KEPT, HeldReports
from phalanx.head.mirror import Settings
from phalanx.testing.fleet import SimNode
from tests.head.conftest import HeadProc, start_head, stop_head

JSON = {"content-type": "application/json"}


class Agent:
    """A SimNode (the agent's real report stream) over a plain HTTP client, one beat at a
    time: a test chooses to lose a request or its answer."""

    def __init__(self, head: HeadProc, name: str, address: str) -> None:
        self.node = SimNode(name=name, address=address, gpus=2)
        self.head = head
        reg = RegisterRequest(
            name=name,
            address=address,
            agent_url=f"http://{address}:9",
            agent_secret=secrets.token_hex(16),
            cpus=8,
            memory_mb=65536,
            gpus=self.node.inventory(),
        )
        with head.client(head.join_token) as join:
            r = join.post("/v1/agent/register", content=reg.model_dump_json(), headers=JSON)
        assert r.status_code == 200, r.text
        self.registered = RegisterResponse.model_validate_json(r.content)
        self.node.token = self.registered.node_token
        self.http = head.client(self.node.token)

    def report(self) -> Heartbeat:
        return self.node.heartbeat(0.0, lambda _job: 50.0)

    def send(self, beat: Heartbeat, *, lose_answer: bool = False) -> DesiredState:
        r = self.http.post("/v1/agent/heartbeat", content=beat.model_dump_json(), headers=JSON)
        assert r.status_code == 200, r.text
        state = DesiredState.model_validate_json(r.content)
        if not lose_answer:
            self.node.apply(state, time.time())
        return state

    def beat(self) -> DesiredState:
        return self.send(self.report())


def _job(head: HeadProc, node: str, **fields: Any) -> int:
    spec = {"command": ["train"], "workdir": "/tmp", "nodelist": [node], **fields}
    with head.client() as admin:
        r = admin.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    job_id: int = r.json()["job_ids"][0]
    return job_id


def _job_info(head: HeadProc, job_id: int) -> dict[str, Any]:
    with head.client() as admin:
        info: dict[str, Any] = admin.get(f"/v1/jobs/{job_id}").json()["job"]
    return info


def _until(what: str, agent: Agent, probe: Any, timeout: float = 30.0) -> None:
    """Heartbeat `agent` until `probe()` holds."""
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        agent.beat()
        time.sleep(0.05)


def _running(head: HeadProc, agent: Agent, **fields: Any) -> int:
    """A job on `agent`'s node, started and running (its ranks reported)."""
    job_id = _job(head, agent.node.name, **fields)
    _until("the job to run", agent, lambda: _job_info(head, job_id)["state"] == "R")
    _until("its ranks to be reported", agent, lambda: job_id in agent.node.running)
    agent.beat()
    return job_id


def _ends(head: HeadProc, agent: Agent, job_id: int) -> dict[str, Any]:
    """Heartbeat `agent` until the job has ended (its ranks' end settled); its info."""
    done = ("CD", "F", "CA", "TO", "NF", "OOM")
    _until("the job to end", agent, lambda: _job_info(head, job_id)["state"] in done)
    return _job_info(head, job_id)


def _heartbeats(head: HeadProc) -> dict[str, float]:
    with head.client() as admin:
        text = admin.get("/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == "phalanx_heartbeats":
            return {s.labels["kind"]: s.value for s in family.samples if s.name.endswith("_total")}
    return {}


def test_reports_are_acknowledged_and_then_sent_as_deltas(head: HeadProc) -> None:
    agent = Agent(head, "delta-a", "127.0.4.1")
    first = agent.report()
    assert first.delta is None and first.seq == 1  # no base yet: a full report
    state = agent.send(first)
    assert (state.report_ack, state.full_report) == (1, False)
    job_id = _running(head, agent)
    for _ in range(2):  # nothing new: empty deltas (the second renews the lease only)
        quiet = agent.report()
        assert quiet.delta is not None and quiet.processes is None
        assert (quiet.delta.processes, quiet.delta.gone, quiet.delta.master_ports) == ([], [], {})
        assert agent.send(quiet).report_ack == quiet.seq
    agent.node.finish(job_id, 0, time.time())
    ended = agent.report()
    assert ended.delta is not None
    assert [(p.job_id, p.running, p.exit_code) for p in ended.delta.processes] == [
        (job_id, False, 0)
    ]
    agent.send(ended)
    assert _ends(head, agent, job_id)["state"] == "CD"
    counts = _heartbeats(head)
    assert counts.get("delta", 0) >= 1 and counts.get("lease", 0) >= 1 and counts["full"] >= 1


def test_an_exit_status_survives_a_lost_request_and_lost_answers(head: HeadProc) -> None:
    agent = Agent(head, "delta-b", "127.0.4.2")
    agent.beat()
    job_id = _running(head, agent)
    agent.node.finish(job_id, 3, time.time())
    agent.report()  # lost on the way: the head never heard of the exit
    assert _job_info(head, job_id)["state"] == "R"
    # The next delta is against the same acknowledged base: it carries the exit again. Its
    # answer is lost too, and so are those of the deltas after it.
    for _ in range(2):
        beat = agent.report()
        assert beat.delta is not None
        assert [p.exit_code for p in beat.delta.processes] == [3]
        agent.send(beat, lose_answer=True)
    assert _job_info(head, job_id)["state"] in ("CG", "F")  # the exit was heard
    # The head applied deltas whose answers were lost; the next one names an older base,
    # which it still holds: applied, acknowledged, nothing asked again.
    state = agent.beat()
    assert state.full_report is False and state.report_ack is not None
    assert agent.node.reports.base == state.report_ack
    info = _ends(head, agent, job_id)
    assert (info["state"], info["exit_code"], info["restart_count"]) == ("F", "3:0", 0)


def test_a_base_too_far_back_gets_a_full_report_asked_and_given(head: HeadProc) -> None:
    agent = Agent(head, "delta-c", "127.0.4.3")
    agent.beat()
    job_id = _running(head, agent)
    agent.node.finish(job_id, 0, time.time())
    for _ in range(KEPT + 1):  # every answer lost: the agent's base falls out of the head's
        agent.send(agent.report(), lose_answer=True)
    beat = agent.report()
    assert beat.delta is not None
    asked = agent.send(beat)
    assert asked.full_report is True
    full = agent.report()
    # Full: every rank the agent still reports (the ended job is no longer wanted here).
    assert full.delta is None and full.processes is not None and full.master_ports is not None
    state = agent.send(full)
    assert (state.full_report, state.report_ack) == (False, full.seq)
    assert _ends(head, agent, job_id)["state"] == "CD"
    assert _heartbeats(head).get("refused", 0) >= 1


def test_a_delta_on_an_unknown_base_renews_the_lease_and_asks_for_all(head: HeadProc) -> None:
    agent = Agent(head, "delta-d", "127.0.4.4")
    stray = Heartbeat(
        name="delta-d", version=0, processes=None, master_ports=None, gpus=None, health=None,
        seq=42, delta=ReportDelta(base=41),
    )  # fmt: skip
    state = agent.send(stray, lose_answer=True)
    assert (state.full_report, state.report_ack) == (True, None)
    with head.client() as admin:
        nodes = {n["name"]: n for n in admin.get("/v1/nodes").json()["nodes"]}
    assert nodes["delta-d"]["state"] == "up"
    assert agent.beat().report_ack == 1  # the agent's own first report: full


def test_an_old_agent_s_full_reports_are_served_as_before(head: HeadProc) -> None:
    agent = Agent(head, "delta-e", "127.0.4.5")
    agent.node.protocol = "full"
    beat = agent.report()
    assert beat.seq is None and beat.delta is None
    # What an agent before deltas sends: no `seq`, no `delta`.
    old = json.loads(beat.model_dump_json(exclude={"seq", "delta"}))
    r = agent.http.post("/v1/agent/heartbeat", json=old)
    assert r.status_code == 200, r.text
    assert r.json()["report_ack"] is None and r.json()["full_report"] is False
    job_id = _running(head, agent)
    agent.node.finish(job_id, 0, time.time())
    assert _ends(head, agent, job_id)["state"] == "CD"


def test_hostile_deltas_get_a_4xx_and_the_node_s_job_runs_on(head: HeadProc) -> None:
    agent = Agent(head, "delta-f", "127.0.4.6")
    other = Agent(head, "delta-g", "127.0.4.7")
    agent.beat()
    other.beat()
    job_id = _running(head, agent)
    ok = agent.report()
    assert ok.delta is not None
    body = json.loads(ok.model_dump_json())

    def post(who: Agent, data: dict[str, Any]) -> httpx.Response:
        return who.http.post("/v1/agent/heartbeat", content=json.dumps(data), headers=JSON)

    exited = ProcessStatus(
        job_id=job_id, epoch=1, rank=0, local_rank=0, pid=None, running=False, exit_code=9,
        started_at=1.0, ended_at=2.0,
    )  # fmt: skip
    many = [{"job_id": 1, "epoch": 0, "rank": 0}] * (MAX_LIST + 1)
    refused = {
        "a delta with a process list": {**body, "processes": []},
        "a full report without one": {**body, "delta": None},
        "a delta without a seq": {**body, "seq": None},
        "a base not before its seq": {**body, "delta": {**body["delta"], "base": body["seq"]}},
        "too many ranks gone": {**body, "delta": {**body["delta"], "gone": many}},
    }
    for what, data in refused.items():
        r = post(agent, data)
        assert r.status_code in (413, 422), (what, r.status_code, r.text[:300])
    # Another node reports this node's job as failed: nothing happens to it.
    theirs = other.report()
    assert theirs.delta is not None
    forged = theirs.model_copy(
        update={"delta": theirs.delta.model_copy(update={"processes": [exited]})}
    )
    r = post(other, json.loads(forged.model_dump_json()))
    assert r.status_code == 200, r.text
    # And as the node itself, a rank of an epoch the job is not in: ignored as well.
    elsewhen = exited.model_copy(update={"epoch": 7})
    stale = ok.model_copy(update={"delta": ok.delta.model_copy(update={"processes": [elsewhen]})})
    assert post(agent, json.loads(stale.model_dump_json())).status_code == 200
    health = httpx.get(head.url + "/healthz", timeout=10).json()
    assert health["status"] == "ok" and health["loop_errors"] == 0, health
    agent.beat()
    assert _job_info(head, job_id)["state"] == "R"


def test_a_restarted_head_asks_every_node_for_a_full_report(tmp_path: Path) -> None:
    settings = "heartbeat_s=0.5, lease_s=6.0, heartbeat_rate=1.0"
    head = start_head(tmp_path / "head", None, settings)
    try:
        agent = Agent(head, "restart-a", "127.0.4.8")
        # Adaptive interval: 1 node at 1 heartbeat/s budget → 1 s; capped at lease / 3.
        assert agent.registered.heartbeat_s == 1.0
        Agent(head, "restart-b", "127.0.4.9")
        Agent(head, "restart-c", "127.0.4.10")
        assert agent.beat().heartbeat_s == 2.0
        job_id = _running(head, agent)
        stop_head(head.proc)
        head = start_head(tmp_path / "head", None, settings)
        agent.head, agent.http = head, head.client(agent.node.token)
        beat = agent.report()
        assert beat.delta is not None
        asked = agent.send(beat)
        assert (asked.full_report, asked.report_ack) == (True, None)
        full = agent.report()
        assert full.delta is None
        assert agent.send(full).report_ack == full.seq
        info = _job_info(head, job_id)
        assert (info["state"], info["restart_count"]) == ("R", 0)
        agent.node.finish(job_id, 0, time.time())
        assert _ends(head, agent, job_id)["state"] == "CD"
    finally:
        stop_head(head.proc)


def _status(job: int, rank: int, running: bool = True) -> ProcessStatus:
    return ProcessStatus(
        job_id=job, epoch=1, rank=rank, local_rank=0, pid=None, running=running, started_at=1.0
    )


def test_held_reports_never_grow_past_a_full_report_s_bounds() -> None:
    held = HeldReports()
    full = Heartbeat(name="n", version=0, processes=[_status(1, 0)], seq=1)
    assert held.resolve(full) is full
    half = MAX_LIST // 2 + 1
    for seq, job in ((2, 2), (3, 3)):
        delta = ReportDelta(base=seq - 1, processes=[_status(job, r) for r in range(half)])
        beat = Heartbeat(
            name="n", version=0, processes=None, master_ports=None, gpus=None, health=None,
            seq=seq, delta=delta,
        )  # fmt: skip
        resolved = held.resolve(beat)
        if seq == 2:
            assert resolved is not None and len(resolved.processes or []) == half + 1
    assert resolved is None and held.ack("n") is None  # past MAX_LIST: a full report asked


def test_a_delta_applies_on_the_base_it_names_among_those_kept() -> None:
    held = HeldReports()
    base = Heartbeat(name="n", version=3, processes=[_status(1, 0), _status(1, 1)], seq=1)
    held.resolve(base)
    gone = Heartbeat(
        name="n", version=3, processes=None, master_ports=None, gpus=None, health=None, seq=2,
        delta=ReportDelta(base=1, gone=[RankRef(job_id=1, epoch=1, rank=1)]),
    )  # fmt: skip
    assert [p.rank for p in held.resolve(gone).processes or []] == [0]  # type: ignore[union-attr]
    # A delta computed against report 1 (the agent never saw report 2's answer): applied on
    # report 1 itself, so rank 1 (unchanged since 1) comes back, rank 0 ends.
    again = Heartbeat(
        name="n", version=3, processes=None, master_ports=None, gpus=None, health=None, seq=3,
        delta=ReportDelta(base=1, processes=[_status(1, 0, running=False)]),
    )  # fmt: skip
    resolved = held.resolve(again)
    assert resolved is not None and resolved.health == NodeHealth()
    assert sorted((p.rank, p.running) for p in resolved.processes or []) == [(0, False), (1, True)]
    assert held.stale(gone) and held.ack("n") == 3


def test_the_interval_grows_with_the_fleet_within_the_lease() -> None:
    s = Settings()  # 2 s, 8 s lease, 1,500 heartbeats a second
    table = {1: 2.0, 3_000: 2.0, 3_600: 2.4, 4_000: 2.667, 10_000: 2.667, 100_000: 2.667}
    assert {n: intervals.heartbeat_s(s, n) for n in table} == table
    # Never shorter than configured, even where a third of the lease is.
    assert intervals.heartbeat_s(Settings(heartbeat_s=5.0, lease_s=12.0), 10_000) == 5.0
    # A longer lease lets the fleet spread out further: 10,000 nodes at 1,500 a second.
    assert intervals.heartbeat_s(Settings(lease_s=20.0), 10_000) == 6.667
