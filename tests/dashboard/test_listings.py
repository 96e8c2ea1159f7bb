"""The ended-jobs listing over a long history, in process against a real store (SQLite
and PostgreSQL): a selective filter searches a bounded id range per page and the pages,
followed, still list every match exactly once, newest first."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.api.models import JobSpec
from phalanx.core import JobState
from phalanx.head import db, store
from phalanx.head.auth import Principal
from phalanx.head.dashboard import listings
from phalanx.head.mirror import Settings
from phalanx.head.records import JobRecord
from phalanx.head.server import build
from phalanx.head.service import Head
from phalanx.testing.postgres import PostgresServer

ALICE = Principal(kind="api", token_id=1, user="alice", teams=frozenset({"red"}))
ADMIN = Principal(kind="api", token_id=2, user="root", admin=True)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def head(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Head]:
    """A head (not started) whose store holds 300 ended jobs: every 37th is alice's (team
    red, 2 nodes × 4 GPUs), the rest bob's (team blue); and 200 events (after the head's
    own), every 13th a node's, the rest jobs'."""
    url = None
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        url = pg.new_database("dash_listings")
    state = Path(tmp_path_factory.mktemp("listings")) / "head"
    state.mkdir(mode=0o700)
    h = build(state, url, Settings())
    now = time.time()
    rows = []
    for i in range(1, 301):
        mine = i % 37 == 0
        spec = JobSpec(command=["true"], workdir="/w", nodes=2 if mine else 1, gpus_per_node=4)
        rows.append(
            JobRecord(
                id=i, name=f"j{i}", user="alice" if mine else "bob",
                team="red" if mine else "blue", account=None, qos="normal", priority=100,
                state=JobState.COMPLETED, spec=spec, submit_time=now, end_time=now,
            ).row()
        )  # fmt: skip
    events = [
        {
            "time": now, "job_id": None if i % 13 == 0 else i, "node": f"n{i % 2}",
            "kind": "drain" if i % 13 == 0 else "running", "message": f"event {i}",
            "from_state": None, "to_state": None, "epoch": None,
        }
        for i in range(1, 201)
    ]  # fmt: skip
    with h.control.engine.begin() as conn:
        store.insert_rows(conn, db.jobs, rows)
        store.insert_events(conn, events)
    yield h
    h.control.engine.dispose()


def _walk(head: Head, who: Principal, per: int, window: int) -> tuple[list[int], int]:
    """Follow the pages from the newest: the job ids listed, and how many pages it took."""
    seen: list[int] = []
    before, pages = None, 0
    while True:
        page = listings.job_page(head, who, "ended", None, None, None, None, 1, before, per, window)
        pages += 1
        assert len(page.rows) <= per
        seen += [r.id for r in page.rows]
        if page.next_before is None:
            return seen, pages
        assert page.searched_to is None or len(page.rows) < per
        before = page.next_before


def test_a_selective_viewer_pages_through_bounded_windows_and_misses_nothing(head: Head) -> None:
    mine = [i for i in range(300, 0, -1) if i % 37 == 0]
    seen, pages = _walk(head, ALICE, per=3, window=50)
    assert seen == mine
    assert pages >= 300 // 50  # a window of 50 ids per page at most
    first = listings.job_page(head, ALICE, "ended", None, None, None, None, 1, None, 3, 50)
    assert first.searched_to == 251 and [r.id for r in first.rows] == [296, 259]
    assert first.rows[0].gpus == "2×4"  # the shape, from the stored spec
    # A window large enough for the whole history: ordinary keyset pages.
    assert _walk(head, ALICE, per=3, window=10_000) == (mine, 3)


def test_an_admin_sees_every_ended_job_once(head: Head) -> None:
    seen, _ = _walk(head, ADMIN, per=40, window=100)
    assert seen == list(range(300, 0, -1))
    bob = listings.job_page(head, ADMIN, "ended", None, "bob", None, None, 1, None, 5, 100)
    assert [r.user for r in bob.rows] == ["bob"] * 5 and bob.rows[0].gpus == "4"


def test_node_events_page_through_bounded_windows_among_job_events(head: Head) -> None:
    def walk(node: str | None, window: int) -> list[str]:
        seen: list[str] = []
        before = None
        while True:
            page = listings.event_page(head, {"drain"}, node, before, 4, window)
            assert len(page.rows) <= 4
            seen += [r.message for r in page.rows]
            if page.next_before is None:
                return seen
            before = page.next_before

    drains = [f"event {i}" for i in range(200, 0, -1) if i % 13 == 0]
    assert walk(None, 20) == drains
    assert walk(None, 100_000) == drains
    assert walk("n1", 20) == [m for m in drains if int(m.split()[1]) % 2 == 1]
    assert "drain" in listings.event_kinds(head)
