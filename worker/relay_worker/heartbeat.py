"""A worker's heartbeat row: written by the reconciler thread of its main process each pass, so
/metrics can count the workers that are alive, busy or not."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import delete, insert, update
from sqlalchemy.orm import Session, sessionmaker

from relay_api.db import rows_changed, utcnow
from relay_api.models import worker_heartbeats

# Rows of workers gone this long are removed (each start of a worker process writes a new one).
FORGET_AFTER = dt.timedelta(days=1)


def beat(sessions: sessionmaker[Session], name: str, started_at: dt.datetime) -> None:
    """Note that worker `name` is alive now."""
    now = utcnow()
    with sessions() as session:
        seen = rows_changed(
            session.execute(
                update(worker_heartbeats).where(worker_heartbeats.c.name == name).values(seen_at=now)
            )
        )
        if not seen:
            session.execute(insert(worker_heartbeats).values(name=name, started_at=started_at, seen_at=now))
            session.execute(delete(worker_heartbeats).where(worker_heartbeats.c.seen_at < now - FORGET_AFTER))
        session.commit()
