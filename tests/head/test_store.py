"""The head's multi-row inserts (store.insert_rows) on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from phalanx.head import db, store
from phalanx.head.migrate import upgrade
from phalanx.testing.postgres import PostgresServer


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        url = pg.new_database(f"store_{request.node.name.split('[')[0][-40:]}")
    else:
        url = db.default_url(tmp_path)
    engine = db.make_engine(url)
    upgrade(engine)
    yield engine
    engine.dispose()


def test_rows_past_one_statement_are_all_stored_in_order_with_their_values(
    engine: Engine,
) -> None:
    count = 2 * store.ROWS_PER_INSERT + 3  # three statements, the last one short
    rows = [
        {
            "time": float(i),
            "kind": "submitted",
            # Quotes and the drivers' own placeholder spellings are values, not SQL.
            "message": f'job {i}: it\'s "quoted", %s ? %(x)s',
            "job_id": i if i % 2 else None,
            "node": None if i % 3 else f"node-{i}",
        }
        for i in range(count)
    ]
    with engine.begin() as conn:
        store.insert_events(conn, rows)
        store.insert_events(conn, [])  # nothing to insert is no statement
    with engine.connect() as conn:
        got = conn.execute(
            select(
                db.events.c.time,
                db.events.c.kind,
                db.events.c.message,
                db.events.c.job_id,
                db.events.c.node,
            ).order_by(db.events.c.id)
        ).all()
    assert [r._asdict() for r in got] == rows


def test_a_failing_multi_row_insert_stores_none_of_its_rows(engine: Engine) -> None:
    row = {"time": 1.0, "kind": "k", "message": "m", "job_id": None, "node": None}
    with pytest.raises(Exception, match=r"(?i)null|not.null"), engine.begin() as conn:
        store.insert_events(conn, [row, {**row, "kind": None}])
    with engine.connect() as conn:
        assert conn.execute(select(db.events.c.id)).all() == []
