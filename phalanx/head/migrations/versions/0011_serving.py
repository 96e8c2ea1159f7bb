"""Serving deployments: each deployment's spec, owner, generation and engine key, and its
replica jobs (pool, generation, engine URL, readiness, retiring).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "serve_deployments",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("team", sa.String(128), nullable=False),
        sa.Column("spec_json", sa.Text, nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
        sa.Column("engine_key", sa.String(256), nullable=False),
        sa.Column("status_json", sa.Text, nullable=True),
    )
    op.create_table(
        "serve_replicas",
        sa.Column("job_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("deployment", sa.String(63), nullable=False),
        sa.Column("pool", sa.String(16), nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("slots", sa.Integer, nullable=False),
        sa.Column("url", sa.String(512), nullable=True),
        sa.Column("ready", sa.Boolean, nullable=False),
        sa.Column("retiring", sa.Boolean, nullable=False),
    )
    op.create_index("ix_serve_replicas_deployment", "serve_replicas", ["deployment"])


def downgrade() -> None:
    op.drop_index("ix_serve_replicas_deployment", table_name="serve_replicas")
    op.drop_table("serve_replicas")
    op.drop_table("serve_deployments")
