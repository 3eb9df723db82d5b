"""The seats of a job's gang: the worker hosts a job of more GPUs than one host has runs on.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fine_tune_hosts",
        sa.Column("job_id", sa.String(length=16), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("seat", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=False),
        sa.Column("processes", sa.Integer(), nullable=False),
        sa.Column("endpoint", sa.String(length=255), nullable=False),
        sa.Column("joined_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["fine_tunes.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "round", "seat"),
    )


def downgrade() -> None:
    op.drop_table("fine_tune_hosts")
