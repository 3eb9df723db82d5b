"""The results card as the route computes it (relay_api.job_summary.job_summary: the job's card row,
folded as its events are written, and its few other events) is the card of every event
(job_summary.summarize, the reference), on real PostgreSQL, for jobs of varied event sequences:
metrics with and without their figures, resumes, repeats, checkpoints between windows and at them,
validation and evaluation, pushes, reports out of time order, and events written before cards were
kept (folded at the job's next metrics event, or at its card's first read). (test_job_summary.py
checks the reference's figures themselves.)"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Connection, create_engine, insert, select, update
from sqlalchemy.orm import Session

from relay.events import checkpoint_dir
from relay.sft import status as st
from relay_api import job_summary, migrate
from relay_api.event_rows import insert_event_row, stored_kind
from relay_api.job_cards import MAX_RECENT, CardState
from relay_api.models import fine_tune_cards, fine_tune_events, fine_tunes, users
from tests.service.stack import Stack

START = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
NOW = START + dt.timedelta(hours=2)
summarize = job_summary.summarize  # the reference, kept before a test stands in for it

# (step, kind, seconds after START it is written, data)
Event = tuple[int, str, float, dict[str, Any]]


def at(seconds: float) -> dt.datetime:
    return START + dt.timedelta(seconds=seconds)


def metrics(
    step: int, written: float, loss: float | None = None, rate: float | None = 2.0, **more: Any
) -> Event:
    window: dict[str, Any] = {"grad_norm": 1.0, "lr": 1e-3, **more}
    if loss is not None:
        window["loss"] = loss
    if rate is not None:
        window["steps_per_second"] = rate
    return (step, "metrics", written, window)


def event(step: int, kind: str, written: float, **data: Any) -> Event:
    return (step, kind, written, data)


def pushed(step: int, written: float, commit: str) -> Event:
    return event(step, "pushed", written, repo_id="me/model", revision="main", private=True, commit=commit)


def varied() -> list[Event]:
    """Windows with and without loss, pace and samples; checkpoints at a window's step, between
    windows and before the first; validation and eval at checkpoints; a resume to an earlier step
    whose repeated window is stored once; a loss that ties the best; two pushes."""
    return [
        event(0, "dataset", 1, path="/data/dots", frames=100),
        metrics(10, 10, 0.9, 2.0, samples_per_second=8.0),
        metrics(20, 20, None, 4.0),
        event(20, "checkpoint", 25, seconds=0.25),
        event(20, "validation", 26, mean_action_mse=0.02, action_mse=0.03, blind_mse=0.05, chunks=4),
        event(20, "eval", 27, success_rate=0.4, episodes=20),
        metrics(30, 40, 0.7, None),
        event(35, "checkpoint", 45, seconds=0.5),
        metrics(40, 50, 0.5, 0.0),
        event(30, "resumed", 200, attempt=2),
        metrics(40, 210, 0.45, 3.0),  # a repeat of step 40: stored once, folded once
        metrics(50, 215, 0.5, 5.0, samples_per_second=20.0),  # ties the best: the earliest stays
        event(50, "checkpoint", 216, seconds=1.5),
        event(50, "validation", 217, mean_action_mse=0.01, action_mse=0.02, blind_mse=0.05, chunks=4),
        event(50, "eval", 218, success_rate=0.6),
        pushed(50, 219, "abc"),
        metrics(60, 290, 0.6, 5.0),  # over a minute after the one before
        metrics(70, 295, 0.55, 5.0),
        event(5, "checkpoint", 300, seconds=0.1),  # before any window
        event(70, "retry", 301, attempt=3, reason="lost"),
        pushed(70, 302, "def"),
    ]


def long_run(reports: int, every: float, resume_at: int | None = None) -> list[Event]:
    """`reports` windows `every` seconds apart (each tenth a little late), a checkpoint every 10,
    and a resume back to `resume_at` halfway."""
    events: list[Event] = []
    written = 0.0
    step = 0
    for n in range(1, reports + 1):
        written += every * (7 if n % 10 == 0 else 1)
        step += 10
        events.append(metrics(step, written, 1 / n, 2.0 + n % 3, samples_per_second=8.0 * n))
        if n % 10 == 0:
            events.append(event(step, "checkpoint", written + 0.5, seconds=0.5))
        if resume_at is not None and n == reports // 2:
            events.append(event(resume_at, "resumed", written + 100, attempt=2))
            written += 100
            step = resume_at
    return events


@pytest.fixture(scope="module")
def owner(stack: Stack) -> dict[str, str]:
    """The request headers of the jobs' user."""
    return {"authorization": f"Bearer {stack.new_user()[1]}"}


