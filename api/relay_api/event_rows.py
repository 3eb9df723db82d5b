"""A job's event rows, written and read in one place: the worker writes the engine's events and the
reconciler's, the API writes a queued job's cancel and serves them all.

A row holds the event's step, its kind and its other keys (`data`); the API's answer puts them back
together as the engine reported them, with the row's id and time, and the kind named (older rows,
written before events carried one, read the same).

A metrics or resumed event is also folded, in the same transaction, into the job's results card
(``fine_tune_cards``, relay_api.job_cards), so that the card need not read a long job's every
metrics event.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, bindparam, null, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker

from relay.events import METRICS, Event, ResumedEvent, RetryEvent, StageEvent, TrackerEvent
from relay_api.db import iso
from relay_api.job_cards import FOLDED_KINDS, CardState
from relay_api.models import fine_tune_cards, fine_tune_events, fine_tunes

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
    # The card's row is locked before the event row takes its id: two writers of one job's events
    # fold them one at a time, in the order of their ids, the order the card reads events in.
    card = locked_card(db, job_id) if shown_kind(kind) in FOLDED_KINDS else None
    written = db.execute(
        _insert(db, fine_tune_events)
        .values(values)
        .on_conflict_do_nothing(index_elements=["job_id", "step", "kind"])
        .returning(fine_tune_events.c.id)  # a row only if one was written (a Session's rowcount is -1)
    ).first()
    if card is not None:
        if written is not None:  # a repeat is no new event, for the card either
            card.add(shown_kind(kind), step, data, now.timestamp())
        save_card(db, job_id, card)


def _insert(db: Session, table: Any) -> Any:
    return (pg_insert if db.get_bind().dialect.name == "postgresql" else sqlite_insert)(table)


def _of_kinds(kinds: frozenset[str]) -> ColumnElement[bool]:
    """Rows whose kind shows as one of `kinds` (stored as it, or with an attempt: "resumed:2")."""
    column = fine_tune_events.c.kind
    return or_(column.in_(kinds), *(column.startswith(f"{kind}:") for kind in sorted(kinds)))


_CARD = (
    select(fine_tune_cards.c.state).where(fine_tune_cards.c.job_id == bindparam("job_id")).with_for_update()
)
_FOLDED_EVENTS = (
    select(
        fine_tune_events.c.created_at,
        fine_tune_events.c.step,
        fine_tune_events.c.kind,
        fine_tune_events.c.data,
    )
    .where(fine_tune_events.c.job_id == bindparam("job_id"), _of_kinds(FOLDED_KINDS))
    .order_by(fine_tune_events.c.id)
)


def locked_card(db: Session, job_id: str) -> CardState:
    """The job's card state, its row locked until the transaction ends. A job without one (before
    its first metrics or resumed event, or whose events were written before cards were kept) gets
    its row here, its events so far folded into it: the row is created locked, so no other writer
    folds an event of the job until this transaction ends."""
    found = db.execute(_CARD, {"job_id": job_id}).first()
    if found is None:
        db.execute(
            _insert(db, fine_tune_cards)
            .values(job_id=job_id, state=null())
            .on_conflict_do_nothing(index_elements=["job_id"])
        )
        found = db.execute(_CARD, {"job_id": job_id}).first()  # ours, or the row another writer made
    state = CardState.from_json(found.state) if found is not None else None
    if state is None:  # just made, or kept in an older form
        config = db.execute(select(fine_tunes.c.config).where(fine_tunes.c.id == job_id)).scalar_one()
        state = CardState(int(config["batch_size"]))
        for event in db.execute(_FOLDED_EVENTS, {"job_id": job_id}):
            state.add(shown_kind(event.kind), event.step, event.data, event.created_at.timestamp())
    return state


def save_card(db: Session, job_id: str, card: CardState) -> None:
    """Store the card state of locked_card, folded on."""
    db.execute(update(fine_tune_cards).where(fine_tune_cards.c.job_id == job_id).values(state=card.to_json()))


def fill_card(sessions: sessionmaker[Session], job_id: str) -> None:
    """Give a job without a card row (its events were written before cards were kept) its row, its
    events so far folded in, in a transaction of its own: a reader's, so that the next read of its
    card is constant time. The same locking as a writer's, so a writer's event is never lost."""
    with sessions() as db:
        save_card(db, job_id, locked_card(db, job_id))
        db.commit()


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
