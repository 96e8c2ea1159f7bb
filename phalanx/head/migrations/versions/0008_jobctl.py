"""Job controls: who holds a pending job (`phalanx hold`: user or admin), and an index to
find an array's tasks (`123_4`).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("hold", sa.String(8), nullable=True))
    op.create_index("ix_jobs_array", "jobs", ["array_job_id", "array_task_id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_array", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("hold")
