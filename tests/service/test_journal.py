"""The job's event journal (relay_worker.journal): what the next attempt replays after an outage."""

from __future__ import annotations

from pathlib import Path

from relay.events import CheckpointEvent, MetricsEvent, kind_of
from relay_worker.journal import EventJournal


def test_the_journal_gives_back_the_events_of_a_span_of_steps_in_order(tmp_path: Path) -> None:
    journal = EventJournal(tmp_path)
    for step in (10, 20, 30):
        journal.append({"step": step, "loss": 0.5})
        journal.append({"step": step, "event": "checkpoint"})
    journal.append({"step": 30, "event": "finished"})
    with open(journal.path, "a") as file:
        file.write('{"step": 40, "lo')  # a line cut short by a crash
    assert journal.between(20, 40) == [
        {"step": 20, "loss": 0.5},
        {"step": 20, "event": "checkpoint"},
        {"step": 30, "loss": 0.5},
        {"step": 30, "event": "checkpoint"},
    ]  # never `finished`: the attempt that reaches the end reports it
    assert EventJournal(tmp_path / "elsewhere").between(0, 100) == []


def test_a_journal_that_cannot_be_written_does_not_stop_the_job(tmp_path: Path) -> None:
    journal = EventJournal(tmp_path / "missing")  # no such directory: every append fails
    journal.append({"step": 10, "event": "checkpoint"})
    assert journal.between(0, 100) == []


def test_a_checkpoint_whose_event_was_never_noted_is_reported_by_the_attempt_resuming_from_it(
    tmp_path: Path,
) -> None:
    # The attempt wrote checkpoint 30 and was frozen (or killed) before noting it: the next attempt
    # resumes from it, so its event must still reach the job's events (seen once in CI: a job's
    # checkpoint events skipped 30 after a freeze).
    journal = EventJournal(tmp_path)
    for step in (10, 20, 30):
        journal.append(MetricsEvent(step=step, loss=0.5, grad_norm=1.0, lr=1e-3))
        if step < 30:
            journal.append(CheckpointEvent(step=step, seconds=0.1))
    replayed = journal.to_replay(20, 30)
    assert [(kind_of(e), e.step) for e in replayed] == [
        ("metrics", 20),
        ("checkpoint", 20),
        ("metrics", 30),
        ("checkpoint", 30),
    ]
    assert replayed[-1] == CheckpointEvent(step=30, seconds=None)  # how long it took is not known
    # Noted, it is replayed as noted, once.
    journal.append(CheckpointEvent(step=30, seconds=0.2))
    assert [e for e in journal.to_replay(30, 30) if kind_of(e) == "checkpoint"] == [
        CheckpointEvent(step=30, seconds=0.2)
    ]
