"""Webhook deliveries, derived from the jobs' rows and sent by each worker's reconciler thread.

Every pass (`Dispatcher.run_pass`, every `reconcile_seconds`):

1. Derive: each webhook gets a delivery row for each of its user's jobs that ended (a terminal
   status its events name) after the webhook was created, and for each closed-loop evaluation
   (`eval` event) a job finished since (fine_tune.evaluated). The rows are derived from the jobs'
   rows and events, not written by the code that ends a job, so no way of ending one (the worker's
   end, the reconciler's, the API's cancel of a queued job) can be missed; (webhook, job, type,
   step) is unique, so two workers' passes write a delivery once.
2. Send: due deliveries are claimed in one atomic UPDATE that moves their `next_attempt_at` past the
   attempt's time limit (rows another worker is claiming are skipped), and sent on a small pool of
   threads of their own. The pass never waits for a receiver: a receiver that is down or slow costs
   one thread of that pool for at most `webhook_timeout_seconds`, never the reconciler, a job or an
   API request. A worker lost while sending leaves the claim to lapse: the delivery is due again
   (at least once: a receiver may see one event twice, and tells by its `webhook-id`).

Each answer is recorded on the row, fenced by the claim: a 2xx is `delivered`; anything else is
retried after the next delay of `webhook_retry_seconds` (the last repeating), until
`webhook_max_attempts` or `webhook_give_up_seconds` after the event, then `failed`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import secrets
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from sqlalchemy import Text, and_, cast, exists, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from relay import __version__, webhook_signature
from relay.events import EvalEvent
from relay.webhooks import EVENT_OF_STATUS, FINE_TUNE_EVALUATED
from relay_api.db import rows_changed, utcnow
from relay_api.models import fine_tune_events, fine_tunes, webhook_deliveries, webhooks
from relay_api.settings import Settings
from relay_api.webhook_addresses import RefusedAddress, public_address

log = logging.getLogger(__name__)

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
EVENT_ID_PREFIX = "evt_"
# Jobs looked at per pass; the rest are found by the next passes.
DERIVE_BATCH = 500
# Beyond the attempt's own time limit, how long a claim holds a delivery from other workers.
CLAIM_MARGIN_SECONDS = 30.0
ERROR_MAX = 200


def new_event_id() -> str:
    return EVENT_ID_PREFIX + secrets.token_hex(12)


def event_body(event_id: str, event_type: str, data: Mapping[str, Any], at: dt.datetime) -> str:
    """The event, thin as OpenAI's: what happened to which job (``data``: its id and status, or the
    step of its evaluation); the receiver reads the rest from the API with its key (nothing in the
    body needs protecting beyond the signature)."""
    event = {
        "id": event_id,
        "object": "event",
        "type": event_type,
        "created_at": int(at.timestamp()),
        "data": dict(data),
    }
    return json.dumps(event, separators=(",", ":"))


def derive(db: Session, settings: Settings, now: dt.datetime) -> int:
    """Write the missing deliveries of jobs that ended, and of evaluations that jobs finished, since
    their webhook was created (and within the give-up window: an older event would only be given
    up); returns how many were written."""
    rows = _ended_jobs(db, settings, now) + _evaluations(db, settings, now)
    if not rows:
        db.rollback()
        return 0
    dialect = postgresql if db.get_bind().dialect.name == "postgresql" else sqlite
    try:
        # Another worker's pass may have written some of them since: those are left as they are.
        written = db.execute(dialect.insert(webhook_deliveries).values(rows).on_conflict_do_nothing())
        db.commit()
    except IntegrityError:  # a webhook deleted meanwhile: the next pass finds the rest again
        db.rollback()
        log.info("webhooks: a webhook was deleted while its deliveries were written; trying next pass")
        return 0
    return rows_changed(written)


def _delivery(
    webhook_id: str, job_id: str, event_type: str, data: Mapping[str, Any], at: dt.datetime, now: dt.datetime
) -> dict[str, Any]:
    event_id = new_event_id()
    return {
        "id": event_id,
        "webhook_id": webhook_id,
        "job_id": job_id,
        "type": event_type,
        "step": int(data.get("step", -1)),
        "payload": event_body(event_id, event_type, data, at),
        "status": PENDING,
        "attempts": 0,
        "next_attempt_at": now,
        "created_at": now,
    }


def _evaluations(db: Session, settings: Settings, now: dt.datetime) -> list[dict[str, Any]]:
    """The deliveries of fine_tune.evaluated not yet written: one per `eval` event of a webhook's
    user's job, reported after the webhook was created."""
    events_text = cast(webhooks.c.events, Text)
    delivered_already = exists().where(
        webhook_deliveries.c.webhook_id == webhooks.c.id,
        webhook_deliveries.c.job_id == fine_tune_events.c.job_id,
        webhook_deliveries.c.type == FINE_TUNE_EVALUATED,
        webhook_deliveries.c.step == fine_tune_events.c.step,
    )
    since = now - dt.timedelta(seconds=settings.webhook_give_up_seconds)
    found = db.execute(
        select(webhooks.c.id, fine_tunes.c.id, fine_tune_events.c.step, fine_tune_events.c.created_at)
        .join(fine_tunes, fine_tunes.c.user_id == webhooks.c.user_id)
        .join(fine_tune_events, fine_tune_events.c.job_id == fine_tunes.c.id)
        .where(
            fine_tune_events.c.kind == EvalEvent.kind,
            # A job that ended before the give-up window has no evaluation left to send.
            or_(fine_tunes.c.finished_at.is_(None), fine_tunes.c.finished_at >= since),
            fine_tune_events.c.created_at >= webhooks.c.created_at,
            fine_tune_events.c.created_at >= since,
            events_text.like(f'%"{FINE_TUNE_EVALUATED}"%'),
            ~delivered_already,
        )
        .order_by(fine_tune_events.c.created_at)
        .limit(DERIVE_BATCH)
    ).all()
    return [
        _delivery(webhook_id, job_id, FINE_TUNE_EVALUATED, {"id": job_id, "step": step}, reported_at, now)
        for webhook_id, job_id, step, reported_at in found
    ]


