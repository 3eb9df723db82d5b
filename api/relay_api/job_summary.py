"""A fine-tune's results card (relay.sft.summary.FineTuneSummary), computed in one place from the
job's row and its events, for ``GET /v1/fine-tunes/{id}/summary``: the console's job page, the
SDK's ``FineTuneJob.summary()`` and ``relay fine-tunes retrieve`` all read this answer.

Most of a long job's events are metrics windows (one every 10 steps: a million for 10 million
steps), and the card only needs what they add up to: its pace, its losses, its latest reports. That
is folded as each metrics or resumed event is written, into the job's row of ``fine_tune_cards``
(relay_api.job_cards, relay_api.event_rows), so `job_summary` reads a constant few rows whatever the
job's length: the job, its card row, and its few events of other kinds (checkpoints, validation,
eval, pushes), each checkpoint with the metrics window at its step (an indexed probe). Its time
grows with those few, not with the metrics.

`summarize` is the reference: the card from every event of the job, folded with the same rules. The
route uses it when the stored reports cannot give the ETA's pace (CardState.recent_is_complete);
the tests check that both ways give the same card. A job without a card row (its events were
written before cards were kept, migration 0017) gets one at its card's first read, which folds its
events so far as a writer would.

It is a route of its own rather than part of retrieve, which stays a single-row read:
``FineTuneJob.wait`` and the console poll that.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, select

from relay.events import METRICS, METRICS_EVERY, CheckpointEvent, PushedEvent, checkpoint_dir
from relay.sft import status as st
from relay.sft.summary import (
    CheckpointSummary,
    FineTuneSummary,
    HubPushed,
    LossAt,
    TrainingLoss,
    eval_summary,
    model_use,
    validation_summary,
)
from relay_api.db import Db, iso
from relay_api.event_rows import shown_kind
from relay_api.files import CHECKPOINT_MANIFEST, CHECKPOINTS
from relay_api.fine_tunes import get
from relay_api.job_cards import FOLDED_KINDS, CardState
from relay_api.models import fine_tune_cards, fine_tune_events

# The kinds of the held-out validation and closed-loop evaluation reports: the card shows their
# best and latest figures once a job reports them.
VALIDATION = "validation"
EVAL = "eval"
# The kinds the card shows row by row: a job has a few of each (one a checkpoint at most).
CARD_KINDS = (CheckpointEvent.kind, VALIDATION, EVAL, PushedEvent.kind)

_EVENT_COLUMNS = tuple(fine_tune_events.c[name] for name in ("id", "created_at", "step", "kind", "data"))
_EVENT_KEYS = tuple(column.name for column in _EVENT_COLUMNS)
_JOBS_EVENTS = (
    select(*_EVENT_COLUMNS)
    .where(fine_tune_events.c.job_id == bindparam("job_id"))
    .order_by(fine_tune_events.c.id)
)
_CARD_STATE = select(fine_tune_cards.c.state).where(fine_tune_cards.c.job_id == bindparam("job_id"))


def _window_column(name: str) -> Any:
    """A column of the metrics window that ends at an event's step or the latest before it, as
    _Windows.at finds it: the highest step at or below it (one window a step: (job, step, kind) is
    unique), one probe of the (job, kind, step) index; NULL when there is none."""
    event, window = fine_tune_events, fine_tune_events.alias("window")
    return (
        select(window.c[name])
        .where(window.c.job_id == event.c.job_id, window.c.kind == METRICS, window.c.step <= event.c.step)
        .order_by(window.c.step.desc())
        .limit(1)
        .correlate(event)
        .scalar_subquery()
    )


# The job's events of CARD_KINDS (stored as they are named: stored_kind adds nothing to these), each
# with the metrics window at its step (a checkpoint's figures; the few others' are not used).
_CARDS_EVENTS = (
    select(
        *_EVENT_COLUMNS, _window_column("step").label("window_step"), _window_column("data").label("window")
    )
    .where(fine_tune_events.c.job_id == bindparam("job_id"), fine_tune_events.c.kind.in_(CARD_KINDS))
    .order_by(fine_tune_events.c.id)
)

# A metrics window by step: its step and figures, or (None, {}) when there is none.
Window = tuple[int | None, Mapping[str, Any]]


def job_summary(
    db: Db,
    user_id: int,
    job_id: str,
    work_dir: Path,
    now: dt.datetime,
    fill_card: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The caller's job's card, as the API answers it (404 for another user's job). A job without a
    card row gets one through `fill_card` (event_rows.fill_card, in a transaction of its own), so
    that only its first read reads every event; without `fill_card`, every read does."""
    row = get(db, user_id, job_id, shown_only=True)
    stored = db.execute(_CARD_STATE, {"job_id": job_id}).scalar()
    if stored is None and fill_card is not None:
        db.rollback()  # end this read's snapshot, so that the next one sees the new row
        fill_card(job_id)
        stored = db.execute(_CARD_STATE, {"job_id": job_id}).scalar()
    state = CardState.from_json(stored)
    if state is None or not state.recent_is_complete():
        rows = db.execute(_JOBS_EVENTS, {"job_id": job_id}).all()
        db.rollback()  # end the read here, as fine_tunes.get does, before the answer is written
        events = [dict(zip(_EVENT_KEYS, event, strict=True)) for event in rows]
        return summarize(row, events, work_dir, now).model_dump(mode="json")
    shown = [dict(event) for event in db.execute(_CARDS_EVENTS, {"job_id": job_id}).mappings()]
    db.rollback()
    windows: dict[int, Window] = {
        event["step"]: (event["window_step"], event["window"] or {})
        for event in shown
        if event["kind"] == CheckpointEvent.kind
    }
    return _card(row, state, shown, windows.__getitem__, work_dir, now).model_dump(mode="json")