@pytest.fixture(scope="module")
def new_job(stack: Stack, parked: TestClient, owner: dict[str, str]) -> Callable[..., str]:
    """A job (parked: no worker takes it) with its row as a worker would have left it."""

    def create(status: str = st.RUNNING, step: int = 0, steps: int = 1000, **row: Any) -> str:
        body = {"model": "pi05-tiny", "dataset_name": "lerobot/pusht_image", "steps": steps, "batch_size": 4}
        answer = parked.post("/v1/fine-tunes", json=body, headers=owner)
        assert answer.status_code == 200, answer.text
        job_id = str(answer.json()["id"])
        values = {"status": status, "step": step, "created_at": at(-5), **row}
        if status != st.QUEUED:
            values.setdefault("started_at", at(0))
        with stack.sessions() as session:
            session.execute(update(fine_tunes).where(fine_tunes.c.id == job_id).values(values))
            session.commit()
        return job_id

    return create


@pytest.fixture
def db(stack: Stack) -> Iterator[Connection]:
    with stack.sessions.kw["bind"].connect() as connection:
        yield connection


def write(stack: Stack, job_id: str, events: list[Event]) -> None:
    """As a worker writes them: one transaction an event, through the one writer."""
    for step, kind, written, data in events:
        with stack.sessions() as session:
            insert_event_row(session, job_id, step, kind, int(data.get("attempt", 1)), data, at(written))
            session.commit()


def reference(db: Connection, job_id: str, work_dir: Path) -> dict[str, Any]:
    """The card from every event of the job (summarize), as the route answers it."""
    row = dict(db.execute(select(fine_tunes).where(fine_tunes.c.id == job_id)).mappings().one())
    events = db.execute(
        select(fine_tune_events).where(fine_tune_events.c.job_id == job_id).order_by(fine_tune_events.c.id)
    ).mappings()
    db.rollback()
    return summarize(row, [dict(e) for e in events], work_dir, NOW).model_dump(mode="json")


def card(db: Connection, job_id: str, work_dir: Path) -> dict[str, Any]:
    user_id = db.execute(select(fine_tunes.c.user_id).where(fine_tunes.c.id == job_id)).scalar_one()
    return job_summary.job_summary(db, user_id, job_id, work_dir, NOW)


