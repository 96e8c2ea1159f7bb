"""Bring a database's schema up to date with the Alembic migrations shipped in the package."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine


def upgrade(engine: Engine) -> None:
    """Apply every migration the database does not have yet (idempotent)."""
    config = Config()
    config.set_main_option("script_location", "phalanx.head:migrations")
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
