"""Tracker credentials: the W&B key and MLflow token given with a job's integrations, kept apart
from the job until it ends. And the step of a webhook delivery: a job sends fine_tune.evaluated once
per evaluation, so (webhook, job, type, step) is what is unique.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tracker_credentials",
        sa.Column("job_id", sa.String(length=16), nullable=False),
        sa.Column("secrets", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["fine_tunes.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
    )
    # Batch mode: SQLite changes a table's constraints by copying it.
    with op.batch_alter_table("webhook_deliveries") as table:
        table.add_column(sa.Column("step", sa.Integer(), server_default="-1", nullable=False))
        table.drop_constraint("uq_webhook_deliveries_webhook_job_type", type_="unique")
        table.create_unique_constraint(
            "uq_webhook_deliveries_webhook_job_type_step", ["webhook_id", "job_id", "type", "step"]
        )


def downgrade() -> None:
    with op.batch_alter_table("webhook_deliveries") as table:
        table.drop_constraint("uq_webhook_deliveries_webhook_job_type_step", type_="unique")
        table.create_unique_constraint("uq_webhook_deliveries_webhook_job_type", ["webhook_id", "job_id", "type"])
        table.drop_column("step")
    op.drop_table("tracker_credentials")
