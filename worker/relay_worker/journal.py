"""A job's events on disk, beside its checkpoints, so that none is lost to a database outage.

Every event the engine reports is appended here (one JSON line) before the lease keeper writes it
to the database. An attempt stopped by an outage cannot write what it buffered, and the next
attempt resumes from the last checkpoint, past those events: so the next attempt writes them from
here, those from the step the job last reported up to the checkpoint it resumes from (later steps
run again and report again). The database keeps one event per (job, step, kind), so an event
written twice (by two attempts, or by the replay and the original) is stored once.

The journal lives in the job's directory, which every attempt of the job reads (its checkpoints do
too). A line is written with one `write` in append mode, so lines of two attempts (a frozen one
that woke up) never interleave; a line cut short by a crash is skipped.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from relay.events import CheckpointEvent, Event, EventBase, FinishedEvent, event_line, parse_event

log = logging.getLogger("relay_worker")

JOURNAL = "events.jsonl"
# Reported again by whichever attempt reaches the end, so never replayed: a replayed one would come
# before the new attempt's `resumed`.
NOT_REPLAYED: tuple[type[EventBase], ...] = (FinishedEvent,)


class EventJournal:
    def __init__(self, work_dir: Path) -> None:
        self.path = Path(work_dir) / JOURNAL

    def append(self, event: Event) -> None:
        """Note one event, as it goes on the wire. After a checkpoint's event the file is flushed to
        disk: the events before a checkpoint must outlive the machine as the checkpoint does."""
        line = event_line(event) + "\n"
        try:
            with open(self.path, "a", encoding="utf-8") as file:
                file.write(line)
                if isinstance(event, CheckpointEvent):
                    file.flush()
                    os.fsync(file.fileno())
        except OSError as error:
            # A safety net for outages, not a reason to fail a job: a full disk is the checkpoint's
            # to report, in its own words; the event still goes to the database.
            log.warning("%s: could not note an event (%s)", self.path, error)

    def to_replay(self, reported_step: int, resumes_from: int) -> list[Event]:
        """What a resumed attempt writes before it trains: the noted events from the step the job
        last reported up to the checkpoint it resumes from, and that checkpoint's own event when it
        was never noted (an attempt frozen or killed between writing the checkpoint and noting it:
        the checkpoint is complete, and the job's events must say so; `seconds` is then unknown).
        Written twice, it is stored once (the database keeps one event per job, step and kind)."""
        events = self.between(reported_step, resumes_from)
        if not any(isinstance(event, CheckpointEvent) and event.step == resumes_from for event in events):
            events.append(CheckpointEvent(step=resumes_from, seconds=None))
        return events

    def between(self, first_step: int, last_step: int) -> list[Event]:
        """The noted events of steps `first_step` to `last_step`, in the order they were noted (lines
        noted before events carried their kind read as they were meant)."""
        if not self.path.is_file():
            return []
        events = []
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                event = parse_event(json.loads(line))
            except (ValueError, TypeError, AttributeError):  # a line cut short, or not an event
                log.warning("%s: skipped a line cut short: %.80s", self.path, line)
                continue
            if first_step <= event.step <= last_step and not isinstance(event, NOT_REPLAYED):
                events.append(event)
        return events
