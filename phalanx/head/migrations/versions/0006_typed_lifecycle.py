"""Typed lifecycle: each state move's from/to state and epoch on its event, and why a node is
drained kept apart from why it is down (it was encoded in the reason text).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

HEALTH_CHECK = "health check failed: "
WAS_DRAINED = "; was drained: "


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("from_state", sa.String(8), nullable=True))
        batch.add_column(sa.Column("to_state", sa.String(8), nullable=True))
        batch.add_column(sa.Column("epoch", sa.Integer, nullable=True))
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("drain_cause", sa.String(16), nullable=True))
        batch.add_column(sa.Column("drain_reason", sa.Text, nullable=True))
    nodes = sa.table(
        "nodes",
        sa.column("name", sa.String),
        sa.column("state", sa.String),
        sa.column("reason", sa.Text),
        sa.column("drain_cause", sa.String),
        sa.column("drain_reason", sa.Text),
    )
    conn = op.get_bind()
    for name, state, reason in conn.execute(sa.select(nodes.c.name, nodes.c.state, nodes.c.reason)):
        why = None
        if state == "drain":
            why = reason or "drained"
        elif state == "down" and reason and WAS_DRAINED in reason:
            why = reason.partition(WAS_DRAINED)[2] or "drained"
        if why is None:
            continue
        cause = "health_check" if why.startswith(HEALTH_CHECK) else "admin"
        conn.execute(
            nodes.update().where(nodes.c.name == name).values(drain_cause=cause, drain_reason=why)
        )


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("drain_reason")
        batch.drop_column("drain_cause")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("epoch")
        batch.drop_column("to_state")
        batch.drop_column("from_state")
