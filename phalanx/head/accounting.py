"""Usage accounting: a daily rollup per user, team and QOS, kept up to date as jobs run and
end, and the reports read from it (`GET /v1/reports/usage`, `phalanx report`).

Allocated GPU-seconds, jobs, failures and preemptions come from the job event log (the
typed transitions the control thread commits): the rollup replays it from a durable cursor,
so a crash of the head loses nothing of them. Utilisation-weighted and idle GPU-seconds
come from the GPU samples (head/idle.py) and are added at each flush. A flush writes in its
own transaction, never in the control thread's: the rollup rows, the allocations still
open, and the cursor, together.

A report reads only the rollup (one row per day, user, team and QOS): a year of a
million jobs is a few hundred thousand rows at most, whatever the jobs' number.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection, Engine, Table, and_, delete, func, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from phalanx.core import JobState
from phalanx.core.idle import day_of, split_days
from phalanx.head import db
from phalanx.head.idle import UsageKey

HOLDS = frozenset(s.value for s in JobState if s.holds_gpus)
ENDS = frozenset(s.value for s in JobState if s.terminal)
FAILED = frozenset(
    s.value for s in (JobState.FAILED, JobState.NODE_FAIL, JobState.OUT_OF_MEMORY, JobState.TIMEOUT)
)
EVENT_BATCH = 20_000  # events replayed per query
# The rollup's numbers, in column order.
AMOUNTS = ("alloc_gpu_s", "util_gpu_s", "idle_gpu_s", "jobs", "failures", "preemptions")
ALLOC, UTIL, IDLE, JOBS, FAILURES, PREEMPTIONS = range(6)
By = Literal["user", "team", "qos"]
Per = Literal["day", "month"]


@dataclass(slots=True)
class _Open:
    epoch: int
    gpus: int
    user: str
    team: str
    qos: str
    since: float
    stored: bool = False  # in usage_open already


@dataclass(frozen=True, slots=True)
class Scope:
    """Whose rows a caller may see: their own, and every row of the teams they administer
    (None instead of a Scope: everything, an admin)."""

    user: str
    admin_of: frozenset[str]


class Rollup:
    """The daily rollup's maintainer: replays new job events and adds sample sums."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._open: dict[int, _Open] = {}
        self._last_event = 0
        self._accounted_to: float | None = None
        self._closed: set[int] = set()  # stored open rows to delete at the next flush

    def load(self) -> None:
        """The cursor and the allocations open at it (a first start replays all history)."""
        with self._lock:
            self._load()

    def _load(self) -> None:
        with self.engine.connect() as conn:
            cursor = conn.execute(select(db.usage_cursor).where(db.usage_cursor.c.id == 1)).first()
            self._open.clear()
            self._closed.clear()
            if cursor is None:
                self._last_event, self._accounted_to = 0, None
                return
            self._last_event, self._accounted_to = cursor.last_event_id, cursor.accounted_to
            for row in conn.execute(select(db.usage_open)):
                self._open[row.job_id] = _Open(
                    row.epoch, row.gpus, row.user, row.team, row.qos, cursor.accounted_to, True
                )

    def flush(self, now: float, sums: dict[UsageKey, list[float]]) -> int:
        """Apply the job events committed since the last flush, count open allocations up
        to `now`, add `sums` (utilisation- and idle-weighted GPU-seconds) and store it all
        in one transaction; the number of events applied. On failure nothing is stored and
        the in-memory state is rebuilt from the database (the caller keeps `sums`)."""
        with self._lock:
            try:
                with self.engine.begin() as conn:
                    amounts: dict[UsageKey, list[float]] = {}
                    applied = self._replay(conn, amounts)
                    for job in self._open.values():
                        self._accrue(amounts, job, now)
                    for key, (util, idle) in sums.items():
                        row = _row(amounts, key)
                        row[UTIL] += util
                        row[IDLE] += idle
                    _upsert(conn, amounts)
                    self._store(conn, now)
                return applied
            except Exception:
                self._load()  # what was stored is all there is
                raise

    def _replay(self, conn: Connection, amounts: dict[UsageKey, list[float]]) -> int:
        e = db.events
        applied = 0
        while True:
            rows = conn.execute(
                select(e.c.id, e.c.time, e.c.job_id, e.c.epoch, e.c.message)
                .add_columns(e.c.from_state, e.c.to_state)
                .where(e.c.id > self._last_event, e.c.to_state.is_not(None))
                .where(e.c.job_id.is_not(None))
                .order_by(e.c.id)
                .limit(EVENT_BATCH)
            ).all()
            if not rows:
                return applied
            jobs = _jobs(conn, {r.job_id for r in rows})
            starts = {r.job_id for r in rows if r.to_state in HOLDS and r.from_state not in HOLDS}
            gpus = _gpus(conn, starts)
            for r in rows:
                self._apply(amounts, r, jobs.get(r.job_id), gpus.get(r.job_id, 1))
                self._last_event = r.id
            applied += len(rows)
            if len(rows) < EVENT_BATCH:
                return applied

    def _apply(self, amounts: dict[UsageKey, list[float]], r: Any, job: Any, gpus: int) -> None:
        was, to, t = r.from_state, r.to_state, r.time
        open_job = self._open.get(r.job_id)
        if to in HOLDS and was not in HOLDS and job is not None:
            if open_job is not None:  # a start the rollup missed the end of: close it
                self._close(amounts, r.job_id, t)
            # A stored row closed in this same replay stays marked for deletion: `_store`
            # deletes it before inserting this new run's row (same job id, unique).
            self._open[r.job_id] = _Open(r.epoch or 0, gpus, job.user, job.team, job.qos, t)
        elif was in HOLDS and to not in HOLDS and open_job is not None:
            self._close(amounts, r.job_id, t)
        if job is None:
            return
        key = (day_of(t), job.user, job.team, job.qos)
        if to in ENDS:
            row = _row(amounts, key)
            row[JOBS] += 1
            if to in FAILED:
                row[FAILURES] += 1
        preempted = to == JobState.PREEMPTED.value or (
            was == JobState.RUNNING.value
            and to == JobState.COMPLETING.value
            and (r.message or "").startswith("preempted")
        )
        if preempted:
            _row(amounts, key)[PREEMPTIONS] += 1

    def _close(self, amounts: dict[UsageKey, list[float]], job_id: int, t: float) -> None:
        job = self._open.pop(job_id)
        self._accrue(amounts, job, t)
        if job.stored:
            self._closed.add(job_id)

    @staticmethod
    def _accrue(amounts: dict[UsageKey, list[float]], job: _Open, until: float) -> None:
        """Count `job`'s GPUs from its `since` to `until` (a late-committed end that is
        already counted past adds nothing)."""
        for day, seconds in split_days(job.since, until):
            _row(amounts, (day, job.user, job.team, job.qos))[ALLOC] += job.gpus * seconds
        job.since = max(job.since, until)

    def _store(self, conn: Connection, now: float) -> None:
        o = db.usage_open
        if self._closed:
            conn.execute(delete(o).where(o.c.job_id.in_(sorted(self._closed))))
            self._closed.clear()
        new = [(i, j) for i, j in self._open.items() if not j.stored]
        if new:
            conn.execute(
                insert(o),
                [
                    {
                        "job_id": i,
                        "epoch": j.epoch,
                        "gpus": j.gpus,
                        "user": j.user,
                        "team": j.team,
                        "qos": j.qos,
                    }
                    for i, j in new
                ],
            )
            for _, j in new:
                j.stored = True
        c = db.usage_cursor
        values = {"last_event_id": self._last_event, "accounted_to": now}
        if self._accounted_to is None:
            conn.execute(insert(c).values(id=1, **values))
        else:
            conn.execute(update(c).where(c.c.id == 1).values(**values))
        self._accounted_to = now


