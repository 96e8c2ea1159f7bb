"""Usage accounting and idle-GPU policy: a daily rollup per user, team and QOS (and per
each of them alone), the
allocations it has counted so far, its cursor over the job event log, and each team's
idle-GPU policy.

Revision ID: 0010
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009_telemetry"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_daily",
        sa.Column("day", sa.String(10), primary_key=True),
        sa.Column("user", sa.String(128), primary_key=True),
        sa.Column("team", sa.String(128), primary_key=True),
        sa.Column("qos", sa.String(128), primary_key=True),
        sa.Column("alloc_gpu_s", sa.Float, nullable=False),
        sa.Column("util_gpu_s", sa.Float, nullable=False),
        sa.Column("idle_gpu_s", sa.Float, nullable=False),
        sa.Column("jobs", sa.Integer, nullable=False),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("preemptions", sa.Integer, nullable=False),
    )
    op.create_index("ix_usage_daily_team", "usage_daily", ["team", "day"])
    op.create_index("ix_usage_daily_user", "usage_daily", ["user", "day"])
    op.create_table(
        "usage_groups",
        sa.Column("dim", sa.String(8), primary_key=True),
        sa.Column("day", sa.String(10), primary_key=True),
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("alloc_gpu_s", sa.Float, nullable=False),
        sa.Column("util_gpu_s", sa.Float, nullable=False),
        sa.Column("idle_gpu_s", sa.Float, nullable=False),
        sa.Column("jobs", sa.Integer, nullable=False),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("preemptions", sa.Integer, nullable=False),
    )
    op.create_table(
        "usage_open",
        sa.Column("job_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("user", sa.String(128), nullable=False),
        sa.Column("team", sa.String(128), nullable=False),
        sa.Column("qos", sa.String(128), nullable=False),
    )
    op.create_table(
        "usage_cursor",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("last_event_id", sa.Integer, nullable=False),
        sa.Column("accounted_to", sa.Float, nullable=False),
    )
    op.create_table(
        "idle_policies",
        sa.Column("team", sa.String(128), primary_key=True),
        sa.Column("action", sa.String(8), nullable=False),
        sa.Column("window_s", sa.Float, nullable=False),
        sa.Column("grace_s", sa.Float, nullable=False),
        sa.Column("threshold_pct", sa.Float, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("idle_policies")
    op.drop_table("usage_cursor")
    op.drop_table("usage_open")
    op.drop_table("usage_groups")
    op.drop_index("ix_usage_daily_user", table_name="usage_daily")
    op.drop_index("ix_usage_daily_team", table_name="usage_daily")
    op.drop_table("usage_daily")
