"""A fine-tune's results card (relay.sft.summary.FineTuneSummary), computed in one place from the
job's row and its events, for ``GET /v1/fine-tunes/{id}/summary``: the console's job page, the
SDK's ``FineTuneJob.summary()`` and ``relay fine-tunes retrieve`` all read this answer.

It reads every event of the job (one indexed range scan), so it is a route of its own rather than
part of retrieve, which stays a single-row read: ``FineTuneJob.wait`` and the console poll that.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, select

from relay.events import METRICS, METRICS_EVERY, CheckpointEvent, PushedEvent, ResumedEvent, checkpoint_dir
from relay.progress import recent_rate
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
from relay_api.models import fine_tune_events

# The kinds of the held-out validation and closed-loop evaluation reports: the card shows their
# best and latest figures once a job reports them.
VALIDATION = "validation"
EVAL = "eval"

_EVENT_COLUMNS = tuple(fine_tune_events.c[name] for name in ("id", "created_at", "step", "kind", "data"))
_EVENT_KEYS = tuple(column.name for column in _EVENT_COLUMNS)
_JOBS_EVENTS = (
    select(*_EVENT_COLUMNS)
    .where(fine_tune_events.c.job_id == bindparam("job_id"))
    .order_by(fine_tune_events.c.id)
)


def job_summary(db: Db, user_id: int, job_id: str, work_dir: Path, now: dt.datetime) -> dict[str, Any]:
    """The caller's job's card, as the API answers it (404 for another user's job)."""
    row = get(db, user_id, job_id, shown_only=True)
    rows = db.execute(_JOBS_EVENTS, {"job_id": job_id}).all()
    events = [dict(zip(_EVENT_KEYS, event, strict=True)) for event in rows]
    db.rollback()  # end the read here, as fine_tunes.get does, before the answer is written
    return summarize(row, events, work_dir, now).model_dump(mode="json")


def summarize(
    job: Mapping[str, Any], events: Sequence[Mapping[str, Any]], work_dir: Path, now: dt.datetime
) -> FineTuneSummary:
    """The card of the job row `job` from its event rows (oldest first: id, created_at, step, kind,
    data), its checkpoints looked for in `work_dir`, at the time `now`."""
    config = job["config"]
    steps, status = int(config["steps"]), job["status"]
    pace = _Pace(batch_size=int(config["batch_size"]))
    # Plain tuples on this path: a long job has tens of thousands of metrics events.
    metrics: list[tuple[int, Mapping[str, Any]]] = []
    losses = _Losses()
    checkpoints: dict[int, Mapping[str, Any]] = {}
    reported: list[tuple[int, float]] = []  # (step, when its metrics event was written)
    validations: list[dict[str, Any]] = []
    evaluations: list[dict[str, Any]] = []
    pushed: dict[str, Any] | None = None
    for event in events:
        kind, step, data = shown_kind(event["kind"]), int(event["step"]), event["data"]
        if kind == METRICS:
            metrics.append((step, data))
            losses.add(step, data.get("loss"))
            pace.add_window(step, data)
            reported.append((step, event["created_at"].timestamp()))
        elif kind == ResumedEvent.kind:
            pace.restart_at(step)
            reported.clear()  # the ETA's pace is this attempt's
        elif kind == CheckpointEvent.kind:
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
    windows = _Windows(metrics)
    # Until a second report, the first window's own pace (its compute alone) stands in.
    recent = recent_rate(reported) or (_window_rate(metrics[-1][1]) if len(reported) == 1 else None)
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
        steps_per_second=pace.steps_per_second(),
        samples_per_second=pace.samples_per_second(),
        latest_steps_per_second=recent,
        loss=losses.summary(),
        metrics_note=None if metrics else _no_metrics_note(job, steps),
        checkpoints=[
            _checkpoint(checkpoints[at], windows, validations, evaluations, work_dir)
            for at in sorted(checkpoints)
        ],
        validation=validation_summary(validations),
        eval=eval_summary(evaluations),
        weights=job.get("weights"),
        use=model_use(job["id"], config["model"], config["dataset_name"], status, config.get("task")),
        pushed=HubPushed.model_validate(pushed) if pushed is not None else None,
    )


def _window_rate(window: Mapping[str, Any]) -> float | None:
    rate = window.get("steps_per_second")
    return float(rate) if isinstance(rate, int | float) and rate > 0 else None


class _Pace:
    """The run's training pace from its metrics windows: each window's steps over the time its
    ``steps_per_second`` says they took. A window is at most METRICS_EVERY steps: after a resume a
    lost attempt's events may be missing, and the gap is no window of the one that resumed."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.window_start = 0
        self.steps = 0
        self.samples = 0.0
        self.seconds = 0.0

    def restart_at(self, step: int) -> None:
        self.window_start = step

    def add_window(self, step: int, data: Mapping[str, Any]) -> None:
        length = min(step - self.window_start, METRICS_EVERY)
        self.window_start = step
        rate = data.get("steps_per_second")
        if not isinstance(rate, int | float) or rate <= 0:
            return
        if length <= 0:
            return
        seconds = length / rate
        self.steps += length
        self.seconds += seconds
        sample_rate = data.get("samples_per_second")
        if isinstance(sample_rate, int | float):
            self.samples += sample_rate * seconds
        else:  # an event without it: the recipe's batch at the window's pace
            self.samples += length * self.batch_size

    def steps_per_second(self) -> float | None:
        return self.steps / self.seconds if self.seconds > 0 else None

    def samples_per_second(self) -> float | None:
        return self.samples / self.seconds if self.seconds > 0 else None


class _Losses:
    """The first and latest training loss reported, and the lowest (the earliest on a tie)."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, float] | None = None
        self.best: tuple[int, float] | None = None

    def add(self, step: int, loss: float | None) -> None:
        if loss is None:
            return
        self.last = (step, loss)
        if self.first is None:
            self.first = self.last
        if self.best is None or loss < self.best[1]:
            self.best = self.last

    def summary(self) -> TrainingLoss:
        def at(found: tuple[int, float] | None) -> LossAt | None:
            return None if found is None else LossAt(step=found[0], loss=found[1])

        return TrainingLoss(first=at(self.first), last=at(self.last), best=at(self.best))


class _Windows:
    """The metrics events by step, to find the window that ends at a step (or the latest before it)."""

    def __init__(self, metrics: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        self.by_step = sorted(metrics, key=lambda window: window[0])
        self.steps = [step for step, _ in self.by_step]

    def at(self, step: int) -> tuple[int | None, Mapping[str, Any]]:
        """The window's step and figures; (None, {}) when none ends at or before `step`."""
        found = bisect.bisect_right(self.steps, step)
        return self.by_step[found - 1] if found else (None, {})


def _checkpoint(
    event: Mapping[str, Any],
    windows: _Windows,
    validations: Sequence[Mapping[str, Any]],
    evaluations: Sequence[Mapping[str, Any]],
    work_dir: Path,
) -> CheckpointSummary:
    """A checkpoint beside the metrics window that ends at its step (or the latest before it), and
    the validation and evaluation reported at its step."""
    step = int(event["step"])
    path = f"{CHECKPOINTS}/{checkpoint_dir(step)}"
    window_step, window = windows.at(step)
    return CheckpointSummary(
        step=step,
        path=path,
        kept=(work_dir / path / CHECKPOINT_MANIFEST).is_file(),
        created_at=iso(event["created_at"]),
        seconds=event["data"].get("seconds"),
        metrics_step=window_step,
        loss=window.get("loss"),
        grad_norm=window.get("grad_norm"),
        lr=window.get("lr"),
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
