"""Idle-GPU detection, policy actions and accounting on the head's real control loop and
store, with a fake clock and GPU samples of known utilisation: exact GPU-hours and flag
times."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from phalanx.api.models import GpuTelemetry
from phalanx.core.idle import IdleAction, IdlePolicy
from phalanx.head.mirror import Settings
from phalanx.head.telemetry import GpuSamples
from phalanx.head.usage import Usage
from phalanx.testing.clock import FakeClock
from phalanx.testing.headloop import HeadLoop

SAMPLE_S = 10.0


def _at(text: str) -> float:
    """Unix seconds of a UTC time `YYYY-MM-DD HH:MM`."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()


class Rig:
    """A head loop, its GPU samples and its usage service; the test sets each GPU's
    utilisation and lets time pass, every node sampling every SAMPLE_S."""

    def __init__(self, state: Path, start: float = _at("2026-03-02 08:00")) -> None:
        settings = Settings(tick_s=1.0, heartbeat_s=5.0, lease_s=60.0, kill_grace_s=2.0)
        self.loop = HeadLoop(state, settings, FakeClock(start))
        self.util: dict[tuple[str, int], float] = {}
        self._start_usage()

    def _start_usage(self) -> None:
        self.samples = GpuSamples()
        self.usage = Usage(self.loop.control, self.samples, run_op=self.loop.op)
        self.usage.load()

    def restart(self) -> None:
        """The head dies (nothing flushed) and starts again on its database."""
        self.loop.restart()
        self._start_usage()

    def node(self, name: str, gpus: int) -> None:
        self.loop.join(name, gpus=gpus)
        for i in range(gpus):
            self.util[(name, i)] = 0.0

    def run(self, seconds: float) -> None:
        """Let `seconds` pass (a multiple of SAMPLE_S), sampling at the end of each step."""
        steps = round(seconds / SAMPLE_S)
        assert steps * SAMPLE_S == seconds
        for _ in range(steps):
            self.loop.advance(SAMPLE_S)
            self.sample()

    def sample(self) -> None:
        now = self.loop.clock.time()
        nodes = sorted({n for n, _ in self.util})
        for node in nodes:
            gpus = [
                GpuTelemetry(index=i, utilization_pct=u)
                for (n, i), u in sorted(self.util.items())
                if n == node
            ]
            self.samples.record(node, gpus, now)
        self.usage.tick()

    def start(self, **spec: object) -> tuple[int, float]:
        """Submit a job; time passes (unsampled) until it runs: its id and start time."""
        job = self.loop.submit(**spec)  # type: ignore[arg-type]
        for _ in range(10):
            if self.loop.state(job) == "R":
                break
            self.loop.advance(1.0)
        start = self.loop.job(job).start_time
        assert start == self.loop.clock.time(), self.loop.moves(job)
        return job, start

    def end(self, job: int, ranks: int, code: int = 0) -> float:
        """The job's ranks exit with `code`; time passes (unsampled) until it ends."""
        for rank in range(ranks):
            self.loop.exit(job, rank, code)
        for _ in range(60):
            if self.loop.state(job) not in ("R", "CG", "PR"):
                break
            self.loop.advance(1.0)
        end = self.loop.job(job).end_time
        assert end is not None, self.loop.moves(job)
        return end

    def report(self, by: str = "user", per: str = "day") -> list[dict[str, object]]:
        self.usage.flush()
        return self.usage.report(by, per, "2000-01-01", "2100-01-01", None)  # type: ignore[arg-type]

    def events(self, job: int, kind: str) -> list[tuple[float, str]]:
        return [(e.time, e.message) for e in self.loop.events(job) if e.kind == kind]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    r = Rig(tmp_path / "head")
    r.node("n1", gpus=2)
    return r


def _one(rows: list[dict[str, object]]) -> dict[str, object]:
    assert len(rows) == 1, rows
    return rows[0]