def folded_card(
    db: Connection, job_id: str, work_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """The route's card, which must come from the card row: reading every event is refused."""

    def every_event(*args: Any) -> Any:
        raise AssertionError("the card read every event of the job")

    with monkeypatch.context() as patched:
        patched.setattr(job_summary, "summarize", every_event)
        return card(db, job_id, work_dir)


def stored_state(db: Connection, job_id: str) -> CardState | None:
    stored = db.execute(select(fine_tune_cards.c.state).where(fine_tune_cards.c.job_id == job_id)).scalar()
    db.rollback()
    return CardState.from_json(stored)


@pytest.mark.parametrize(
    ("events", "row"),
    [
        pytest.param(varied(), {"step": 70}, id="varied"),
        pytest.param(varied(), {"status": st.COMPLETED, "step": 70, "finished_at": at(400)}, id="completed"),
        pytest.param([metrics(10, 30, 0.9, 2.5)], {"step": 10}, id="one-report"),
        pytest.param([metrics(10, 30, 0.9, None)], {"step": 10}, id="one-report-without-pace"),
        pytest.param(
            [event(0, "resumed", 5, attempt=2), metrics(10, 30, 0.9)], {"step": 10}, id="resume-first"
        ),
        pytest.param(long_run(300, 1.0), {"step": 3000, "steps": 5000}, id="long"),
        pytest.param(long_run(300, 3.0, resume_at=1000), {"step": 2500, "steps": 5000}, id="long-resumed"),
        pytest.param(long_run(40, 30.0), {"step": 400}, id="sparse"),
        pytest.param(
            [*long_run(40, 30.0), event(400, "resumed", 9000, attempt=2)], {"step": 400}, id="resumed-last"
        ),
    ],
)
def test_the_folded_card_is_the_card_of_every_event(
    stack: Stack,
    new_job: Callable[..., str],
    db: Connection,
    events: list[Event],
    row: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_id = new_job(**row)
    kept = tmp_path / "checkpoints" / checkpoint_dir(20)
    kept.mkdir(parents=True)
    (kept / "manifest.json").write_text("{}")
    write(stack, job_id, events)
    expected = reference(db, job_id, tmp_path)
    assert folded_card(db, job_id, tmp_path, monkeypatch) == expected


def test_the_varied_card_has_what_the_events_say(
    stack: Stack, new_job: Callable[..., str], db: Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above is of cards with the figures they should have (a card of nothing would
    compare equal too)."""
    job_id = new_job(step=70)
    write(stack, job_id, varied())
    shown = folded_card(db, job_id, tmp_path, monkeypatch)
    assert [(c["step"], c["metrics_step"]) for c in shown["checkpoints"]] == [
        (5, None),
        (20, 20),
        (35, 30),
        (50, 50),
    ]
    assert shown["loss"]["best"] == {"step": 40, "loss": 0.5} and shown["loss"]["first"]["step"] == 10
    assert shown["pushed"]["commit"] == "def" and shown["validation"]["scored"] == 2
    assert shown["latest_steps_per_second"] == pytest.approx(10 / 5)  # steps 60 to 70 in 5 s
    state = stored_state(db, job_id)
    assert state is not None and (state.metrics, state.reports) == (7, 3)  # the repeat of step 40 is once


def test_jobs_without_metrics(
    stack: Stack, new_job: Callable[..., str], db: Connection, tmp_path: Path
) -> None:
    """No events (queued, or running before its first report), or only a cancel: no card row."""
    for job_id in (new_job(st.QUEUED), new_job()):
        assert card(db, job_id, tmp_path) == reference(db, job_id, tmp_path)
        assert card(db, job_id, tmp_path)["metrics_note"] is not None
    cancelled = new_job(st.QUEUED)
    write(stack, cancelled, [event(0, "cancelled", 3)])
    assert card(db, cancelled, tmp_path) == reference(db, cancelled, tmp_path)


def test_a_stored_card_keeps_a_minute_of_reports(
    stack: Stack, new_job: Callable[..., str], db: Connection
) -> None:
    job_id = new_job(step=3000, steps=5000)
    write(stack, job_id, long_run(300, 1.0))
    state = stored_state(db, job_id)
    assert state is not None and state.reports == 300 and 3 <= len(state.recent) < 80
    assert state.recent_is_complete()


@pytest.mark.parametrize(
    "events",
    [
        # Written out of time order: the reports the card dropped may be within the latest's minute.
        pytest.param([*long_run(100, 1.0), metrics(1010, 20, 0.1)], id="time-goes-back"),
        # More reports in a minute than a card keeps.
        pytest.param(
            [metrics(10 * n, n * 0.05, 1 / n) for n in range(1, MAX_RECENT + 20)], id="many-in-a-minute"
        ),
    ],
)
def test_reports_the_card_cannot_keep_are_read_from_the_events(
    stack: Stack, new_job: Callable[..., str], db: Connection, tmp_path: Path, events: list[Event]
) -> None:
    job_id = new_job(step=events[-1][0], steps=20_000)
    write(stack, job_id, events)
    state = stored_state(db, job_id)
    assert state is not None and not state.recent_is_complete()
    assert card(db, job_id, tmp_path) == reference(db, job_id, tmp_path)


def test_events_written_before_cards_are_folded_at_the_next_one(
    stack: Stack, new_job: Callable[..., str], db: Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job running across the migration that added cards: its events so far have no card row, so
    its card reads them all, until its next metrics event folds them into a new row."""
    job_id = new_job(step=200)
    earlier = long_run(19, 2.0)
    with stack.sessions() as session:
        for step, kind, written, data in [*earlier, event(100, "resumed", 100, attempt=2)]:
            row = {"job_id": job_id, "step": step, "kind": stored_kind(kind, 2), "attempt": 1, "data": data}
            session.execute(insert(fine_tune_events).values({**row, "created_at": at(written)}))
        session.commit()
    assert stored_state(db, job_id) is None
    assert card(db, job_id, tmp_path) == reference(db, job_id, tmp_path)
    write(stack, job_id, [metrics(200, 150, 0.01), metrics(210, 155, 0.02)])
    assert folded_card(db, job_id, tmp_path, monkeypatch) == reference(db, job_id, tmp_path)


def test_the_route_answers_the_folded_card(
    stack: Stack, parked: TestClient, owner: dict[str, str], new_job: Callable[..., str], db: Connection
) -> None:
    job_id = new_job(st.COMPLETED, step=70, finished_at=at(400))  # its card does not change with the time
    write(stack, job_id, varied())
    answer = parked.get(f"/v1/fine-tunes/{job_id}/summary", headers=owner)
    assert answer.status_code == 200, answer.text
    assert answer.json() == reference(db, job_id, stack.settings.job_dir(job_id))


def test_a_job_from_before_cards_gets_its_row_at_its_first_read(
    stack: Stack,
    parked: TestClient,
    owner: dict[str, str],
    new_job: Callable[..., str],
    db: Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job that ended before cards were kept has no row, and no event will come to fold its events
    into one: the route's first read folds them (as a writer would), and every read after it takes
    the row, never every event."""
    job_id = new_job(st.COMPLETED, step=400, finished_at=at(9000))
    with stack.sessions() as session:
        for step, kind, written, data in [*long_run(40, 30.0), event(400, "resumed", 8000, attempt=2)]:
            row = {"job_id": job_id, "step": step, "kind": stored_kind(kind, 2), "attempt": 1, "data": data}
            session.execute(insert(fine_tune_events).values({**row, "created_at": at(written)}))
        session.commit()
    assert stored_state(db, job_id) is None
    expected = reference(db, job_id, stack.settings.job_dir(job_id))
    first = parked.get(f"/v1/fine-tunes/{job_id}/summary", headers=owner)
    assert first.status_code == 200, first.text
    assert first.json() == expected
    assert stored_state(db, job_id) is not None

    def every_event(*args: Any) -> Any:
        raise AssertionError("the card read every event of the job")

    monkeypatch.setattr(job_summary, "summarize", every_event)
    again = parked.get(f"/v1/fine-tunes/{job_id}/summary", headers=owner)
    assert again.status_code == 200, again.text
    assert again.json() == expected


def test_the_folded_card_on_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded service's database folds the same card (no row locks there: SQLite has one writer)."""
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    migrate.upgrade(url)
    engine = create_engine(url)
    config = {"model": "pi05-tiny", "dataset_name": "/data/dots", "steps": 1000, "batch_size": 4}
    with Session(engine) as session:
        user_id = session.execute(
            insert(users).values(name="u", created_at=at(0)).returning(users.c.id)
        ).scalar_one()
        for job_id, events in (("ft-varied", varied()), ("ft-long", long_run(200, 1.0, resume_at=500))):
            row = {"id": job_id, "user_id": user_id, "config": config, "status": st.RUNNING, "step": 70}
            times = {"created_at": at(-5), "updated_at": at(0), "started_at": at(0)}
            session.execute(insert(fine_tunes).values({**row, **times, "attempt": 1, "handovers": 0}))
            for step, kind, written, data in events:
                insert_event_row(session, job_id, step, kind, 1, data, at(written))
        session.commit()
    with engine.connect() as db:
        for job_id in ("ft-varied", "ft-long"):
            expected = reference(db, job_id, tmp_path)
            assert folded_card(db, job_id, tmp_path, monkeypatch) == expected
    engine.dispose()
