"""Controls on submitted jobs, as Slurm's scancel and scontrol: cancel, signal, hold, release,
requeue and update, each on a job (`123`), an array task (`123_4`) or a whole array (its id).

Every state change goes through head.lifecycle; every control is recorded as an event.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from phalanx.api.models import JobUpdate
from phalanx.core import JobState
from phalanx.head import corestate, lifecycle, store
from phalanx.head.auth import Principal, allowed_qos
from phalanx.head.control import HeadError
from phalanx.head.jobs import check_dependencies
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import QOS_PRIORITY, JobRecord

_REF = re.compile(r"([1-9][0-9]{0,9})(?:_([0-9]{1,7}))?")
MAX_JOB_ID = 2**31 - 1
HELD_USER, HELD_ADMIN = "JobHeldUser", "JobHeldAdmin"  # Slurm's reasons


def parse_ref(ref: str) -> tuple[int, int | None]:
    """`123` → (123, None); `123_4` → (123, 4). 422 for anything else (never `1234`)."""
    match = _REF.fullmatch(ref)
    if match is None or int(match[1]) > MAX_JOB_ID:
        raise HeadError(422, f"{ref!r} is not a job id: use 123, or 123_4 for an array task")
    return int(match[1]), None if match[2] is None else int(match[2])


def task_id(mirror: Mirror, array_job_id: int, task: int) -> int | None:
    """The job id of live task `task` of array `array_job_id` (None: not live)."""
    for rec in mirror.jobs.values():
        if rec.array_job_id == array_job_id and rec.array_task_id == task:
            return rec.id
    return None


def resolve(mirror: Mirror, tx: Tx, who: Principal, ref: str) -> list[JobRecord]:
    """The live jobs `ref` names, which `who` may control: a job, an array task, or every
    live task of an array (named by its id, as Slurm). 404 if it never existed (or `who`
    may not see it), 403 if it is someone else's, 409 if it already ended."""
    first, task = parse_ref(ref)
    if task is not None:
        found = [
            r for r in mirror.jobs.values() if r.array_job_id == first and r.array_task_id == task
        ]
    else:
        rec = mirror.jobs.get(first)
        if rec is not None and rec.array_job_id not in (None, first):
            found = [rec]  # a task named by its own job id: that task only
        else:
            found = sorted(
                (r for r in mirror.jobs.values() if r.array_job_id == first),
                key=lambda r: r.id,
            )
            if not found and rec is not None:
                found = [rec]
    if not found:
        tx.flush()
        ended = (
            store.job(tx.conn, first) if task is None else store.array_task(tx.conn, first, task)
        )
        if ended is None or not who.may_see_job(ended.user, ended.team):
            raise HeadError(404, f"no job {ref}")
        what = "array" if task is None and ended.array_job_id == first else "job"
        raise HeadError(409, f"{what} {ref} already ended ({ended.state.value})")
    for rec in found:
        if not who.may_see_job(rec.user, rec.team):
            raise HeadError(403, f"job {ref} belongs to {rec.user} (team {rec.team})")
    return found


def _by(who: Principal) -> str:
    return who.user or "an admin"


def _each(
    ref: str, found: list[JobRecord], act: Callable[[JobRecord], str | None], verb: str
) -> list[JobRecord]:
    """Apply `act` to every job `ref` named; `act` returns why it does not apply to one
    (None: done). One job that does not apply is a 409; an array's tasks that do not
    apply are skipped, unless none does."""
    done, refusals = [], []
    for rec in found:
        refusal = act(rec)
        if refusal is None:
            done.append(rec)
        else:
            refusals.append(refusal)
    if not done:
        if len(found) == 1:
            raise HeadError(409, refusals[0])
        raise HeadError(409, f"no task of array {ref} can be {verb}: {refusals[0]}")
    return done


def cancel(mirror: Mirror, tx: Tx, who: Principal, ref: str) -> list[JobRecord]:
    """`scancel REF`: an array's id cancels every live task."""
    found = resolve(mirror, tx, who, ref)
    for rec in found:
        lifecycle.cancel(mirror, tx, rec, tx.now, _by(who))
    return found


