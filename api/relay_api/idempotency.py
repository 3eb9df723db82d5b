"""Creating a row once per Idempotency-Key, as Stripe's API does, for jobs and sessions alike.

The first request with a key creates the row; a repeat with the same body returns it; a repeat
with another body is a 409. Two concurrent requests with one key race on the table's unique
(user_id, idempotency_key), and the loser returns the winner's row.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

from pydantic import BaseModel
from sqlalchemy import Insert, Table, insert, select
from sqlalchemy.exc import IntegrityError

from relay_api.db import Db
from relay_api.errors import APIProblem
from relay_api.responses import rendered

# What a route answers for a new row (its JSON object), built by the caller's `shown`.
Answer = TypeVar("Answer")


def request_hash(config: BaseModel) -> str:
    canonical = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def insert_once(
    db: Db,
    table: Table,
    user_id: int,
    idempotency_key: str | None,
    digest: str,
    new_row: Callable[[], dict[str, Any]],
    noun: str,
    shown: Callable[[dict[str, Any]], Answer],
    along: Callable[[Db, dict[str, Any]], None] | None = None,
) -> tuple[dict[str, Any], bool, Answer | None]:
    """Insert `new_row()` and commit; returns (row, replayed, its answer). `new_row` draws a fresh
    id each call, so a clash of random ids is tried again. `shown(row)` is the answer the route
    will give, rendered before anything is written: an answer that cannot be rendered (TypeError)
    must not leave a row behind that every later list would fail on. It is returned for a new row
    (which it stays: the route need not build it again); None for a replay, whose stored row the
    route shows. `along(db, row)` writes what belongs with a new row, in its transaction (nothing
    of a replay)."""
    if idempotency_key is not None:
        existing = _by_key(db, table, user_id, idempotency_key, digest, noun)
        if existing is not None:
            return existing, True, None
    for _ in range(3):
        row = new_row()
        answer = shown(row)
        rendered(answer)
        try:
            # The row as parameters of a statement built once per table: building an INSERT with
            # the values inside costs more CPU than sending it.
            db.execute(_insert(table), row)
            if along is not None:
                along(db, row)
            db.commit()
            return row, False, answer
        except IntegrityError:
            db.rollback()
            if idempotency_key is not None:  # a concurrent request with the same key won
                existing = _by_key(db, table, user_id, idempotency_key, digest, noun)
                if existing is not None:
                    return existing, True, None
    raise RuntimeError(f"could not pick a free {noun} id")


@cache
def _insert(table: Table) -> Insert:
    return insert(table)


def _by_key(db: Db, table: Table, user_id: int, key: str, digest: str, noun: str) -> dict[str, Any] | None:
    row = (
        db.execute(select(table).where(table.c.user_id == user_id, table.c.idempotency_key == key))
        .mappings()
        .first()
    )
    if row is None:
        return None
    if row["request_hash"] != digest:
        raise APIProblem(
            409,
            f"Idempotency-Key {key!r} was used for {noun} {row['id']} with other settings; "
            f"use a new key for a new {noun}",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    return dict(row)
