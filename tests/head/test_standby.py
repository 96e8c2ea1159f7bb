"""One writer per database: a second SQLite head refuses to start; PostgreSQL heads elect a
leader, and a standby takes over when the leader dies, with its agents, jobs and clients."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from phalanx.api.models import JobSpec
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.head.leader import CHECK_INTERVAL_S, LOST_AFTER_S, LOST_LEADERSHIP_EXIT
from phalanx.testing.postgres import PostgresServer
from tests.head.heads import PHALANX, HeadServer, Proc, start_agent, wait_for


@pytest.fixture
def stop_later() -> Iterator[list[HeadServer | Proc]]:
    """Everything a test starts, stopped afterwards (agents first: they stop their jobs)."""
    started: list[HeadServer | Proc] = []
    yield started
    for thing in sorted(started, key=lambda t: isinstance(t, HeadServer)):
        thing.stop()


def test_a_second_head_on_the_same_sqlite_state_dir_exits_2(
    tmp_path: Path, stop_later: list[HeadServer | Proc]
) -> None:
    first = HeadServer(tmp_path / "head").start()
    stop_later.append(first)
    first.wait_role("leader")
    assert first.proc is not None
    second = subprocess.run(
        [*PHALANX, "head", "--state-dir", str(tmp_path / "head"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 2, second.stdout + second.stderr
    message = f"another head is running on this state directory (pid {first.proc.popen.pid})"
    assert message in second.stderr and "Traceback" not in second.stderr
    assert first.role() == "leader"  # the first one is untouched


def _pair(
    db_url: str, tmp_path: Path, stop_later: list[HeadServer | Proc]
) -> tuple[HeadServer, HeadServer]:
    """Two heads on one database, started together: (the leader, the standby)."""
    heads = [
        HeadServer(tmp_path / "a", db_url, host="127.0.0.1"),
        HeadServer(tmp_path / "b", db_url, host="127.0.0.2"),
    ]
    for head in heads:
        stop_later.append(head.start())
    roles = [wait_for(f"{h.url} to answer", h.role, timeout=60) for h in heads]
    assert sorted(roles) == ["leader", "standby"], roles
    leader, standby = heads if roles[0] == "leader" else heads[::-1]
    leader.wait_role("leader")  # its start-up is done (tokens written)
    return leader, standby


def _job(tmp_path: Path, seconds: float, name: str) -> JobSpec:
    command = [sys.executable, "-c", f"import time; time.sleep({seconds})"]
    return JobSpec(command=command, workdir=str(tmp_path), name=name)


def _state(api: PhalanxClient, job_id: int) -> str | None:
    try:
        return api.job(job_id).job.state
    except ApiError:
        return None  # no head answers for a moment: ask again


def test_a_standby_takes_over_when_the_leader_dies(
    postgres: PostgresServer, tmp_path: Path, stop_later: list[HeadServer | Proc]
) -> None:
    leader, standby = _pair(postgres.new_database("standby_takeover"), tmp_path, stop_later)

    # The agent lists the standby first: it is refused (503) and moves on to the leader.
    agent = start_agent(f"{standby.url},{leader.url}", leader.join_token, "127.0.0.41", tmp_path)
    stop_later.append(agent)

    # A standby answers /healthz only; everything else is 503 with a reason and Retry-After.
    token = leader.admin_token
    auth = {"Authorization": f"Bearer {token}"}
    for method, path in (("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/openapi.json")):
        r = httpx.request(method, standby.url + path, headers=auth, json={})
        assert r.status_code == 503, (method, path, r.text)
        assert r.json()["detail"] == "standby head: the leader is elsewhere"
        assert r.headers["retry-after"] == "1"

    both = f"{leader.url},{standby.url}"
    with PhalanxClient(both, token) as api:
        wait_for("the node to join", lambda: any(n.state == "up" for n in api.nodes().nodes))
        first = api.submit(_job(tmp_path, 2, "across-failover")).job_ids[0]
        wait_for("the job to run", lambda: api.job(first).job.state == "R")
        epoch = api.job(first).job.epoch

        assert leader.proc is not None
        leader.proc.kill()  # kill -9
        standby.wait_role("leader")
        became_leader = time.time()
        leader.start()  # the old leader comes back: as a standby of the new one (below)

        # The job was not lost nor restarted: it ends on its own, reported to the new leader.
        wait_for("the job to complete", lambda: _state(api, first) == "CD", timeout=60)
        done = api.job(first).job
        assert (done.epoch, done.restart_count) == (epoch, 0)
        assert api.url == standby.url  # the client moved to the head that answers

        # The agent heartbeats to the new leader (its clock says so, not the reload's).
        def beat_since_takeover() -> bool:
            node = api.nodes().nodes[0]
            return node.state == "up" and (node.last_heartbeat or 0) > became_leader

        wait_for("a heartbeat at the new leader", beat_since_takeover)

        second = api.submit(_job(tmp_path, 0, "after-failover")).job_ids[0]
        wait_for("the new job to complete", lambda: _state(api, second) == "CD", timeout=60)
        jobs = api.jobs(active=True, ended=True).jobs
    assert sorted((j.id, j.name, j.state) for j in jobs) == [
        (first, "across-failover", "CD"),
        (second, "after-failover", "CD"),
    ]

    leader.wait_role("standby")
    assert standby.role() == "leader"
    # The CLI takes the same list (flag or PHALANX_HEAD) and finds the leader in it.
    env = {**os.environ, "PHALANX_HEAD": both, "PHALANX_TOKEN": token}
    cli = subprocess.run([*PHALANX, "whoami"], env=env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and "admin" in cli.stdout, cli.stdout + cli.stderr


def test_a_leader_that_loses_its_lock_connection_stops(
    postgres: PostgresServer, tmp_path: Path, stop_later: list[HeadServer | Proc]
) -> None:
    db_url = postgres.new_database("standby_failstop")
    leader, standby = _pair(db_url, tmp_path, stop_later)

    # The database ends the leader's lock session (as a failover of PostgreSQL, or an
    # operator, would): the lock is gone, so the leader must stop at once.
    engine = create_engine(db_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            ended = conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    # This test's database only: other tests' heads hold the same lock
                    # key in their own databases.
                    "WHERE application_name = 'phalanx-head-leader-lock' "
                    "AND datname = current_database() AND pid IN "
                    "(SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)"
                )
            ).all()
    finally:
        engine.dispose()
    assert ended == [(True,)]
    assert leader.proc is not None
    assert leader.proc.popen.wait(timeout=30) == LOST_LEADERSHIP_EXIT
    assert "may no longer be the leader" in leader.proc.tail()
    standby.wait_role("leader")


def test_a_leader_frozen_past_its_lock_check_leads_on_when_thawed(
    postgres: PostgresServer, tmp_path: Path, stop_later: list[HeadServer | Proc]
) -> None:
    leader, standby = _pair(postgres.new_database("standby_pause"), tmp_path, stop_later)
    assert leader.proc is not None

    # Frozen (SIGSTOP: a long GC pause, a stopped VM) for longer than the lock check's
    # LOST_AFTER_S. Its lock session outlives the pause (the kernel answers the server's
    # keepalives), so the standby does not take over, and the thawed leader must not take
    # its own pause for a lost connection: it checks the lock again and leads on.
    os.killpg(leader.proc.popen.pid, signal.SIGSTOP)
    try:
        time.sleep(LOST_AFTER_S + 2)
        assert standby.role() == "standby"
    finally:
        os.killpg(leader.proc.popen.pid, signal.SIGCONT)

    time.sleep(3 * CHECK_INTERVAL_S)  # a fail-stop would have happened by now
    assert leader.proc.alive(), leader.proc.tail()
    assert (leader.role(), standby.role()) == ("leader", "standby")
    assert "was paused" in leader.proc.tail()
