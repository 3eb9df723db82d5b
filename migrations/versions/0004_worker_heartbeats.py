"""Workers' heartbeats, for /metrics' count of live workers; each session's calls, optimizer steps
and saved states, for the console.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SESSION_COUNTS = ("calls", "steps", "saved_states")


def upgrade() -> None:
    op.create_table(
        "worker_heartbeats",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("seen_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    for column in SESSION_COUNTS:
        op.add_column("training_sessions", sa.Column(column, sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("training_sessions") as batch:
        for column in SESSION_COUNTS:
            batch.drop_column(column)
    op.drop_table("worker_heartbeats")
