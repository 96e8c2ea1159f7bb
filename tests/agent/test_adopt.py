"""An agent restarted on its state dir (an upgrade: SIGUSR2) adopts the job processes the
head still wants and kills the others; real agent processes against a stand-in head."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest

from phalanx.agent import adopt, leftovers
from phalanx.agent.guard import LEASE_NAME, read_lease
from phalanx.api.models import Assignment, Notice, ProcessStatus
from phalanx.testing.processes import pid_alive

from .cgroup_fixtures import cgroup_parent  # noqa: F401  (a fixture)
from .helpers import STEP_TOKEN, AgentProcess, FakeHead, assignment, desired, guards, wait_for

ADDRESS = "127.0.0.6"
OTHER_USER = "phxtest-bob"  # the account tests/security uses too


def job(tmp_path: Path, shell: str, **changes: object) -> Assignment:
    """One rank on this node running `shell` with sh in `tmp_path`."""
    fields: dict[str, object] = {
        "command": ["sh", "-c", shell],
        "workdir": str(tmp_path),
        "nodes": [ADDRESS],
        "addresses": [ADDRESS],
        "agent_urls": [f"http://{ADDRESS}:1"],
        "gpus": [0],
        "gpus_per_node": 1,
        "master_addr": ADDRESS,
        "master_port": None,
        **changes,
    }
    return assignment(**fields)


def waiting(tmp_path: Path, name: str = "rank", code: int = 3) -> str:
    """A rank that notes its start, says hello, notes each SIGUSR1 and exits `code` once
    the file `go` exists."""
    return (
        f"echo $$ >> {tmp_path / name}.starts; echo hello from {name}; "
        f"trap 'echo USR1 >> {tmp_path / name}.notices' USR1; "
        f"while [ ! -e {tmp_path / 'go'} ]; do sleep 0.05; done; exit {code}"
    )


@pytest.fixture
def pids() -> Iterator[list[int]]:
    """Process groups to SIGKILL at the end should a test fail halfway."""
    found: list[int] = []
    yield found
    for pid in found:
        if pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)


def ranks(head: FakeHead, job_id: int = 7) -> list[ProcessStatus]:
    return [p for p in head.processes() if p.job_id == job_id]


def running(head: FakeHead, job_id: int = 7, epoch: int = 1) -> ProcessStatus | None:
    return next((p for p in ranks(head, job_id) if p.epoch == epoch and p.running), None)


def agent(head: FakeHead, tmp_path: Path, extra: tuple[str, ...] = ()) -> AgentProcess:
    return AgentProcess(head.url, ADDRESS, tmp_path / "agent", tmp_path / "agent.log", extra)


def test_an_agent_restarted_for_an_upgrade_adopts_its_jobs(tmp_path: Path, pids: list[int]) -> None:
    a = job(tmp_path, waiting(tmp_path))
    head = FakeHead(desired(a, lease_s=30.0, heartbeat_s=0.2))
    first = agent(head, tmp_path)
    second: AgentProcess | None = None
    try:
        before = wait_for("the rank to run", lambda: running(head))
        assert before.pid is not None
        pids.append(before.pid)
        [first_guard] = wait_for("the first agent's guard", lambda: guards(tmp_path / "agent"))
        assert first.leave() == 0
        assert pid_alive(before.pid)  # SIGUSR2 left the job running
        head.beats.clear()
        second = agent(head, tmp_path)

        after = wait_for("the new agent to report the rank", lambda: running(head))
        assert (after.pid, after.started_at, after.lost) == (before.pid, before.started_at, False)
        # The old guard handed its lease over to the new agent's, and exited.
        wait_for("the old guard to exit", lambda: not pid_alive(first_guard))
        assert len(guards(tmp_path / "agent")) == 1
        # The new agent serves the rank's log and delivers a notice to it.
        assert "hello from rank" in rank_log(tmp_path / "agent")
        notice = Notice(id=1, signal="SIGUSR1", reason="preempted")
        head.desired = desired(
            a.model_copy(update={"notices": [notice]}), version=2, lease_s=30.0, heartbeat_s=0.2
        )
        wait_for("the notice", lambda: (tmp_path / "rank.notices").exists())

        (tmp_path / "go").touch()
        ended = wait_for("the rank's exit", lambda: [p for p in ranks(head) if not p.running])[0]
        assert (ended.pid, ended.exit_code, ended.signal, ended.lost) == (
            before.pid,
            3,
            None,
            False,
        )
        assert (tmp_path / "rank.starts").read_text() == f"{before.pid}\n"  # never twice
        assert (tmp_path / "rank.notices").read_text() == "USR1\n"  # once
    finally:
        if second is not None:
            second.stop()
        first.stop()
        head.close()


def test_an_adopted_job_is_stopped_when_the_head_no_longer_wants_it(
    tmp_path: Path, pids: list[int]
) -> None:
    a = job(tmp_path, waiting(tmp_path))
    head = FakeHead(desired(a, lease_s=30.0, heartbeat_s=0.2, kill_grace_s=5.0))
    first = agent(head, tmp_path)
    second: AgentProcess | None = None
    try:
        pid = wait_for("the rank to run", lambda: running(head)).pid
        assert pid is not None
        pids.append(pid)
        first.leave()
        second = agent(head, tmp_path)
        wait_for("the rank adopted", lambda: (r := running(head)) is not None and r.pid == pid)

        head.desired = desired(version=2, lease_s=30.0, heartbeat_s=0.2)  # cancelled
        wait_for("the adopted rank to be stopped", lambda: not pid_alive(pid))
        records = tmp_path / "agent" / "jobs" / "7" / "e1" / adopt.RECORDS_DIR
        wait_for("its records forgotten", lambda: not records.exists())
    finally:
        if second is not None:
            second.stop()
        first.stop()
        head.close()


def test_an_srun_step_runs_on_through_an_upgrade(tmp_path: Path, pids: list[int]) -> None:
    port = free_port(ADDRESS)  # srun inside the job reaches its agent there, before and after
    go = tmp_path / "go"
    task = f"echo $$ > {tmp_path / 'task.pid'}; while [ ! -e {go} ]; do sleep 0.05; done; exit 6"
    script = f"#!/bin/sh\nsrun sh -c '{task}'\necho $? > {tmp_path / 'srun.code'}\n"
    a = job(
        tmp_path,
        "",
        launcher="batch",
        command=None,
        script=script,
        agent_urls=[f"http://{ADDRESS}:{port}"],
    )
    head = FakeHead(desired(a, lease_s=30.0, heartbeat_s=0.2))
    extra = ("--port", str(port))
    first = agent(head, tmp_path, extra)
    second: AgentProcess | None = None
    try:
        batch = wait_for("the batch script to run", lambda: running(head))
        assert batch.pid is not None
        pids.append(batch.pid)
        step_task = int(wait_for("the step's task", lambda: read(tmp_path / "task.pid")))
        pids.append(step_task)
        first.leave()
        assert pid_alive(step_task)
        second = agent(head, tmp_path, extra)
        wait_for("the batch script adopted", lambda: (r := running(head)) and r.pid == batch.pid)
        go.touch()
        # srun waited for the agent through its restart, and got the task's exit from the
        # new one, which adopted the step.
        assert wait_for("srun's exit", lambda: read(tmp_path / "srun.code")) == "6"
        ended = wait_for(
            "the batch script's end", lambda: [p for p in ranks(head) if not p.running]
        )
        assert (ended[0].pid, ended[0].exit_code, ended[0].lost) == (batch.pid, 0, False)
    finally:
        if second is not None:
            second.stop()
        first.stop()
        head.close()


def test_another_epoch_and_a_job_no_longer_wanted_are_killed(
    tmp_path: Path, pids: list[int]
) -> None:
    seven = job(tmp_path, waiting(tmp_path, "seven"))
    eight = job(
        tmp_path, waiting(tmp_path, "eight"), job_id=8, step_token="step-token-job-8-xxxxxxxx"
    )
    head = FakeHead(desired(seven, eight, lease_s=30.0, heartbeat_s=0.2))
    first = agent(head, tmp_path)
    second: AgentProcess | None = None
    try:
        old = []
        for job_id in (7, 8):
            pid = wait_for(f"job {job_id}", partial(running, head, job_id)).pid
            assert pid is not None
            old.append(pid)
        pids.extend(old)
        first.leave()
        # Meanwhile the head moved job 7 to epoch 2 (say, its other node died) and job 8
        # ended: neither old process may live on.
        newer = seven.model_copy(update={"epoch": 2, "restart_count": 1})
        head.desired = desired(newer, version=2, lease_s=30.0, heartbeat_s=0.2)
        second = agent(head, tmp_path)

        fresh = wait_for("epoch 2 to run", lambda: running(head, 7, epoch=2))
        assert fresh.pid not in old and fresh.pid is not None
        pids.append(fresh.pid)
        assert not any(pid_alive(p) for p in old)
        assert [p.epoch for p in head.processes()] == [2]  # epoch 1 and job 8: not reported
        assert len((tmp_path / "seven.starts").read_text().split()) == 2  # epoch 1, epoch 2
    finally:
        if second is not None:
            second.stop()
        first.stop()
        head.close()


def test_the_jobs_are_fenced_when_the_new_agent_cannot_reach_the_head_within_the_lease(
    tmp_path: Path, pids: list[int]
) -> None:
    a = job(tmp_path, waiting(tmp_path))
    head = FakeHead(desired(a, lease_s=2.0, heartbeat_s=0.2))
    first = agent(head, tmp_path)
    second: AgentProcess | None = None
    try:
        pid = wait_for("the rank to run", lambda: running(head)).pid
        assert pid is not None
        pids.append(pid)
        first.leave()
        head.hang()  # the new agent's registration is never answered in time
        second = agent(head, tmp_path)
        # The lease the first agent held runs out: the rank is killed (by the guard or the
        # new agent), as the head may be restarting it elsewhere.
        wait_for("the rank to be fenced", lambda: not pid_alive(pid), timeout=15.0)
        head.beats.clear()
        head.answer()
        lost = wait_for("the rank reported lost", lambda: [p for p in ranks(head) if p.lost])[0]
        assert (lost.epoch, lost.running, lost.signal) == (1, False, 9)
        seen = head.answered
        wait_for("3 more answered heartbeats", lambda: head.answered >= seen + 3)
        assert (tmp_path / "rank.starts").read_text() == f"{pid}\n"  # never run again
    finally:
        if second is not None:
            second.stop()
        first.stop()
        head.close()


def test_a_new_agent_frozen_before_the_head_answers_is_fenced_by_its_own_guard(
    tmp_path: Path, pids: list[int]
) -> None:
    a = job(tmp_path, waiting(tmp_path))
    head = FakeHead(desired(a, lease_s=6.0, heartbeat_s=0.2))
    first = agent(head, tmp_path)
    second: AgentProcess | None = None
    try:
        pid = wait_for("the rank to run", lambda: running(head)).pid
        assert pid is not None
        pids.append(pid)
        [old_guard] = wait_for("the first guard", lambda: guards(tmp_path / "agent"))
        first.leave()
        head.hang()
        second = agent(head, tmp_path)
        state = tmp_path / "agent"
        # The new agent took the lease over (its pid, the old deadline) and the old guard
        # left; then the new agent freezes before the head ever answers it.
        wait_for("the handover", lambda: lease_pid(state) == second.proc.pid)
        wait_for("the old guard to exit", lambda: not pid_alive(old_guard))
        os.kill(second.proc.pid, signal.SIGSTOP)
        try:
            assert pid_alive(pid)
            wait_for("the new guard to fence the rank", lambda: not pid_alive(pid), timeout=15.0)
        finally:
            os.kill(second.proc.pid, signal.SIGCONT)
        head.answer()
        lost = wait_for("the rank reported lost", lambda: [p for p in ranks(head) if p.lost])[0]
        assert (lost.epoch, lost.running, lost.signal) == (1, False, 9)
    finally:
        head.answer()
        if second is not None:
            second.stop()
        first.stop()
        head.close()


def lease_pid(state_dir: Path) -> int | None:
    lease = read_lease(state_dir / LEASE_NAME)
    return lease[0] if lease is not None else None


def test_sigterm_still_stops_the_jobs_and_a_new_agent_reports_them_lost(
    tmp_path: Path, pids: list[int]
) -> None:
    a = job(tmp_path, waiting(tmp_path))
    head = FakeHead(desired(a, lease_s=30.0, heartbeat_s=0.2, kill_grace_s=5.0))
    first = agent(head, tmp_path)
    second: AgentProcess | None = None
    try:
        pid = wait_for("the rank to run", lambda: running(head)).pid
        assert pid is not None
        pids.append(pid)
        first.stop()  # SIGTERM: stop my jobs
        assert not pid_alive(pid)
        head.beats.clear()
        second = agent(head, tmp_path)  # within the lease, but there is nothing to adopt
        [p] = wait_for("the new agent's report", head.processes)
        # Its status file says SIGTERM, but the job did not fail: the agent ended it.
        assert (p.pid, p.running, p.signal, p.lost) == (None, False, 9, True)
        assert (tmp_path / "rank.starts").read_text() == f"{pid}\n"
    finally:
        if second is not None:
            second.stop()
        first.stop()
        head.close()


def test_a_rank_that_fails_while_no_agent_runs_is_reported_with_its_exit(
    tmp_path: Path, pids: list[int]
) -> None:
    a = job(tmp_path, waiting(tmp_path, code=5))
    head = FakeHead(desired(a, lease_s=30.0, heartbeat_s=0.2))
    first = agent(head, tmp_path)
    second: AgentProcess | None = None
    try:
        pid = wait_for("the rank to run", lambda: running(head)).pid
        assert pid is not None
        pids.append(pid)
        first.leave()
        (tmp_path / "go").touch()
        wait_for("the rank to exit", lambda: not pid_alive(pid))
        head.beats.clear()
        second = agent(head, tmp_path)
        ended = wait_for("the report", lambda: [p for p in ranks(head) if not p.running])[0]
        assert (ended.pid, ended.exit_code, ended.signal, ended.lost) == (pid, 5, None, False)
    finally:
        if second is not None:
            second.stop()
        first.stop()
        head.close()


def test_an_adopted_job_that_runs_out_of_memory_is_reported_oom(
    tmp_path: Path,
    pids: list[int],
    cgroup_parent: str,  # noqa: F811  (the fixture)
) -> None:
    grow = "x = []\nwhile True: x.append(bytearray(1 << 20))"
    hog = (
        f"while [ ! -e {tmp_path / 'go'} ]; do sleep 0.05; done; exec {sys.executable} -c '{grow}'"
    )
    a = job(tmp_path, hog, mem_mb=64)
    head = FakeHead(desired(a, lease_s=30.0, heartbeat_s=0.2))
    extra = ("--cgroup-parent", cgroup_parent)
    first = agent(head, tmp_path, extra)
    second: AgentProcess | None = None
    try:
        pid = wait_for("the rank to run", lambda: running(head)).pid
        assert pid is not None
        pids.append(pid)
        first.leave()
        second = agent(head, tmp_path, extra)
        wait_for("the rank adopted", lambda: (r := running(head)) is not None and r.pid == pid)
        (tmp_path / "go").touch()
        ended = wait_for("the OOM kill", lambda: [p for p in ranks(head) if not p.running])[0]
        assert (ended.pid, ended.signal, ended.oom, ended.lost) == (pid, 9, True, False)
    finally:
        if second is not None:
            second.stop()
        first.stop()
        head.close()


# ----------------------------------------------------------------------------- forgeries
@pytest.fixture
def bob() -> pwd.struct_passwd:
    """A real account other than the agent's (created if missing; needs root)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to run a process as another user")
    argv = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
    done = subprocess.run([*argv, OTHER_USER], capture_output=True, text=True, check=False)
    assert done.returncode in (0, 9), done.stderr  # 9: it exists already
    return pwd.getpwnam(OTHER_USER)


