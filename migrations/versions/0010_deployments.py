"""Deployments: models served to robots by workers that hold them, and their events.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("user_id", BigId, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("model_source", sa.Text(), nullable=False),
        sa.Column("info", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("failed_starts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("lease_until", sa.DateTime(), nullable=True),
        sa.Column("internal_url", sa.Text(), nullable=True),
        sa.Column("internal_token", sa.String(length=64), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=True),
        sa.Column("stop_requested_at", sa.DateTime(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("ready_at", sa.DateTime(), nullable=True),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("user_id", "idempotency_key", name="uq_deployments_user_idempotency_key"),
    )
    op.create_index("ix_deployments_status", "deployments", ["status"])
    op.create_index("ix_deployments_user_created", "deployments", ["user_id", "created_at", "id"])
    op.create_table(
        "deployment_events",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("deployment_id", sa.String(length=16), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["deployment_id"], ["deployments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_deployment_events_deployment_id_id", "deployment_events", ["deployment_id", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_deployment_events_deployment_id_id", table_name="deployment_events")
    op.drop_table("deployment_events")
    op.drop_index("ix_deployments_user_created", table_name="deployments")
    op.drop_index("ix_deployments_status", table_name="deployments")
    op.drop_table("deployments")
