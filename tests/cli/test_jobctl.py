"""Job controls through the CLI against a real local cluster (head + 2 agents × 2 fake GPUs,
real HTTP and SQLite): array-task ids, cancel / hold / release / requeue / update, --begin
and -w. The head's rules in detail are in tests/head/test_jobcontrol.py."""

from __future__ import annotations

import json
import time

from phalanx.api.models import JobDetail, JobList
from phalanx.local import LocalCluster
from tests.cli.conftest import invoke

SLEEP = ("python", "-c", "import time; time.sleep(300)")


def _submit(env: dict[str, str], *flags: str) -> list[int]:
    result = invoke("submit", "--json", *flags, "--", *SLEEP, env=env)
    assert result.exit_code == 0, result.stderr
    return list(json.loads(result.stdout)["job_ids"])


def _job(env: dict[str, str], ref: str | int) -> JobDetail:
    result = invoke("show", str(ref), "--json", env=env)
    assert result.exit_code == 0, result.stderr
    return JobDetail.model_validate_json(result.stdout)


def _wait(env: dict[str, str], ref: str | int, states: set[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = _job(env, ref).job.state
        if state in states or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


def test_cancel_of_an_array_task_never_hits_the_job_its_digits_spell(
    cluster: LocalCluster, admin_env: dict[str, str]
) -> None:
    """M1: `phalanx cancel 29_3` cancelled job 293; `cancel 29` cancelled task 0 only."""
    later = ("--begin", "now+1hour")  # everything stays pending: no GPU is needed
    tasks = _submit(admin_env, "--array", "0-3", *later)
    array = tasks[0]
    victim_id = int(f"{array}3")
    filler = victim_id - (tasks[-1] + 1)
    if filler > 0:
        _submit(admin_env, "--array", f"0-{filler - 1}", *later)
    [victim] = _submit(admin_env, *later)
    assert victim == victim_id

    shown = invoke("queue", "--state", "PD", env=admin_env).stdout
    assert f"{array}_3 " in shown and "(BeginTime)" in shown
    cancelled = invoke("cancel", f"{array}_3", env=admin_env)
    assert cancelled.exit_code == 0, cancelled.stderr
    assert _wait(admin_env, f"{array}_3", {"CA"}) == "CA"
    assert _job(admin_env, f"{array}_3").job.id == tasks[3]
    assert _job(admin_env, victim).job.state == "PD"

    whole = invoke("cancel", str(array), env=admin_env)
    assert whole.stdout.strip() == f"array {array} (every task): CA", whole.stderr
    for task in range(3):
        assert _wait(admin_env, f"{array}_{task}", {"CA"}) == "CA"
    listed = invoke("show", str(array), env=admin_env).stdout
    assert "is an array of 4 tasks" in listed and f"{array}_2 " in listed
    assert _job(admin_env, victim).job.state == "PD"
    invoke("cancel", str(victim), env=admin_env)


def test_bad_job_ids_are_one_line_errors(cluster: LocalCluster, admin_env: dict[str, str]) -> None:
    for bad in ("29_", "2_9_3", "abc", "0", "29_[3-1]"):
        result = invoke("cancel", bad, env=admin_env)
        assert result.exit_code == 2
        assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1


def test_hold_release_requeue_and_update_as_a_user(
    cluster: LocalCluster, admin_env: dict[str, str]
) -> None:
    assert invoke("admin", "team", "set", "ml", env=admin_env).exit_code == 0
    assert invoke("admin", "user", "add", "bob", "--team", "ml", env=admin_env).exit_code == 0
    token = invoke("admin", "token", "create", "bob", env=admin_env).stdout.strip()
    bob = cluster.client_env(token)

    [waiting] = _submit(bob, "--begin", "now+1hour", "-t", "1:00:00")
    held = invoke("hold", str(waiting), env=bob)
    assert held.exit_code == 0, held.stderr
    assert held.stdout.strip() == f"job {waiting}: held; PD (JobHeldUser)"
    lowered = invoke("update", str(waiting), "-t", "30:00", env=bob)
    assert lowered.exit_code == 0, lowered.stderr
    assert _job(bob, waiting).job.time_limit_s == 1800
    raised = invoke("update", str(waiting), "-t", "2:00:00", env=bob)
    assert raised.exit_code == 2 and "only admins raise a time limit" in raised.stderr
    assert invoke("update", str(waiting), "--priority", "9", env=bob).exit_code == 2
    nothing = invoke("update", str(waiting), env=bob)
    assert nothing.exit_code == 2 and nothing.stderr.startswith("error: nothing to update")

    admin_hold = invoke("hold", str(waiting), env=admin_env)
    assert "JobHeldAdmin" in admin_hold.stdout
    refused = invoke("release", str(waiting), env=bob)
    assert refused.exit_code == 2 and "only an admin can release it" in refused.stderr
    assert invoke("release", str(waiting), env=admin_env).exit_code == 0
    events = [e.kind for e in _job(bob, waiting).events]
    assert events.count("held") == 2 and "released" in events and "updated" in events

    [admins] = _submit(admin_env, "--begin", "now+1hour")
    others = invoke("hold", str(admins), env=bob)
    assert others.exit_code == 2
    assert others.stderr == f"error: job {admins} belongs to admin (team default)\n"

    [running] = _submit(bob)
    assert _wait(bob, running, {"R"}) == "R"
    requeued = invoke("requeue", str(running), env=bob)
    assert requeued.exit_code == 0, requeued.stderr
    deadline = time.monotonic() + 60
    while _job(bob, running).job.restart_count < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _wait(bob, running, {"R"}) == "R"
    detail = _job(bob, running)
    assert (detail.job.restart_count, detail.job.epoch) == (1, 2)
    for job in (waiting, admins, running):
        invoke("cancel", str(job), env=admin_env)


def test_nodelist_runs_on_the_named_node_and_a_bad_one_is_refused(
    cluster: LocalCluster, admin_env: dict[str, str]
) -> None:
    [job] = _submit(admin_env, "-w", "127.0.0.3")
    assert _wait(admin_env, job, {"R"}) == "R"
    assert [p.node for p in _job(admin_env, job).job.placement] == ["127.0.0.3"]
    invoke("cancel", str(job), env=admin_env)
    unknown = invoke("submit", "-w", "nosuch[1-2]", "--", *SLEEP, env=admin_env)
    assert unknown.exit_code == 2
    assert "no node(s) nosuch[1-2] in the cluster" in unknown.stderr
    too_big = invoke(
        "submit", "-w", "127.0.0.2", "--gpus-per-node", "2", "-N", "2", "--", *SLEEP, env=admin_env
    )
    assert too_big.exit_code == 2 and "--nodelist" in too_big.stderr
    queue = JobList.model_validate_json(invoke("queue", "--json", env=admin_env).stdout)
    assert all(j.id != job or j.state != "R" for j in queue.jobs)
