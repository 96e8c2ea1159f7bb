"""The head's embedded time-series store: GPU telemetry and training progress, on the head's
own database (SQLite or PostgreSQL), written by its own thread with its own connections.

Storage (db.py `telemetry_chunks`): one row per node and time range holding packed numpy
arrays (head/tsblocks.py), never one row per sample. Batches from agents are buffered in
memory per node and flushed every `flush_s` (30 s) as one chunk per node and hour; each
closed hour is then compacted into one raw chunk plus a chunk of minute rollups, and each
closed day's minutes into a chunk of hour rollups. Retention (`phalanx head
--telemetry-raw-days/--telemetry-minute-days/--telemetry-hour-days`: 7, 30, 365 days)
deletes old chunks in the same background pass, and each job that ended gets its
efficiency summary (head/jobstats.py) written to `job_stats`, kept forever.

The control thread never waits for any of this: ingest is a queue the request thread fills
and this thread drains; its transactions are short (one multi-row insert per flush).
Readers see the buffered samples too, so a job's stats are live before a flush.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    func,
    insert,
    select,
    update,
)

from phalanx.api.models import JobProgress
from phalanx.api.states import TERMINAL_JOB_STATES
from phalanx.api.telemetry import GpuSeries, JobStats, Resolution, TelemetryBatch
from phalanx.head import db, tsmaint
from phalanx.head.jobstats import (
    JobFacts,
    ProgressRow,
    compute,
    raw_series,
    rollup_series,
)
from phalanx.head.mirror import Settings
from phalanx.head.telemetry import GpuSamples, Sample
from phalanx.head.tsblocks import (
    RawBlock,
    RollupBlock,
    concat,
    dedupe,
    rollup,
    rollup_of_rollup,
    split_hours,
    unpack_raw,
    unpack_rollup,
)
from phalanx.head.tsmaint import DAY_S, HOUR, HOUR_S, MINUTE, RAW, raw_row

log = logging.getLogger(__name__)

FLUSH_GROUP = 100  # nodes written per transaction
_T = db.telemetry_chunks
__all__ = ["HOUR", "MINUTE", "RAW", "Overloaded", "Retention", "TelemetryStore", "retention"]


def retention(settings: Settings) -> Retention:
    """The retention `phalanx head --telemetry-*-days` asked for."""
    return Retention(
        settings.telemetry_raw_days * DAY_S,
        settings.telemetry_minute_days * DAY_S,
        settings.telemetry_hour_days * DAY_S,
    )


class Overloaded(RuntimeError):
    """The ingest queue is full: the agent should retry later."""


@dataclass(frozen=True)
class Retention:
    raw_s: float = 7 * DAY_S
    minute_s: float = 30 * DAY_S
    hour_s: float = 365 * DAY_S


@dataclass
class _Ingest:
    batch: TelemetryBatch
    received: float  # head clock


@dataclass
class _Progress:
    job_id: int
    report: JobProgress
    time: float  # head clock


@dataclass
class Counters:
    batches: int = 0
    samples: int = 0
    dropped_by_agents: int = 0  # samples agents reported dropped
    stale: int = 0  # samples older than what the node already sent (resent)
    refused_busy: int = 0  # batches refused with 503 (queue full)
    flushes: int = 0
    longest_flush_tx_ms: float = 0.0  # the last flush's longest transaction
    chunks_written: int = 0
    summaries: int = 0
    errors: int = 0
    by_node_dropped: dict[str, int] = field(default_factory=dict)


class TelemetryStore:
    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], float],
        samples: GpuSamples,
        retention: Retention | None = None,
        *,
        flush_s: float = 30.0,
        maintain_s: float = 5.0,
        settle_s: float = 12.0,
        queue_max: int = 4096,
        progress_every_s: float = 5.0,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.samples = samples
        self.retention = retention or Retention()
        self.flush_s = flush_s
        self.maintain_s = maintain_s
        self.settle_s = settle_s  # an ended job's summary waits this long for its samples
        self.progress_every_s = progress_every_s
        self.counters = Counters()
        self._queue: queue.Queue[_Ingest | _Progress] = queue.Queue(queue_max)
        self._lock = threading.Lock()  # the buffers below (readers copy them)
        self._pending: dict[str, list[RawBlock]] = {}
        self._flushing: dict[str, list[RawBlock]] = {}
        self._last_time: dict[str, float] = {}  # per node: the newest sample taken
        self._job_nodes: dict[tuple[int, int, str], list[float]] = {}  # dirty: first, last
        self._known_job_nodes: set[tuple[int, int, str]] = set()
        self._progress_rows: list[dict[str, object]] = []
        self._progress_last: dict[int, float] = {}
        self.watermark: float | None = None  # hours before this are compacted (tsmaint)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.leader: Callable[[], bool] = lambda: True  # False: a standby (writes nothing)

    # ------------------------------------------------------------------ ingest side
    def submit(self, batch: TelemetryBatch) -> None:
        """Queue a batch from a node's agent (the request thread); raises Overloaded."""
        try:
            self._queue.put_nowait(_Ingest(batch, self.clock()))
        except queue.Full:
            self.counters.refused_busy += 1
            raise Overloaded("telemetry ingest is behind; retry shortly") from None

    def progress(self, job_id: int, report: JobProgress) -> None:
        """Keep a training progress report in the job's history (rank 0's, one per
        `progress_every_s`); dropped when the queue is full (it is history, not state)."""
        if report.rank != 0:
            return
        now = self.clock()
        if now - self._progress_last.get(job_id, -math.inf) < self.progress_every_s:
            return
        self._progress_last[job_id] = now
        if len(self._progress_last) > 100_000:
            self._progress_last.clear()
        try:
            self._queue.put_nowait(_Progress(job_id, report, now))
        except queue.Full:
            self.counters.refused_busy += 1

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        try:
            self.drain()
            self.flush()
        except Exception:
            log.exception("flushing telemetry at shutdown failed")

    def _loop(self) -> None:
        next_flush = time.monotonic() + self.flush_s
        next_maint = time.monotonic() + self.maintain_s
        while not self._stop.is_set():
            try:
                self.drain(timeout=0.2)
                mono = time.monotonic()
                if mono >= next_flush:
                    next_flush = mono + self.flush_s
                    self.flush()
                if mono >= next_maint:
                    next_maint = mono + self.maintain_s
                    self.maintain(self.clock())
            except Exception:  # the store must outlive a bad batch or a database hiccup
                self.counters.errors += 1
                log.exception("telemetry store pass failed")
                self._stop.wait(1.0)

    def drain(self, timeout: float = 0.0) -> int:
        """Ingest what is queued (waiting up to `timeout` for the first item)."""
        n = 0
        try:
            item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
        except queue.Empty:
            return 0
        while True:
            if isinstance(item, _Ingest):
                self._ingest(item.batch, item.received)
            else:
                self._keep_progress(item)
            n += 1
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return n

    def _keep_progress(self, p: _Progress) -> None:
        r = p.report
        with self._lock:
            self._progress_rows.append(
                {
                    "job_id": p.job_id,
                    "time": p.time,
                    "step": r.step,
                    "loss": r.loss,
                    "tokens_per_s": r.tokens_per_s,
                    "mfu": r.mfu,
                }
            )

    def _ingest(self, b: TelemetryBatch, received: float) -> None:
        node = b.node
        c = self.counters
        c.batches += 1
        if b.dropped:
            c.dropped_by_agents += b.dropped
            c.by_node_dropped[node] = c.by_node_dropped.get(node, 0) + b.dropped
        g, n = len(b.gpus), len(b.times)
        if not n:
            return
        times = np.asarray(b.times, dtype=np.float64) + (received - b.sent_at)

        def grid(values: list[float | None] | list[int | None]) -> npt.NDArray[Any]:
            return np.asarray(values, dtype=np.float64).reshape(n, g).T.copy()

        jobs = np.nan_to_num(grid(b.job_id)).astype(np.int32)
        epochs = np.nan_to_num(grid(b.epoch), nan=-1).astype(np.int32)
        usage = b.jobs
        block = RawBlock(
            times,
            np.asarray(b.gpus, dtype=np.int32),
            grid(b.utilization_pct),
            grid(b.memory_used_mb),
            grid(b.power_w),
            grid(b.temperature_c),
            grid(b.energy_j),
            jobs,
            epochs,
            np.asarray([u.job_id for u in usage], dtype=np.int32),
            np.asarray([u.epoch for u in usage], dtype=np.int32),
            np.asarray([u.time for u in usage], dtype=np.float64) + (received - b.sent_at),
            np.asarray([u.cpu_cores for u in usage], dtype=np.float64),
            np.asarray([u.cpus for u in usage], dtype=np.int32),
            np.asarray([u.memory_mb for u in usage], dtype=np.float64),
        )
        last = self._last_time.get(node, -math.inf)
        if times[0] <= last:  # resent after a lost answer, or a clock step back: keep new only
            fresh = block.window(math.nextafter(last, math.inf), math.inf)
            c.stale += n - fresh.n
            block = fresh
            if not block.n:
                return
        self._last_time[node] = float(block.times[-1])
        c.samples += block.n
        with self._lock:
            self._pending.setdefault(node, []).append(block)
            jobs, epochs = block.job, block.epoch  # G×N each
            held = {
                (job, epoch)
                for job, epoch in zip(jobs.ravel().tolist(), epochs.ravel().tolist(), strict=True)
                if job
            }
            for job, epoch in held:  # usually one job per node: one pass over the block
                when = block.times[((jobs == job) & (epochs == epoch)).any(axis=0)]
                t0, t1 = float(when[0]), float(when[-1])  # times ascend
                span = self._job_nodes.setdefault((job, epoch, node), [t0, t1])
                span[0], span[1] = min(span[0], t0), max(span[1], t1)
        self._record_latest(node, block)

    def _record_latest(self, node: str, b: RawBlock) -> None:
        """Hand each sample to GpuSamples in time order (idle detection, accounting)."""
        gpus = b.gpus.tolist()
        cols = [
            x.T.tolist() for x in (b.util, b.memory, b.temperature, b.power, b.energy)
        ]  # N×G each
        jobs = b.job.T.tolist()
        for k, t in enumerate(b.times.tolist()):
            u, m, c, p, e = (col[k] for col in cols)
            readings = [
                Sample(
                    gpu,
                    _f(u[i]),
                    None if _f(m[i]) is None else int(m[i]),
                    _f(c[i]),
                    _f(p[i]),
                    _f(e[i]),
                    jobs[k][i] or None,
                )
                for i, gpu in enumerate(gpus)
            ]
            self.samples.stream(node, readings, t)

    # ------------------------------------------------------------------ writes
    def flush(self) -> int:
        """Write the buffered samples, job spans and progress reports (one transaction)."""
        with self._lock:
            self._flushing, self._pending = self._pending, {}
            spans, self._job_nodes = self._job_nodes, {}
            progress, self._progress_rows = self._progress_rows, []
        if not (self._flushing or spans or progress):
            return 0
        # Nodes a few hundred at a time, each group its own short transaction: on SQLite a
        # write transaction holds the database's one write lock, which the control thread's
        # commits (submits) wait for; many short holds delay a submit far less than one.
        nodes = list(self._flushing)
        written = 0
        longest = 0.0
        try:
            for i in range(0, len(nodes), FLUSH_GROUP):
                group = nodes[i : i + FLUSH_GROUP]
                rows = [
                    raw_row(node, part)
                    for node in group
                    for merged in concat(self._flushing[node])
                    for part in split_hours(merged)
                ]
                t0 = time.perf_counter()
                with self.engine.begin() as conn:
                    conn.execute(insert(_T), rows)
                longest = max(longest, time.perf_counter() - t0)
                with self._lock:
                    for node in group:
                        del self._flushing[node]
                written += len(rows)
            with self.engine.begin() as conn:
                self._write_spans(conn, spans)
                if progress:
                    conn.execute(insert(db.job_progress), progress)
        except Exception:
            with self._lock:  # keep what was not written for the next flush
                for node, blocks in self._flushing.items():
                    self._pending[node] = blocks + self._pending.get(node, [])
                for key, span in spans.items():
                    s = self._job_nodes.setdefault(key, span)
                    s[0], s[1] = min(s[0], span[0]), max(s[1], span[1])
                self._progress_rows = progress + self._progress_rows
                self._flushing = {}
            raise
        self.counters.flushes += 1
        self.counters.chunks_written += written
        self.counters.longest_flush_tx_ms = round(1000 * longest, 2)
        return written

    def _write_spans(
        self, conn: Connection, spans: dict[tuple[int, int, str], list[float]]
    ) -> None:
        """Which job ran on which node when: new rows, or a later `last` (one statement
        each, executed for many rows)."""
        jn = db.job_nodes
        new, later = [], []
        unknown = [k for k in spans if k not in self._known_job_nodes]
        found: set[tuple[int, int, str]] = set()
        for part in range(0, len(unknown), 500):
            keys = unknown[part : part + 500]
            rows = conn.execute(
                select(jn.c.job_id, jn.c.epoch, jn.c.node).where(
                    jn.c.job_id.in_(sorted({k[0] for k in keys}))
                )
            ).all()
            found |= {(r.job_id, r.epoch, r.node) for r in rows}
        for key, (t0, t1) in spans.items():
            job, epoch, node = key
            if key in self._known_job_nodes or key in found:
                later.append({"j": job, "e": epoch, "n": node, "t": t1})
            else:
                new.append({"job_id": job, "epoch": epoch, "node": node, "first": t0, "last": t1})
            self._known_job_nodes.add(key)
        if new:
            conn.execute(insert(jn), new)
        if later:
            conn.execute(
                update(jn)
                .where(
                    and_(
                        jn.c.job_id == bindparam("j"),
                        jn.c.epoch == bindparam("e"),
                        jn.c.node == bindparam("n"),
                    )
                )
                .values(last=bindparam("t")),
                later,
            )
        if len(self._known_job_nodes) > 200_000:
            self._known_job_nodes.clear()

    def maintain(self, now: float) -> None:
        """Compact and roll up closed hours and days, apply retention, write the summaries
        of jobs that ended (head/tsmaint.py)."""
        if self.leader():
            tsmaint.maintain(self, now)

    # ------------------------------------------------------------------ reads
    def facts(self, job_id: int, now: float) -> JobFacts | None:
        j = db.jobs
        with self.engine.connect() as conn:
            row = conn.execute(
                select(j.c.state, j.c.start_time, j.c.end_time, j.c.spec_json).where(
                    j.c.id == job_id
                )
            ).first()
        if row is None:
            return None
        ended = row.state in TERMINAL_JOB_STATES and row.end_time is not None
        final = ended and now >= row.end_time + self.settle_s
        request = None
        try:
            spec = json.loads(row.spec_json)
            if isinstance(spec.get("mem_mb"), int):
                request = spec["mem_mb"] * max(1, int(spec.get("nodes") or 1))
        except (ValueError, TypeError, AttributeError):
            pass
        return JobFacts(job_id, row.state, final, row.start_time, row.end_time, now, request)

    def stats(self, facts: JobFacts) -> JobStats:
        """The job's stats from its samples (no series)."""
        spans = self.job_spans(facts.job_id)
        blocks = {node: self.raw(node, t0 - 1.0, t1 + 1.0) for node, (t0, t1) in spans.items()}
        return compute(facts, blocks, self.memory_totals(spans), self.progress_rows(facts.job_id))

    def summary(self, job_id: int) -> JobStats | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(db.job_stats.c.summary_json).where(db.job_stats.c.job_id == job_id)
            ).first()
        return None if row is None else JobStats.model_validate_json(row.summary_json)

    def job_spans(self, job_id: int) -> dict[str, tuple[float, float]]:
        """node → (first, last) sample time of the job there, over all its epochs."""
        out: dict[str, tuple[float, float]] = {}
        jn = db.job_nodes
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(jn.c.node, jn.c.first, jn.c.last).where(jn.c.job_id == job_id)
            ).all()
        spans = [(r.node, r.first, r.last) for r in rows]
        with self._lock:
            spans += [(n, s[0], s[1]) for (j, _e, n), s in self._job_nodes.items() if j == job_id]
        for node, t0, t1 in spans:
            a, b = out.get(node, (t0, t1))
            out[node] = (min(a, t0), max(b, t1))
        return out

    def memory_totals(self, spans: Iterable[str]) -> dict[tuple[str, int], int]:
        names = list(spans)
        if not names:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(db.nodes.c.name, db.nodes.c.gpus_json).where(db.nodes.c.name.in_(names))
            ).all()
        out = {}
        for r in rows:
            try:
                for g in json.loads(r.gpus_json):
                    out[(r.name, int(g["index"]))] = int(g["memory_mb"])
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def raw(self, node: str, t0: float, t1: float) -> list[RawBlock]:
        """The node's raw samples with t0 ≤ time < t1 (stored and still buffered)."""
        with self._lock:
            buffered = [*self._flushing.get(node, []), *self._pending.get(node, [])]
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(_T.c.data).where(
                    and_(_T.c.level == RAW, _T.c.node == node, _T.c.start < t1, _T.c.end >= t0)
                )
            ).all()
        blocks = [unpack_raw(r.data) for r in rows] + buffered
        return [dedupe(b.window(t0, t1)) for b in concat(blocks) if b.n]

    def rollups(self, node: str, level: int, t0: float, t1: float) -> list[RollupBlock]:
        """Stored rollup blocks (level MINUTE or HOUR) overlapping [t0, t1)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(_T.c.data).where(
                    and_(_T.c.level == level, _T.c.node == node, _T.c.start < t1, _T.c.end >= t0)
                )
            ).all()
        return [unpack_rollup(r.data) for r in rows]

    def series(
        self, job_id: int, resolution: Resolution | None = None
    ) -> tuple[Resolution | None, list[GpuSeries]]:
        """Each of the job's GPUs' utilisation over time, for the dashboard and jobstats:
        `raw` (every sample), `minute` or `hour` means; None picks by the job's span and
        what retention still holds (raw up to 6 hours, minutes up to 7 days, else hours)."""
        spans = self.job_spans(job_id)
        if not spans:
            return None, []
        t0 = min(a for a, _ in spans.values())
        t1 = max(b for _, b in spans.values())
        now = self.clock()
        if resolution is None:
            r = self.retention
            if t1 - t0 <= 6 * HOUR_S and t0 >= now - r.raw_s:
                resolution = "raw"
            elif t1 - t0 <= 7 * DAY_S and t0 >= now - r.minute_s:
                resolution = "minute"
            else:
                resolution = "hour"
        if resolution == "raw":
            raw = {node: self.raw(node, a - 1.0, b + 1.0) for node, (a, b) in spans.items()}
            return resolution, raw_series(job_id, raw)
        level = MINUTE if resolution == "minute" else HOUR
        ups = {node: self._rollups_at(node, level, a, b + 1.0) for node, (a, b) in spans.items()}
        return resolution, rollup_series(job_id, ups)

    def _rollups_at(self, node: str, level: int, t0: float, t1: float) -> list[RollupBlock]:
        """Stored rollups of `level` over [t0, t1), completed from finer data where the
        coarser is not written yet (the current hour, the current day)."""
        stored = self.rollups(node, level, t0, t1)
        span = HOUR_S if level == MINUTE else DAY_S
        bucket = 60.0 if level == MINUTE else HOUR_S
        covered = max(
            (
                math.floor(float(r.starts.max()) / span) * span + span
                for r in stored
                if r.starts.size
            ),
            default=t0,
        )
        out = list(stored)
        if level == HOUR:
            minutes = [m for m in self.rollups(node, MINUTE, covered, t1) if m.starts.size]
            if minutes:
                out += [rollup_of_rollup(m, HOUR_S) for m in minutes]
                covered = max(
                    math.floor(float(m.starts.max()) / HOUR_S) * HOUR_S + HOUR_S for m in minutes
                )
        out += [rollup(b, bucket) for b in self.raw(node, max(covered, t0), t1) if b.n]
        return out

    def progress_rows(self, job_id: int) -> list[ProgressRow]:
        p = db.job_progress
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(p.c.time, p.c.step, p.c.loss, p.c.tokens_per_s, p.c.mfu)
                .where(p.c.job_id == job_id)
                .order_by(p.c.time)
                .limit(100_000)
            ).all()
        out = [ProgressRow(r.time, r.step, r.loss, r.tokens_per_s, r.mfu) for r in rows]
        with self._lock:
            out += [
                ProgressRow(
                    float(r["time"]),  # type: ignore[arg-type]  # the dict _keep_progress built
                    int(r["step"]),  # type: ignore[call-overload]
                    r["loss"],  # type: ignore[arg-type]
                    r["tokens_per_s"],  # type: ignore[arg-type]
                    r["mfu"],  # type: ignore[arg-type]
                )
                for r in self._progress_rows
                if r["job_id"] == job_id
            ]
        return out

    def bytes_stored(self) -> dict[int, tuple[int, int]]:
        """level → (chunks, bytes of packed data): what the store holds (bench, tests)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(_T.c.level, func.count(), func.sum(func.length(_T.c.data))).group_by(
                    _T.c.level
                )
            ).all()
        return {int(r[0]): (int(r[1]), int(r[2] or 0)) for r in rows}


def _f(x: float) -> float | None:
    return None if x != x else x
