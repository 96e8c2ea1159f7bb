"""Initial schema: users, teams, memberships, tokens, nodes, jobs, events.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("admin", sa.Boolean, nullable=False),
        sa.Column("default_team", sa.String(128), nullable=True),
        sa.Column("created", sa.Float, nullable=False),
    )
    op.create_table(
        "teams",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("quota_gpus", sa.Integer, nullable=True),
        sa.Column("cohort", sa.String(128), nullable=True),
        sa.Column("borrowing_limit", sa.Integer, nullable=True),
        sa.Column("weight", sa.Float, nullable=True),
        sa.Column("created", sa.Float, nullable=False),
    )
    op.create_table(
        "memberships",
        sa.Column("user", sa.String(128), sa.ForeignKey("users.name"), primary_key=True),
        sa.Column("team", sa.String(128), sa.ForeignKey("teams.name"), primary_key=True),
        sa.Column("team_admin", sa.Boolean, nullable=False),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("hash", sa.String(64), nullable=False, unique=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("user", sa.String(128), nullable=True),
        sa.Column("node", sa.String(128), nullable=True),
        sa.Column("description", sa.String(200), nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("last_used", sa.Float, nullable=True),
        sa.Column("revoked", sa.Boolean, nullable=False),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("agent_url", sa.String(512), nullable=False),
        sa.Column("agent_secret", sa.String(256), nullable=False),
        sa.Column("cpus", sa.Integer, nullable=False),
        sa.Column("memory_mb", sa.Integer, nullable=False),
        sa.Column("gpus_json", sa.Text, nullable=False),
        sa.Column("labels_json", sa.Text, nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("registered", sa.Float, nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("user", sa.String(128), nullable=False),
        sa.Column("team", sa.String(128), nullable=False),
        sa.Column("account", sa.String(128), nullable=True),
        sa.Column("qos", sa.String(128), nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("state", sa.String(2), nullable=False),
        sa.Column("reason", sa.String(64), nullable=True),
        sa.Column("reason_message", sa.Text, nullable=True),
        sa.Column("spec_json", sa.Text, nullable=False),
        sa.Column("submit_time", sa.Float, nullable=False),
        sa.Column("start_time", sa.Float, nullable=True),
        sa.Column("end_time", sa.Float, nullable=True),
        sa.Column("exit_code", sa.String(32), nullable=True),
        sa.Column("restart_count", sa.Integer, nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("array_job_id", sa.Integer, nullable=True),
        sa.Column("array_task_id", sa.Integer, nullable=True),
        sa.Column("placement_json", sa.Text, nullable=True),
        sa.Column("master_port", sa.Integer, nullable=True),
        sa.Column("step_token", sa.String(128), nullable=True),
        sa.Column("stopping", sa.String(16), nullable=True),
        sa.Column("pending_exit", sa.String(32), nullable=True),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_index("ix_jobs_user", "jobs", ["user"])
    op.create_index("ix_jobs_end_time", "jobs", ["end_time"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("job_id", sa.Integer, nullable=True),
        sa.Column("node", sa.String(128), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
    )
    op.create_index("ix_events_job", "events", ["job_id"])
    op.create_index("ix_events_node", "events", ["node"])


def downgrade() -> None:
    for table in ("events", "jobs", "nodes", "tokens", "memberships", "teams", "users"):
        op.drop_table(table)
