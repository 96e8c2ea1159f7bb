"""GPU health on the agent: NVML faults (with a pynvml-shaped stand-in for the GPUs), the
seq/ack event queue, NHC-style check scripts, and fault injection through the agent API."""

from __future__ import annotations

import importlib
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from phalanx.agent.gpus import FakeProvider, GpuFault, NvmlProvider
from phalanx.agent.health import EventQueue, HealthMonitor, check_problem, run_check
from phalanx.agent.main import AgentConfig, AgentError, run_agent
from phalanx.api.models import (
    DesiredState,
    FaultInjection,
    Heartbeat,
)
from phalanx.api.xid import classify

from .harness import AGENT_SECRET, start_agent
from .helpers import wait_for
from .stubhead import JOIN, StubHead, serve

# The real binding, for its NVMLError and its constants only (nvidia-ml-py has no type hints).
pynvml: Any = importlib.import_module("pynvml")


# ----------------------------------------------------------------------------- fake GPUs
class FakeNvml:
    """The part of the `pynvml` module the agent uses, over GPUs that are not there. Errors
    are pynvml's own NVMLError with NVML's codes; `unsupported` names functions that answer
    NVML_ERROR_NOT_SUPPORTED; `lost` GPUs answer NVML_ERROR_GPU_IS_LOST to everything."""

    NVMLError = pynvml.NVMLError

    def __init__(self, count: int = 2) -> None:
        self.handles = [SimpleNamespace(index=i) for i in range(count)]
        self.ecc = [0] * count  # volatile uncorrectable ECC count
        self.remap = [(0, 0, 0, 0)] * count  # corrected, uncorrected, pending, failure
        self.lost: set[int] = set()
        self.unsupported: set[str] = set()
        self.xids: list[tuple[int, int]] = []  # (GPU, XID) waiting in the event set
        self.registered: set[int] = set()
        self.calls: dict[str, int] = {}

    def _gpu(self, fn: str, handle: Any) -> int:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if fn in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if handle.index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return int(handle.index)

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.handles)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        return self.handles[i]

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        self._gpu("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=50, memory=10)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        self._gpu("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(total=80 * 2**30, used=2**30)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        self._gpu("nvmlDeviceGetTemperature", h)
        return 40

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        self._gpu("nvmlDeviceGetPowerUsage", h)
        return 300_000

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        return self.ecc[self._gpu("nvmlDeviceGetTotalEccErrors", h)]

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        return self.remap[self._gpu("nvmlDeviceGetRemappedRows", h)]

    def nvmlDeviceGetSupportedEventTypes(self, h: Any) -> int:
        self._gpu("nvmlDeviceGetSupportedEventTypes", h)
        return int(pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError)

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, events: object) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError
        self.registered.add(self._gpu("nvmlDeviceRegisterEvents", h))

    def nvmlEventSetWait(self, events: object, timeout_ms: int) -> Any:
        if not self.xids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        gpu, xid = self.xids.pop(0)
        return SimpleNamespace(
            device=self.handles[gpu],
            eventType=pynvml.nvmlEventTypeXidCriticalError,
            eventData=xid,
        )

    def nvmlEventSetFree(self, events: object) -> None:
        pass

    def nvmlDeviceGetIndex(self, h: Any) -> int:
        return int(h.index)


def faults(provider: NvmlProvider) -> list[tuple[int | None, str, int | None]]:
    return [(f.gpu, f.kind, f.code) for f in provider.health_events(0.0)]


def test_nvml_xid_events_become_faults() -> None:
    nvml = FakeNvml()
    provider = NvmlProvider(nvml)
    assert nvml.registered == {0, 1}
    assert faults(provider) == []
    nvml.xids += [(1, 79), (0, 13)]
    [first, second] = provider.health_events(0.0)
    assert (first.gpu, first.kind, first.code) == (1, "xid", 79)
    assert first.message == "XID 79 (GPU has fallen off the bus)"
    assert (second.gpu, second.code) == (0, 13)
    assert [classify(f.kind, f.code) for f in (first, second)] == ["drain", "fail_job"]
    provider.close()