def test_flag_at_the_window_busy_again_clears_and_exact_gpu_hours(rig: Rig) -> None:
    rig.util[("n1", 0)] = 100.0
    job, start = rig.start(launcher="node", gpus_per_node=2)
    rig.run(1790.0)
    assert rig.usage.idle.flags() == []  # idle 1790 s of the 1800 s window: not yet
    rig.run(10.0)
    flags = rig.usage.idle.flags()
    assert [(f.node, f.index, f.idle_since, f.flagged_at) for f in flags] == [
        ("n1", 1, start, start + 1800.0)
    ]
    assert [t for t, _ in rig.events(job, "gpu_idle")] == [start + 1800.0]
    assert "GPU n1:1 idle (≤ 1% utilisation) for 30 min" in rig.events(job, "gpu_idle")[0][1]
    rig.run(600.0)  # still idle: still flagged, nothing done (notify is the default)
    assert len(rig.usage.idle.flags()) == 1
    assert rig.loop.state(job) == "R"
    rig.util[("n1", 1)] = 50.0
    rig.run(10.0)
    assert rig.usage.idle.flags() == []
    assert [t for t, _ in rig.events(job, "gpu_busy")] == [start + 2410.0]
    rig.run(590.0)
    end = rig.end(job, ranks=1)
    row = _one(rig.report())
    assert row["period"] == "2026-03-02" and row["key"] == "alice"
    assert row["alloc_gpu_hours"] == pytest.approx(2 * (end - start) / 3600, rel=1e-12)
    # GPU 0 at 100% for the 3000 sampled seconds; GPU 1 at 50% for its last 600.
    assert row["util_gpu_hours"] == pytest.approx((3000.0 + 0.5 * 600.0) / 3600, rel=1e-12)
    # GPU 1's whole idle stretch (2400 s) counts once it was flagged.
    assert row["idle_gpu_hours"] == pytest.approx(2400.0 / 3600, rel=1e-12)
    assert (row["jobs"], row["failures"], row["preemptions"]) == (1, 0, 0)


def test_an_idle_stretch_shorter_than_the_window_is_not_idle_time(rig: Rig) -> None:
    job, _ = rig.start(launcher="node", gpus_per_node=1)
    rig.run(1000.0)  # idle 1000 s, then busy
    rig.util[("n1", 0)] = 100.0
    rig.run(100.0)
    rig.end(job, ranks=1)
    row = _one(rig.report())
    assert row["idle_gpu_hours"] == 0.0
    assert row["util_gpu_hours"] == pytest.approx(100.0 / 3600, rel=1e-12)
    assert rig.events(job, "gpu_idle") == []


def test_preempt_after_the_grace_sends_the_notice_and_requeues(rig: Rig) -> None:
    policy = IdlePolicy(IdleAction.PREEMPT, window_s=600.0, grace_s=120.0)
    rig.usage.set_policy("default", policy)
    job, start = rig.start(launcher="node", gpus_per_node=1, preempt_grace_s=300)
    rig.run(710.0)
    assert rig.loop.state(job) == "R"  # flagged at 600 s; the grace runs to 720 s
    rig.run(10.0)
    assert rig.loop.state(job) == "PR"
    ((when, message),) = rig.events(job, "idle_action")
    assert when == start + 720.0
    assert message.startswith("preempt: GPU n1:0 idle for 10 min and 2 min of grace")
    rec = rig.loop.job(job)
    assert [n.signal for n in rec.notices] == ["SIGUSR1"]
    assert "idle-GPU policy" in rec.notices[0].reason
    rig.loop.exit(job, 0, 75)  # it checkpointed and asks to be requeued
    for _ in range(30):
        if ("CG", "PD") in rig.loop.moves(job):
            break
        rig.loop.advance(1.0)
    assert rig.loop.moves(job)[:5] == [
        ("PD", "R"),
        ("R", "PR"),
        ("PR", "CG"),
        ("CG", "PD"),
        ("PD", "R"),
    ]
    assert rig.loop.job(job).restart_count == 1
    assert rig.usage.idle.flags() == []  # the new run starts with a clean slate
    row = _one(rig.report())
    assert (row["jobs"], row["failures"], row["preemptions"]) == (0, 0, 1)


def test_cancel_with_no_grace_cancels_at_the_flag(rig: Rig) -> None:
    rig.usage.set_policy("default", IdlePolicy(IdleAction.CANCEL, window_s=300.0, grace_s=0.0))
    job, start = rig.start(launcher="node", gpus_per_node=2)
    rig.util[("n1", 0)] = 100.0  # one GPU busy is not enough: the other is idle
    rig.run(300.0)
    for _ in range(30):
        if rig.loop.state(job) == "CA":
            break
        rig.loop.advance(1.0)
    assert rig.loop.state(job) == "CA"
    assert rig.loop.job(job).reason == "IdleGPU"
    assert [t for t, _ in rig.events(job, "idle_action")] == [start + 300.0]
    row = _one(rig.report())
    assert (row["jobs"], row["failures"]) == (1, 0)


def test_notify_never_acts(rig: Rig) -> None:
    rig.usage.set_policy("default", IdlePolicy(IdleAction.NOTIFY, window_s=60.0, grace_s=0.0))
    job, _ = rig.start(launcher="node", gpus_per_node=1)
    rig.run(600.0)
    assert rig.loop.state(job) == "R"
    assert len(rig.events(job, "gpu_idle")) == 1
    assert rig.events(job, "idle_action") == []


def test_a_tick_flags_between_samples(rig: Rig) -> None:
    rig.usage.set_policy("default", IdlePolicy(window_s=55.0))
    job, start = rig.start(launcher="node", gpus_per_node=1)
    rig.run(50.0)
    rig.loop.advance(5.0)
    rig.usage.tick()  # no sample at 55 s: the tick flags it
    assert [f.flagged_at for f in rig.usage.idle.flags()] == [start + 55.0]
    assert [t for t, _ in rig.events(job, "gpu_idle")] == [start + 55.0]


