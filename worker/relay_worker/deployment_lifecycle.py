"""A deployment's life on a worker: claim, lease, ready, end; and the reconciler's part for deployments.

A serving worker claims a starting deployment that no live worker holds, as the next attempt (the
fencing token, as for jobs: relay_worker.lifecycle), renews its lease every `heartbeat_seconds`
with the policy server's figures, and ends it (stopped or error) when it lets go. Each write names
the attempt and is refused once the deployment is no longer this attempt's (``FencedOut``).

A deployment's model can be loaded again anywhere, so unlike a session a deployment outlives its
worker: when the lease lapses the reconciler puts it back to `starting` and publishes it, and
another serving worker loads it as the next attempt. Workers lost while loading it count
(`failed_starts`); `max_attempts` of them in a row end it in `error`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from relay.serving import status as st
from relay_api.db import database_now, rows_changed, unlocked, with_retries
from relay_api.deployments import STOPPED_BY_USER, record_event
from relay_api.models import deployments as table
from relay_api.settings import Settings
from relay_worker.leases import fenced_update, lease_end


@dataclass(frozen=True)
class DeploymentClaim:
    deployment_id: str
    attempt: int
    worker: str
    user_id: int
    config: dict[str, Any]
    model_source: str
    token: str


@dataclass(frozen=True)
class DeploymentState:
    """What the worker learns at each lease renewal."""

    status: str
    stop_requested: bool


def _owned(claim: DeploymentClaim) -> Any:
    return and_(
        table.c.id == claim.deployment_id, table.c.attempt == claim.attempt, table.c.status.in_(st.LIVE)
    )


def claim(
    db_sessions: sessionmaker[Session], settings: Settings, deployment_id: str, worker: str
) -> DeploymentClaim | None:
    """Take the deployment as its next attempt if it is starting, not being stopped, and held by no
    live worker."""

    def run() -> DeploymentClaim | None:
        now = database_now(db_sessions)
        with db_sessions() as db:
            row = db.execute(
                update(table)
                .where(
                    table.c.id == deployment_id,
                    table.c.status == st.STARTING,
                    table.c.stop_requested_at.is_(None),
                    or_(table.c.lease_until.is_(None), table.c.lease_until < now),
                )
                .values(
                    attempt=table.c.attempt + 1,
                    worker=worker,
                    lease_until=lease_end(settings, now),
                    internal_url=None,
                    updated_at=now,
                )
                .returning(
                    table.c.attempt,
                    table.c.user_id,
                    table.c.config,
                    table.c.model_source,
                    table.c.internal_token,
                )
            ).first()
            db.commit()
        if row is None:
            return None
        return DeploymentClaim(
            deployment_id, row.attempt, worker, row.user_id, row.config, row.model_source, row.internal_token
        )

    return with_retries(run)


def renew(
    db_sessions: sessionmaker[Session],
    settings: Settings,
    claim: DeploymentClaim,
    stats: dict[str, Any] | None = None,
) -> DeploymentState:
    """Extend the lease (writing the server's figures, if given) and read whether a stop was asked for."""

    def values(now: dt.datetime) -> dict[str, Any]:
        return {"lease_until": lease_end(settings, now), **({} if stats is None else {"stats": stats})}

    row = fenced_update(
        db_sessions,
        table,
        _owned(claim),
        claim.deployment_id,
        values,
        table.c.status,
        table.c.stop_requested_at,
    )
    return DeploymentState(row.status, row.stop_requested_at is not None)


def mark_ready(
    db_sessions: sessionmaker[Session],
    settings: Settings,
    claim: DeploymentClaim,
    internal_url: str,
    info: dict[str, Any],
) -> bool:
    """The model is loaded and served at `internal_url`; False if it was stopped (or lost) meanwhile."""

    def run() -> bool:
        now = database_now(db_sessions)
        with db_sessions() as db:
            moved = rows_changed(
                db.execute(
                    update(table)
                    .where(_owned(claim), table.c.status == st.STARTING, table.c.stop_requested_at.is_(None))
                    .values(
                        status=st.READY,
                        internal_url=internal_url,
                        info=info,
                        failed_starts=0,
                        ready_at=now,
                        updated_at=now,
                        lease_until=lease_end(settings, now),
                    )
                )
            )
            if moved:
                reason = f"serving on worker {claim.worker} (attempt {claim.attempt})"
                record_event(db, claim.deployment_id, st.READY, claim.attempt, reason, now)
            db.commit()
        return bool(moved)

    return with_retries(run)


def end(
    db_sessions: sessionmaker[Session],
    claim: DeploymentClaim,
    status: str,
    reason: str,
    stats: dict[str, Any] | None = None,
) -> bool:
    """Let go of the deployment: `stopped` or `error`, with why. False if it was no longer this
    attempt's."""
    assert status in st.ENDED

    def run() -> bool:
        now = database_now(db_sessions)
        values: dict[str, Any] = {
            "status": status,
            "error": reason,
            "ended_at": now,
            "updated_at": now,
            "lease_until": None,
            "internal_url": None,
        }
        if stats is not None:
            values["stats"] = stats
        with db_sessions() as db:
            moved = rows_changed(db.execute(update(table).where(_owned(claim)).values(values)))
            if moved:
                record_event(db, claim.deployment_id, status, claim.attempt, reason, now)
            db.commit()
        return bool(moved)

    return with_retries(run)


def hand_back(db_sessions: sessionmaker[Session], claim: DeploymentClaim, reason: str) -> bool:
    """Give the deployment to another worker (this one is shutting down): back to `starting`, not
    counted as a failed start. The caller publishes it again."""

    def run() -> bool:
        now = database_now(db_sessions)
        with db_sessions() as db:
            moved = rows_changed(
                db.execute(
                    update(table)
                    .where(_owned(claim), table.c.stop_requested_at.is_(None))
                    .values(status=st.STARTING, lease_until=None, internal_url=None, updated_at=now)
                )
            )
            if moved:
                record_event(db, claim.deployment_id, st.STARTING, claim.attempt, reason, now)
            db.commit()
        return bool(moved)

    return with_retries(run)


def reconcile(
    db_sessions: sessionmaker[Session],
    settings: Settings,
    publish: Callable[[str], None],
    judge_silent_leases: bool = True,
) -> list[str]:
    """Restart deployments whose worker is gone (or end them: stopped if a stop was asked for,
    error after `max_attempts` lost loads in a row), and publish again those waiting longer than
    `republish_seconds` (the message may have been lost); returns the ids it moved or published.

    `judge_silent_leases`: False just after a database outage (relay_worker.app.Reconciler). A
    deployment's worker serves on while the database is away, and renews its lease once it is
    back; a lease that lapsed during the outage is no sign of a lost worker until then."""
    now = database_now(db_sessions)
    with db_sessions() as db:
        lapsed = db.execute(
            select(
                table.c.id,
                table.c.attempt,
                table.c.status,
                table.c.failed_starts,
                table.c.worker,
                table.c.stop_requested_at,
            ).where(table.c.status.in_(st.LIVE), table.c.lease_until < now)
        ).all()
        waiting = (
            db.execute(
                select(table.c.id).where(
                    table.c.status == st.STARTING,
                    table.c.lease_until.is_(None),
                    table.c.stop_requested_at.is_(None),
                    table.c.updated_at < now - dt.timedelta(seconds=settings.republish_seconds),
                )
            )
            .scalars()
            .all()
        )
    moved: list[str] = []
    if not judge_silent_leases:
        lapsed = []
    for deployment_id, attempt, status, failed_starts, worker, stop_requested_at in lapsed:
        lost = f"its worker {worker} stopped responding (killed or lost)"
        failed = failed_starts + (1 if status == st.STARTING else 0)
        if stop_requested_at is not None:
            change = _Change(st.STOPPED, f"{STOPPED_BY_USER}; {lost}")
        elif failed >= settings.max_attempts:
            change = _Change(
                st.ERROR, f"gave up after {failed} workers were lost loading it; the last: {lost}"
            )
        else:
            change = _Change(st.STARTING, f"{lost}; restarting on another worker (attempt {attempt + 1})")
        if _move_lapsed(db_sessions, deployment_id, attempt, failed, change):
            moved.append(deployment_id)
            if change.status == st.STARTING:
                publish(deployment_id)  # by the one reconciler whose update moved it
    for deployment_id in waiting:
        if _touch_waiting(db_sessions, deployment_id, settings):
            publish(deployment_id)
            moved.append(deployment_id)
    return moved


@dataclass(frozen=True)
class _Change:
    status: str
    reason: str


def _move_lapsed(
    db_sessions: sessionmaker[Session], deployment_id: str, attempt: int, failed: int, change: _Change
) -> bool:
    now = database_now(db_sessions)
    values: dict[str, Any] = {
        "status": change.status,
        "lease_until": None,
        "internal_url": None,
        "updated_at": now,
        "failed_starts": failed,
    }
    if change.status in st.ENDED:
        values.update(error=change.reason, ended_at=now)
    with db_sessions() as db:
        done = rows_changed(
            db.execute(
                update(table)
                .where(
                    unlocked(
                        table,
                        table.c.id == deployment_id,
                        table.c.attempt == attempt,
                        table.c.status.in_(st.LIVE),
                        table.c.lease_until < now,
                    )
                )
                .values(values)
            )
        )
        if done:
            record_event(db, deployment_id, change.status, attempt, change.reason, now)
        db.commit()
    return bool(done)


def _touch_waiting(db_sessions: sessionmaker[Session], deployment_id: str, settings: Settings) -> bool:
    """Note that the waiting deployment is published again, so one reconciler does it once a period."""
    now = database_now(db_sessions)
    before = now - dt.timedelta(seconds=settings.republish_seconds)
    with db_sessions() as db:
        done = rows_changed(
            db.execute(
                update(table)
                .where(
                    unlocked(
                        table,
                        table.c.id == deployment_id,
                        table.c.status == st.STARTING,
                        table.c.lease_until.is_(None),
                        table.c.updated_at < before,
                    )
                )
                .values(updated_at=now)
            )
        )
        db.commit()
    return bool(done)
