"""What jobs, sessions and deployments share about holding a row: its lease, the fenced update that
renews it, and the thread that renews it while the work goes on.

A worker holds a row (a job's attempt, a session, a deployment) by its lease: `lease_until`, which
it pushes on every heartbeat. Every write it makes is fenced: the update matches only while the row
is still this holder's (its id, its attempt or worker, a live status), so a worker that was
replaced (its lease lapsed and another attempt claimed the row) writes nothing and learns so
(`FencedOut`).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from sqlalchemy import Table, update
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql import ColumnElement

from relay_api.db import database_now, with_retries
from relay_api.settings import Settings

log = logging.getLogger(__name__)

State = TypeVar("State")


class FencedOut(Exception):
    """This holder no longer owns the row: a newer attempt claimed it, or it ended."""


def lease_end(settings: Settings, now: dt.datetime) -> dt.datetime:
    """Where a lease taken or renewed `now` lapses."""
    return now + dt.timedelta(seconds=settings.lease_seconds)


def fenced_update(
    db_sessions: sessionmaker[Session],
    table: Table,
    owned: ColumnElement[bool],
    row_id: str,
    values: Callable[[dt.datetime], Mapping[str, Any]],
    *returning: Any,
) -> Row[Any]:
    """Update the row `owned` matches while it is this holder's (`values` of the database's clock),
    retrying a passing outage; its `returning` columns, or FencedOut naming `row_id`."""

    def run() -> Row[Any]:
        now = database_now(db_sessions)
        with db_sessions() as db:
            row = db.execute(
                update(table).where(owned).values(dict(values(now))).returning(*returning)
            ).first()
            db.commit()
        if row is None:
            raise FencedOut(row_id)
        return row

    return with_retries(run)


class LeaseRenewer(threading.Thread, Generic[State]):
    """Renews a held row's lease every heartbeat while its work goes on, and keeps what each renewal
    read (`took`). `lost` once the row is another's. While the database is away the work goes on: the
    lease may lapse meanwhile, the reconcilers judge no lapsed lease until one after the outage, and
    the renewal as soon as the database answers is fenced (refused if another attempt took over)."""

    def __init__(self, settings: Settings, row_id: str, what: str) -> None:
        super().__init__(name=f"lease-{row_id}", daemon=True)
        self.settings = settings
        self.row_id = row_id
        self.what = what  # "session", "deployment": for the log
        self.lost = False
        self._stopping = threading.Event()

    def renew(self) -> State:
        """One renewal: the fenced update, and what it read."""
        raise NotImplementedError

    def took(self, state: State) -> None:
        """Keep what a renewal read (a stop or close asked for)."""
        raise NotImplementedError

    def run(self) -> None:
        away_since: float | None = None
        while not self._stopping.wait(self.settings.heartbeat_seconds):
            try:
                state = self.renew()
            except FencedOut:
                self.lost = True
                return
            except Exception as error:
                if away_since is None:
                    away_since = time.monotonic()
                    log.warning(
                        "%s %s: cannot renew its lease (%s); it goes on",
                        self.what,
                        self.row_id,
                        str(error).splitlines()[0] if str(error) else type(error).__name__,
                    )
                continue
            if away_since is not None:
                log.warning(
                    "%s %s: the database is back after %.1f s; lease renewed",
                    self.what,
                    self.row_id,
                    time.monotonic() - away_since,
                )
                away_since = None
            self.took(state)

    def stop(self) -> None:
        self._stopping.set()
