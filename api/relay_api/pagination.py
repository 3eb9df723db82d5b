"""Cursor pagination over a user's rows, newest first, as the peers' list endpoints do."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, and_, or_, select
from sqlalchemy.orm import Session

from relay_api.errors import APIProblem


def newest_first(
    db: Session, table: Table, user_id: int, after: str | None, limit: int, noun: str
) -> tuple[list[dict[str, Any]], bool]:
    """The user's rows of `table`, newest first, starting after the row whose id is `after`; and
    whether more follow. Ties in created_at are broken by id, so a page never repeats or skips."""
    query = select(table).where(table.c.user_id == user_id)
    if after is not None:
        cursor = db.execute(
            select(table.c.created_at).where(table.c.id == after, table.c.user_id == user_id)
        ).scalar()
        if cursor is None:
            message = f"bad after: {after} (must be the id of one of your {noun})"
            raise APIProblem(400, message, param="after", code="invalid_value")
        query = query.where(
            or_(table.c.created_at < cursor, and_(table.c.created_at == cursor, table.c.id < after))
        )
    rows = (
        db.execute(query.order_by(table.c.created_at.desc(), table.c.id.desc()).limit(limit + 1))
        .mappings()
        .all()
    )
    # End the read here, in the route's thread, so its connection goes back to the pool before
    # the response is sent.
    db.rollback()
    return [dict(r) for r in rows[:limit]], len(rows) > limit
