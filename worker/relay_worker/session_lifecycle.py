"""A session's life on a worker: claim, lease, ready, end; and the reconciler's part for sessions.

A worker claims a starting session that nobody holds, renews its lease every `heartbeat_seconds`
while it holds it, and ends it (closed or error) when it lets go. Each write names the worker and is
refused once the session is no longer its own (``FencedOut``): ended by the API (a lost lease) or
closed before it was ready. Sessions cannot move between workers (the model's state is in the
worker's memory), so a lost worker ends its session in `error`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from relay.training import status as st
from relay_api.db import database_now, rows_changed, unlocked, with_retries
from relay_api.models import training_sessions as table
from relay_api.sessions import WORKER_LOST
from relay_api.settings import Settings
from relay_worker.leases import fenced_update, lease_end


@dataclass(frozen=True)
class SessionClaim:
    session_id: str
    worker: str
    user_id: int
    config: dict[str, Any]


@dataclass
class SessionCounts:
    """What a session has done so far, counted by its worker and written with each lease renewal."""

    calls: int = 0
    steps: int = 0
    saved_states: int = 0

    def values(self) -> dict[str, int]:
        return {"calls": self.calls, "steps": self.steps, "saved_states": self.saved_states}


@dataclass(frozen=True)
class SessionState:
    """What the worker learns at each lease renewal."""

    status: str
    last_contact_at: dt.datetime
    close_requested: bool


def _owned(claim: SessionClaim) -> Any:
    return and_(table.c.id == claim.session_id, table.c.worker == claim.worker, table.c.status.in_(st.LIVE))


def claim(
    db_sessions: sessionmaker[Session], settings: Settings, session_id: str, worker: str
) -> SessionClaim | None:
    """Take the session if it is starting and nobody holds it."""

    def run() -> SessionClaim | None:
        now = database_now(db_sessions)
        with db_sessions() as db:
            row = db.execute(
                update(table)
                .where(table.c.id == session_id, table.c.status == st.STARTING, table.c.worker.is_(None))
                .values(worker=worker, lease_until=lease_end(settings, now), updated_at=now)
                .returning(table.c.user_id, table.c.config)
            ).first()
            db.commit()
        return None if row is None else SessionClaim(session_id, worker, row.user_id, row.config)

    return with_retries(run)


def renew(
    db_sessions: sessionmaker[Session],
    settings: Settings,
    claim: SessionClaim,
    counts: SessionCounts | None = None,
) -> SessionState:
    """Extend the lease (writing the session's counts, if given), and read whether the client is
    still in touch or asked to close."""

    row = fenced_update(
        db_sessions,
        table,
        _owned(claim),
        claim.session_id,
        lambda now: {"lease_until": lease_end(settings, now), **(counts.values() if counts else {})},
        table.c.status,
        table.c.last_contact_at,
        table.c.close_requested_at,
    )
    return SessionState(row.status, row.last_contact_at, row.close_requested_at is not None)


def mark_ready(
    db_sessions: sessionmaker[Session], settings: Settings, claim: SessionClaim, info: dict[str, Any]
) -> bool:
    """The model is loaded; False if the session was closed (or lost) meanwhile. The idle clock
    starts now: loading is not the client's silence."""

    def run() -> bool:
        now = database_now(db_sessions)
        with db_sessions() as db:
            moved = rows_changed(
                db.execute(
                    update(table)
                    .where(_owned(claim), table.c.status == st.STARTING)
                    .values(
                        status=st.READY,
                        info=info,
                        ready_at=now,
                        updated_at=now,
                        last_contact_at=now,
                        lease_until=lease_end(settings, now),
                    )
                )
            )
            db.commit()
        return bool(moved)

    return with_retries(run)


def end(
    db_sessions: sessionmaker[Session],
    claim: SessionClaim,
    status: str,
    message: str | None,
    counts: SessionCounts | None = None,
) -> bool:
    """Let go of the session: `closed` or `error`, with why (and its final counts, if given).
    False if it had ended already."""
    assert status in st.ENDED

    def run() -> bool:
        now = database_now(db_sessions)
        with db_sessions() as db:
            moved = rows_changed(
                db.execute(
                    update(table)
                    .where(_owned(claim))
                    .values(
                        status=status,
                        error=message,
                        ended_at=now,
                        updated_at=now,
                        lease_until=None,
                        **(counts.values() if counts else {}),
                    )
                )
            )
            db.commit()
        return bool(moved)

    return with_retries(run)


def reconcile(db_sessions: sessionmaker[Session], settings: Settings) -> list[str]:
    """End sessions whose worker is gone, and sessions that did not start in time; returns their ids."""
    now = database_now(db_sessions)
    too_old = now - dt.timedelta(seconds=settings.session_start_seconds)
    ended: list[str] = []
    with db_sessions() as db:
        lost = (
            db.execute(
                select(table.c.id).where(
                    table.c.status.in_(st.LIVE), table.c.worker.is_not(None), table.c.lease_until < now
                )
            )
            .scalars()
            .all()
        )
        stale = (
            db.execute(select(table.c.id).where(table.c.status == st.STARTING, table.c.created_at < too_old))
            .scalars()
            .all()
        )
    for session_id in lost:
        if _end_unless_moved(
            db_sessions, session_id, WORKER_LOST, table.c.lease_until < database_now(db_sessions)
        ):
            ended.append(session_id)
    reason = (
        f"no worker started it within {settings.session_start_seconds:.0f} s (every worker was busy, "
        "or none was running)"
    )
    for session_id in stale:
        alive = or_(table.c.worker.is_(None), table.c.lease_until < database_now(db_sessions))
        if _end_unless_moved(db_sessions, session_id, reason, and_(table.c.status == st.STARTING, alive)):
            ended.append(session_id)
    return ended


def _end_unless_moved(
    db_sessions: sessionmaker[Session], session_id: str, message: str, condition: Any
) -> bool:
    now = database_now(db_sessions)
    with db_sessions() as db:
        moved = rows_changed(
            db.execute(
                update(table)
                .where(unlocked(table, table.c.id == session_id, table.c.status.in_(st.LIVE), condition))
                .values(status=st.ERROR, error=message, ended_at=now, updated_at=now, lease_until=None)
            )
        )
        db.commit()
    return bool(moved)
