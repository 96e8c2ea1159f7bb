"""Fault tolerance: nodes a job avoids, signal notices, preemption deadlines, and a client
token that makes submits idempotent (a retried submit after a lost answer is not a second
job).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("avoid_json", sa.Text, nullable=True))
        batch.add_column(sa.Column("notices_json", sa.Text, nullable=True))
        batch.add_column(sa.Column("notice_deadline", sa.Float, nullable=True))
        batch.add_column(sa.Column("client_token", sa.String(128), nullable=True))
    op.create_index("ix_jobs_client_token", "jobs", ["user", "client_token"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_jobs_client_token", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        for column in ("client_token", "notice_deadline", "notices_json", "avoid_json"):
            batch.drop_column(column)
