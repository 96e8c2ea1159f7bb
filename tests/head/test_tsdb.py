"""The telemetry store on SQLite and PostgreSQL with a fake clock: chunks per node and hour,
compaction, minute and hour rollups with exact values, retention, the sample stream handed
to GpuSamples in time order, and series at each resolution."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, select

from phalanx.api.models import GpuTelemetry, JobProgress
from phalanx.api.telemetry import TelemetryBatch
from phalanx.head import db
from phalanx.head.migrate import upgrade
from phalanx.head.telemetry import GpuReading, GpuSamples
from phalanx.head.tsblocks import unpack_raw, unpack_rollup
from phalanx.head.tsdb import HOUR, MINUTE, RAW, Retention, TelemetryStore
from phalanx.testing.clock import FakeClock
from phalanx.testing.postgres import PostgresServer

DAY = 86400.0
T0 = 19676 * DAY  # a midnight (UTC)
JOB = 7


@contextmanager
def _migrated(url: str) -> Iterator[Engine]:
    engine = db.make_engine(url)
    try:
        upgrade(engine)
        yield engine
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        url = pg.new_database(f"tsdb_{request.node.name.split('[')[0][-40:]}")
    else:
        url = db.default_url(tmp_path)
    with _migrated(url) as e:
        yield e


def flat(a: list[Any], b: list[Any]) -> list[Any]:
    """Two GPUs' values, sample-major (a batch's layout)."""
    return [x for pair in zip(a, b, strict=True) for x in pair]


class Stream(GpuSamples):
    """GpuSamples that also keeps every (node, time, readings) it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, float, Sequence[GpuReading]]] = []

    def stream(self, node: str, gpus: Sequence[GpuReading], now: float) -> None:
        self.seen.append((node, now, gpus))
        super().stream(node, gpus, now)


def _batch(node: str, times: list[float], util0: float, energy0: list[float]) -> TelemetryBatch:
    """GPU 0 held by job 7 at `util0`; GPU 1 idle and unheld."""
    n = len(times)
    return TelemetryBatch.model_validate(
        {
            "node": node,
            "sent_at": times[-1],
            "gpus": [0, 1],
            "times": times,
            "utilization_pct": flat([util0] * n, [0.0] * n),
            "memory_used_mb": flat([4000] * n, [0] * n),
            "power_w": flat([300.0] * n, [65.0] * n),
            "temperature_c": flat([60.0] * n, [32.0] * n),
            "energy_j": flat(energy0, [t - T0 for t in times]),
            "job_id": flat([JOB] * n, [None] * n),
            "epoch": flat([1] * n, [None] * n),
        }
    )


def _feed(store: TelemetryStore, clock: FakeClock, start: float, minutes: int) -> None:
    """A sample every 10 s from `start`, shipped a minute at a time: GPU 0 at 30% in the
    first hour of the day and 70% after, using 100 J per sample."""
    for m in range(minutes):
        times = [start + 60 * m + 10 * k for k in range(6)]
        util = 30.0 if times[0] < T0 + 3600 else 70.0
        clock.wall = times[-1]
        store.submit(_batch("n1", times, util, [100.0 * (t - T0) / 10 for t in times]))
        store.drain()
        store.flush()


def _chunks(engine: Engine, level: int) -> list[tuple[float, float, bytes]]:
    t = db.telemetry_chunks
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.c.start, t.c.end, t.c.data).where(t.c.level == level).order_by(t.c.start)
        ).all()
    return [(r.start, r.end, r.data) for r in rows]


def test_chunks_rollups_and_retention(engine: Engine) -> None:
    clock = FakeClock(T0)
    stream = Stream()
    retention = Retention(raw_s=DAY, minute_s=2 * DAY, hour_s=3 * DAY)
    store = TelemetryStore(engine, clock.time, stream, retention)
    _feed(store, clock, T0, 120)  # two hours: 720 samples
    clock.wall = T0 + 7200 + 60
    store.maintain(clock.time())

    # Each closed hour: one raw chunk (compacted from a chunk a minute) and one chunk of
    # 60 minute rollups.
    raw = _chunks(engine, RAW)
    assert [(s, e) for s, e, _ in raw] == [(T0, T0 + 3590), (T0 + 3600, T0 + 7190)]
    first = unpack_raw(raw[0][2])
    assert first.n == 360 and first.gpus.tolist() == [0, 1]
    assert np.all(first.util[0] == 30.0) and np.all(first.util[1] == 0.0)
    assert np.all(first.job[0] == JOB) and np.all(first.job[1] == 0)
    minutes = _chunks(engine, MINUTE)
    assert [s for s, _, _ in minutes] == [T0, T0 + 3600]
    m0, m1 = (unpack_rollup(d) for _, _, d in minutes)
    assert m0.starts.tolist() == [T0 + 60 * k for k in range(60)]
    assert np.all(m0.mean_util[0] == 30.0) and np.all(m1.mean_util[0] == 70.0)
    assert np.all(m0.samples == 6) and np.all(m0.max_memory[0] == 4000)
    # 100 J a sample on GPU 0: 5 steps in the day's first minute, 6 in every other (the
    # step across the hour boundary included), 10 J a sample on GPU 1.
    assert m0.energy[0].tolist() == [500.0] + [600.0] * 59
    assert m1.energy[0].tolist() == [600.0] * 60
    assert m1.energy[1].tolist() == [60.0] * 60

    # Every sample reached GpuSamples, in time order, tagged with its job.
    times = [t for node, t, _ in stream.seen if node == "n1"]
    assert len(times) == 720 and times == sorted(times) and times[0] == T0
    assert {g[0].job_id for _, _, g in stream.seen} == {JOB}
    assert {g[1].job_id for _, _, g in stream.seen} == {None}

    # Series at each resolution.
    res, raw_series = store.series(JOB, "raw")
    assert res == "raw" and [(s.node, s.index) for s in raw_series] == [("n1", 0)]
    assert len(raw_series[0].points) == 720
    _, by_minute = store.series(JOB, "minute")
    assert [p.value for p in by_minute[0].points] == [30.0] * 60 + [70.0] * 60
    _, by_hour = store.series(JOB, "hour")  # from minutes, the day not being over
    assert [(p.time, p.value) for p in by_hour[0].points] == [(T0, 30.0), (T0 + 3600, 70.0)]

    # The next day: the day's hour rollups, then retention one level at a time.
    clock.wall = T0 + DAY + 2 * 3600
    store.maintain(clock.time())
    [(start, end, data)] = _chunks(engine, HOUR)
    assert (start, end) == (T0, T0 + DAY)
    hours = unpack_rollup(data)
    assert hours.mean_util[0].tolist() == [30.0, 70.0] and hours.samples[0].tolist() == [360, 360]
    assert hours.energy[0].tolist() == [35_900.0, 36_000.0]
    assert _chunks(engine, RAW) == []  # older than a day
    assert len(_chunks(engine, MINUTE)) == 2
    _, by_hour = store.series(JOB, "hour")
    assert [p.value for p in by_hour[0].points] == [30.0, 70.0]
    clock.wall = T0 + 2 * DAY + 3 * 3600
    store.maintain(clock.time())
    assert _chunks(engine, MINUTE) == [] and len(_chunks(engine, HOUR)) == 1
    clock.wall = T0 + 4 * DAY - 60  # an hour chunk holds a day: it goes when all of it is old
    store.maintain(clock.time())
    assert len(_chunks(engine, HOUR)) == 1
    clock.wall = T0 + 4 * DAY + 60
    store.maintain(clock.time())
    assert _chunks(engine, HOUR) == []