def signal(
    mirror: Mirror, tx: Tx, who: Principal, ref: str, sig: str, scope: str | None = None
) -> list[JobRecord]:
    """`scancel --signal SIG REF`: the job's agents deliver SIG to its processes once;
    `scope` "steps" (a batch job's srun tasks only) or "batch" (its script only)."""

    def act(rec: JobRecord) -> str | None:
        if not rec.state.running or rec.stopping is not None:
            return f"job {rec.id} is not running ({rec.state.value}): nothing to signal"
        lifecycle.notify(
            mirror,
            tx,
            rec,
            sig,
            f"sent by {_by(who)}",
            tx.now,
            batch_only=scope == "batch",
            steps_only=scope == "steps",
        )
        return None

    return _each(ref, resolve(mirror, tx, who, ref), act, "signalled")


def hold(mirror: Mirror, tx: Tx, who: Principal, ref: str) -> list[JobRecord]:
    """`scontrol hold`: a pending job stays pending (JobHeldUser; by an admin JobHeldAdmin,
    which only an admin releases) until released."""
    kind = "admin" if who.admin else "user"

    def act(rec: JobRecord) -> str | None:
        if rec.state is not JobState.PENDING or rec.stopping is not None:
            return f"job {rec.id} is not pending ({rec.state.value}): only pending jobs are held"
        if rec.hold == kind or rec.hold == "admin":
            return None  # held already (an admin's hold stays an admin's)
        rec.hold = kind
        rec.reason = HELD_ADMIN if kind == "admin" else HELD_USER
        rec.reason_message = (
            f"held by {_by(who)}"
            + (" (an admin): only an admin can release it" if kind == "admin" else "")
            + f"; `phalanx release {ref}` lets it start"
        )
        corestate.withdraw(mirror, rec)
        if rec.in_core:
            rec.in_core = False
            lifecycle.release_array_slot(mirror, tx, rec)  # its throttle slot goes to another
        tx.update_job(rec)
        tx.event(tx.now, "held", f"held by {_by(who)}", rec.id)
        return None

    return _each(ref, resolve(mirror, tx, who, ref), act, "held")


def release(mirror: Mirror, tx: Tx, who: Principal, ref: str) -> list[JobRecord]:
    """`scontrol release`: a held job may start again (an admin's hold: by an admin)."""
    found = resolve(mirror, tx, who, ref)
    if not who.admin:
        by_admin = [r.id for r in found if r.hold == "admin"]
        if by_admin and len(by_admin) == sum(1 for r in found if r.hold is not None):
            raise HeadError(
                403, f"job {by_admin[0]} was held by an admin: only an admin can release it"
            )

    def act(rec: JobRecord) -> str | None:
        if rec.hold is None:
            return f"job {rec.id} is not held"
        if rec.hold == "admin" and not who.admin:
            return f"job {rec.id} was held by an admin"
        rec.hold = None
        rec.reason = rec.reason_message = None
        if _slot_free(mirror, rec):
            rec.in_core = True
            corestate.resubmit(mirror, tx, rec, tx.now)
        tx.update_job(rec)
        tx.event(tx.now, "released", f"released by {_by(who)}", rec.id)
        tx.kick = True
        return None

    return _each(ref, found, act, "released")


def _slot_free(mirror: Mirror, rec: JobRecord) -> bool:
    """Whether a released job may join the queue now: an array task only while its array
    runs fewer tasks than its `%N` limit (else it waits, JobArrayTaskLimit)."""
    array = rec.spec.array
    if rec.array_job_id is None or array is None or array.max_parallel is None:
        return True
    active = sum(
        1 for r in mirror.jobs.values() if r.array_job_id == rec.array_job_id and r.in_core
    )
    if active < array.max_parallel:
        return True
    rec.reason = "JobArrayTaskLimit"
    rec.reason_message = f"array {rec.array_job_id} runs at most {array.max_parallel} tasks at once"
    return False


def requeue(mirror: Mirror, tx: Tx, who: Principal, ref: str) -> list[JobRecord]:
    """`scontrol requeue`: a running job is stopped and queued again (PD), to start anew
    (from its checkpoint, if it keeps one). As in Slurm, it counts as a restart: its
    restart count (SLURM_RESTART_COUNT) goes up by one, also against `max_restarts`."""

    def act(rec: JobRecord) -> str | None:
        if not rec.state.running or rec.stopping is not None:
            return (
                f"job {rec.id} is not running ({rec.state.value}): only running jobs are requeued"
            )
        if not rec.spec.requeue:
            return f"job {rec.id} was submitted with --no-requeue"
        message = f"requeued by {_by(who)}"
        rec.reason, rec.reason_message = "Requeued", message
        tx.event(tx.now, "requeue", message, rec.id)
        lifecycle.begin_stop(mirror, tx, rec, "requeue", None, message, tx.now)
        return None

    return _each(ref, resolve(mirror, tx, who, ref), act, "requeued")


