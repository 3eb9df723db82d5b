"""A job's life on the workers: claim, lease, fenced writes, the end, and the reconciler.

A worker claims a job by incrementing its `attempt` (the fencing token) and taking a lease. Every
later write of that worker names the attempt and is refused (``FencedOut``) once a newer attempt
owns the job. A reconciler, run by every worker, hands jobs whose lease lapsed to a new attempt
(which resumes from the last checkpoint), publishes jobs that never reached the broker, and fails
a job after `max_attempts` failed claims (a claim given back by a worker that shuts down does not
count). Writes are short transactions, retried when the database blips. The reconciler's updates
skip a row another transaction holds locked (`relay_api.db.unlocked`), so a worker frozen inside
a transaction never holds up the jobs after its own; the server ends that transaction after half
the lease (`relay_api.db.Liveness`), and the row is handed on at a later pass.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session, sessionmaker

from relay.events import (
    CancelledEvent,
    DatasetEvent,
    ErrorEvent,
    MetricsEvent,
    RetryEvent,
    WeightsEvent,
    parse_event,
)
from relay.sft import status as st
from relay_api import dataset_credentials
from relay_api.db import database_now, rows_changed, unlocked, with_retries
from relay_api.event_rows import ROW_KEYS, insert_event
from relay_api.models import fine_tunes
from relay_api.settings import Settings
from relay_api.tracker_credentials import forget_ended_jobs_secrets
from relay_api.workers import live_workers
from relay_worker.leases import FencedOut, fenced_update, lease_end

log = logging.getLogger(__name__)

LIVE = (st.RUNNING, st.CANCEL_REQUESTED)


@dataclass(frozen=True)
class Claim:
    job_id: str
    attempt: int
    user_id: int
    config: dict[str, Any]
    step: int  # the job's last reported step when claimed (0 for a first attempt)


@dataclass(frozen=True)
class JobState:
    status: str

    @property
    def cancel_requested(self) -> bool:
        return self.status == st.CANCEL_REQUESTED


# Claims that ended in a failure; handovers (a worker's shutdown) do not count.
failed_attempts = fine_tunes.c.attempt - fine_tunes.c.handovers


def _owned(claim: Claim) -> Any:
    return and_(
        fine_tunes.c.id == claim.job_id, fine_tunes.c.attempt == claim.attempt, fine_tunes.c.status.in_(LIVE)
    )


def lost_worker_reason(attempt: int) -> str:
    """Why a job is retried when its attempt's lease lapsed without a word from its worker."""
    return f"the worker of attempt {attempt} stopped responding (killed or lost)"


def claimable(settings: Settings, now: dt.datetime) -> Any:
    """A job a worker (or a gang of them) may take: queued, or running with a lapsed lease, and
    with attempts left."""
    return and_(
        failed_attempts < settings.max_attempts,
        or_(
            fine_tunes.c.status == st.QUEUED,
            and_(
                fine_tunes.c.status == st.RUNNING,
                or_(fine_tunes.c.lease_until.is_(None), fine_tunes.c.lease_until < now),
            ),
        ),
    )


def stored_config(db_sessions: sessionmaker[Session], job_id: str) -> dict[str, Any] | None:
    """The job's recipe as the API stored it; None when there is no such job."""

    def run() -> dict[str, Any] | None:
        with db_sessions() as db:
            config = db.execute(select(fine_tunes.c.config).where(fine_tunes.c.id == job_id)).scalar()
        return None if config is None else dict(config)

    return with_retries(run)


