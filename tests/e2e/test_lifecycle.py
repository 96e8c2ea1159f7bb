"""Job lifecycles on a real cluster: states, exit codes, cancel, limits, logs, queue rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.api.models import (
    ArraySpec,
    DependencySpec,
    DependencyType,
    JobInfo,
    TeamSpec,
    UserCreate,
)
from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from phalanx.testing.processes import pid_alive
from tests.e2e.helpers import (
    all_gone,
    final_log,
    job,
    printed_pids,
    sh,
    submit,
    wait_for,
    wait_reason,
    wait_state,
)


@pytest.mark.parametrize(
    ("script", "state", "exit_code"),
    [
        ("echo fine", "CD", "0:0"),
        ("exit 3", "F", "3:0"),
        ("kill -KILL $$", "F", "0:9"),
    ],
    ids=["success", "exit-3", "sigkill"],
)
def test_the_final_state_and_exit_code_follow_the_process(
    api: PhalanxClient, workdir: Path, script: str, state: str, exit_code: str
) -> None:
    job_id = submit(api, job(workdir, sh(script)))

    info = wait_state(api, job_id, ["CD", "F", "CA", "TO", "NF"], timeout=30)

    assert (info.state, info.exit_code) == (state, exit_code)
    assert info.start_time is not None and info.end_time is not None
    assert info.submit_time <= info.start_time <= info.end_time


def test_one_failing_rank_tears_the_whole_gang_down(api: PhalanxClient, workdir: Path) -> None:
    # Rank 1 (on the other node) sleeps; rank 0 fails once rank 1 is surely running.
    script = (
        'if [ "$RANK" = 1 ]; then sleep 60 & echo "pids $$ $!"; touch rank1-up; wait; fi\n'
        "for _ in $(seq 300); do [ -e rank1-up ] && exit 4; sleep 0.1; done; exit 99"
    )
    job_id = submit(api, job(workdir, sh(script), nodes=2, gpus_per_node=1))
    sleeper = printed_pids(api, job_id, 1)

    info = wait_state(api, job_id, "F", timeout=30)

    assert info.exit_code == "4:0"
    assert info.start_time is not None and info.end_time is not None
    assert info.end_time - info.start_time < 60  # nobody waited for the sleeper
    wait_for("the sleeping rank's processes to be gone", lambda: all_gone(sleeper), 10)


def test_cancelling_a_running_job_stops_every_process(api: PhalanxClient, workdir: Path) -> None:
    job_id = submit(
        api, job(workdir, sh('sleep 60 & echo "pids $$ $!"; wait'), nodes=2, gpus_per_node=1)
    )
    wait_state(api, job_id, "R")
    pids = printed_pids(api, job_id, 0) + printed_pids(api, job_id, 1)
    assert all(pid_alive(p) for p in pids)

    api.cancel(job_id)
    info = wait_state(api, job_id, "CA", timeout=30)

    assert info.end_time is not None
    wait_for("the cancelled job's processes to be gone", lambda: all_gone(pids), 10)


def test_the_table_listing_is_the_object_listing_as_rows(api: PhalanxClient, workdir: Path) -> None:
    running = submit(api, job(workdir, sh("sleep 60"), nodes=2, gpus_per_node=2))
    wait_state(api, running, "R")
    waiting = submit(api, job(workdir, sh("echo never")))
    wait_state(api, waiting, "PD")

    objects = api.jobs(active=True).jobs
    table = api.job_table(active=True)

    assert table.columns == list(JobInfo.model_fields)
    as_rows = [JobInfo.model_validate(dict(zip(table.columns, r, strict=True))) for r in table.rows]
    by_id = {j.id: j for j in as_rows}
    # Pending reasons and a running job's run time are computed per call.
    live = {"reason": None, "reason_message": None, "run_time_s": None}
    for listed in objects:
        if listed.id in (running, waiting):
            assert by_id[listed.id].model_copy(update=live) == listed.model_copy(update=live)
    assert by_id[running].placement and by_id[running].placement == api.job(running).job.placement
    assert by_id[waiting].reason
    api.cancel(running)
    api.cancel(waiting)


def test_cancelling_a_pending_job(api: PhalanxClient, workdir: Path) -> None:
    blocker = submit(api, job(workdir, sh("sleep 60"), nodes=2, gpus_per_node=2))
    wait_state(api, blocker, "R")
    waiting = submit(api, job(workdir, sh("echo never")))
    wait_state(api, waiting, "PD")

    api.cancel(waiting)
    info = wait_state(api, waiting, "CA", timeout=10)

    assert info.start_time is None
    assert api.job(blocker).job.state == "R"


def test_a_job_past_its_time_limit_is_stopped(api: PhalanxClient, workdir: Path) -> None:
    job_id = submit(api, job(workdir, sh("sleep 60"), time_limit_s=2))

    info = wait_state(api, job_id, "TO", timeout=30)

    assert info.start_time is not None and info.end_time is not None
    assert info.end_time >= info.start_time + 2  # not before the limit


def test_logs_through_the_api_and_output_files(api: PhalanxClient, workdir: Path) -> None:
    script = 'echo "out $RANK"; echo "err $RANK" >&2'
    plain = submit(api, job(workdir, sh(script), gpus_per_node=2))
    to_files = submit(api, job(workdir, sh(script), gpus_per_node=2, output="out-%j-%t.txt"))
    wait_state(api, plain, "CD")
    wait_state(api, to_files, "CD")

    for rank in range(2):
        assert final_log(api, plain, rank, "stdout") == f"out {rank}\n"
        assert final_log(api, plain, rank, "stderr") == f"err {rank}\n"
        # `-o` alone: stdout and stderr go to the rank's file in the workdir.
        text = (workdir / f"out-{to_files}-{rank}.txt").read_text()
        assert sorted(text.splitlines()) == [f"err {rank}", f"out {rank}"]
        assert f"out {rank}\n" in final_log(api, to_files, rank, "stdout")


def test_dependencies(api: PhalanxClient, workdir: Path) -> None:
    first = submit(api, job(workdir, sh("sleep 2")))
    failed = submit(api, job(workdir, sh("exit 1")))

    def after(kind: DependencyType, job_id: int) -> int:
        spec = job(workdir, sh("true"), dependencies=[DependencySpec(type=kind, job_ids=[job_id])])
        return submit(api, spec)

    ok_after_first = after("afterok", first)
    ok_after_failed = after("afterok", failed)
    any_after_failed = after("afterany", failed)
    notok_after_failed = after("afternotok", failed)
    wait_reason(api, ok_after_first, "Dependency")  # while `first` still runs

    first_info = wait_state(api, first, "CD")
    wait_state(api, failed, "F")
    waited = wait_state(api, ok_after_first, "CD")
    assert waited.start_time is not None and first_info.end_time is not None
    assert waited.start_time >= first_info.end_time
    wait_state(api, any_after_failed, "CD")
    wait_state(api, notok_after_failed, "CD")
    never = wait_reason(api, ok_after_failed, "DependencyNeverSatisfied")
    assert never.start_time is None


def _max_overlap(infos: list[JobInfo]) -> int:
    """The most jobs that ran at the same moment, from their start and end times."""
    spans = [(i.start_time, i.end_time) for i in infos if i.start_time and i.end_time]
    assert len(spans) == len(infos), infos
    return max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)


def test_an_array_runs_at_most_max_parallel_tasks_at_once(
    api: PhalanxClient, workdir: Path
) -> None:
    spec = job(
        workdir,
        sh('echo "task $SLURM_ARRAY_TASK_ID"; sleep 1'),
        array=ArraySpec(indices=[0, 1, 2, 3], max_parallel=2),
    )
    answer = api.submit(spec)
    assert len(answer.job_ids) == 4

    infos = [wait_state(api, task, "CD", timeout=60) for task in answer.job_ids]

    # Four free GPUs would run all four 1-GPU tasks at once; the array allows two.
    assert _max_overlap(infos) == 2
    # The array's id names the whole array (as in Slurm): each task's log by its `ID_TASK`.
    tasks = [f"{answer.array_job_id}_{i.array_task_id}" for i in infos]
    outputs = sorted(final_log(api, task) for task in tasks)
    assert outputs == [f"task {i}\n" for i in range(4)]
    assert sorted(i.array_task_id for i in infos if i.array_task_id is not None) == [0, 1, 2, 3]


def test_a_high_priority_job_starts_before_an_earlier_normal_one(
    api: PhalanxClient, workdir: Path
) -> None:
    whole = {"nodes": 2, "gpus_per_node": 2}
    blocker = submit(api, job(workdir, sh("sleep 60"), preemptible=False, **whole))
    wait_state(api, blocker, "R")
    normal = submit(api, job(workdir, sh("true"), **whole))
    high = submit(api, job(workdir, sh("true"), qos="high", **whole))
    wait_state(api, normal, "PD")
    wait_state(api, high, "PD")

    api.cancel(blocker)
    normal_info = wait_state(api, normal, "CD", timeout=60)
    high_info = wait_state(api, high, "CD", timeout=60)

    assert high_info.priority > normal_info.priority
    assert high_info.start_time is not None and normal_info.start_time is not None
    assert high_info.start_time < normal_info.start_time


def test_a_team_quota_limits_the_gpus_its_jobs_hold(
    api: PhalanxClient, cluster: LocalCluster, workdir: Path, request: pytest.FixtureRequest
) -> None:
    team = f"quota-{request.node.callspec.id}"  # the test may run once per database
    api.set_team(TeamSpec(name=team, quota_gpus=2))
    api.create_user(UserCreate(name=f"{team}-user", teams=[team], default_team=team))
    token = api.create_token(f"{team}-user").token
    with cluster.client(token) as user:
        ids = [submit(user, job(workdir, sh("sleep 1"), gpus_per_node=2)) for _ in range(3)]
        running = wait_state(user, ids[0], "R")
        for waiting in ids[1:]:
            info = wait_reason(user, waiting, "QuotaExceeded")
            assert "quota 2/2" in (info.reason_message or ""), info.reason_message
        assert running.team == team

        infos = [wait_state(user, i, "CD", timeout=60) for i in ids]

    # The cluster has four GPUs: without the quota two of these jobs would run together.
    assert _max_overlap(infos) == 1