def summarize(
    job: Mapping[str, Any], events: Sequence[Mapping[str, Any]], work_dir: Path, now: dt.datetime
) -> FineTuneSummary:
    """The card of the job row `job` from its event rows (oldest first: id, created_at, step, kind,
    data), its checkpoints looked for in `work_dir`, at the time `now`."""
    state = CardState(batch_size=int(job["config"]["batch_size"]), keep_all_reports=True)
    # Plain tuples on this path: a long job has tens of thousands of metrics events.
    metrics: list[tuple[int, Mapping[str, Any]]] = []
    shown: list[Mapping[str, Any]] = []
    for event in events:
        kind, step = shown_kind(event["kind"]), int(event["step"])
        if kind in FOLDED_KINDS:
            state.add(kind, step, event["data"], event["created_at"].timestamp())
        if kind == METRICS:
            metrics.append((step, event["data"]))
        elif kind in CARD_KINDS:
            shown.append(event)
    return _card(job, state, shown, _Windows(metrics).at, work_dir, now)


def _card(
    job: Mapping[str, Any],
    state: CardState,
    shown: Sequence[Mapping[str, Any]],
    window_at: Callable[[int], Window],
    work_dir: Path,
    now: dt.datetime,
) -> FineTuneSummary:
    """The card from the folded metrics (`state`), the events of CARD_KINDS (oldest first), and
    the metrics window at each checkpoint's step (`window_at`)."""
    config = job["config"]
    steps, status = int(config["steps"]), job["status"]
    checkpoints: dict[int, Mapping[str, Any]] = {}
    validations: list[dict[str, Any]] = []
    evaluations: list[dict[str, Any]] = []
    pushed: dict[str, Any] | None = None
    for event in shown:
        kind, step, data = shown_kind(event["kind"]), int(event["step"]), event["data"]
        if kind == CheckpointEvent.kind:
            checkpoints[step] = event
        elif kind == VALIDATION:
            validations.append({**data, "step": step})
        elif kind == EVAL:
            evaluations.append({**data, "step": step})
        elif kind == PushedEvent.kind:  # a recipe's hub block: the latest push is what the repo holds
            pushed = {**data, "step": step}

    created, started, finished = job["created_at"], job["started_at"], job["finished_at"]
    ended = status in st.TERMINAL
    end = finished if ended and finished is not None else now
    running = status == st.RUNNING
    step = int(job["step"])
    recent = state.latest_rate()
    return FineTuneSummary(
        id=job["id"],
        status=status,
        step=step,
        steps=steps,
        progress=min(1.0, step / steps) if steps else 0.0,
        queued_seconds=_seconds(created, started or end),
        elapsed_seconds=_seconds(started, end) if started is not None else None,
        duration_seconds=_seconds(started, finished) if ended and started and finished else None,
        eta_seconds=round(max(0, steps - step) / recent, 1) if running and recent else None,
        steps_per_second=state.pace.steps_per_second(),
        samples_per_second=state.pace.samples_per_second(),
        latest_steps_per_second=recent,
        loss=_losses(state),
        metrics_note=None if state.metrics else _no_metrics_note(job, steps),
        checkpoints=[
            _checkpoint(checkpoints[at], window_at(at), validations, evaluations, work_dir)
            for at in sorted(checkpoints)
        ],
        validation=validation_summary(validations),
        eval=eval_summary(evaluations),
        weights=job.get("weights"),
        use=model_use(job["id"], config["model"], config["dataset_name"], status, config.get("task")),
        pushed=HubPushed.model_validate(pushed) if pushed is not None else None,
    )


