"""Cursor pagination over a user's rows, newest first, as the peers' list endpoints do."""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

from sqlalchemy import Column, Select, Table, and_, bindparam, or_, select

from relay_api.db import Db
from relay_api.errors import APIProblem


class _PageStatements(NamedTuple):
    first: Select[Any]  # the newest rows
    cursor: Select[Any]  # the created_at of the row `after`
    after: Select[Any]  # the rows after the row `after`


@cache
def _statements(table: Table, columns: tuple[Column[Any], ...] | None) -> _PageStatements:
    """A table's page statements, built once, values bound at execution (SQLAlchemy memoizes a
    statement's cache key, so a request skips building and hashing the expression)."""
    shown = columns or (table,)
    mine = table.c.user_id == bindparam("user_id")
    newest = (table.c.created_at.desc(), table.c.id.desc())
    older = or_(
        table.c.created_at < bindparam("cursor"),
        and_(table.c.created_at == bindparam("cursor"), table.c.id < bindparam("after")),
    )
    return _PageStatements(
        first=select(*shown).where(mine).order_by(*newest).limit(bindparam("limit")),
        cursor=select(table.c.created_at).where(table.c.id == bindparam("after"), mine),
        after=select(*shown).where(mine, older).order_by(*newest).limit(bindparam("limit")),
    )


def newest_first(
    db: Db,
    table: Table,
    user_id: int,
    after: str | None,
    limit: int,
    noun: str,
    columns: tuple[Column[Any], ...] | None = None,
) -> tuple[list[dict[str, Any]], bool]:
    """The user's rows of `table` (only `columns`, if given), newest first, starting after the row
    whose id is `after`; and whether more follow. Ties in created_at are broken by id, so a page
    never repeats or skips."""
    statements = _statements(table, columns)
    values: dict[str, Any] = {"user_id": user_id, "limit": limit + 1}
    query = statements.first
    if after is not None:
        cursor = db.execute(statements.cursor, {"user_id": user_id, "after": after}).scalar()
        if cursor is None:  # as for an id in a path: not yours, or not there, is a 404
            message = f"bad after: {after} (must be the id of one of your {noun}; it names none)"
            raise APIProblem(404, message, param="after", code="not_found")
        query = statements.after
        values.update(cursor=cursor, after=after)
    result = db.execute(query, values)
    keys, rows = tuple(result.keys()), result.all()
    # End the read here, in the route's thread, so its connection goes back to the pool before
    # the response is sent.
    db.rollback()
    # zip: a fraction of the CPU of a RowMapping per row, which builds a key view each
    return [dict(zip(keys, row, strict=True)) for row in rows[:limit]], len(rows) > limit
