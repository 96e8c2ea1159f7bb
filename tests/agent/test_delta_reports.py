"""Delta heartbeats, the agent's side (agent/reportdelta.py; README.md#heartbeats-at-scale):
the report stream on its own, and a real agent process against stand-in heads of both
kinds: one that predates deltas (never acknowledges; refuses a delta's null process list
with a 422) and one that acknowledges reports or asks for a full one."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Literal

from phalanx.agent.reportdelta import GPU_REFRESH_S, ReportStream
from phalanx.api.models import (
    GpuHealthEvent,
    GpuTelemetry,
    Heartbeat,
    NodeHealth,
    ProcessStatus,
    RegisterResponse,
)

from .helpers import (
    JOIN_TOKEN,
    NODE_TOKEN,
    AgentProcess,
    FakeHead,
    _reply,
    assignment,
    desired,
    wait_for,
)

ADDRESS = "127.0.0.7"


def _rank(rank: int, running: bool = True, exit_code: int | None = None) -> ProcessStatus:
    return ProcessStatus(
        job_id=5, epoch=1, rank=rank, local_rank=rank, pid=100 + rank, running=running,
        exit_code=exit_code, started_at=1.0,
    )  # fmt: skip


def _gpu(util: float, temperature: float = 40.0) -> GpuTelemetry:
    return GpuTelemetry(index=0, utilization_pct=util, temperature_c=temperature)


def _report(
    stream: ReportStream,
    ranks: list[ProcessStatus],
    util: float = 0.0,
    health: NodeHealth | None = None,
    ports: dict[str, int] | None = None,
) -> Heartbeat:
    return stream.report(
        name="n1", version=1, wait_s=0.0, processes=ranks, ports=ports or {},
        gpus=[_gpu(util)], health=health or NodeHealth(),
    )  # fmt: skip


def test_a_delta_holds_every_change_since_the_acknowledged_report() -> None:
    stream = ReportStream()
    first = _report(stream, [_rank(0), _rank(1)], ports={"5": 29500})
    assert first.delta is None and first.seq == 1
    stream.answered(1, False)
    second = _report(stream, [_rank(0, False, 0), _rank(1)])  # never acknowledged (lost)
    assert second.delta is not None and second.delta.base == 1
    third = _report(stream, [_rank(0, False, 0)])
    assert third.delta is not None and third.delta.base == 1  # still on the acknowledged one
    assert [(p.rank, p.exit_code) for p in third.delta.processes] == [(0, 0)]  # resent
    assert [(g.job_id, g.rank) for g in third.delta.gone] == [(5, 1)]
    assert third.delta.ports_gone == ["5"] and third.gpus is None and third.health is None
    stream.answered(3, False)
    quiet = _report(stream, [_rank(0, False, 0)])
    assert quiet.delta is not None and quiet.delta.base == 3
    assert (quiet.delta.processes, quiet.delta.gone, quiet.processes) == ([], [], None)


def test_no_acknowledgement_or_a_request_for_one_means_a_full_report() -> None:
    stream = ReportStream()
    _report(stream, [_rank(0)])
    stream.answered(None, False)  # a head that predates deltas
    assert _report(stream, [_rank(0)]).delta is None
    stream.answered(2, True)  # acknowledged, but the head asks for a full report
    assert _report(stream, [_rank(0)]).delta is None
    stream.answered(99, False)  # a report this agent never sent (another head's)
    assert _report(stream, [_rank(0)]).delta is None
    stream.answered(4, False)
    assert _report(stream, [_rank(0)]).delta is not None
    stream.reset()  # registered anew, or another head
    assert _report(stream, [_rank(0)]).delta is None


def test_gpu_readings_ride_along_when_they_moved_or_have_aged() -> None:
    now = [0.0]
    stream = ReportStream(clock=lambda: now[0])
    _report(stream, [], util=50.0)
    stream.answered(1, False)
    sent = []
    for _ in range(12):
        now[0] += GPU_REFRESH_S / 10
        beat = _report(stream, [], util=52.0)  # a small move: not news
        stream.answered(beat.seq, False)
        sent.append(beat.gpus is not None)
    assert sent == [False] * 9 + [True, False, False]  # refreshed once 20 s had passed
    moved = _report(stream, [], util=80.0)
    assert moved.gpus is not None and moved.gpus[0].utilization_pct == 80.0


def test_unacknowledged_gpu_events_and_a_changed_check_are_sent() -> None:
    stream = ReportStream()
    _report(stream, [])
    stream.answered(1, False)
    event = GpuHealthEvent(seq=1, time=1.0, gpu=0, kind="xid", code=79, message="fell off")
    with_event = _report(stream, [], health=NodeHealth(events=[event]))
    assert with_event.health is not None and with_event.health.events == [event]
    stream.answered(with_event.seq, False)
    again = _report(stream, [], health=NodeHealth(events=[event]))
    assert again.health is not None  # until the head acknowledges it (health_ack)
    stream.answered(again.seq, False)
    failing = _report(stream, [], health=NodeHealth(check_failure="disk full"))
    assert failing.health is not None and failing.health.check_failure == "disk full"
    stream.answered(failing.seq, False)
    assert _report(stream, [], health=NodeHealth(check_failure="disk full")).health is None


Mode = Literal["old", "ack", "ask_full"]


class DeltaHead(FakeHead):
    """FakeHead that, in mode "old", answers as a head before deltas (no acknowledgement; a
    delta's null process list refused with 422); in "ack", acknowledges each report; in
    "ask_full", asks for a full report in every answer."""

    mode: Mode = "old"
    refused = 0

    def _handle(self, req: BaseHTTPRequestHandler, body: bytes) -> None:
        if req.path == "/v1/agent/register" and req.headers.get("Authorization") == (
            f"Bearer {JOIN_TOKEN}"
        ):
            s = self.desired
            out = RegisterResponse(
                node_token=NODE_TOKEN, heartbeat_s=s.heartbeat_s, lease_s=s.lease_s
            )
            return _reply(req, 200, out.model_dump_json().encode())
        if req.path != "/v1/agent/heartbeat":  # telemetry: not this head's business
            return _reply(req, 401, b'{"detail": "invalid token"}')
        beat = Heartbeat.model_validate_json(body)
        mode = self.mode  # as the request found it (a test may switch while it is held)
        if mode == "old" and beat.delta is not None:
            self.refused += 1
            return _reply(req, 422, b'{"detail": "processes: Input should be a valid list"}')
        with self._lock:
            self.beats.append(beat)
        if beat.version == self.desired.version:
            self._closed.wait(min(beat.wait_s, 0.2))  # keep the beats coming
        answer = self.desired
        if mode != "old":
            full = mode == "ask_full"
            answer = answer.model_copy(update={"report_ack": beat.seq, "full_report": full})
        _reply(req, 200, answer.model_dump_json().encode())

    def seen(self) -> list[Heartbeat]:
        with self._lock:
            return list(self.beats)


def test_a_real_agent_speaks_full_reports_to_an_old_head_and_deltas_to_a_new_one(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "go"
    job = assignment(
        command=["sh", "-c", f"while [ ! -e {marker} ]; do sleep 0.05; done; exit 3"],
        workdir=str(tmp_path), nodes=[ADDRESS], addresses=[ADDRESS],
        agent_urls=[f"http://{ADDRESS}:1"], gpus=[0], gpus_per_node=1, master_addr=ADDRESS,
    )  # fmt: skip
    head = DeltaHead(desired(job, heartbeat_s=0.3, lease_s=30.0))
    agent = AgentProcess(head.url, ADDRESS, tmp_path / "state", tmp_path / "agent.log")
    try:

        def beats_with_rank() -> list[Heartbeat]:
            return [b for b in head.seen() if b.processes and b.processes[0].running]

        wait_for("reports of the running rank", lambda: len(beats_with_rank()) >= 3)
        # An old head: nothing acknowledged, every report full (numbered all the same).
        old = head.seen()
        assert all(b.delta is None and b.processes is not None for b in old)
        seqs = [b.seq or 0 for b in old]
        assert seqs == sorted(seqs) and 0 not in seqs
        head.mode = "ack"
        count = len(head.seen())
        wait_for("deltas", lambda: any(b.delta is not None for b in head.seen()[count:]))
        marker.touch()  # the rank exits 3: the change rides in a delta

        def exit_in_delta() -> bool:
            return any(
                b.delta is not None and [p.exit_code for p in b.delta.processes] == [3]
                for b in head.seen()
            )

        wait_for("the exit status in a delta", exit_in_delta)
        head.mode = "ask_full"
        count = len(head.seen())
        wait_for("full reports asked for", lambda: len(head.seen()) >= count + 2)
        assert all(b.delta is None for b in head.seen()[count + 1 :])
        # A head replaced by an older one: it refuses the next delta, and gets full reports.
        head.mode = "ack"
        count = len(head.seen())
        wait_for("deltas again", lambda: any(b.delta is not None for b in head.seen()[count:]))
        head.mode = "old"
        wait_for("a delta refused", lambda: head.refused >= 1)
        count = len(head.seen())
        wait_for("full reports after", lambda: len(head.seen()) >= count + 2)
        after = head.seen()[count:]
        assert all(b.delta is None for b in after)
        assert [p.exit_code for b in after for p in b.processes or []][-1] == 3
        assert agent.proc.poll() is None
    finally:
        agent.stop()
        head.close()
    log = (tmp_path / "agent.log").read_text()
    assert "Traceback" not in log and "fenced" not in log


def test_an_agent_moving_to_another_head_starts_it_with_a_full_report(tmp_path: Path) -> None:
    first = DeltaHead(desired(heartbeat_s=0.3, lease_s=30.0))
    second = DeltaHead(desired(heartbeat_s=0.3, lease_s=30.0))
    first.mode = second.mode = "ack"
    urls = f"{first.url},{second.url}"
    agent = AgentProcess(urls, ADDRESS, tmp_path / "state", tmp_path / "agent.log")
    try:
        wait_for("deltas to the first head", lambda: any(b.delta for b in first.seen()))
        first.close()  # gone (a failover): the agent moves to the standby
        wait_for("reports to the second head", lambda: len(second.seen()) >= 3)
        beats = second.seen()
        assert beats[0].delta is None  # it holds none of this node's reports
        assert any(b.delta is not None for b in beats[1:])  # acknowledged: deltas again
        assert agent.proc.poll() is None
    finally:
        agent.stop()
        second.close()
