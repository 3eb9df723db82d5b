"""Workers report the video codecs they can decode, so the API can refuse a dataset whose camera
no live worker can read.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A JSON list of codec names (h264, hevc, av1...); NULL from a worker that does not say.
    op.add_column("worker_heartbeats", sa.Column("video_decoders", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("worker_heartbeats", "video_decoders")
