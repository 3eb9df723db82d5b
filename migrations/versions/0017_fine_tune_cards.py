"""A job's results card, kept as its events are written: what the card folds from the job's metrics
and resumed events (fine_tune_cards, one row a job), and an index on (job, kind, step) for the few
events of other kinds and the metrics window at a checkpoint's step. The card then reads a few rows
instead of every metrics event of a long job.

No backfill: a job whose events predate this revision gets its row when its next metrics or resumed
event is written (relay_api.event_rows folds its earlier events then); until then, and for a job
that ended before it, the card reads every event as it did before (relay_api.job_summary).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fine_tune_cards",
        sa.Column("job_id", sa.String(length=16), nullable=False),
        sa.Column("state", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["fine_tunes.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_index("ix_fine_tune_events_job_kind_step", "fine_tune_events", ["job_id", "kind", "step"])


def downgrade() -> None:
    op.drop_index("ix_fine_tune_events_job_kind_step", table_name="fine_tune_events")
    op.drop_table("fine_tune_cards")