def claim(db_sessions: sessionmaker[Session], settings: Settings, job_id: str, owner: str) -> Claim | None:
    """Take the job if it is queued, or running with a lapsed lease, and has attempts left."""

    def run() -> Claim | None:
        now = database_now(db_sessions)
        with db_sessions() as db:
            # What the job was, for its retry event: a running job is taken from an attempt whose
            # lease lapsed, and a task delivered again (the broker's redelivery of a killed
            # worker's task) can take it before any reconciler reported the retry.
            before = db.execute(
                select(fine_tunes.c.status, fine_tunes.c.attempt, fine_tunes.c.last_failure).where(
                    fine_tunes.c.id == job_id
                )
            ).first()
            row = db.execute(
                update(fine_tunes)
                .where(fine_tunes.c.id == job_id, claimable(settings, now))
                .values(
                    status=st.RUNNING,
                    attempt=fine_tunes.c.attempt + 1,
                    lease_until=lease_end(settings, now),
                    lease_lapsed_at=None,
                    lease_owner=owner,
                    updated_at=now,
                    last_failure=None,
                    started_at=func.coalesce(fine_tunes.c.started_at, now),
                )
                .returning(fine_tunes.c.attempt, fine_tunes.c.user_id, fine_tunes.c.config, fine_tunes.c.step)
            ).first()
            if row is not None and before is not None and before.status == st.RUNNING:
                # The reconciler's retry event, if it wrote one, is this one (one per step and attempt).
                reason = before.last_failure or lost_worker_reason(before.attempt)
                retry = RetryEvent(step=row.step, attempt=row.attempt, reason=reason)
                insert_event(db, job_id, retry, before.attempt, now)
            db.commit()
            if row is None:
                return None
            return Claim(job_id, row.attempt, row.user_id, row.config, row.step)

    return with_retries(run)


def renew(db_sessions: sessionmaker[Session], settings: Settings, claim: Claim) -> JobState:
    """Extend the lease (the heartbeat) and read whether a cancel was asked for."""

    row = fenced_update(
        db_sessions,
        fine_tunes,
        _owned(claim),
        claim.job_id,
        lambda now: {"lease_until": lease_end(settings, now)},
        fine_tunes.c.status,
    )
    return JobState(row.status)


def observe(db_sessions: sessionmaker[Session], claim: Claim) -> JobState:
    """Read whether a cancel was asked for, writing nothing (a host of a gang that does not hold
    rank 0 only watches the job); raise FencedOut once the claim is no longer the job's."""

    def run() -> JobState:
        with db_sessions() as db:
            status = db.execute(select(fine_tunes.c.status).where(_owned(claim))).scalar()
        if status is None:
            raise FencedOut(claim.job_id)
        return JobState(status)

    return with_retries(run)


def record_event(
    db_sessions: sessionmaker[Session], settings: Settings, claim: Claim, reported: Mapping[str, Any]
) -> JobState:
    """Write one of the engine's events (typed, or its wire form) and the job's progress, as this
    attempt; once per (step, kind)."""
    event = parse_event(reported)

    def run() -> JobState:
        now = database_now(db_sessions)
        progress: dict[str, Any] = {
            "step": event.step,
            "updated_at": now,
            "lease_until": lease_end(settings, now),
        }
        if isinstance(event, MetricsEvent) and event.loss is not None:
            progress["loss"] = float(event.loss)
        if isinstance(event, DatasetEvent):  # the job's `dataset`: what this attempt read
            progress["dataset"] = {key: value for key, value in event.items() if key not in ROW_KEYS}
        if isinstance(event, WeightsEvent):  # the job's `weights`: where its starting weights came from
            progress["weights"] = {key: value for key, value in event.items() if key not in ROW_KEYS}
        with db_sessions() as db:
            status = db.execute(
                update(fine_tunes).where(_owned(claim)).values(progress).returning(fine_tunes.c.status)
            ).scalar()
            if status is None:
                db.rollback()
                raise FencedOut(claim.job_id)
            if not isinstance(event, (DatasetEvent, WeightsEvent)):
                # What was read is the job's `dataset` and `weights`, not its events: a job's events
                # are its training's (metrics first, as the API has always listed them).
                insert_event(db, claim.job_id, event, claim.attempt, now)
            db.commit()
        return JobState(status)

    return with_retries(run)


def complete(
    db_sessions: sessionmaker[Session],
    claim: Claim,
    step: int,
    loss: float | None,
    output_dir: str,
    files: dict[str, Any],
) -> str:
    """The engine finished and wrote the output: `completed` (or `cancelled`, if a cancel came first)."""

    def run() -> str:
        now = database_now(db_sessions)
        with db_sessions() as db:
            moved = rows_changed(
                db.execute(
                    update(fine_tunes)
                    .where(_owned(claim), fine_tunes.c.status == st.RUNNING)
                    .values(
                        status=st.COMPLETED,
                        step=step,
                        loss=loss,
                        output_dir=output_dir,
                        files=files,
                        finished_at=now,
                        updated_at=now,
                        lease_until=None,
                    )
                )
            )
            db.commit()
        return st.COMPLETED if moved else ""

    if with_retries(run):
        return st.COMPLETED
    return _end_cancelled_or_fenced(db_sessions, claim, step)


