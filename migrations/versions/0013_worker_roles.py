"""Workers say what they take: recipe jobs (and sessions), deployments, or both, so that a worker
started for deployments only beats too, and the API refuses a deployment no serving worker could
hold as it refuses a job no job worker could.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Every worker that beat before took jobs, and none of them said it served deployments.
    op.add_column(
        "worker_heartbeats", sa.Column("takes_jobs", sa.Boolean(), nullable=False, server_default=sa.true())
    )
    op.add_column(
        "worker_heartbeats",
        sa.Column("serves_deployments", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("worker_heartbeats", "serves_deployments")
    op.drop_column("worker_heartbeats", "takes_jobs")
