"""A job's event rows, written and read in one place: the worker writes the engine's events and the
reconciler's, the API writes a queued job's cancel and serves them all.

A row holds the event's step, its kind and its other keys (`data`); the API's answer puts them back
together as the engine reported them, with the row's id and time, and the kind named (older rows,
written before events carried one, read the same).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from relay.events import METRICS, Event, ResumedEvent, RetryEvent, StageEvent, TrackerEvent
from relay_api.db import iso
from relay_api.models import fine_tune_events

# Events that can happen more than once at one step, once per attempt (a job retried twice before
# its next checkpoint). Events are unique per (job, step, kind), so these are stored with their
# attempt in the kind ("retry:3"), and shown without it.
PER_ATTEMPT_EVENTS = (RetryEvent.kind, ResumedEvent.kind)
# A stage event happens once per stage at a step (validating, then evaluating, at one checkpoint):
# stored with its stage in the kind ("stage:validating").
PER_STAGE_EVENTS = (StageEvent.kind,)
# A tracker's warning is once per tracker, and two trackers may fail at one step: stored with the
# tracker in the kind ("tracker:wandb").
PER_TRACKER_EVENTS = (TrackerEvent.kind,)
# The keys an event row keeps in columns of its own, not in `data`.
ROW_KEYS = frozenset({"step", "event", "kind"})


def stored_kind(kind: str, attempt: int, stage: str | None = None, tracker: str | None = None) -> str:
    if kind in PER_ATTEMPT_EVENTS:
        return f"{kind}:{attempt}"
    if kind in PER_STAGE_EVENTS:
        return f"{kind}:{stage}"
    if kind in PER_TRACKER_EVENTS:
        return f"{kind}:{tracker}"
    return kind


def shown_kind(stored: str) -> str:
    """A row's kind as the event's: without the attempt that stored_kind adds."""
    return stored.partition(":")[0]


def insert_event(db: Session, job_id: str, event: Event, attempt: int, now: dt.datetime) -> None:
    """Write one typed event as attempt `attempt` of the job (see insert_event_row)."""
    data = {key: value for key, value in event.items() if key not in ROW_KEYS}
    insert_event_row(db, job_id, event.step, event.kind, attempt, data, now)


def insert_event_row(
    db: Session, job_id: str, step: int, kind: str, attempt: int, data: dict[str, Any], now: dt.datetime
) -> None:
    """The one writer of event rows; once per (job, step, kind): a repeat (a replayed event, one
    written by two attempts) is stored once. An event that names its attempt (a retry, a resume) is
    stored under that attempt."""
    values = {
        "job_id": job_id,
        "step": step,
        "kind": stored_kind(kind, int(data.get("attempt", attempt)), data.get("stage"), data.get("tracker")),
        "attempt": attempt,
        "data": data,
        "created_at": now,
    }
    builder = pg_insert if db.get_bind().dialect.name == "postgresql" else sqlite_insert
    db.execute(
        builder(fine_tune_events)
        .values(values)
        .on_conflict_do_nothing(index_elements=["job_id", "step", "kind"])
    )


def event_object(row: Mapping[str, Any]) -> dict[str, Any]:
    """An event as the engine reported it (``{"step": 10, "loss": ...}``), with its id, time and kind."""
    kind = shown_kind(row["kind"])
    event: dict[str, Any] = {
        "id": row["id"],
        "object": "fine_tune.event",
        "created_at": iso(row["created_at"]),
        "step": row["step"],
        **row["data"],
    }
    if kind != METRICS:
        event["event"] = kind
    event["kind"] = kind
    return event
