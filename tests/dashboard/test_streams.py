"""The dashboard's live streams against a real head process (SQLite: streams read no
store): each is counted out when its browser leaves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from phalanx.head.dashboard import live
from tests.head.conftest import HeadProc, start_head, stop_head


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadProc]:
    h = start_head(Path(tmp_path_factory.mktemp("streams")) / "head", None)
    try:
        yield h
    finally:
        stop_head(h.proc)


def test_live_streams_are_released_when_browsers_leave(head: HeadProc) -> None:
    """More streams than the head admits at once, one after another: each is counted out
    when its browser goes, so the next is still served (a leak would end in 503s)."""
    with httpx.Client(base_url=head.url, timeout=30) as admin:
        assert admin.post("/ui/login", data={"token": head.admin_token}).status_code == 303
        for _ in range(live.MAX_STREAMS + 20):
            with admin.stream("GET", "/ui/live/teams") as s:
                assert s.status_code == 200
                assert s.headers["content-type"].startswith("text/event-stream")
                assert next(s.iter_lines()) == f"retry: {live.RETRY_MS}"