def fail(db_sessions: sessionmaker[Session], claim: Claim, message: str) -> str:
    """End the job in `error` with a message for the user (or `cancelled`, if a cancel came first)."""

    def run() -> str:
        now = database_now(db_sessions)
        with db_sessions() as db:
            step = db.execute(
                update(fine_tunes)
                .where(_owned(claim), fine_tunes.c.status == st.RUNNING)
                .values(status=st.ERROR, error=message, finished_at=now, updated_at=now, lease_until=None)
                .returning(fine_tunes.c.step)
            ).scalar()
            if step is not None:
                insert_event(db, claim.job_id, ErrorEvent(step=step, message=message), claim.attempt, now)
            db.commit()
        return st.ERROR if step is not None else ""

    if with_retries(run):
        return st.ERROR
    return _end_cancelled_or_fenced(db_sessions, claim, None)


def cancelled(db_sessions: sessionmaker[Session], claim: Claim, step: int | None) -> str:
    """The engine stopped because a cancel was asked for: `cancelled`."""
    return _end_cancelled_or_fenced(db_sessions, claim, step)


def _end_cancelled_or_fenced(db_sessions: sessionmaker[Session], claim: Claim, step: int | None) -> str:
    def run() -> bool:
        now = database_now(db_sessions)
        values: dict[str, Any] = {
            "status": st.CANCELLED,
            "finished_at": now,
            "updated_at": now,
            "lease_until": None,
        }
        if step is not None:
            values["step"] = step
        with db_sessions() as db:
            final_step = db.execute(
                update(fine_tunes)
                .where(_owned(claim), fine_tunes.c.status == st.CANCEL_REQUESTED)
                .values(values)
                .returning(fine_tunes.c.step)
            ).scalar()
            if final_step is not None:
                insert_event(db, claim.job_id, CancelledEvent(step=final_step), claim.attempt, now)
            db.commit()
        return final_step is not None

    if with_retries(run):
        return st.CANCELLED
    raise FencedOut(claim.job_id)


def release(db_sessions: sessionmaker[Session], claim: Claim, reason: str) -> None:
    """Give the job up after a failure (an infrastructure fault): its lease lapses now, so the
    reconciler hands it to a new attempt, or fails it when no attempts are left."""
    _give_back(db_sessions, claim, {"last_failure": reason[:2000]})


def hand_back(db_sessions: sessionmaker[Session], claim: Claim, reason: str = "its worker shut down") -> None:
    """Give the job back for a reason that is not the job's fault (its worker is shutting down, the
    database was away); another attempt resumes it, and this claim does not count against max_attempts."""
    _give_back(db_sessions, claim, {"last_failure": reason[:2000], "handovers": fine_tunes.c.handovers + 1})


def _give_back(db_sessions: sessionmaker[Session], claim: Claim, values: dict[str, Any]) -> None:
    def run() -> None:
        now = database_now(db_sessions)
        with db_sessions() as db:
            db.execute(
                update(fine_tunes).where(_owned(claim)).values(lease_until=now, updated_at=now, **values)
            )
            db.commit()

    with_retries(run)


@dataclass
class ReconcileReport:
    published: list[str]
    resumed: list[str]
    failed: list[str]
    cancelled: list[str]


def reconcile(
    db_sessions: sessionmaker[Session],
    settings: Settings,
    publish: Callable[[str], None],
    broker_started_at: dt.datetime | None = None,
    judge_silent_leases: bool = True,
) -> ReconcileReport:
    """One pass of the reconciler; safe to run from many workers at once (each change is conditional).

    `broker_started_at`: when the broker (Redis) last started. A job handed to the broker before
    then may have been lost with a restart that kept nothing, so it is published again at once
    rather than after `republish_seconds`.

    `judge_silent_leases`: False just after a database outage. A lease that lapsed then, without its
    worker saying why, may be a worker that the outage stopped and that is giving the job back right
    now (not counted against the job); judging it a lost worker would count it. Jobs given back
    with a reason are handed on either way."""
    report = ReconcileReport([], [], [], [])
    now = database_now(db_sessions)
    stale = _republish_before(settings, now, broker_started_at)
    with db_sessions() as db:
        waiting = _waiting(db, settings, now, stale)
        expired = _expired(db, now)
        orphaned_cancels = _orphaned_cancels(db, now)
        exhausted = _exhausted(db, settings)
    if not judge_silent_leases:
        expired = [row for row in expired if row.last_failure is not None]

    report.published += _publish_waiting(db_sessions, publish, waiting, stale)
    resumed, failed = _hand_on_lapsed(db_sessions, settings, publish, [*expired, *exhausted])
    report.resumed += resumed
    report.failed += failed
    report.cancelled += _end_orphaned_cancels(db_sessions, orphaned_cancels)
    dataset_credentials.forget_ended_jobs_urls(db_sessions)
    forget_ended_jobs_secrets(db_sessions)
    return report


