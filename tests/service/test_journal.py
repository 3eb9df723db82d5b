"""The job's event journal (relay_worker.journal): what the next attempt replays after an outage."""

from __future__ import annotations

from pathlib import Path

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
