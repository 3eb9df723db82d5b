"""What a job's engine read: the dataset's repo or path, revision, commit sha, format and size.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The latest dataset event's fields; NULL until the dataset is open, and for older jobs.
    op.add_column("fine_tunes", sa.Column("dataset", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("fine_tunes", "dataset")