def update(mirror: Mirror, tx: Tx, who: Principal, ref: str, change: JobUpdate) -> list[JobRecord]:
    """`scontrol update`: change a pending job's time limit, QOS, priority or dependencies,
    or a running job's time limit. Users may only lower a time limit and use the QOS they
    are allowed; only admins raise time limits and set priorities (as Slurm). Everything
    is checked before anything changes."""
    given = change.model_fields_set
    if not given:
        raise HeadError(422, "nothing to update: give a time limit, qos, priority or dependency")
    if "priority" in given and not who.admin:
        raise HeadError(403, "only admins set a job's priority (use --qos for yours)")
    if change.qos is not None and change.qos not in QOS_PRIORITY:
        raise HeadError(422, f"unknown qos {change.qos!r}; known: {', '.join(QOS_PRIORITY)}")
    if change.dependencies:
        check_dependencies(mirror, tx, change.dependencies)
    found = resolve(mirror, tx, who, ref)
    for rec in found:
        _check_update(mirror, who, rec, change)
    pending_only = sorted(given - {"time_limit_s"})

    def act(rec: JobRecord) -> str | None:
        pending = rec.state is JobState.PENDING
        if rec.stopping is not None:
            return f"job {rec.id} is ending ({rec.state.value})"
        if pending_only and not pending:
            fields = ", ".join(pending_only)
            return f"job {rec.id} is {rec.state.value}: only a pending job's {fields} can change"
        _apply_update(mirror, tx, who, rec, change)
        return None

    return _each(ref, found, act, "updated")


def _check_update(mirror: Mirror, who: Principal, rec: JobRecord, change: JobUpdate) -> None:
    """Refuse (403/422) what `who` may not change on `rec`."""
    if change.time_limit_s is not None and not who.admin:
        old = rec.spec.time_limit_s  # None: unlimited, so any limit lowers it
        if old is not None and change.time_limit_s > old:
            raise HeadError(
                403, f"job {rec.id}: only admins raise a time limit (now {old} s); you may lower it"
            )
    if change.qos is not None and not who.admin:
        team_qos = mirror.team_qos.get(rec.team)
        if not who.may_use_qos(change.qos, team_qos):
            allowed = ", ".join(sorted(allowed_qos(who.qos, team_qos)))
            raise HeadError(
                403,
                f"qos {change.qos!r} is above your allowance in team {rec.team!r} "
                f"(allowed: {allowed})",
            )
    if change.dependencies and any(rec.id in d.job_ids for d in change.dependencies):
        raise HeadError(422, f"job {rec.id} cannot depend on itself")


def _apply_update(
    mirror: Mirror, tx: Tx, who: Principal, rec: JobRecord, change: JobUpdate
) -> None:
    spec_change: dict[str, object] = {}
    said: list[str] = []
    if change.time_limit_s is not None:
        old = rec.spec.time_limit_s
        spec_change["time_limit_s"] = change.time_limit_s
        said.append(f"time limit {old or 'UNLIMITED'} → {change.time_limit_s} s")
    if change.qos is not None:
        said.append(f"qos {rec.qos} → {change.qos}")
        rec.qos = change.qos
        rec.priority = QOS_PRIORITY[change.qos]
    if change.priority is not None:
        said.append(f"priority {rec.priority} → {change.priority}")
        rec.priority = change.priority
    if change.dependencies is not None:
        spec_change["dependencies"] = list(change.dependencies)
        shown = ",".join(f"{d.type}:{':'.join(map(str, d.job_ids))}" for d in change.dependencies)
        said.append(f"dependency {shown or 'none'}")
    if change.dependency_any is not None:
        spec_change["dependency_any"] = change.dependency_any
    if spec_change:
        rec.spec = rec.spec.model_copy(update=spec_change)
        tx.flush()
        store.update_job_spec(tx.conn, rec)
    if rec.state is JobState.PENDING:
        if rec.in_core and rec.hold is None:  # queued again as it is now
            corestate.withdraw(mirror, rec)
            corestate.resubmit(mirror, tx, rec, tx.now)
    else:  # running: the new limit reaches the core (a rebuild) and its nodes (Assignment)
        mirror.core_dirty = True
        for node, _ in rec.placement:
            mirror.bump(tx, node)
    tx.update_job(rec)
    tx.event(tx.now, "updated", f"{'; '.join(said) or 'updated'} by {_by(who)}", rec.id)
    tx.kick = True
