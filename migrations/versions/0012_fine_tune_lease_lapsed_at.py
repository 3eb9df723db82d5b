"""When a job's last lease lapsed, kept after the reconciler hands the job on (which clears the lease).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL for jobs handed on before this column existed: how long ago their lease lapsed is unknown.
    op.add_column("fine_tunes", sa.Column("lease_lapsed_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    op.drop_column("fine_tunes", "lease_lapsed_at")