def test_policies_and_counts_survive_a_head_restart(rig: Rig) -> None:
    rig.usage.set_policy("default", IdlePolicy(IdleAction.CANCEL, 900.0, 60.0, 5.0))
    rig.util[("n1", 0)] = rig.util[("n1", 1)] = 100.0
    job, start = rig.start(launcher="node", gpus_per_node=2)
    rig.run(1000.0)
    rig.usage.flush()
    rig.run(500.0)
    rig.restart()  # a crash: the last 500 s were never flushed
    assert rig.usage.idle.policy("default") == IdlePolicy(IdleAction.CANCEL, 900.0, 60.0, 5.0)
    rig.run(500.0)
    end = rig.end(job, ranks=1)
    row = _one(rig.report())
    # Allocation comes from the job event log: nothing lost. Samples since the last flush
    # before the crash are (the 500 s, 2 GPUs at 100%).
    assert row["alloc_gpu_hours"] == pytest.approx(2 * (end - start) / 3600, rel=1e-12)
    assert row["util_gpu_hours"] == pytest.approx(2 * 1500.0 / 3600, rel=1e-12)
    assert row["jobs"] == 1


def test_a_graceful_stop_keeps_the_samples(rig: Rig) -> None:
    rig.util[("n1", 0)] = 40.0
    job, _ = rig.start(launcher="node", gpus_per_node=1)
    rig.run(200.0)
    rig.usage.stop()
    rig.restart()
    rig.run(100.0)
    rig.end(job, ranks=1)
    row = _one(rig.report())
    assert row["util_gpu_hours"] == pytest.approx(0.4 * 300.0 / 3600, rel=1e-12)


def test_a_job_across_midnight_counts_on_both_days(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "head", start=_at("2026-03-31 23:00"))
    rig.node("n1", gpus=4)
    for i in range(4):
        rig.util[("n1", i)] = 25.0
    job, start = rig.start(launcher="node", gpus_per_node=4, qos="high")
    rig.run(7200.0)  # sampled up to start + 7200 s, past 01:00
    end = rig.end(job, ranks=1)
    midnight = _at("2026-04-01 00:00")
    by_day = rig.report("user", "day")
    assert [r["period"] for r in by_day] == ["2026-03-31", "2026-04-01"]
    assert by_day[0]["alloc_gpu_hours"] == pytest.approx(4 * (midnight - start) / 3600, rel=1e-12)
    assert by_day[1]["alloc_gpu_hours"] == pytest.approx(4 * (end - midnight) / 3600, rel=1e-12)
    assert by_day[0]["util_gpu_hours"] == pytest.approx((midnight - start) / 3600, rel=1e-12)
    assert by_day[1]["util_gpu_hours"] == pytest.approx((start + 7200 - midnight) / 3600, rel=1e-12)
    assert (by_day[0]["jobs"], by_day[1]["jobs"]) == (0, 1)
    by_month = rig.report("qos", "month")
    assert [(r["period"], r["key"]) for r in by_month] == [("2026-03", "high"), ("2026-04", "high")]
    assert by_month[0]["alloc_gpu_hours"] == by_day[0]["alloc_gpu_hours"]
    assert by_month[0]["utilization_pct"] == pytest.approx(25.0, rel=1e-12)
    assert by_month[1]["alloc_gpu_hours"] == by_day[1]["alloc_gpu_hours"]


def test_failures_and_groups(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "head")
    rig.node("n1", gpus=2)
    ok, _ = rig.start(launcher="node", gpus_per_node=1)
    bad, _ = rig.start(launcher="node", gpus_per_node=1, requeue=False)
    rig.run(60.0)
    rig.end(ok, ranks=1)
    rig.end(bad, ranks=1, code=3)
    assert rig.loop.state(bad) == "F"
    row = _one(rig.report("team", "month"))
    assert (row["key"], row["jobs"], row["failures"]) == ("default", 2, 1)


def test_a_failing_subscriber_neither_stops_the_recorder_nor_the_others() -> None:
    samples = GpuSamples()
    seen: list[tuple[str, float]] = []

    def broken(node: str, gpus: object, t: float) -> None:
        raise RuntimeError("bug in a subscriber")

    samples.subscribe(broken)
    samples.subscribe(lambda node, gpus, t: seen.append((node, t)))
    samples.record("n1", [GpuTelemetry(index=0, utilization_pct=5.0)], 12.0)
    samples.record("n1", [], 13.0)  # no reading: nobody is called
    assert seen == [("n1", 12.0)]
    reading = samples.latest("n1")
    assert reading is not None and reading.time == 12.0
