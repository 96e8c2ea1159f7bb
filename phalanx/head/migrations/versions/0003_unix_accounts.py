"""Users map to Unix accounts on the nodes: an optional uid/gid set by an admin (None: the
account with the user's name; docs/security.md).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("unix_uid", sa.Integer, nullable=True))
        batch.add_column(sa.Column("unix_gid", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.drop_column("unix_gid")
        batch.drop_column("unix_uid")
