"""Where a job's starting weights came from (a recipe's from_checkpoint), from its weights event.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL for jobs from a base model, and for jobs created before from_checkpoint existed.
    op.add_column("fine_tunes", sa.Column("weights", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("fine_tunes", "weights")
