"""Job controls in the head's real control loop on a fake clock (phalanx.testing.headloop):
hold / release, requeue, update, `--begin`, `-w`, and array-task ids (`12_3`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.api.models import ArraySpec, DependencySpec, JobUpdate
from phalanx.head import jobcontrol
from phalanx.head.auth import Principal
from phalanx.head.control import HeadError
from phalanx.head.mirror import Settings
from phalanx.testing.headloop import HeadLoop

SETTINGS = Settings(heartbeat_s=1.0, lease_s=8.0, tick_s=0.5, hang_timeout_s=0.0)
ADMIN = Principal(kind="api", token_id=1, user="root", admin=True, teams=frozenset({"default"}))
# HeadLoop submits as alice: OWNER is the jobs' owner, without admin rights.
OWNER = Principal(kind="api", token_id=2, user="alice", teams=frozenset({"default"}))
STRANGER = Principal(kind="api", token_id=3, user="mallory", teams=frozenset({"other"}))


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[HeadLoop]:
    head = HeadLoop(tmp_path / "head", SETTINGS)
    yield head
    head.close()


def _do(loop: HeadLoop, action: str, ref: str | int, who: Principal = OWNER) -> list[int]:
    fn = getattr(jobcontrol, action)
    recs = loop.op(lambda tx: fn(loop.mirror, tx, who, str(ref)))
    return [r.id for r in recs]


def _update(loop: HeadLoop, ref: str | int, who: Principal = OWNER, **change: object) -> None:
    update = JobUpdate.model_validate(change)
    loop.op(lambda tx: jobcontrol.update(loop.mirror, tx, who, str(ref), update))


def _refused(loop: HeadLoop, status: int, action: str, ref: str | int, **kw: object) -> str:
    with pytest.raises(HeadError) as err:
        if action == "update":
            _update(loop, ref, **kw)  # type: ignore[arg-type]
        else:
            _do(loop, action, ref, **kw)  # type: ignore[arg-type]
    assert err.value.status == status, err.value.detail
    return err.value.detail


def _busy(loop: HeadLoop) -> int:
    """One node with one GPU, taken by a running job."""
    loop.join("n1")
    blocker = loop.submit()
    loop.advance(1)
    assert loop.state(blocker) == "R"
    return blocker


def test_a_held_job_does_not_start_until_released(loop: HeadLoop) -> None:
    blocker = _busy(loop)
    job = loop.submit()
    assert _do(loop, "hold", job) == [job]
    loop.exit(blocker, 0)
    loop.advance(3)
    rec = loop.job(job)
    assert (rec.state.value, rec.reason, rec.hold) == ("PD", "JobHeldUser", "user")
    assert "held by alice" in (rec.reason_message or "")
    assert _do(loop, "release", job) == [job]
    loop.advance(1)
    assert loop.state(job) == "R"
    assert {"held", "released"} <= set(loop.kinds(job))
    assert loop.moves(job) == [("PD", "R")]  # a hold is no state move: PD all along


def test_an_admins_hold_is_released_only_by_an_admin(loop: HeadLoop) -> None:
    _busy(loop)
    job = loop.submit()
    _do(loop, "hold", job, ADMIN)
    assert (loop.job(job).reason, loop.job(job).hold) == ("JobHeldAdmin", "admin")
    assert "only an admin" in _refused(loop, 403, "release", job)
    _do(loop, "hold", job)  # the owner's hold does not turn an admin's into a user's
    assert loop.job(job).hold == "admin"
    assert _do(loop, "release", job, ADMIN) == [job]
    assert loop.job(job).hold is None


def test_others_cannot_touch_a_job(loop: HeadLoop) -> None:
    _busy(loop)
    job = loop.submit()
    for action in ("hold", "release", "requeue", "cancel"):
        _refused(loop, 403, action, job, who=STRANGER)
    _refused(loop, 403, "update", job, who=STRANGER, time_limit_s=60)
    assert loop.state(job) == "PD" and loop.job(job).hold is None


def test_only_pending_jobs_are_held(loop: HeadLoop) -> None:
    blocker = _busy(loop)
    assert "not pending (R)" in _refused(loop, 409, "hold", blocker)
    assert "is not held" in _refused(loop, 409, "release", blocker)


def test_a_job_that_depends_on_a_held_job_waits_and_a_cancelled_hold_frees_it(
    loop: HeadLoop,
) -> None:
    blocker = _busy(loop)
    first = loop.submit()
    then = loop.submit(dependencies=[DependencySpec(type="afterany", job_ids=[first])])
    _do(loop, "hold", first)
    loop.exit(blocker, 0)
    loop.advance(2)
    assert loop.mirror.jobs[then].state.value == "PD"
    loop.cancel(first)  # cancelled while held: afterany is satisfied
    loop.advance(2)
    assert (loop.state(first), loop.state(then)) == ("CA", "R")


def test_a_hold_survives_a_head_restart(loop: HeadLoop) -> None:
    blocker = _busy(loop)
    job = loop.submit()
    _do(loop, "hold", job)
    loop.restart()
    loop.exit(blocker, 0)
    loop.advance(3)
    assert (loop.state(job), loop.job(job).reason) == ("PD", "JobHeldUser")
    _do(loop, "release", job)
    loop.advance(1)
    assert loop.state(job) == "R"


def test_requeue_restarts_a_running_job_and_counts_it(loop: HeadLoop) -> None:
    job = _busy(loop)
    assert _do(loop, "requeue", job) == [job]
    loop.advance(3)
    rec = loop.job(job)
    assert loop.moves(job) == [("PD", "R"), ("R", "CG"), ("CG", "PD"), ("PD", "R")]
    assert (rec.state.value, rec.restart_count, rec.epoch) == ("R", 1, 2)
    requeued = [e.message for e in loop.events(job) if e.kind == "requeued"]
    assert requeued and "requeued by alice; restart 1" in requeued[0]


def test_requeue_is_refused_for_pending_and_no_requeue_jobs(loop: HeadLoop) -> None:
    loop.join("n1", gpus=2)
    pinned = loop.submit(requeue=False)
    loop.advance(1)
    assert "--no-requeue" in _refused(loop, 409, "requeue", pinned)
    waiting = loop.submit(gpus_per_node=2)
    assert "not running (PD)" in _refused(loop, 409, "requeue", waiting)


def test_update_a_pending_job(loop: HeadLoop) -> None:
    _busy(loop)
    job = loop.submit(time_limit_s=3600)
    _update(loop, job, time_limit_s=600, qos="low")
    rec = loop.job(job)
    assert (rec.spec.time_limit_s, rec.qos, rec.priority) == (600, "low", 0)
    assert loop.mirror.core is not None and loop.mirror.core.pending[job].time_limit_s == 600
    updated = [e.message for e in loop.events(job) if e.kind == "updated"]
    assert updated == ["time limit 3600 → 600 s; qos normal → low by alice"]
    loop.restart()  # written through: the spec change is in the database
    assert loop.job(job).spec.time_limit_s == 600


def test_only_admins_raise_time_limits_and_set_priorities(loop: HeadLoop) -> None:
    _busy(loop)
    job = loop.submit(time_limit_s=600)
    unlimited = loop.submit()
    assert "only admins raise" in _refused(loop, 403, "update", job, time_limit_s=601)
    _update(loop, unlimited, time_limit_s=60_000)  # any limit lowers "unlimited"
    assert "only admins set" in _refused(loop, 403, "update", job, priority=5)
    assert loop.job(job).spec.time_limit_s == 600
    _update(loop, job, ADMIN, time_limit_s=7200, priority=5)
    assert (loop.job(job).spec.time_limit_s, loop.job(job).priority) == (7200, 5)


def test_a_running_jobs_time_limit_may_be_lowered_and_then_applies(loop: HeadLoop) -> None:
    job = _busy(loop)
    loop.advance(10)
    assert "pending job's qos" in _refused(loop, 409, "update", job, qos="low")
    _update(loop, job, time_limit_s=5)  # already ran longer: it times out now
    loop.advance(2)
    assert loop.state(job) in ("CG", "TO")
    loop.advance(3)
    assert loop.state(job) == "TO"


def test_update_dependencies(loop: HeadLoop) -> None:
    blocker = _busy(loop)
    job = loop.submit()
    _update(loop, job, dependencies=[{"type": "afterok", "job_ids": [blocker]}])
    assert "cannot depend on itself" in _refused(
        loop, 422, "update", job, dependencies=[{"type": "afterok", "job_ids": [job]}]
    )
    assert "do not exist" in _refused(
        loop, 422, "update", job, dependencies=[{"type": "afterok", "job_ids": [999]}]
    )
    loop.exit(blocker, 0, code=1)  # afterok can never be satisfied now
    loop.advance(2)
    code, _ = loop.op(lambda tx: _reason(loop, job))
    assert code == "DependencyNeverSatisfied"
    _update(loop, job, dependencies=[])
    loop.advance(1)
    assert loop.state(job) == "R"


def _reason(loop: HeadLoop, job: int) -> tuple[str | None, str | None]:
    from phalanx.head.scheduling import pending_reason

    return pending_reason(loop.mirror, loop.mirror.jobs[job])


def test_begin_time_keeps_a_job_pending_with_reason_begin_time(loop: HeadLoop) -> None:
    loop.join("n1")
    job = loop.submit(begin_time=loop.clock.time() + 30)
    loop.advance(2)
    assert loop.state(job) == "PD"
    assert loop.op(lambda tx: _reason(loop, job))[0] == "BeginTime"
    loop.advance(30)
    assert loop.state(job) == "R"


def test_a_nodelist_places_the_job_on_the_named_node(loop: HeadLoop) -> None:
    loop.join("n1")
    loop.join("n2")
    job = loop.submit(nodelist=["n2"])
    loop.advance(1)
    assert loop.job(job).placement == [("n2", [0])]


def test_a_nodelist_that_cannot_fit_is_refused_at_submit(loop: HeadLoop) -> None:
    loop.join("n1")
    loop.join("n2", gpus=4)
    with pytest.raises(HeadError, match=r"only 0 of the listed nodes") as err:
        loop.submit(nodelist=["n1"], gpus_per_node=4)  # n2 has 4 GPUs; n1 has one
    assert err.value.status == 422
    with pytest.raises(HeadError, match=r"no node\(s\) n9 in the cluster"):
        loop.submit(nodelist=["n9"])


def _array(loop: HeadLoop, tasks: int, **spec: object) -> int:
    return loop.submit(array=ArraySpec(indices=list(range(tasks)), **spec))  # type: ignore[arg-type]


def test_an_array_task_id_is_never_read_as_a_longer_job_id(loop: HeadLoop) -> None:
    """M1: `cancel 1_3` cancelled job 13 (Python's int() allows underscores)."""
    loop.join("n1")
    array = _array(loop, 4, max_parallel=1)  # ids 1..4 = tasks 1_0 .. 1_3
    while loop.mirror.next_job_id < int(f"{array}3"):
        loop.submit()
    victim = loop.submit()
    assert victim == int(f"{array}3") == 13
    assert _do(loop, "cancel", f"{array}_3") == [array + 3]
    loop.advance(1)
    assert loop.state(array + 3) == "CA" and loop.state(victim) != "CA"
    with pytest.raises(HeadError, match=r"already ended \(CA\)"):
        _do(loop, "cancel", f"{array}_3")
    _refused(loop, 404, "cancel", f"{array}_7")


def test_an_array_id_means_every_task(loop: HeadLoop) -> None:
    loop.join("n1")
    array = _array(loop, 3)
    loop.advance(1)
    running = [t for t in range(array, array + 3) if loop.state(t) == "R"]
    assert len(running) == 1
    held = _do(loop, "hold", array)
    assert held == [t for t in range(array, array + 3) if t not in running]
    _update(loop, array, time_limit_s=60)
    assert {loop.job(t).spec.time_limit_s for t in range(array, array + 3)} == {60}
    assert sorted(_do(loop, "cancel", array)) == [array, array + 1, array + 2]
    loop.advance(2)
    assert {loop.state(t) for t in range(array, array + 3)} == {"CA"}
    with pytest.raises(HeadError, match=rf"array {array} already ended"):
        _do(loop, "cancel", array)


def test_holding_a_throttled_arrays_task_frees_its_slot(loop: HeadLoop) -> None:
    """`%1`: holding the task whose turn it is lets the next one run; released, the held
    task waits for the array's slot again."""
    loop.join("n1")
    loop.join("n2")
    array = _array(loop, 3, max_parallel=1)
    loop.advance(1)
    assert [loop.state(t) for t in (array, array + 1)] == ["R", "PD"]
    _do(loop, "hold", f"{array}_1")
    loop.exit(array, 0)
    loop.advance(2)
    assert [loop.state(t) for t in (array + 1, array + 2)] == ["PD", "R"]
    _do(loop, "release", f"{array}_1")
    assert loop.job(array + 1).reason == "JobArrayTaskLimit"
    loop.exit(array + 2, 0)
    loop.advance(2)
    assert loop.state(array + 1) == "R"


def test_a_malformed_ref_is_refused() -> None:
    for ref in ("1_", "_3", "01", "1__3", "1_3_4", "99999999999", "1-3"):
        with pytest.raises(HeadError) as err:
            jobcontrol.parse_ref(ref)
        assert err.value.status == 422


def test_a_job_that_depends_on_a_throttled_array_task_waits_for_it(loop: HeadLoop) -> None:
    """A task kept out of the queue by the array's `%1` limit exists and will run: a job
    that depends on it waits (reason Dependency), it is not 'never satisfied'; also after a
    head restart rebuilds the core's state."""
    loop.join("n1")
    loop.join("n2")
    array = _array(loop, 3, max_parallel=1)
    then = loop.submit(dependencies=[DependencySpec(type="afterok", job_ids=[array + 2])])
    loop.advance(1)
    assert loop.job(array + 2).reason == "JobArrayTaskLimit"
    assert _reason(loop, then)[0] == "Dependency"
    loop.restart()
    loop.advance(1)
    assert _reason(loop, then)[0] == "Dependency"
    for task in (array, array + 1, array + 2):
        loop.advance(1)
        assert loop.state(task) == "R"
        loop.exit(task, 0)
        loop.advance(1)
    loop.advance(1)
    assert loop.state(then) == "R"
