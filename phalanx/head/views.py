"""Read-only views the head computes for people: how long requeued jobs really ran, the
queue's priority order (`phalanx priority`) and the teams' fair-share standing (`phalanx
share`), from the typed job events and the core's own numbers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, select

from phalanx.api import models as m
from phalanx.core import ClusterState, JobState, queue_order
from phalanx.head import db

# States in which a job holds its GPUs: its run time counts from entering R to leaving CG.
_HOLDS = {s.value for s in JobState if s.holds_gpus}
_CHUNK = 500  # job ids per query: SQLite caps bound parameters


def add_run_times(conn: Connection, jobs: list[dict[str, Any]], now: float) -> None:
    """Give each job dict (JobRecord.wire) `first_start_time` and `run_time_s`.

    A job that never was requeued ran once, from start_time to end_time (or now); only the
    requeued ones (restart_count > 0) need their event log, read in one batched query.
    """
    requeued = [j["id"] for j in jobs if j["restart_count"]]
    runs = _runs(conn, requeued, now) if requeued else {}
    for job in jobs:
        if job["id"] in runs:
            job["first_start_time"], job["run_time_s"] = runs[job["id"]]
            continue
        start = job["start_time"]
        job["first_start_time"] = start
        if start is None:
            job["run_time_s"] = None
        else:
            end = job["end_time"] if job["end_time"] is not None else now
            job["run_time_s"] = max(0.0, end - start)


def run_times(events: Iterable[m.JobEvent], now: float) -> tuple[float | None, float | None]:
    """(first start, seconds holding GPUs over every run) from one job's typed events."""
    first: float | None = None
    total = 0.0
    since: float | None = None
    for event in events:
        if event.to_state is None:
            continue
        if event.to_state == JobState.RUNNING.value and since is None:
            since = event.time
            first = event.time if first is None else first
        elif event.to_state not in _HOLDS and since is not None:
            total += max(0.0, event.time - since)
            since = None
    if since is not None:
        total += max(0.0, now - since)
    return first, (None if first is None else total)


def _runs(
    conn: Connection, job_ids: list[int], now: float
) -> dict[int, tuple[float | None, float | None]]:
    e = db.events.c
    moves: dict[int, list[m.JobEvent]] = {}
    for i in range(0, len(job_ids), _CHUNK):
        rows = conn.execute(
            select(e.job_id, e.time, e.to_state)
            .where(e.job_id.in_(job_ids[i : i + _CHUNK]), e.to_state.is_not(None))
            .order_by(e.id)
        )
        for r in rows:
            moves.setdefault(r.job_id, []).append(
                m.JobEvent.model_construct(time=r.time, kind="", message="", to_state=r.to_state)
            )
    return {job_id: run_times(events, now) for job_id, events in moves.items()}


def priorities(
    core: ClusterState | None, now: float, qos: dict[int, str], visible: set[int] | None
) -> m.PriorityList:
    """Every eligible queued job in the order the next cycle considers it, with the numbers
    that order it; `qos` maps job id → its QOS name, `visible` limits the jobs listed
    (None: all). Ranks count every queued job, listed or not."""
    if core is None:
        return m.PriorityList(policy="priority", order="no nodes have joined yet", jobs=[])
    policy = core.policy
    fair: dict[str, float] = {}
    out = []
    for rank, job in enumerate(queue_order(core, now), start=1):
        if visible is not None and job.id not in visible:
            continue
        if job.team not in fair:
            fair[job.team] = core.fairshare(job.team, now) if policy.uses_fairshare else 0.0
        out.append(
            m.PendingPriority(
                rank=rank,
                job_id=job.id,
                user=job.user,
                team=job.team,
                qos=qos.get(job.id, "normal"),
                qos_priority=job.priority,
                fairshare=fair[job.team],
                age_s=max(0.0, now - job.submit_s),
            )
        )
    return m.PriorityList(policy=policy.name, order=policy.description, jobs=out)


def shares(core: ClusterState | None, now: float) -> m.ShareList:
    """Each team's quota, GPUs in use and borrowed, decayed usage and fair-share value, and
    what it has queued, from the core's live state."""
    if core is None:
        return m.ShareList(policy="priority", uses_fairshare=True, halflife_s=0.0, teams=[])
    pending: dict[str, list[int]] = {}
    for job in core.pending.values():  # queued ones, those held by a dependency included
        pending.setdefault(job.team, []).append(job.gpus)
    out = []
    for name in sorted(core.teams):
        team = core.teams[name]
        used = core.usage.get(name, 0)
        fairshare = core.fairshare(name, now)
        queued = pending.get(name, [])
        out.append(
            m.TeamShare(
                team=name,
                quota_gpus=team.quota,
                cohort=team.cohort,
                borrowing_limit=team.borrowing_limit,
                share=team.share,
                gpus_in_use=used,
                borrowed_gpus=max(0, used - team.quota) if team.quota is not None else 0,
                usage_gpu_h=fairshare * team.share / 3600.0,
                fairshare=fairshare,
                pending_jobs=len(queued),
                pending_gpus=sum(queued),
            )
        )
    return m.ShareList(
        policy=core.policy.name,
        uses_fairshare=core.policy.uses_fairshare,
        halflife_s=core.fairshare_halflife_s,
        teams=out,
    )
