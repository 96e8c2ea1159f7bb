"""The head's writes: multi-row inserts (store.insert_rows) on SQLite and PostgreSQL, and
the control thread's connection between batches."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Column, Engine, MetaData, String, Table, select

from phalanx.head import db, store
from phalanx.head.control import ControlThread
from phalanx.head.migrate import upgrade
from phalanx.head.mirror import Settings, Tx
from phalanx.testing.postgres import PostgresServer


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        url = pg.new_database(f"store_{request.node.name.split('[')[0][-40:]}")
    else:
        url = db.default_url(tmp_path)
    with _migrated(url) as engine:
        yield engine


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    with _migrated(db.default_url(tmp_path)) as engine:
        yield engine


@contextmanager
def _migrated(url: str) -> Iterator[Engine]:
    """An engine on `url` with the head's schema."""
    engine = db.make_engine(url)
    try:
        upgrade(engine)
        yield engine
    finally:
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


def test_sqlite_statements_stay_within_the_builds_parameter_limit(sqlite_engine: Engine) -> None:
    """Older SQLite builds allow 999 parameters per statement, not 32,766: the rows per
    statement follow the connection's own limit (here 12: two 5-column rows)."""
    engine = sqlite_engine
    rows = [
        {"time": float(i), "kind": "k", "message": str(i), "job_id": i, "node": None}
        for i in range(7)
    ]
    with engine.begin() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        driver.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 12)
        store.insert_events(conn, rows)
    with engine.connect() as conn:
        stored = conn.execute(select(db.events.c.job_id).order_by(db.events.c.id)).scalars()
        assert list(stored) == list(range(7))


def test_the_control_thread_gives_its_connection_back_once_the_queue_runs_dry(
    sqlite_engine: Engine,
) -> None:
    """A connection kept for a waiting batch goes back to the pool (where it is pinged
    before reuse) even when that batch wrote nothing."""
    engine = sqlite_engine
    control = ControlThread(engine, Settings())
    control.start()
    try:
        inside = threading.Event()
        go_on = threading.Event()

        def write(tx: Tx) -> None:
            tx.conn.exec_driver_sql("SELECT 1")
            inside.set()
            go_on.wait(10)

        first = control.submit_op(write)
        assert inside.wait(10)
        second = control.submit_op(lambda tx: None)  # queued while the first batch runs
        go_on.set()
        first.result(10)
        second.result(10)
        deadline = time.monotonic() + 10
        while engine.pool.checkedout() and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.01)
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        control.stop()


def test_a_one_column_table_gets_its_values_whole(engine: Engine) -> None:
    """One column: each row's value goes in as itself (a string is not split into
    characters), across several statements."""
    table = Table("one_column", MetaData(), Column("name", String(40)))
    table.create(engine)
    names = [f"node-{i}" for i in range(store.ROWS_PER_INSERT + 2)]
    with engine.begin() as conn:
        store.insert_rows(conn, table, [{"name": n} for n in names])
    with engine.connect() as conn:
        assert sorted(r.name for r in conn.execute(select(table.c.name))) == sorted(names)
