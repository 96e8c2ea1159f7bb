"""Confinement: how each node's agent confines jobs (cgroups), and room for the OOM job state
(three letters, as Slurm's OUT_OF_MEMORY short form).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("confinement", sa.String(200), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column(
            "state", existing_type=sa.String(2), type_=sa.String(3), existing_nullable=False
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column(
            "state", existing_type=sa.String(3), type_=sa.String(2), existing_nullable=False
        )
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("confinement")
