"""A head killed (-9) and restarted while a client streams submits: every submit returns a
job, and the head holds exactly those jobs — none lost, none twice."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.api.models import JobSpec
from phalanx.client.api import PhalanxClient
from phalanx.testing.postgres import PostgresServer
from tests.head.heads import HeadServer, wait_for

SUBMITS = 60
CRASH_AFTER = (15, 40)  # kill -9 the head once this many submits have been answered


@pytest.fixture(params=["sqlite", "postgresql"])
def head(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HeadServer]:
    db_url = None
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        db_url = pg.new_database("head_crash")
    server = HeadServer(tmp_path / "head", db_url).start()
    try:
        server.wait_role("leader")
        yield server
    finally:
        server.stop()


def test_no_submit_is_lost_or_doubled_across_head_crashes(head: HeadServer, tmp_path: Path) -> None:
    answered: list[int] = []
    errors: list[BaseException] = []
    spec = JobSpec(command=["true"], workdir=str(tmp_path), name="stream")

    def stream() -> None:
        try:
            with PhalanxClient(head.url, head.admin_token, submit_retry_s=60) as api:
                for _ in range(SUBMITS):
                    answered.extend(api.submit(spec).job_ids)
        except BaseException as e:  # reported by the test's thread below
            errors.append(e)

    submitter = threading.Thread(target=stream)
    submitter.start()
    try:
        for count in CRASH_AFTER:

            def reached(n: int = count) -> bool:
                return len(answered) >= n or bool(errors)

            wait_for(f"{count} submits", reached, 60)
            head.restart()  # SIGKILL mid-stream, then a new head on the same state
    finally:
        submitter.join(timeout=120)
    assert not submitter.is_alive() and not errors, errors
    assert len(answered) == SUBMITS and len(set(answered)) == SUBMITS
    with head.client() as api:
        held = [j.id for j in api.jobs(active=True, ended=True, limit=1000).jobs]
    assert sorted(held) == sorted(answered)
