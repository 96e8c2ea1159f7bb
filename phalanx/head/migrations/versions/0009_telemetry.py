"""Telemetry: packed sample chunks per node (raw, minute and hour levels), which job ran
on which node, training progress history, and each ended job's efficiency summary.

Revision ID: 0009_telemetry
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_telemetry"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "telemetry_chunks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("level", sa.Integer, nullable=False),
        sa.Column("start", sa.Float, nullable=False),
        sa.Column("end", sa.Float, nullable=False),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_telemetry_chunks_node", "telemetry_chunks", ["level", "node", "start"])
    op.create_index("ix_telemetry_chunks_end", "telemetry_chunks", ["level", "end"])
    op.create_table(
        "job_nodes",
        sa.Column("job_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("epoch", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("node", sa.String(128), primary_key=True),
        sa.Column("first", sa.Float, nullable=False),
        sa.Column("last", sa.Float, nullable=False),
    )
    op.create_index("ix_job_nodes_last", "job_nodes", ["last"])
    op.create_table(
        "job_progress",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("loss", sa.Float, nullable=True),
        sa.Column("tokens_per_s", sa.Float, nullable=True),
        sa.Column("mfu", sa.Float, nullable=True),
    )
    op.create_index("ix_job_progress_job", "job_progress", ["job_id", "time"])
    op.create_index("ix_job_progress_time", "job_progress", ["time"])
    op.create_table(
        "job_stats",
        sa.Column("job_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("summary_json", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_stats")
    op.drop_index("ix_job_progress_time", table_name="job_progress")
    op.drop_index("ix_job_progress_job", table_name="job_progress")
    op.drop_table("job_progress")
    op.drop_index("ix_job_nodes_last", table_name="job_nodes")
    op.drop_table("job_nodes")
    op.drop_index("ix_telemetry_chunks_end", table_name="telemetry_chunks")
    op.drop_index("ix_telemetry_chunks_node", table_name="telemetry_chunks")
    op.drop_table("telemetry_chunks")