def _row(amounts: dict[UsageKey, list[float]], key: UsageKey) -> list[float]:
    row = amounts.get(key)
    if row is None:
        row = amounts[key] = [0.0] * len(AMOUNTS)
    return row


def _jobs(conn: Connection, ids: set[int]) -> dict[int, Any]:
    """Job id → (user, team, qos)."""
    j = db.jobs
    out: dict[int, Any] = {}
    ordered = sorted(ids)
    for i in range(0, len(ordered), 5000):
        chunk = ordered[i : i + 5000]
        for row in conn.execute(
            select(j.c.id, j.c.user, j.c.team, j.c.qos).where(j.c.id.in_(chunk))
        ):
            out[row.id] = row
    return out


def _gpus(conn: Connection, ids: set[int]) -> dict[int, int]:
    """Job id → the GPUs a run of it holds: nodes × GPUs per node, as its spec asked. Specs
    are read a few at a time (one may be 256 KB) and only their two numbers kept."""
    j = db.jobs
    out: dict[int, int] = {}
    ordered = sorted(ids)
    for i in range(0, len(ordered), 200):
        chunk = ordered[i : i + 200]
        for job_id, text in conn.execute(select(j.c.id, j.c.spec_json).where(j.c.id.in_(chunk))):
            try:
                spec = json.loads(text)
                out[job_id] = int(spec.get("nodes", 1)) * int(spec.get("gpus_per_node", 1))
            except (ValueError, TypeError, AttributeError):
                out[job_id] = 1
    return out


