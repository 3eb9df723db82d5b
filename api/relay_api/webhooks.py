"""What the API does with webhooks' rows: create (the secret made here and shown once), find,
list, delete, and list a webhook's deliveries. The deliveries themselves are written and sent by
the workers (relay_worker.webhook_dispatch); the API never calls a receiver, so a receiver that is
down or slow never holds a request.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from sqlalchemy import and_, delete, func, insert, or_, select
from sqlalchemy.orm import Session

from relay.webhook_signature import new_secret
from relay.webhooks import EVENT_TYPES, FINE_TUNE_EVALUATED, WebhookConfig
from relay_api.db import Db, iso, utcnow
from relay_api.errors import APIProblem
from relay_api.models import users
from relay_api.models import webhook_deliveries as deliveries_table
from relay_api.models import webhooks as table
from relay_api.pagination import newest_first
from relay_api.schemas import WebhookDeliveryOut, WebhookOut
from relay_api.settings import Settings

WEBHOOK_ID_PREFIX = "wh_"
# Every column but the secret: lists and retrieves never read it.
SHOWN = tuple(column for column in table.c if column.name != "secret")


def new_webhook_id() -> str:
    return WEBHOOK_ID_PREFIX + secrets.token_hex(12)


def webhook_object(row: Mapping[str, Any], secret: str | None = None) -> dict[str, Any]:
    """A webhook as the API shows it; `secret` only in the create's answer."""
    shown = {
        "id": row["id"],
        "object": "webhook",
        "url": row["url"],
        "events": row["events"],
        "description": row["description"],
        "created_at": iso(row["created_at"]),
        "secret": secret,
    }
    return WebhookOut.model_validate(shown).model_dump(mode="json")


def delivery_object(row: Mapping[str, Any]) -> dict[str, Any]:
    shown = {
        "id": row["id"],
        "object": "webhook.delivery",
        "webhook_id": row["webhook_id"],
        "type": row["type"],
        "job_id": row["job_id"],
        "step": row["step"] if row["type"] == FINE_TUNE_EVALUATED else None,
        "status": row["status"],
        "attempts": row["attempts"],
        "last_response_code": row["last_response_code"],
        "last_error": row["last_error"],
        "next_attempt_at": iso(row["next_attempt_at"]),
        "created_at": iso(row["created_at"]),
        "delivered_at": iso(row["delivered_at"]),
    }
    return WebhookDeliveryOut.model_validate(shown).model_dump(mode="json")


def not_found(webhook_id: str) -> APIProblem:
    return APIProblem(404, f"no webhook {webhook_id}", param="id", code="not_found")


def create(db: Session, user_id: int, config: WebhookConfig, settings: Settings) -> dict[str, Any]:
    """Insert the webhook and answer it with its secret; refuse one over the user's limit."""
    # The user's row, locked: two creates at once count one after the other (SQLite serializes
    # writers already, and ignores the lock).
    db.execute(select(users.c.id).where(users.c.id == user_id).with_for_update())
    held = db.execute(select(func.count()).select_from(table).where(table.c.user_id == user_id)).scalar_one()
    if held >= settings.webhooks_per_user:
        raise APIProblem(
            400,
            f"you have {held} webhooks, the most a user may have ({settings.webhooks_per_user}); "
            "delete one first",
            code="webhook_limit_reached",
        )
    secret = new_secret()
    row: dict[str, Any] = {
        "id": new_webhook_id(),
        "user_id": user_id,
        "url": config.url,
        "events": list(config.events or EVENT_TYPES),
        "description": config.description,
        "secret": secret,
        "created_at": utcnow(),
    }
    db.execute(insert(table).values(**row))
    db.commit()
    return webhook_object(row, secret=secret)


def get(db: Db, user_id: int, webhook_id: str) -> dict[str, Any]:
    """The user's webhook, without its secret; 404 for another user's, as for one that is not there."""
    row = (
        db.execute(select(*SHOWN).where(table.c.id == webhook_id, table.c.user_id == user_id))
        .mappings()
        .first()
    )
    if row is None:
        raise not_found(webhook_id)
    return dict(row)


def list_page(db: Db, user_id: int, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
    return newest_first(db, table, user_id, after, limit, "webhooks", SHOWN)


def remove(db: Session, user_id: int, webhook_id: str) -> dict[str, Any]:
    """Delete the webhook and, by the foreign key's cascade, its deliveries: nothing more is sent
    to it (an attempt under way when it is deleted finds no row to record its answer in)."""
    row = get(db, user_id, webhook_id)
    db.execute(delete(table).where(table.c.id == webhook_id, table.c.user_id == user_id))
    db.commit()
    return row


def deliveries_page(
    db: Db, user_id: int, webhook_id: str, after: str | None, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """A page of the webhook's deliveries, newest first, after the delivery `after`."""
    get(db, user_id, webhook_id)  # 404 unless the caller's
    mine = deliveries_table.c.webhook_id == webhook_id
    query = select(deliveries_table).where(mine)
    if after is not None:
        cursor = db.execute(
            select(deliveries_table.c.created_at).where(mine, deliveries_table.c.id == after)
        ).scalar()
        if cursor is None:
            message = (
                f"bad after: {after} (must be the id of one of this webhook's deliveries; it names none)"
            )
            raise APIProblem(404, message, param="after", code="not_found")
        query = query.where(
            or_(
                deliveries_table.c.created_at < cursor,
                and_(deliveries_table.c.created_at == cursor, deliveries_table.c.id < after),
            )
        )
    newest = (deliveries_table.c.created_at.desc(), deliveries_table.c.id.desc())
    rows = db.execute(query.order_by(*newest).limit(limit + 1)).mappings().all()
    return [delivery_object(dict(r)) for r in rows[:limit]], len(rows) > limit
