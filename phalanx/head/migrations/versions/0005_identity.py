"""Identity: token expiry, the token that minted a token, join-token bindings (single use,
node names, address ranges), and QOS allowances per user and per team.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("expires", sa.Float, nullable=True))
        batch.add_column(sa.Column("parent_id", sa.Integer, nullable=True))
        batch.add_column(sa.Column("single_use", sa.Boolean, nullable=True))
        batch.add_column(sa.Column("bind_nodes", sa.String(1000), nullable=True))
        batch.add_column(sa.Column("bind_addresses", sa.String(1000), nullable=True))
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("qos", sa.String(500), nullable=True))
    with op.batch_alter_table("teams") as batch:
        batch.add_column(sa.Column("qos", sa.String(500), nullable=True))
    # Join tokens used to live forever: those of an existing install now expire in a day
    # (the head writes a fresh join.token at start once its own has expired).
    tokens = sa.table("tokens", sa.column("kind", sa.String), sa.column("expires", sa.Float))
    op.execute(
        tokens.update()
        .where(tokens.c.kind == "join", tokens.c.expires.is_(None))
        .values(expires=time.time() + 86400)
    )


def downgrade() -> None:
    with op.batch_alter_table("teams") as batch:
        batch.drop_column("qos")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("qos")
    with op.batch_alter_table("tokens") as batch:
        for column in ("bind_addresses", "bind_nodes", "single_use", "parent_id", "expires"):
            batch.drop_column(column)