def _waiting(db: Session, settings: Settings, now: dt.datetime, stale: dt.datetime) -> list[str]:
    """Jobs accepted but never handed to the broker (the API died in between, or the broker was
    down), or handed over long ago, when the message may be gone (a Redis restart)."""
    grace = now - dt.timedelta(seconds=min(settings.reconcile_seconds, 5.0))
    slots = max(settings.worker_slots, sum(w.gpus for w in live_workers(db, settings.reconcile_seconds)))
    rows = db.execute(
        select(fine_tunes.c.id, fine_tunes.c.config).where(
            or_(
                fine_tunes.c.status == st.QUEUED,
                and_(fine_tunes.c.status == st.RUNNING, fine_tunes.c.lease_until.is_(None)),
            ),
            failed_attempts < settings.max_attempts,
            or_(
                and_(fine_tunes.c.enqueued_at.is_(None), fine_tunes.c.created_at < grace),
                fine_tunes.c.enqueued_at < stale,
            ),
        )
    )
    # A job whose gang the live workers cannot form waits until they can (relay_worker.gang).
    return [job_id for job_id, config in rows if int(config.get("gpus") or 1) <= slots]


# What the reconciler reads of a job whose lease lapsed: enough to hand it on or to fail it.
_LAPSED_COLUMNS = (
    fine_tunes.c.id,
    fine_tunes.c.attempt,
    failed_attempts,
    fine_tunes.c.step,
    fine_tunes.c.last_failure,
)
# id, attempt, failed attempts, step, last_failure
LapsedJob = Row[str, int, int, int, str | None]


def _expired(db: Session, now: dt.datetime) -> Sequence[LapsedJob]:
    """Running, but the worker stopped renewing the lease (killed, lost, or gave it back)."""
    return db.execute(
        select(*_LAPSED_COLUMNS).where(fine_tunes.c.status == st.RUNNING, fine_tunes.c.lease_until < now)
    ).all()


def _orphaned_cancels(db: Session, now: dt.datetime) -> Sequence[Row[str, int]]:
    """A cancel was asked for and the worker is gone: nothing is left to stop."""
    lapsed = or_(fine_tunes.c.lease_until.is_(None), fine_tunes.c.lease_until < now)
    return db.execute(
        select(fine_tunes.c.id, fine_tunes.c.attempt).where(
            fine_tunes.c.status == st.CANCEL_REQUESTED, lapsed
        )
    ).all()


def _exhausted(db: Session, settings: Settings) -> Sequence[LapsedJob]:
    """Out of attempts (e.g. a worker gave the job back on its last attempt)."""
    return db.execute(
        select(*_LAPSED_COLUMNS).where(
            fine_tunes.c.status == st.RUNNING,
            fine_tunes.c.lease_until.is_(None),
            failed_attempts >= settings.max_attempts,
        )
    ).all()


def _publish_waiting(
    db_sessions: sessionmaker[Session], publish: Callable[[str], None], waiting: list[str], stale: dt.datetime
) -> list[str]:
    """Publish each waiting job, once among many reconcilers: each first takes the job's turn."""
    published = []
    for job_id in waiting:
        with db_sessions() as db:
            taken = rows_changed(
                db.execute(
                    update(fine_tunes)
                    .where(
                        unlocked(
                            fine_tunes,
                            fine_tunes.c.id == job_id,
                            or_(fine_tunes.c.enqueued_at.is_(None), fine_tunes.c.enqueued_at < stale),
                        )
                    )
                    .values(enqueued_at=database_now(db_sessions))
                )
            )
            db.commit()
        if taken:
            publish(job_id)
            published.append(job_id)
    return published


