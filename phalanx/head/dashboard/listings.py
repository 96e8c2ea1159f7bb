"""The dashboard's lists, paginated and filtered on the server: jobs (live from the mirror,
ended ones from the database by keyset), the queue in the scheduler's order with each job's
reason and estimated start, and the nodes' health events. A page never holds more than
`per` rows, whatever the cluster's size (the Ray dashboard's failing is sending it all)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, Connection, cast, func, select, type_coerce

from phalanx.core import JobState, queue_order
from phalanx.head import db, store
from phalanx.head.auth import Principal
from phalanx.head.dashboard.cluster import visible
from phalanx.head.records import JobRecord
from phalanx.head.scheduling import pending_reason
from phalanx.head.service import Head


@dataclass(frozen=True, slots=True)
class JobRow:
    id: int
    name: str
    user: str
    team: str
    state: str
    gpus: str  # "2×4"
    submit_time: float
    start_time: float | None
    end_time: float | None
    reason: str | None
    detail: str | None  # the reason's sentence, or the exit code


@dataclass(frozen=True, slots=True)
class JobPage:
    rows: tuple[JobRow, ...]
    scope: str  # active | ended
    total: int | None  # live jobs matching (ended: not counted, keyset pages)
    page: int
    pages: int
    next_before: int | None  # ended jobs: the keyset cursor of the next page
    # Ended jobs: the page stopped at this id, having searched SCAN_IDS ids without filling
    # (a selective filter over a long history); the next page searches on from it.
    searched_to: int | None = None


@dataclass(frozen=True, slots=True)
class QueueRow:
    rank: int | None  # place in the scheduler's order (None: not eligible yet)
    id: int
    name: str
    user: str
    team: str
    qos: str
    gpus: str
    submit_time: float
    reason: str | None
    reason_message: str | None
    estimated_start: float | None  # unix seconds; math.inf: when a job without a limit ends


@dataclass(frozen=True, slots=True)
class QueuePage:
    rows: tuple[QueueRow, ...]
    total: int
    page: int
    pages: int


@dataclass(frozen=True, slots=True)
class EventRow:
    id: int
    time: float
    node: str | None
    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class EventPage:
    rows: tuple[EventRow, ...]
    next_before: int | None
    searched_to: int | None = None  # as JobPage's


def _gpus(nodes: int, per_node: int) -> str:
    return f"{nodes}×{per_node}" if nodes > 1 else str(per_node)


def _row(head: Head, rec: JobRecord) -> JobRow:
    code, message = pending_reason(head.mirror, rec)
    return JobRow(
        id=rec.id,
        name=rec.name,
        user=rec.user,
        team=rec.team,
        state=rec.state.value,
        gpus=_gpus(rec.spec.nodes, rec.spec.gpus_per_node),
        submit_time=rec.submit_time,
        start_time=rec.start_time,
        end_time=rec.end_time,
        reason=code,
        detail=message,
    )


def _matches(
    user: str, team: str, state: str, name: str, f_user: str | None, f_team: str | None,
    f_states: set[str] | None, f_name: str | None,
) -> bool:  # fmt: skip
    return (
        (f_user is None or user == f_user)
        and (f_team is None or team == f_team)
        and (f_states is None or state in f_states)
        and (f_name is None or f_name in name)
    )


# Ended jobs are searched this many ids at a time: a page whose filter (or visibility)
# matches few jobs reads a bounded id range by primary key, never the whole history.
SCAN_IDS = 100_000


def job_page(
    head: Head,
    who: Principal,
    scope: str,
    states: set[str] | None,
    user: str | None,
    team: str | None,
    name: str | None,
    page: int,
    before: int | None,
    per: int,
    window: int = SCAN_IDS,
) -> JobPage:
    """One page of the jobs `who` may see: live ones newest first (numbered pages), or ended
    ones newest first from the database (keyset pages: `before` a job id; each searches at
    most `window` ids)."""
    if scope == "active":
        with head.control.lock:
            ids = [
                rec.id
                for rec in head.mirror.jobs.values()
                if visible(who, rec.user, rec.team)
                and _matches(
                    rec.user, rec.team, rec.state.value, rec.name, user, team, states, name
                )
            ]
            ids.sort(reverse=True)
            total = len(ids)
            pages = max(1, -(-total // per))
            page = min(page, pages)
            rows = tuple(
                _row(head, head.mirror.jobs[i]) for i in ids[(page - 1) * per : page * per]
            )
        return JobPage(rows, "active", total, page, pages, None)
    return _ended_page(head, who, states, user, team, name, before, per, window)


def _ended_page(
    head: Head,
    who: Principal,
    states: set[str] | None,
    user: str | None,
    team: str | None,
    name: str | None,
    before: int | None,
    per: int,
    window: int,
) -> JobPage:
    j = db.jobs.c
    # The job's shape from its stored spec, extracted by the database (a spec may hold a
    # large script: it is not sent here and parsed row by row).
    postgres = head.control.engine.dialect.name == "postgresql"  # SQLite reads JSON text
    spec = cast(j.spec_json, JSON) if postgres else type_coerce(j.spec_json, JSON)
    columns = (
        j.id, j.name, j.user, j.team, j.state, j.submit_time, j.start_time, j.end_time,
        j.exit_code, j.reason, j.reason_message, spec["nodes"].as_integer().label("nodes"),
        spec["gpus_per_node"].as_integer().label("gpus_per_node"),
    )  # fmt: skip
    with head.control.engine.connect() as conn:
        top = before if before is not None else store.max_job_id(conn) + 1
        low = max(1, top - window)
        query = select(*columns).where(j.id < top, j.id >= low, j.state.not_in(store.LIVE_STATES))
    if not who.admin:
        teams = sorted(who.teams | who.admin_of)
        query = query.where((j.user == who.user) | j.team.in_(teams))
    if states is not None:
        query = query.where(j.state.in_(sorted(states)))
    if user is not None:
        query = query.where(j.user == user)
    if team is not None:
        query = query.where(j.team == team)
    if name is not None:
        escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = query.where(j.name.like(f"%{escaped}%", escape="\\"))
    query = query.order_by(j.id.desc()).limit(per + 1)
    with head.control.engine.connect() as conn:
        found = list(conn.execute(query))
    rows = tuple(_ended_row(r) for r in found[:per])
    if len(found) > per:
        return JobPage(rows, "ended", None, 1, 1, rows[-1].id)
    if low > 1:  # the window ran out before the page filled: go on below it
        return JobPage(rows, "ended", None, 1, 1, low, searched_to=low)
    return JobPage(rows, "ended", None, 1, 1, None)


def _ended_row(r: Any) -> JobRow:
    nodes, per_node = r.nodes or 1, r.gpus_per_node or 1  # absent from a spec: defaults
    return JobRow(
        id=r.id,
        name=r.name,
        user=r.user,
        team=r.team,
        state=r.state,
        gpus=_gpus(nodes, per_node),
        submit_time=r.submit_time,
        start_time=r.start_time,
        end_time=r.end_time,
        reason=r.reason,
        detail=r.exit_code or r.reason_message,
    )


def queue_page(head: Head, who: Principal, page: int, per: int) -> QueuePage:
    """The pending jobs `who` may see: those the scheduler considers, in its order (with
    their rank among all queued jobs), then those not yet eligible (dependencies, holds,
    begin times); each with its reason and, where known, its estimated start."""
    now = head.now()
    with head.control.lock:
        mirror = head.mirror
        core = mirror.core
        reservation = mirror.decisions.reservation if mirror.decisions is not None else None
        # The eligible ones (in the scheduler's queues) and the rest, both as `who` sees
        # them; the scheduler's order is walked only as far as this page reaches.
        eligible: set[int] = set()
        if core is not None:
            for queue in core.queues.values():
                eligible.update(int(key[-1]) for key, _ in queue)
        shown_eligible = 0
        rest: list[JobRecord] = []
        for rec in mirror.jobs.values():
            if rec.state is JobState.PENDING and visible(who, rec.user, rec.team):
                if rec.id in eligible:
                    shown_eligible += 1
                else:
                    rest.append(rec)
        total = shown_eligible + len(rest)
        pages = max(1, -(-total // per))
        page = min(page, pages)
        first, last = (page - 1) * per, page * per
        walked: list[tuple[int | None, JobRecord]] = []
        if core is not None and first < shown_eligible:
            for place, job in enumerate(queue_order(core, now), start=1):
                queued = mirror.jobs.get(job.id)
                if queued is not None and visible(who, queued.user, queued.team):
                    walked.append((place, queued))
                    if len(walked) >= last:
                        break
        rest.sort(key=lambda r: r.id)
        after = rest[max(0, first - shown_eligible) : max(0, last - shown_eligible)]
        picked = walked[first:] + [(None, rec) for rec in after]
        rows = []
        for rank, rec in picked:
            code, message = pending_reason(mirror, rec)
            start: float | None = None
            if reservation is not None and reservation.job_id == rec.id:
                start = reservation.start_s if math.isfinite(reservation.start_s) else math.inf
            elif rec.spec.begin_time is not None and rec.spec.begin_time > now:
                start = rec.spec.begin_time
            rows.append(
                QueueRow(
                    rank=rank,
                    id=rec.id,
                    name=rec.name,
                    user=rec.user,
                    team=rec.team,
                    qos=rec.qos,
                    gpus=_gpus(rec.spec.nodes, rec.spec.gpus_per_node),
                    submit_time=rec.submit_time,
                    reason=code,
                    reason_message=message,
                    estimated_start=start,
                )
            )
    return QueuePage(tuple(rows), total, page, pages)


def event_page(
    head: Head,
    kinds: set[str] | None,
    node: str | None,
    before: int | None,
    per: int,
    window: int = SCAN_IDS,
) -> EventPage:
    """Node events (no job's), newest first: drains, failures, GPU faults and XIDs, …;
    searching at most `window` event ids per page (the log holds every job's events too)."""
    e = db.events.c
    with head.control.engine.connect() as conn:
        top = before if before is not None else _max_event_id(conn) + 1
        low = max(1, top - window)
        query = select(e.id, e.time, e.node, e.kind, e.message).where(
            e.id < top, e.id >= low, e.job_id.is_(None), e.node.is_not(None)
        )
        if kinds is not None:
            query = query.where(e.kind.in_(sorted(kinds)))
        if node is not None:
            query = query.where(e.node == node)
        found = list(conn.execute(query.order_by(e.id.desc()).limit(per + 1)))
    rows = tuple(EventRow(r.id, r.time, r.node, r.kind, r.message) for r in found[:per])
    if len(found) > per:
        return EventPage(rows, rows[-1].id)
    if low > 1:
        return EventPage(rows, low, searched_to=low)
    return EventPage(rows, None)


def _max_event_id(conn: Connection) -> int:
    return int(conn.execute(select(func.max(db.events.c.id))).scalar() or 0)


def event_kinds(head: Head) -> list[str]:
    """The node event kinds among the newest SCAN_IDS events (the health page's filter
    choices)."""
    e = db.events.c
    with head.control.engine.connect() as conn:
        low = _max_event_id(conn) - SCAN_IDS
        found = conn.execute(
            select(e.kind)
            .where(e.id > low, e.job_id.is_(None), e.node.is_not(None))
            .distinct()
            .limit(100)
        )
        return sorted(r.kind for r in found)
