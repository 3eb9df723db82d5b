"""Workers report the memory of their GPUs, so the API can refuse a job whose memory plan fits none.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Bytes of the smallest GPU the worker gives a job; NULL on a host without GPUs.
    op.add_column("worker_heartbeats", sa.Column("gpu_memory", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("worker_heartbeats", "gpu_memory")