def _hand_on_lapsed(
    db_sessions: sessionmaker[Session],
    settings: Settings,
    publish: Callable[[str], None],
    lapsed: Sequence[LapsedJob],
) -> tuple[list[str], list[str]]:
    """Hand each job whose lease lapsed to a new attempt, or fail it when it is out of attempts;
    returns the jobs handed on and those failed."""
    resumed, failed = [], []
    for job_id, attempt, failures, step, last_failure in lapsed:
        reason = last_failure or lost_worker_reason(attempt)
        if failures >= settings.max_attempts:
            message = f"gave up after {failures} failed attempts; the last one ended with: {reason}"
            if _end_exhausted(db_sessions, job_id, attempt, step, message):
                failed.append(job_id)
        elif _retry(db_sessions, job_id, attempt, step, reason):
            publish(job_id)  # by the one reconciler whose update moved it
            resumed.append(job_id)
    return resumed, failed


def _retry(db_sessions: sessionmaker[Session], job_id: str, attempt: int, step: int, reason: str) -> bool:
    """Make the lapsed attempt's job claimable again, with a `retry` event naming the next attempt."""
    with db_sessions() as db:
        moved = rows_changed(
            db.execute(
                update(fine_tunes)
                .where(
                    unlocked(
                        fine_tunes,
                        fine_tunes.c.id == job_id,
                        fine_tunes.c.attempt == attempt,
                        fine_tunes.c.status == st.RUNNING,
                        fine_tunes.c.lease_until < database_now(db_sessions),
                    )
                )
                # The lapsed lease's end stays readable (`lease_lapsed_seconds`) until a claim.
                .values(
                    lease_until=None,
                    lease_lapsed_at=fine_tunes.c.lease_until,
                    enqueued_at=database_now(db_sessions),
                    last_failure=reason,
                )
            )
        )
        if moved:
            retry = RetryEvent(step=step, attempt=attempt + 1, reason=reason)
            insert_event(db, job_id, retry, attempt, database_now(db_sessions))
        db.commit()
    return bool(moved)


def _end_orphaned_cancels(db_sessions: sessionmaker[Session], orphaned: Sequence[Row[str, int]]) -> list[str]:
    """End in `cancelled` each job whose cancel no worker is left to carry out."""
    cancelled = []
    for job_id, attempt in orphaned:
        with db_sessions() as db:
            when = database_now(db_sessions)
            final_step = db.execute(
                update(fine_tunes)
                .where(
                    unlocked(
                        fine_tunes,
                        fine_tunes.c.id == job_id,
                        fine_tunes.c.attempt == attempt,
                        fine_tunes.c.status == st.CANCEL_REQUESTED,
                        or_(fine_tunes.c.lease_until.is_(None), fine_tunes.c.lease_until < when),
                    )
                )
                .values(status=st.CANCELLED, finished_at=when, updated_at=when, lease_until=None)
                .returning(fine_tunes.c.step)
            ).scalar()
            if final_step is not None:
                insert_event(db, job_id, CancelledEvent(step=final_step), attempt, when)
            db.commit()
        if final_step is not None:
            cancelled.append(job_id)
    return cancelled


def _republish_before(
    settings: Settings, now: dt.datetime, broker_started_at: dt.datetime | None
) -> dt.datetime:
    """Jobs handed to the broker before this moment are published again."""
    stale = now - dt.timedelta(seconds=settings.republish_seconds)
    if broker_started_at is None:
        return stale
    # A second of slack for clocks: a job published just after the restart may go out twice, which
    # is harmless (its second delivery finds it taken); one published just before must not be lost.
    return max(stale, broker_started_at + dt.timedelta(seconds=1))


def _end_exhausted(
    db_sessions: sessionmaker[Session], job_id: str, attempt: int, step: int, message: str
) -> bool:
    with db_sessions() as db:
        now = database_now(db_sessions)
        moved = rows_changed(
            db.execute(
                update(fine_tunes)
                .where(
                    unlocked(
                        fine_tunes,
                        fine_tunes.c.id == job_id,
                        fine_tunes.c.attempt == attempt,
                        fine_tunes.c.status == st.RUNNING,
                        or_(fine_tunes.c.lease_until.is_(None), fine_tunes.c.lease_until < now),
                    )
                )
                .values(status=st.ERROR, error=message, finished_at=now, updated_at=now, lease_until=None)
            )
        )
        if moved:
            insert_event(db, job_id, ErrorEvent(step=step, message=message), attempt, now)
        db.commit()
    return bool(moved)