def test_a_forged_record_makes_the_agent_neither_adopt_nor_kill_anothers_process(
    tmp_path: Path, bob: pwd.struct_passwd
) -> None:
    victim = subprocess.Popen(
        ["sleep", "120"], user=bob.pw_uid, group=bob.pw_gid, start_new_session=True
    )
    state = tmp_path / "agent"
    # What a previous agent would have left, within its lease: the launches of job 7 (run
    # as the agent's own account) and job 8 (as bob), each with a record naming bob's
    # process. Job 7's record is the agent's own file but the process is bob's, not the
    # uid the record and the assignment say; job 8's record is a file bob could have
    # written (his own), naming his own process.
    seven = job(tmp_path, "sleep 60")
    eight = job(
        tmp_path,
        "sleep 60",
        job_id=8,
        step_token="step-token-job-8-xxxxxxxx",
        user=OTHER_USER,
        uid=bob.pw_uid,
        gid=bob.pw_gid,
    )
    plant(state, seven, victim.pid, uid=os.getuid(), owner=None)
    plant(state, eight, victim.pid, uid=bob.pw_uid, owner=bob)
    (state / LEASE_NAME).write_text(f"999999 {time.monotonic() + 60.0!r}\n")
    head = FakeHead(desired(seven, eight, lease_s=30.0, heartbeat_s=0.2))
    second: AgentProcess | None = None
    try:
        second = agent(head, tmp_path)
        reports = wait_for("both jobs reported", lambda: len(head.processes()) == 2 or None)
        assert reports
        for p in head.processes():  # not adopted: lost (never started here again)
            assert (p.pid, p.running, p.lost) == (None, False, True), p
        assert pid_alive(victim.pid)  # and not killed
        assert "not a file only this agent can write" in (tmp_path / "agent.log").read_text()
    finally:
        if second is not None:
            second.stop()
        head.close()
        victim.kill()
        victim.wait()