def test_nvml_ecc_growth_and_remap_failure() -> None:
    nvml = FakeNvml()
    nvml.ecc = [2, 0]  # errors from before the agent started: the baseline, not reported
    provider = NvmlProvider(nvml)
    assert faults(provider) == []
    nvml.ecc[0] = 3
    [ecc] = provider.health_events(0.0)
    assert (ecc.gpu, ecc.kind, ecc.code) == (0, "ecc_uncorrectable", None)
    assert "1 new, 3 since the driver loaded" in ecc.message
    assert faults(provider) == []  # reported once per growth
    nvml.remap[1] = (0, 1, 1, 0)
    [pending] = provider.health_events(0.0)
    assert (pending.gpu, pending.kind) == (1, "row_remap_failure")
    assert "pending" in pending.message
    assert faults(provider) == []
    nvml.remap[1] = (0, 1, 1, 1)
    [failed] = provider.health_events(0.0)
    assert "failed" in failed.message
    assert classify(failed.kind, failed.code) == "drain"


def test_a_lost_gpu_is_reported_once_and_no_longer_polled() -> None:
    nvml = FakeNvml()
    provider = NvmlProvider(nvml)
    nvml.lost.add(1)
    readings = provider.telemetry()  # any query may be the one that finds it
    assert (readings[0].utilization_pct, readings[1].utilization_pct) == (50.0, None)
    [lost] = provider.health_events(0.0)
    assert (lost.gpu, lost.kind) == (1, "gpu_lost")
    ecc_reads = nvml.calls["nvmlDeviceGetTotalEccErrors"]
    assert faults(provider) == []
    assert nvml.calls["nvmlDeviceGetTotalEccErrors"] == ecc_reads + 1  # only GPU 0 now


