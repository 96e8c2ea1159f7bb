"""Job submission in the head: validated first, then durable and queued (idempotent with a
key). Controls on submitted jobs (cancel, hold, …) are in head.jobcontrol."""

from __future__ import annotations

import os
import re

from phalanx.api.models import DependencySpec, JobSpec, SubmitResponse
from phalanx.core import JobState
from phalanx.head import capacity, corestate, notify, store
from phalanx.head.auth import Principal, allowed_qos
from phalanx.head.control import HeadError
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import QOS_PRIORITY, JobRecord
from phalanx.jobspec.hostlist import compress


def submit(
    mirror: Mirror, tx: Tx, who: Principal, spec: JobSpec, client_token: str | None = None
) -> SubmitResponse:
    """Validate everything first (a refusal changes nothing), then store and queue the job.

    `client_token` (an idempotency key, see `submit_once`) is stored on the first record
    only (an array's first task): the unique index on (user, client_token) allows one."""
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
    if not who.may_use_qos(spec.qos, mirror.team_qos.get(team)):
        allowed = ", ".join(sorted(allowed_qos(who.qos, mirror.team_qos.get(team))))
        raise HeadError(
            403,
            f"qos {spec.qos!r} is above your allowance in team {team!r} (allowed: {allowed}); "
            "an admin grants more with `phalanx admin user set USER --qos …` or "
            "`phalanx admin team set TEAM --qos …`",
        )
    if not os.path.isabs(spec.workdir):
        raise HeadError(422, f"workdir must be an absolute path, got {spec.workdir!r}")
    if (spec.command is None) == (spec.script is None):
        raise HeadError(422, "give exactly one of `command` and `script`")
    if spec.command is not None and not spec.command:
        raise HeadError(422, "`command` is empty")
    if spec.notify_url is not None:
        problem = notify.refusal(mirror.settings.notify_allow, spec.notify_url)
        if problem is not None:
            raise HeadError(422, problem)
    capacity.check(mirror.nodes.values(), spec)
    if spec.nodelist:
        _check_nodelist(mirror, spec)
    check_dependencies(mirror, tx, spec.dependencies)

    indices: list[int | None] = list(spec.array.indices) if spec.array else [None]
    cap_live = mirror.settings.max_queued_per_user
    live = mirror.live_per_user.get(who.user, 0)
    if cap_live and live + len(indices) > cap_live:
        raise HeadError(
            429,
            f"you have {live} queued or running jobs; this submit of {len(indices)} would pass "
            f"the limit of {cap_live} per user: wait for some to end",
        )
    now = tx.now
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
            state=JobState.PENDING,
            spec=spec,  # as submitted (frozen: an array's tasks share it); `team` decided
            submit_time=now,
            array_job_id=first if spec.array else None,
            array_task_id=index,
            in_core=k < cap,
            client_token=client_token if k == 0 else None,
        )
        if not rec.in_core:
            rec.reason = "JobArrayTaskLimit"
            rec.reason_message = f"array {first} runs at most {cap} tasks at once"
        if spec.hold:  # `sbatch -H`: held from the start (no run can slip in before)
            rec.hold, rec.in_core = "user", False
            rec.reason = "JobHeldUser"
            rec.reason_message = f"submitted held (-H); `phalanx release {rec.id}` lets it start"
        records.append(rec)
    tx.insert_jobs(records)
    mirror.live_per_user[who.user] = live + len(records)
    for rec in records:
        mirror.jobs[rec.id] = rec
        tx.event(now, "submitted", f"submitted by {who.user} to team {team}", rec.id)
    corestate.queue(mirror, tx, records, now)
    tx.kick = True
    return SubmitResponse(
        job_ids=[r.id for r in records], array_job_id=first if spec.array else None
    )


def check_dependencies(mirror: Mirror, tx: Tx, dependencies: list[DependencySpec]) -> None:
    """Refuse dependencies on jobs that do not exist (422)."""
    deps = sorted({j for d in dependencies for j in d.job_ids})
    if deps:
        tx.flush()  # a dependency may name a job submitted earlier in this batch
    unknown = [j for j in deps if j not in mirror.jobs]
    missing = set(unknown) - store.existing_job_ids(tx.conn, unknown)
    if missing:
        raise HeadError(
            422, f"dependency on job(s) {', '.join(map(str, sorted(missing)))} that do not exist"
        )


# An idempotency key (the `Idempotency-Key` header of POST /v1/jobs).
IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


class SubmitKeys:
    """Which job each (user, idempotency key) created, for the jobs in the mirror.

    A cache in front of the database: a job that left the mirror (ended) was written
    through `tx.update_job` first, so the database, read in the same transaction, has it.
    Owned by the control thread (built on first use, after the mirror was loaded).
    """

    def __init__(self) -> None:
        self._first: dict[tuple[str, str], int] = {}
        self._built = False

    def find(self, mirror: Mirror, tx: Tx, user: str, key: str) -> JobRecord | None:
        """The first job `user` submitted with `key` (live or ended), or None."""
        if not self._built or len(self._first) > 2 * len(mirror.jobs) + 1024:
            # (Re)build from the live jobs: drops entries of ended jobs, keeps memory bounded.
            self._first = {
                (r.user, r.client_token): r.id for r in mirror.jobs.values() if r.client_token
            }
            self._built = True
        job_id = self._first.get((user, key))
        rec = mirror.jobs.get(job_id) if job_id is not None else None
        if rec is not None and rec.client_token == key and rec.user == user:
            return rec
        return store.job_by_client_token(tx.conn, user, key)

    def add(self, user: str, key: str, job_id: int) -> None:
        self._first[(user, key)] = job_id


def submit_once(
    mirror: Mirror, keys: SubmitKeys, tx: Tx, who: Principal, spec: JobSpec, key: str
) -> tuple[SubmitResponse, bool]:
    """An idempotent submit: the first time `who` sends `key`, `submit` (and True); every
    later time, live or ended, before or after a head restart, the same answer (and False).
    A repeat's spec is not compared: the key alone names the submit."""
    assert who.user is not None
    rec = keys.find(mirror, tx, who.user, key)
    if rec is not None:
        tasks = len(rec.spec.array.indices) if rec.spec.array else 1
        array = rec.array_job_id if rec.spec.array else None
        return SubmitResponse(job_ids=[rec.id + k for k in range(tasks)], array_job_id=array), False
    answer = submit(mirror, tx, who, spec, client_token=key)
    keys.add(who.user, key, answer.job_ids[0])
    return answer, True


def _check_nodelist(mirror: Mirror, spec: JobSpec) -> None:
    """`-w`: every named node must exist, and enough of them must fit the job (Slurm
    refuses such a job at submit too)."""
    listed = compress(spec.nodelist)
    unknown = [n for n in spec.nodelist if n not in mirror.nodes]
    if unknown:
        raise HeadError(422, f"--nodelist {listed}: no node(s) {compress(unknown)} in the cluster")
    model = spec.gpu_model.lower() if spec.gpu_model else None
    fitting = [
        n
        for n in spec.nodelist
        if len(mirror.nodes[n].gpus) >= spec.gpus_per_node
        and (model is None or mirror.nodes[n].gpus[0].model.lower() == model)
    ]
    if len(fitting) < spec.nodes:
        what = f"{spec.gpus_per_node}{'' if model is None else ' ' + str(spec.gpu_model)} GPUs"
        raise HeadError(
            422,
            f"--nodelist {listed}: the job needs {spec.nodes} node(s) with {what} each; "
            f"only {len(fitting)} of the listed nodes have that (the job would never start)",
        )