def plant(
    state: Path, a: Assignment, pid: int, *, uid: int, owner: pwd.struct_passwd | None
) -> None:
    """A launch dir of `a` whose process record names `pid` (owned by `owner`, else the
    agent)."""
    job_dir = state / "jobs" / str(a.job_id) / f"e{a.epoch}"
    (job_dir / adopt.RECORDS_DIR).mkdir(parents=True, mode=0o700)
    (job_dir / "launched").write_text(hashlib.sha256(a.step_token.encode()).hexdigest())
    record = {
        "kind": "rank",
        "job_id": a.job_id,
        "epoch": a.epoch,
        "rank": 0,
        "pid": pid,
        "start": leftovers.start_time(pid),
        "shim_pid": None,
        "shim_start": None,
        "boot": adopt.boot_id(),
        "uid": uid,
        "as_user": owner is not None,
        "started_at": time.time(),
        "stdout": str(job_dir / "out"),
        "stderr": str(job_dir / "err"),
    }
    path = job_dir / adopt.RECORDS_DIR / "rank-0.json"
    path.write_text(json.dumps(record))
    path.chmod(0o600)
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        port: int = s.getsockname()[1]
        return port


def read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def rank_log(state_dir: Path, job_id: int = 7) -> str:
    """Rank 0's stdout, read through the agent's API with the job's step token."""
    address, port = (state_dir / "port").read_text().split()
    r = httpx.get(
        f"http://{address}:{port}/v1/logs/{job_id}",
        params={"rank": 0},
        headers={"Authorization": f"Bearer {STEP_TOKEN}"},
    )
    assert r.status_code == 200, r.text
    data: str = r.json()["data"]
    return data