def test_unsupported_queries_degrade_and_log_once(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml()
    nvml.unsupported |= {
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
    }
    with caplog.at_level(logging.WARNING, logger="phalanx.agent.gpus"):
        provider = NvmlProvider(nvml)
        for _ in range(3):
            assert faults(provider) == []
    assert nvml.registered == set()
    assert nvml.calls["nvmlDeviceGetTotalEccErrors"] == 2  # once per GPU, then not asked again
    assert nvml.calls["nvmlDeviceGetRemappedRows"] == 2
    text = [r.getMessage() for r in caplog.records]
    assert sum("ECC" in t for t in text) == 1
    assert sum("row remapping" in t for t in text) == 1
    assert any("XIDs are not reported" in t for t in text)
    assert [t.index for t in provider.telemetry()] == [0, 1]  # telemetry still works


def test_fake_provider_reports_injected_faults_and_rejects_bad_ones() -> None:
    gpus = FakeProvider(2)
    gpus.inject(FaultInjection(gpu=1, kind="xid", code=79, message="drill"))
    gpus.inject(FaultInjection(kind="gpu_lost"))
    [xid, lost] = gpus.health_events(0.0)
    assert (xid.gpu, xid.kind, xid.code) == (1, "xid", 79)
    assert xid.message == "XID 79 (GPU has fallen off the bus): drill"
    assert (lost.gpu, lost.kind, lost.code) == (None, "gpu_lost", None)
    assert gpus.health_events(0.0) == []
    for bad, why in [
        (FaultInjection(gpu=2, code=79), "no GPU 2"),
        (FaultInjection(code=None), "needs its code"),
        (FaultInjection(kind="ecc_uncorrectable", code=48), "has none"),
    ]:
        with pytest.raises(ValueError, match=why):
            gpus.inject(bad)


def test_classify() -> None:
    assert classify("xid", 94) == "fail_job"  # contained ECC: only that process
    assert classify("xid", 95) == "drain"
    assert classify("xid", 999) == "ignore"
    assert classify("xid", None) == "ignore"
    assert classify("gpu_lost", None) == "drain"


# ----------------------------------------------------------------------------- event queue
def fault(code: int, gpu: int = 0) -> GpuFault:
    return GpuFault(gpu, "xid", code, f"XID {code}", 1.5)


def test_queue_numbers_events_until_acked_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "health-events.json"
    queue = EventQueue(path, clock=lambda: 1000.0)  # a fresh state dir: after the clock
    a, b, c = (queue.add(fault(code)) for code in (13, 31, 79))
    assert [e.seq for e in (a, b, c)] == [1001, 1002, 1003]
    assert queue.pending() == [a, b, c]
    queue.ack(1002)
    assert queue.pending() == [c]
    queue.ack(1)  # an old ack changes nothing
    assert queue.pending() == [c]

    again = EventQueue(path, clock=lambda: 5.0)  # restarted, with a clock gone backwards
    assert again.pending() == [c]
    assert again.add(fault(48)).seq == 1004
    again.ack(1004)
    assert again.pending() == []
    assert json.loads(path.read_text()) == {"last_seq": 1004, "events": []}


def test_queue_keeps_the_newest_events(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    queue = EventQueue(None, limit=3, clock=lambda: 0.0)
    with caplog.at_level(logging.WARNING):
        for code in range(5):
            queue.add(fault(code))
    assert [e.code for e in queue.pending()] == [2, 3, 4]
    assert "never acknowledged" in caplog.text


def test_an_unreadable_state_file_starts_after_the_clock(tmp_path: Path) -> None:
    path = tmp_path / "health-events.json"
    path.write_text("{not json")
    assert EventQueue(path, clock=lambda: 77.0).add(fault(13)).seq == 78


# ----------------------------------------------------------------------------- checks
def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_checks_pass_fail_with_their_first_line_or_exit_code(tmp_path: Path) -> None:
    ok = script(tmp_path, "ok.sh", "echo all good")
    full = script(tmp_path, "disk.sh", "echo\necho 'scratch is 99% full'\necho more\nexit 1")
    stderr = script(tmp_path, "ib.sh", "echo 'ib0 is down' >&2; exit 2")
    silent = script(tmp_path, "quiet.sh", "exit 3")
    assert run_check(ok, 10) is None
    assert run_check(full, 10) == "disk.sh: scratch is 99% full"
    assert run_check(stderr, 10) == "ib.sh: ib0 is down"
    assert run_check(silent, 10) == "quiet.sh: exit 3"


def test_a_hung_check_fails_and_is_killed_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    hung = script(tmp_path, "hung.sh", f"sleep 300 &\necho $! > {pid_file}\nwait")
    assert run_check(hung, 0.5) == f"health check {hung} timed out after 0.5s"
    child = int(pid_file.read_text())
    wait_for("the check's child to be gone", lambda: not _alive(child), timeout=10)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie awaits its reaper: gone


def test_bad_check_paths_are_explained(tmp_path: Path) -> None:
    plain = tmp_path / "plain.sh"
    plain.write_text("exit 0\n")
    assert (
        check_problem(tmp_path / "missing.sh")
        == f"--health-check {tmp_path}/missing.sh: no such file"
    )
    assert "not executable" in (check_problem(plain) or "")
    with pytest.raises(AgentError, match="no such file"):
        run_agent(agent_config("http://127.0.0.1:9", tmp_path, [tmp_path / "missing.sh"]))
    with pytest.raises(AgentError, match="--health-interval must be > 0"):
        run_agent(agent_config("http://127.0.0.1:9", tmp_path, [], interval=0))


def test_monitor_reports_a_failure_and_the_recovery(tmp_path: Path) -> None:
    flag = tmp_path / "broken"
    flag.write_text("GPU 3 is too hot\n")
    check = script(tmp_path, "temp.sh", f"[ -f {flag} ] && {{ cat {flag}; exit 1; }}\nexit 0")
    changes: list[str | None] = []
    monitor = HealthMonitor(FakeProvider(1), EventQueue(None), [check], interval_s=10)
    monitor.on_change = lambda: changes.append(monitor.check_failure)
    assert monitor.run_checks() == "temp.sh: GPU 3 is too hot"
    assert monitor.snapshot().check_failure == "temp.sh: GPU 3 is too hot"
    monitor.run_checks()  # the same result: no news
    flag.unlink()
    assert monitor.run_checks() is None
    assert changes == ["temp.sh: GPU 3 is too hot", None]
    assert monitor.snapshot().check_failure is None


# ----------------------------------------------------------------------------- whole agent
@pytest.fixture
def head() -> Iterator[StubHead]:
    desired = DesiredState(version=1, jobs=[], heartbeat_s=0.3, lease_s=5.0, kill_grace_s=1.0)
    with serve(StubHead(desired)) as stub:
        yield stub


def agent_config(
    head_url: str, tmp_path: Path, checks: list[Path], interval: float = 30.0
) -> AgentConfig:
    return AgentConfig(
        head_url=head_url,
        token=JOIN,
        address="127.0.0.2",
        name="127.0.0.2",
        state_dir=tmp_path / "agent",
        fake_gpus=2,
        heartbeat_s=0.3,
        health_checks=tuple(checks),
        health_interval_s=interval,
    )


def test_injected_fault_and_check_failure_reach_the_heartbeat_until_acked(
    head: StubHead, tmp_path: Path
) -> None:
    check = script(tmp_path, "nhc.sh", "echo 'NHC: /scratch is read-only'; exit 1")
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run_agent(agent_config(head.url, tmp_path, [check]), stop)
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    agent = threading.Thread(target=target)
    agent.start()
    try:
        wait_for(
            "the check failure in a heartbeat",
            lambda: any(
                b.health is not None
                and b.health.check_failure == "nhc.sh: NHC: /scratch is read-only"
                for b in head.beats
            ),
        )
        reg = head.registered[0]
        faults_url = f"{reg.agent_url}/v1/faults"
        bearer = {"Authorization": f"Bearer {reg.agent_secret}"}
        body = {"gpu": 1, "kind": "xid", "code": 79, "message": "drill"}
        assert httpx.post(faults_url, json=body).status_code == 401
        wrong = {"Authorization": "Bearer not-the-secret"}
        assert httpx.post(faults_url, json=body, headers=wrong).status_code == 401
        r = httpx.post(faults_url, json={**body, "gpu": 5}, headers=bearer)
        assert (r.status_code, r.json()["detail"]) == (
            422,
            "this node has GPUs 0-1; there is no GPU 5",
        )
        assert httpx.post(faults_url, json=body, headers=bearer).status_code == 204

        def sent() -> Heartbeat | None:
            return next(
                (b for b in reversed(head.beats) if b.health is not None and b.health.events), None
            )

        health = wait_for("the event in a heartbeat", sent).health
        assert health is not None
        [event] = health.events
        assert (event.gpu, event.kind, event.code) == (1, "xid", 79)
        assert event.message == "XID 79 (GPU has fallen off the bus): drill"
        head.desired = head.desired.model_copy(update={"health_ack": event.seq})
        seen = len(head.beats)
        wait_for(
            "a heartbeat after the ack without the event",
            lambda: any(
                b.health is not None and not b.health.events for b in head.beats[seen + 1 :]
            ),
        )
    finally:
        stop.set()
        agent.join(timeout=30)
    assert errors == [] and not agent.is_alive()
    state = json.loads((tmp_path / "agent" / "health-events.json").read_text())
    assert state == {"last_seq": event.seq, "events": []}


def test_a_node_with_real_gpus_refuses_injection(tmp_path: Path) -> None:
    agent = start_agent("127.0.0.2", tmp_path)  # its API without an injector: real GPUs
    try:
        r = httpx.post(
            f"{agent.url}/v1/faults",
            json={"gpu": 0, "kind": "xid", "code": 48},
            headers={"Authorization": f"Bearer {AGENT_SECRET}"},
        )
    finally:
        agent.close()
    assert r.status_code == 409
    assert "real GPUs" in r.json()["detail"]
