"""Job operations of the head: submit (validated, then durable), cancel, views."""

from __future__ import annotations

import os
import time

from phalanx.api.models import JobSpec, SubmitResponse
from phalanx.core import JobState
from phalanx.head import lifecycle, store
from phalanx.head.auth import Principal
from phalanx.head.control import HeadError
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import QOS_PRIORITY, JobRecord
from phalanx.head.scheduling import core_request


def submit(mirror: Mirror, tx: Tx, who: Principal, spec: JobSpec) -> SubmitResponse:
    """Validate everything first (a refusal changes nothing), then store and queue the job."""
    assert who.user is not None
    team = spec.team or who.default_team or (min(who.teams) if who.teams else None)
    if team is None:
        raise HeadError(422, "no team given (-p/--partition) and you have no default team")
    if team not in mirror.teams:
        known = ", ".join(sorted(mirror.teams)) or "none"
        raise HeadError(422, f"unknown team {team!r}; known teams: {known}")
    if not who.may_submit_to(team):
        raise HeadError(403, f"you are not a member of team {team!r}")
    if spec.qos not in QOS_PRIORITY:
        raise HeadError(422, f"unknown qos {spec.qos!r}; known: {', '.join(QOS_PRIORITY)}")
    if not os.path.isabs(spec.workdir):
        raise HeadError(422, f"workdir must be an absolute path, got {spec.workdir!r}")
    if (spec.command is None) == (spec.script is None):
        raise HeadError(422, "give exactly one of `command` and `script`")
    if spec.command is not None and not spec.command:
        raise HeadError(422, "`command` is empty")
    _check_capacity(mirror, spec)
    deps = sorted({j for d in spec.dependencies for j in d.job_ids})
    if deps:
        tx.flush()  # a dependency may name a job submitted earlier in this batch
    unknown = [j for j in deps if j not in mirror.jobs]
    missing = set(unknown) - store.existing_job_ids(tx.conn, unknown)
    if missing:
        raise HeadError(
            422, f"dependency on job(s) {', '.join(map(str, sorted(missing)))} that do not exist"
        )

    now = time.time()
    indices: list[int | None] = list(spec.array.indices) if spec.array else [None]
    first = mirror.next_job_id
    mirror.next_job_id += len(indices)
    cap = spec.array.max_parallel if spec.array and spec.array.max_parallel else len(indices)
    records = []
    for k, index in enumerate(indices):
        rec = JobRecord(
            id=first + k,
            name=spec.name,
            user=who.user,
            team=team,
            account=spec.account,
            qos=spec.qos,
            priority=QOS_PRIORITY[spec.qos],
            state="PD",
            spec=spec.model_copy(update={"team": team}),
            submit_time=now,
            array_job_id=first if spec.array else None,
            array_task_id=index,
            in_core=k < cap,
        )
        if not rec.in_core:
            rec.reason = "JobArrayTaskLimit"
            rec.reason_message = f"array {first} runs at most {cap} tasks at once"
        records.append(rec)
    tx.insert_jobs(records)
    for rec in records:
        mirror.jobs[rec.id] = rec
        tx.event(now, "submitted", f"submitted by {who.user} to team {team}", rec.id)
    core = mirror.core
    if core is not None and not mirror.core_dirty:
        unknown = [j for j in deps if core.lookup(j) is None]
        for job_id, (started, final) in store.outcomes(tx.conn, unknown).items():
            core.remember(job_id, started, JobState(final))
        for rec in records:
            if rec.in_core:
                core.submit(core_request(mirror, rec), now)
    tx.kick = True
    return SubmitResponse(
        job_ids=[r.id for r in records], array_job_id=first if spec.array else None
    )


def _check_capacity(mirror: Mirror, spec: JobSpec) -> None:
    """Refuse a job no node set could ever run (once nodes have joined)."""
    if not mirror.nodes:
        return
    shapes = [
        len(n.gpus)
        for n in mirror.nodes.values()
        if spec.gpu_model is None or (n.gpus and n.gpus[0].model.lower() == spec.gpu_model.lower())
    ]
    if not shapes:
        models = sorted({n.gpus[0].model for n in mirror.nodes.values() if n.gpus})
        raise HeadError(
            422, f"no node has GPU model {spec.gpu_model!r}; models: {', '.join(models)}"
        )
    largest = max(shapes)
    if spec.gpus_per_node > largest:
        raise HeadError(
            422,
            f"asks for {spec.gpus_per_node} GPUs per node; the largest node has {largest}",
        )
    fitting = sum(1 for s in shapes if s >= spec.gpus_per_node)
    if spec.nodes > fitting:
        raise HeadError(
            422,
            f"asks for {spec.nodes} nodes with {spec.gpus_per_node} GPUs each; "
            f"the cluster has {fitting} such node(s)",
        )


def cancel(mirror: Mirror, tx: Tx, who: Principal, job_id: int) -> JobRecord:
    rec = mirror.jobs.get(job_id)
    if rec is None:
        tx.flush()
        ended = store.job(tx.conn, job_id)
        if ended is None or not who.may_see_job(ended.user, ended.team):
            raise HeadError(404, f"no job {job_id}")
        raise HeadError(409, f"job {job_id} already ended ({ended.state})")
    if not who.may_see_job(rec.user, rec.team):
        raise HeadError(403, f"job {job_id} belongs to {rec.user} (team {rec.team})")
    lifecycle.cancel(mirror, tx, rec, time.time(), who.user or "an admin")
    return rec