def _upsert(conn: Connection, amounts: dict[UsageKey, list[float]]) -> None:
    """Add `amounts` to the rollup rows (created at zero when new), and to the rows of
    each dimension alone."""
    if not amounts:
        return
    groups: dict[tuple[str, str, str], list[float]] = {}
    for (d, u, te, q), v in amounts.items():
        for dim, key in (("user", u), ("team", te), ("qos", q)):
            row = groups.get((dim, d, key))
            if row is None:
                groups[(dim, d, key)] = list(v)
            else:
                for i, x in enumerate(v):
                    row[i] += x
    daily = [
        {"day": d, "user": u, "team": te, "qos": q, **_numbers(v)}
        for (d, u, te, q), v in amounts.items()
    ]
    by_dim = [{"dim": dim, "day": d, "key": k, **_numbers(v)} for (dim, d, k), v in groups.items()]
    _add(conn, db.usage_daily, ("day", "user", "team", "qos"), daily)
    _add(conn, db.usage_groups, ("dim", "day", "key"), by_dim)


def _numbers(v: list[float]) -> dict[str, Any]:
    return {name: v[i] if i < JOBS else round(v[i]) for i, name in enumerate(AMOUNTS)}


def _add(conn: Connection, t: Table, keys: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(t)
    stmt = stmt.on_conflict_do_update(
        index_elements=[t.c[k] for k in keys],
        set_={name: t.c[name] + stmt.excluded[name] for name in AMOUNTS},
    )
    for i in range(0, len(rows), 5000):
        conn.execute(stmt, rows[i : i + 5000])


# ---------------------------------------------------------------------------- reports
def report(
    conn: Connection, by: By, per: Per, since: str, until: str, scope: Scope | None
) -> list[dict[str, Any]]:
    """The rollup over days [since, until) (`YYYY-MM-DD`), grouped by `by` and period,
    as rows of hours and counts ordered by period then key; only what `scope` may see.

    Everything (an admin): the one-dimension rows, read in their key's order (per day
    they are the answer's rows already). A scope: the full rows, the caller's and their
    teams' only."""
    sums: list[Any]
    if scope is None:
        t = db.usage_groups
        key = t.c.key
        where = [t.c.dim == by, t.c.day >= since, t.c.day < until]
        if per == "day":
            return _rows(_driver_rows(conn, by, since, until))
    else:
        t = db.usage_daily
        key = t.c[by]
        where = [t.c.day >= since, t.c.day < until]
        mine = t.c.user == scope.user
        where.append(or_(mine, t.c.team.in_(sorted(scope.admin_of))) if scope.admin_of else mine)
    period = t.c.day if per == "day" else func.substr(t.c.day, 1, 7)
    sums = [func.sum(t.c[name]) for name in AMOUNTS]
    query = (
        select(period, key, *sums).where(and_(*where)).group_by(period, key).order_by(period, key)
    )
    return _rows(conn.execute(query))


# The answer's rows as they are stored: read through the database driver itself, as SQL
# Core's row objects cost as much again as the query (~200,000 rows for a year by user).
_GROUP_ROWS = (
    "SELECT day, key, alloc_gpu_s, util_gpu_s, idle_gpu_s, jobs, failures, preemptions "
    "FROM usage_groups WHERE dim = ? AND day >= ? AND day < ? ORDER BY day, key"
)


def _driver_rows(conn: Connection, by: str, since: str, until: str) -> list[Any]:
    raw: Any = conn.connection.driver_connection
    sql = _GROUP_ROWS if conn.dialect.name == "sqlite" else _GROUP_ROWS.replace("?", "%s")
    rows: list[Any] = raw.execute(sql, (by, since, until)).fetchall()
    return rows


def _rows(result: Any) -> list[dict[str, Any]]:
    # Plain tuples into plain dicts: a year by user per day is ~200,000 rows.
    return [
        _hours(p, k, a or 0.0, u or 0.0, i or 0.0, j or 0, f or 0, n or 0)
        for p, k, a, u, i, j, f, n in result
    ]


def _hours(
    period: str,
    key: str,
    alloc: float,
    util: float,
    idle: float,
    jobs: float,
    failures: float,
    preemptions: float,
) -> dict[str, Any]:
    return {
        "period": period,
        "key": key,
        "alloc_gpu_hours": alloc / 3600.0,
        "util_gpu_hours": util / 3600.0,
        "idle_gpu_hours": idle / 3600.0,
        "utilization_pct": None if alloc <= 0 else min(100.0, 100.0 * util / alloc),
        "jobs": int(jobs),
        "failures": int(failures),
        "preemptions": int(preemptions),
    }


def total(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The rows summed (period and key `total`)."""
    sums = [0.0] * 6
    names = (
        "alloc_gpu_hours",
        "util_gpu_hours",
        "idle_gpu_hours",
        "jobs",
        "failures",
        "preemptions",
    )
    for r in rows:
        for k, name in enumerate(names):
            sums[k] += r[name]
    alloc, util, idle = (x * 3600.0 for x in sums[:3])
    return _hours("total", "total", alloc, util, idle, sums[3], sums[4], sums[5])
