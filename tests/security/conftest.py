"""A real head (SQLite and PostgreSQL) with small per-user limits, for the identity tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from phalanx.testing.postgres import PostgresServer
from tests.head.conftest import HeadProc, start_head, stop_head

# Small enough for a test to reach: 5 live jobs per user, job specs up to 8 KiB.
SETTINGS = "max_queued_per_user=5, max_spec_bytes=8192"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def head(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HeadProc]:
    tmp_path = tmp_path_factory.mktemp("head")
    db_url = None
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        db_url = pg.new_database(f"security_{request.module.__name__.rsplit('.', 1)[-1]}")
    h = start_head(tmp_path / "head", db_url, SETTINGS)
    try:
        yield h
    finally:
        stop_head(h.proc)
