"""The store's schema: Alembic migrations create exactly the tables the code queries."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from phalanx.head import db
from phalanx.head.migrate import upgrade
from phalanx.testing.postgres import PostgresServer


def _columns(engine: sa.Engine) -> dict[str, set[str]]:
    insp = sa.inspect(engine)
    return {
        t: {c["name"] for c in insp.get_columns(t)}
        for t in insp.get_table_names()
        if t != "alembic_version"
    }


def _expected() -> dict[str, set[str]]:
    return {t.name: {c.name for c in t.columns} for t in db.metadata.sorted_tables}


def test_migrations_match_the_tables_on_sqlite(tmp_path: Path) -> None:
    engine = db.make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    upgrade(engine)
    upgrade(engine)  # idempotent
    assert _columns(engine) == _expected()
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_migrations_match_the_tables_on_postgresql(postgres: PostgresServer) -> None:
    postgres.reset()
    engine = db.make_engine(postgres.url)
    upgrade(engine)
    assert _columns(engine) == _expected()
    engine.dispose()