def test_resent_and_late_samples(engine: Engine) -> None:
    clock = FakeClock(T0)
    stream = Stream()
    store = TelemetryStore(engine, clock.time, stream)
    _feed(store, clock, T0, 2)
    # The agent sends the last minute again (its answer was lost) plus one new sample:
    # only the new one is stored and streamed.
    times = [T0 + 60 + 10 * k for k in range(7)]
    clock.wall = times[-1]
    store.submit(_batch("n1", times, 30.0, [100.0 * (t - T0) / 10 for t in times]))
    store.drain()
    assert store.counters.stale == 6
    [block] = store.raw("n1", T0, T0 + 3600)  # buffered and stored alike, once each
    assert block.n == 13 and block.times.tolist() == [T0 + 10 * k for k in range(13)]
    assert len(stream.seen) == 13
    # A batch whose clock runs 5 s behind the head's: its samples land on the head's clock.
    clock.wall = T0 + 200
    late = _batch("n2", [T0 + 190.0, T0 + 195.0], 50.0, [0.0, 10.0])
    store.submit(late.model_copy(update={"sent_at": T0 + 195.0}))
    store.drain()
    [b2] = store.raw("n2", T0, T0 + 3600)
    assert b2.times.tolist() == [T0 + 195.0, T0 + 200.0]


def test_ingest_queue_is_bounded(engine: Engine) -> None:
    clock = FakeClock(T0)
    store = TelemetryStore(engine, clock.time, GpuSamples(), queue_max=2)
    b = _batch("n1", [T0], 10.0, [0.0])
    store.submit(b)
    store.submit(b)
    from phalanx.head.tsdb import Overloaded

    with pytest.raises(Overloaded):
        store.submit(b)
    assert store.counters.refused_busy == 1
    assert store.drain() == 2


def test_progress_history_keeps_rank_0_every_few_seconds(engine: Engine) -> None:
    clock = FakeClock(T0)
    store = TelemetryStore(engine, clock.time, GpuSamples(), progress_every_s=5.0)
    for i in range(12):  # a report a second from ranks 0 and 1
        for rank in (0, 1):
            report = JobProgress(rank=rank, step=i, loss=1.0, mfu=0.4 + i / 100, time=T0 + i)
            store.progress(JOB, report)
        clock.advance(1.0)
    store.drain()
    buffered = [(r.step, r.time) for r in store.progress_rows(JOB)]
    assert buffered == [(0, T0), (5, T0 + 5), (10, T0 + 10)]
    store.flush()
    assert [(r.step, r.mfu) for r in store.progress_rows(JOB)] == [(0, 0.4), (5, 0.45), (10, 0.5)]
    assert store.progress_rows(JOB + 1) == []


def test_heartbeat_readings_update_the_latest_view_but_not_the_stream() -> None:
    stream = Stream()
    now = [GpuTelemetry(index=0, utilization_pct=50.0)]
    stream.observe("n1", now, 100.0)  # a heartbeat's reading
    assert stream.seen == []
    latest = stream.latest("n1")
    assert latest is not None and latest.time == 100.0
    # A batch's older samples reach the stream but do not roll the latest view back.
    stream.record("n1", [GpuTelemetry(index=0, utilization_pct=10.0)], 90.0)
    assert [t for _, t, _ in stream.seen] == [90.0]
    latest = stream.latest("n1")
    assert latest is not None and latest.gpus[0].utilization_pct == 50.0
    stream.record("n1", [GpuTelemetry(index=0, utilization_pct=20.0)], 110.0)
    latest = stream.latest("n1")
    assert latest is not None and latest.gpus[0].utilization_pct == 20.0