def _losses(state: CardState) -> TrainingLoss:
    def at(found: tuple[int, float] | None) -> LossAt | None:
        return None if found is None else LossAt(step=found[0], loss=found[1])

    losses = state.losses
    return TrainingLoss(first=at(losses.first), last=at(losses.last), best=at(losses.best))


class _Windows:
    """The metrics events by step, to find the window that ends at a step (or the latest before it)."""

    def __init__(self, metrics: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        self.by_step = sorted(metrics, key=lambda window: window[0])
        self.steps = [step for step, _ in self.by_step]

    def at(self, step: int) -> Window:
        """The window's step and figures; (None, {}) when none ends at or before `step`."""
        found = bisect.bisect_right(self.steps, step)
        return self.by_step[found - 1] if found else (None, {})


def _checkpoint(
    event: Mapping[str, Any],
    window: Window,
    validations: Sequence[Mapping[str, Any]],
    evaluations: Sequence[Mapping[str, Any]],
    work_dir: Path,
) -> CheckpointSummary:
    """A checkpoint beside `window`, the metrics window that ends at its step (or the latest before
    it), and the validation and evaluation reported at its step."""
    step = int(event["step"])
    path = f"{CHECKPOINTS}/{checkpoint_dir(step)}"
    window_step, figures = window
    return CheckpointSummary(
        step=step,
        path=path,
        kept=(work_dir / path / CHECKPOINT_MANIFEST).is_file(),
        created_at=iso(event["created_at"]),
        seconds=event["data"].get("seconds"),
        metrics_step=window_step,
        loss=figures.get("loss"),
        grad_norm=figures.get("grad_norm"),
        lr=figures.get("lr"),
        validation=next((v for v in reversed(validations) if v["step"] == step), None),
        eval=next((e for e in reversed(evaluations) if e["step"] == step), None),
    )


def _no_metrics_note(job: Mapping[str, Any], steps: int) -> str:
    """Why a job has no metrics yet: what its charts wait for."""
    first = f"step {min(METRICS_EVERY, steps)}"
    status = job["status"]
    if status == st.QUEUED:
        return "no metrics yet: the job is queued, waiting for a worker"
    if status in (st.RUNNING, st.CANCEL_REQUESTED):
        if job.get("dataset") is None:
            return f"no metrics yet: the worker is loading the model and the data; the first come at {first}"
        return f"no metrics yet: training has started; the first come at {first}"
    if status == st.CANCELLED:
        when = "while it was queued" if job["started_at"] is None else f"before its first metrics ({first})"
        return f"no metrics: the job was cancelled {when}"
    if status == st.ERROR:
        return f"no metrics: the job failed before its first metrics ({first}); its error says why"
    return "no metrics: the job reported none"


def _seconds(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round(max(0.0, (end - start).total_seconds()), 1)
