"""The telemetry store's background pass (head/tsdb.py runs it every few seconds on its
own thread): compact each closed hour's raw chunks into one and write its minute rollups,
roll each closed day's minutes up into hours, apply retention, and keep the efficiency
summary of each job that ended.

Rows: `telemetry_chunks` (db.py), one per node and time range at level RAW (a raw chunk
never spans two hours), MINUTE (an hour of minute rollups) or HOUR (a day of hour
rollups).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import and_, delete, insert, select

from phalanx.api.states import TERMINAL_JOB_STATES
from phalanx.head import db
from phalanx.head.tsblocks import (
    RawBlock,
    RollupBlock,
    concat,
    dedupe,
    pack_raw,
    pack_rollup,
    rollup,
    rollup_of_rollup,
    unpack_raw,
    unpack_rollup,
)

if TYPE_CHECKING:
    from phalanx.head.tsdb import TelemetryStore

RAW, MINUTE, HOUR = 0, 1, 2
HOUR_S, DAY_S = 3600.0, 86400.0
_T = db.telemetry_chunks


def maintain(store: TelemetryStore, now: float) -> None:
    """Compact and roll up closed hours and days, apply retention, write the summaries
    of jobs that ended."""
    compact_hours(store, now)
    rollup_days(store, now)
    expire(store, now)
    summarise(store, now)


def compact_hours(store: TelemetryStore, now: float) -> None:
    closed = math.floor((now - 2 * store.flush_s) / HOUR_S) * HOUR_S  # hours before it
    since = store.watermark if store.watermark is not None else now - store.retention.raw_s
    with store.engine.connect() as conn:
        raw = conn.execute(
            select(_T.c.node, _T.c.start).where(
                and_(_T.c.level == RAW, _T.c.end >= since, _T.c.start < closed)
            )
        ).all()
        done = {
            (r.node, r.start)
            for r in conn.execute(
                select(_T.c.node, _T.c.start).where(
                    and_(_T.c.level == MINUTE, _T.c.start >= math.floor(since / HOUR_S) * HOUR_S)
                )
            )
        }
    count: dict[tuple[str, float], int] = {}
    for r in raw:
        key = (r.node, math.floor(r.start / HOUR_S) * HOUR_S)
        count[key] = count.get(key, 0) + 1
    for (node, hour), n in sorted(count.items(), key=lambda kv: kv[0][1]):
        if n > 1 or (node, hour) not in done:
            compact(store, node, hour)
    store.watermark = closed


def compact(store: TelemetryStore, node: str, hour: float) -> None:
    """One raw chunk and one minute-rollup chunk for (node, hour)."""
    with store.engine.begin() as conn:
        rows = conn.execute(
            select(_T.c.id, _T.c.data).where(
                and_(
                    _T.c.level == RAW,
                    _T.c.node == node,
                    _T.c.start >= hour,
                    _T.c.start < hour + HOUR_S,
                )
            )
        ).all()
        if not rows:
            return
        blocks = concat([unpack_raw(r.data) for r in rows])
        blocks = [dedupe(b) for b in blocks]
        conn.execute(delete(_T).where(_T.c.id.in_([r.id for r in rows])))
        conn.execute(insert(_T), [raw_row(node, b) for b in blocks if b.n])
        conn.execute(
            delete(_T).where(and_(_T.c.level == MINUTE, _T.c.node == node, _T.c.start == hour))
        )
        prev = conn.execute(
            select(_T.c.data)
            .where(
                and_(
                    _T.c.level == RAW,
                    _T.c.node == node,
                    _T.c.start >= hour - HOUR_S,
                    _T.c.start < hour,
                )
            )
            .order_by(_T.c.start.desc())
            .limit(1)
        ).first()
        last = unpack_raw(prev.data) if prev is not None else None
        ups = [rollup(b, 60.0, energy_before(last, b, hour - 300.0)) for b in blocks if b.n]
        conn.execute(insert(_T), [rollup_row(node, r, MINUTE, hour, HOUR_S) for r in ups])


def rollup_days(store: TelemetryStore, now: float) -> None:
    """Hour rollups of each closed day from its minute rollups (redone when late
    samples changed the day's minutes)."""
    closed = math.floor((now - HOUR_S - 2 * store.flush_s) / DAY_S) * DAY_S
    since = closed - 2 * DAY_S
    with store.engine.connect() as conn:
        minutes = conn.execute(
            select(_T.c.node, _T.c.start, _T.c.samples).where(
                and_(_T.c.level == MINUTE, _T.c.start >= since, _T.c.start < closed)
            )
        ).all()
        hours = {
            (r.node, r.start): r.samples
            for r in conn.execute(
                select(_T.c.node, _T.c.start, _T.c.samples).where(
                    and_(_T.c.level == HOUR, _T.c.start >= since)
                )
            )
        }
    total: dict[tuple[str, float], int] = {}
    for r in minutes:
        key = (r.node, math.floor(r.start / DAY_S) * DAY_S)
        total[key] = total.get(key, 0) + r.samples
    for (node, day), n in total.items():
        if hours.get((node, day)) != n:
            rollup_day(store, node, day)


def rollup_day(store: TelemetryStore, node: str, day: float) -> None:
    with store.engine.begin() as conn:
        rows = conn.execute(
            select(_T.c.data).where(
                and_(
                    _T.c.level == MINUTE,
                    _T.c.node == node,
                    _T.c.start >= day,
                    _T.c.start < day + DAY_S,
                )
            )
        ).all()
        conn.execute(
            delete(_T).where(and_(_T.c.level == HOUR, _T.c.node == node, _T.c.start == day))
        )
        by_shape: dict[tuple[int, ...], list[RollupBlock]] = {}
        for r in rows:
            m = unpack_rollup(r.data)
            by_shape.setdefault(tuple(m.gpus.tolist()), []).append(m)
        out = []
        for parts in by_shape.values():
            merged = merge_rollups(parts)
            out.append(rollup_row(node, rollup_of_rollup(merged, HOUR_S), HOUR, day, DAY_S))
        if out:
            conn.execute(insert(_T), out)


def expire(store: TelemetryStore, now: float) -> None:
    r = store.retention
    with store.engine.begin() as conn:
        for level, keep in ((RAW, r.raw_s), (MINUTE, r.minute_s), (HOUR, r.hour_s)):
            conn.execute(delete(_T).where(and_(_T.c.level == level, _T.c.end < now - keep)))
        conn.execute(delete(db.job_progress).where(db.job_progress.c.time < now - r.minute_s))
        conn.execute(delete(db.job_nodes).where(db.job_nodes.c.last < now - r.hour_s))


def summarise(store: TelemetryStore, now: float) -> None:
    """The final summary of each job with telemetry that ended `settle_s` ago."""
    jn, jobs, js = db.job_nodes, db.jobs, db.job_stats
    with store.engine.connect() as conn:
        # Two steps, each by primary key: the jobs with telemetry and no summary yet (the
        # running and the recently ended: few), then which of them ended. One query joined
        # the other way lets SQLite walk every ended job of the cluster's history (1M jobs:
        # ~0.3 s per pass).
        pending = [
            row.job_id
            for row in conn.execute(
                select(jn.c.job_id)
                .distinct()
                .outerjoin(js, js.c.job_id == jn.c.job_id)
                .where(js.c.job_id.is_(None))
            )
        ]
        ids: list[int] = []
        for k in range(0, len(pending), 500):
            ids += [
                row.id
                for row in conn.execute(
                    select(jobs.c.id).where(
                        and_(
                            jobs.c.id.in_(pending[k : k + 500]),
                            jobs.c.end_time.is_not(None),
                            jobs.c.end_time <= now - store.settle_s,
                            jobs.c.state.in_(sorted(TERMINAL_JOB_STATES)),
                        )
                    )
                )
            ]
            if len(ids) >= 500:
                break
        ids = sorted(ids)[:500]
    for job_id in ids:
        facts = store.facts(job_id, now)
        if facts is None:
            continue
        stats = store.stats(facts)
        summary = stats.model_copy(update={"per_gpu": [], "util_series": []})
        with store.engine.begin() as conn:
            conn.execute(
                insert(js),
                [{"job_id": job_id, "time": now, "summary_json": summary.model_dump_json()}],
            )
        store.counters.summaries += 1


def energy_before(last: RawBlock | None, b: RawBlock, since: float) -> Any:
    """Each GPU's energy counter at the previous hour's last sample, when that block has
    the same GPUs and ends just before `b` (within 5 minutes of the hour); else None."""
    if last is None or not last.n or not np.array_equal(last.gpus, b.gpus):
        return None
    if float(last.times[-1]) < since:
        return None
    return last.energy[:, -1]


def raw_row(node: str, b: RawBlock) -> dict[str, object]:
    return {
        "node": node,
        "level": RAW,
        "start": float(b.times[0]),
        "end": float(b.times[-1]),
        "samples": b.n,
        "data": pack_raw(b),
    }


def rollup_row(
    node: str, r: RollupBlock, level: int, start: float, span: float
) -> dict[str, object]:
    return {
        "node": node,
        "level": level,
        "start": start,
        "end": start + span,
        "samples": int(r.samples.sum()),
        "data": pack_rollup(r),
    }


def merge_rollups(parts: list[RollupBlock]) -> RollupBlock:
    parts = sorted(parts, key=lambda r: float(r.starts[0]) if r.starts.size else 0.0)
    first = parts[0]
    return RollupBlock(
        first.bucket_s,
        np.concatenate([p.starts for p in parts]),
        first.gpus,
        np.concatenate([p.mean_util for p in parts], axis=1),
        np.concatenate([p.max_util for p in parts], axis=1),
        np.concatenate([p.max_memory for p in parts], axis=1),
        np.concatenate([p.energy for p in parts], axis=1),
        np.concatenate([p.job for p in parts], axis=1),
        np.concatenate([p.samples for p in parts], axis=1),
    )
