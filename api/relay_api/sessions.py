"""What the API does with training sessions' rows: create (idempotently), find, list, heartbeats,
close, and noticing a worker that is gone.

The row is the truth about a session. Its status only moves forward (starting -> ready ->
closed | error), through conditional updates, so the API, the worker and the reconciler cannot
undo each other.
"""

from __future__ import annotations

import datetime as dt
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from relay.training import status as st
from relay.training.config import SessionConfig, with_current_names
from relay_api.db import Db, iso, rows_changed, utcnow
from relay_api.errors import APIProblem
from relay_api.idempotency import insert_once, request_hash
from relay_api.models import training_sessions as table
from relay_api.pagination import newest_first
from relay_api.schemas import SessionOut
from relay_api.settings import Settings

SESSION_ID_PREFIX = "ses-"
WORKER_LOST = (
    "its worker stopped responding (killed or lost); the session has ended and what was not saved is "
    "lost: start a new session (and load_state what you saved)"
)


def new_session_id() -> str:
    return SESSION_ID_PREFIX + secrets.token_hex(6)


def session_object(row: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """A session as the API shows it (schemas.SessionOut, the one definition of its shape)."""
    shown = {
        "id": row["id"],
        "object": "training_session",
        "status": row["status"],
        **with_current_names(row["config"]),
        "info": row["info"],
        "error": row["error"],
        "worker": row["worker"],
        "calls": row["calls"],
        "steps": row["steps"],
        "saved_states": row["saved_states"],
        "idle_timeout_seconds": settings.session_idle_seconds,
        "created_at": iso(row["created_at"]),
        "ready_at": iso(row["ready_at"]),
        "ended_at": iso(row["ended_at"]),
    }
    return SessionOut.model_validate(shown).model_dump(mode="json")


def not_found(session_id: str) -> APIProblem:
    return APIProblem(404, f"no training session {session_id}", param="id", code="not_found")


def create(
    db: Session,
    user_id: int,
    config: SessionConfig,
    idempotency_key: str | None,
    settings: Settings,
) -> tuple[dict[str, Any], bool]:
    """Insert a starting session and commit; returns (row, replayed). The same Idempotency-Key
    with the same config returns the session it created before; with a different one, 409."""

    digest = request_hash(config)

    def new_row() -> dict[str, Any]:
        now = utcnow()
        return {
            "id": new_session_id(),
            "user_id": user_id,
            "status": st.STARTING,
            "config": config.model_dump(mode="json"),
            "info": None,
            "error": None,
            "worker": None,
            "lease_until": None,
            "last_contact_at": now,
            "close_requested_at": None,
            "idempotency_key": idempotency_key,
            "request_hash": digest,
            "created_at": now,
            "updated_at": now,
            "ready_at": None,
            "ended_at": None,
            "calls": 0,
            "steps": 0,
            "saved_states": 0,
        }

    def shown(row: dict[str, Any]) -> dict[str, Any]:
        return session_object(row, settings)

    row, replayed, _ = insert_once(db, table, user_id, idempotency_key, digest, new_row, "session", shown)
    return row, replayed


def get(db: Db, user_id: int, session_id: str) -> dict[str, Any]:
    """The caller's session; another user's is as absent as one that never existed."""
    row = (
        db.execute(select(table).where(table.c.id == session_id, table.c.user_id == user_id))
        .mappings()
        .first()
    )
    db.rollback()  # end the read here, in the route's thread
    if row is None:
        raise not_found(session_id)
    return dict(row)


def list_page(db: Db, user_id: int, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """The caller's sessions, newest first, starting after the session `after`."""
    return newest_first(db, table, user_id, after, limit, "sessions")


def worker_lost(row: Mapping[str, Any], now: dt.datetime | None = None) -> bool:
    """Whether the worker holding the session stopped renewing its lease."""
    now = now or utcnow()
    return (
        row["status"] in st.LIVE
        and row["worker"] is not None
        and row["lease_until"] is not None
        and row["lease_until"] < now
    )


def end_if_worker_lost(db: Session, row: dict[str, Any]) -> dict[str, Any]:
    """End a session whose worker is gone (its lease lapsed) in `error`; return the row as it is now."""
    if not worker_lost(row):
        return row
    now = utcnow()
    moved = rows_changed(
        db.execute(
            update(table)
            .where(table.c.id == row["id"], table.c.status.in_(st.LIVE), table.c.lease_until < now)
            .values(status=st.ERROR, error=WORKER_LOST, ended_at=now, updated_at=now, lease_until=None)
        )
    )
    db.commit()
    if moved:
        return {**row, "status": st.ERROR, "error": WORKER_LOST, "ended_at": now, "lease_until": None}
    return _reread(db, row)


def _reread(db: Session, row: Mapping[str, Any]) -> dict[str, Any]:
    fresh = db.execute(select(table).where(table.c.id == row["id"])).mappings().one()
    db.rollback()
    return dict(fresh)


class ReadyCache:
    """Sessions seen `ready` in the last `ttl` seconds, so that a stream of calls does not read the
    database once a call. A session that ends is noticed at most `ttl` later: a call sent in between
    is queued and never runs, and its result answers that the session ended."""

    def __init__(self, ttl: float = 1.0) -> None:
        self.ttl = ttl
        self._rows: dict[str, tuple[dict[str, Any], float]] = {}
        self._lock = threading.Lock()

    def get(self, user_id: int, session_id: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._rows.get(session_id)
        if found is None or found[1] < time.monotonic() or found[0]["user_id"] != user_id:
            return None
        return found[0]

    def note(self, row: dict[str, Any]) -> None:
        with self._lock:
            if len(self._rows) > 10_000:
                self._rows.clear()
            if row["status"] == st.READY and row["close_requested_at"] is None:
                self._rows[row["id"]] = (row, time.monotonic() + self.ttl)
            else:
                self._rows.pop(row["id"], None)


def heartbeat(db: Session, user_id: int, session_id: str) -> dict[str, Any]:
    """The client is alive: note the contact, and answer with the session (its status)."""
    now = utcnow()
    db.execute(
        update(table)
        .where(table.c.id == session_id, table.c.user_id == user_id, table.c.status.in_(st.LIVE))
        .values(last_contact_at=now)
    )
    db.commit()
    return end_if_worker_lost(db, get(db, user_id, session_id))


def request_close(db: Session, user_id: int, session_id: str) -> tuple[dict[str, Any], bool]:
    """Close: a starting session ends now; a ready one ends once its worker has run the calls
    before the close (its channel carries a close marker after them). Returns (row, whether the
    worker must be told). Closing again is harmless."""
    row = get(db, user_id, session_id)
    now = utcnow()
    if row["status"] == st.STARTING:
        moved = rows_changed(
            db.execute(
                update(table)
                .where(table.c.id == session_id, table.c.status == st.STARTING)
                .values(
                    status=st.CLOSED,
                    error="closed by its client before it was ready",
                    ended_at=now,
                    updated_at=now,
                    close_requested_at=now,
                )
            )
        )
        db.commit()
        if moved:
            return get(db, user_id, session_id), False
        row = get(db, user_id, session_id)  # it became ready meanwhile
    if row["status"] == st.READY and row["close_requested_at"] is None:
        db.execute(
            update(table)
            .where(table.c.id == session_id, table.c.close_requested_at.is_(None))
            .values(close_requested_at=now, updated_at=now)
        )
        db.commit()
        return get(db, user_id, session_id), True
    return row, False


def end_unpublished(db: Session, session_id: str, reason: str) -> None:
    """The queue could not be reached: end the session now rather than leave it starting."""
    now = utcnow()
    db.execute(
        update(table)
        .where(table.c.id == session_id, table.c.status == st.STARTING)
        .values(status=st.ERROR, error=reason, ended_at=now, updated_at=now)
    )
    db.commit()