def _ended_jobs(db: Session, settings: Settings, now: dt.datetime) -> list[dict[str, Any]]:
    """The deliveries of jobs' ends not yet written."""
    # A webhook's events are a JSON list of known names, none a part of another's quoted name, so
    # its text holding '"fine_tune.failed"' says the same as the list holding it, on both databases.
    events_text = cast(webhooks.c.events, Text)
    subscribed = or_(
        *(
            and_(fine_tunes.c.status == status, events_text.like(f'%"{event_type}"%'))
            for status, event_type in EVENT_OF_STATUS.items()
        )
    )
    delivered_already = exists().where(
        webhook_deliveries.c.webhook_id == webhooks.c.id,
        webhook_deliveries.c.job_id == fine_tunes.c.id,
        webhook_deliveries.c.type != FINE_TUNE_EVALUATED,
    )
    since = now - dt.timedelta(seconds=settings.webhook_give_up_seconds)
    found = db.execute(
        select(webhooks.c.id, fine_tunes.c.id, fine_tunes.c.status, fine_tunes.c.finished_at)
        .join(fine_tunes, fine_tunes.c.user_id == webhooks.c.user_id)
        .where(
            fine_tunes.c.finished_at >= webhooks.c.created_at,
            fine_tunes.c.finished_at >= since,
            subscribed,
            ~delivered_already,
        )
        .order_by(fine_tunes.c.finished_at)
        .limit(DERIVE_BATCH)
    ).all()
    return [
        _delivery(
            webhook_id, job_id, EVENT_OF_STATUS[status], {"id": job_id, "status": status}, finished_at, now
        )
        for webhook_id, job_id, status, finished_at in found
    ]


def claim(db: Session, settings: Settings, now: dt.datetime, limit: int) -> list[dict[str, Any]]:
    """Claim up to `limit` due deliveries for this worker, with what sending them takes."""
    claimed_until = now + dt.timedelta(seconds=settings.webhook_timeout_seconds + CLAIM_MARGIN_SECONDS)
    due = (
        select(webhook_deliveries.c.id)
        .where(webhook_deliveries.c.status == PENDING, webhook_deliveries.c.next_attempt_at <= now)
        .order_by(webhook_deliveries.c.next_attempt_at)
        .limit(limit)
        # Rows another worker is claiming are skipped, never waited for (SQLite: one writer at a time).
        .with_for_update(skip_locked=True)
    )
    ids = (
        db.execute(
            update(webhook_deliveries)
            .where(webhook_deliveries.c.id.in_(due), webhook_deliveries.c.status == PENDING)
            .values(next_attempt_at=claimed_until)
            .returning(webhook_deliveries.c.id)
        )
        .scalars()
        .all()
    )
    db.commit()
    if not ids:
        return []
    rows = (
        db.execute(
            select(
                webhook_deliveries.c.id,
                webhook_deliveries.c.payload,
                webhook_deliveries.c.attempts,
                webhook_deliveries.c.created_at,
                webhooks.c.url,
                webhooks.c.secret,
            )
            .join(webhooks, webhooks.c.id == webhook_deliveries.c.webhook_id)
            .where(webhook_deliveries.c.id.in_(ids))
        )
        .mappings()
        .all()
    )
    db.rollback()
    return [{**row, "claimed_until": claimed_until} for row in rows]


def next_attempt(
    settings: Settings, attempts: int, created_at: dt.datetime, now: dt.datetime
) -> dt.datetime | None:
    """When to try again after `attempts` failed attempts; None to give up."""
    if attempts >= settings.webhook_max_attempts:
        return None
    schedule = settings.webhook_retry_schedule
    due = now + dt.timedelta(seconds=schedule[min(attempts, len(schedule)) - 1])
    if due - created_at > dt.timedelta(seconds=settings.webhook_give_up_seconds):
        return None
    return due


