"""A worker's heartbeat row: written by the reconciler thread of its main process each pass, so
/metrics can count the workers that are alive, busy or not."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from relay_api.db import utcnow
from relay_api.models import WorkerHeartbeat

# Rows of workers gone this long are removed (each start of a worker process writes a new one).
FORGET_AFTER = dt.timedelta(days=1)


def beat(sessions: sessionmaker[Session], name: str, started_at: dt.datetime, gpus: int = 1) -> None:
    """Note that worker `name` is alive now, and gives a job `gpus` GPUs (processes)."""
    now = utcnow()
    with sessions() as session:
        row = session.get(WorkerHeartbeat, name)
        if row is None:
            session.add(WorkerHeartbeat(name=name, started_at=started_at, seen_at=now, gpus=gpus))
            session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.seen_at < now - FORGET_AFTER))
        else:
            row.seen_at = now
            row.gpus = gpus
        session.commit()