def record(
    db: Session,
    settings: Settings,
    delivery: Mapping[str, Any],
    code: int | None,
    error: str | None,
    now: dt.datetime,
) -> None:
    """Write one attempt's outcome, if this worker's claim still holds the delivery."""
    attempts = delivery["attempts"] + 1
    values: dict[str, Any] = {"attempts": attempts, "last_response_code": code, "last_error": error}
    if code is not None and 200 <= code < 300:
        values.update(status=DELIVERED, delivered_at=now, next_attempt_at=None, last_error=None)
    else:
        due = next_attempt(settings, attempts, delivery["created_at"], now)
        values.update(status=PENDING if due else FAILED, next_attempt_at=due)
    written = db.execute(
        update(webhook_deliveries)
        .where(
            webhook_deliveries.c.id == delivery["id"],
            webhook_deliveries.c.status == PENDING,
            webhook_deliveries.c.next_attempt_at == delivery["claimed_until"],
        )
        .values(**values)
    )
    db.commit()
    if not rows_changed(written):  # deleted with its webhook, or the claim lapsed and another took it
        log.info(
            "webhooks: delivery %s changed hands while it was sent; its answer is not recorded",
            delivery["id"],
        )


def send(
    http: httpx.Client, delivery: Mapping[str, Any], private_addresses: bool
) -> tuple[int | None, str | None]:
    """One attempt: POST the signed body; the answer's status code, or why there was none. Unless
    `private_addresses`, only to a public address, the one checked (relay_api.webhook_addresses)."""
    body = delivery["payload"].encode()
    headers = {
        "content-type": "application/json",
        "user-agent": f"relay-webhooks/{__version__}",
        **webhook_signature.headers(delivery["secret"], delivery["id"], int(time.time()), body),
    }
    extensions: dict[str, Any] = {}
    try:
        url = httpx.URL(delivery["url"])
        if not private_addresses:
            address = public_address(url.host, url.port or (443 if url.scheme == "https" else 80))
            # To the address checked; the URL's host still names the receiver (Host, TLS's SNI
            # and the certificate's check).
            headers["host"] = url.netloc.decode("ascii")
            if url.scheme == "https":
                extensions["sni_hostname"] = url.host
            url = url.copy_with(host=address)
        # Streamed, and the answer's body never read: only its status matters, and a receiver
        # answering a large or endless body must not hold the thread.
        with http.stream("POST", url, content=body, headers=headers, extensions=extensions) as response:
            code = response.status_code
    except RefusedAddress as refused:
        return None, str(refused)[:ERROR_MAX]
    except httpx.HTTPError as error:
        return None, f"{type(error).__name__}: {error}"[:ERROR_MAX]
    except Exception as error:  # a URL httpx refuses late (an odd host): the receiver's fault, not ours
        return None, f"{type(error).__name__}: {error}"[:ERROR_MAX]
    return code, None if 200 <= code < 300 else f"HTTP {code}"


class Dispatcher:
    """The webhook pass of one worker's reconciler, and the threads that send for it."""

    def __init__(self, db_sessions: sessionmaker[Session], settings: Settings) -> None:
        self.db_sessions, self.settings = db_sessions, settings
        self.pool = ThreadPoolExecutor(settings.webhook_senders, thread_name_prefix="relay-webhook")
        # No redirects: a delivery goes to the URL its owner gave, and nowhere else.
        self.http = httpx.Client(timeout=settings.webhook_timeout_seconds, follow_redirects=False)
        self._busy = 0
        self._lock = threading.Lock()

    def run_pass(self) -> tuple[int, int]:
        """Derive new deliveries and start sending the due ones; returns how many of each."""
        now = utcnow()
        with self.db_sessions() as db:
            derived = derive(db, self.settings, now)
            with self._lock:
                free = self.settings.webhook_senders - self._busy
            claimed = claim(db, self.settings, now, free) if free > 0 else []
        for delivery in claimed:
            with self._lock:
                self._busy += 1
            self.pool.submit(self._attempt, delivery)
        return derived, len(claimed)

    def _attempt(self, delivery: Mapping[str, Any]) -> None:
        try:
            code, error = send(self.http, delivery, self.settings.webhook_private_addresses)
            with self.db_sessions() as db:
                record(db, self.settings, delivery, code, error, utcnow())
            if error:
                log.info("webhooks: delivery %s to %s: %s", delivery["id"], delivery["url"], error)
        except Exception:  # the database away: the claim lapses and the delivery is sent again
            log.exception("webhooks: could not record delivery %s", delivery["id"])
        finally:
            with self._lock:
                self._busy -= 1

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.http.close()
