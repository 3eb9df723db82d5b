"""Notes that a job's message reached the broker, written off the request's path.

The note only tells the reconciler that a queued job's message was handed over, so that it does
not publish it again after its few seconds of grace. Losing a note costs at most a duplicate
message, which finds the job taken and does nothing; so a create request does not wait for it.
A background thread writes the notes in batches, one statement for many jobs.
"""

from __future__ import annotations

import logging
import queue
import threading

from sqlalchemy.orm import Session, sessionmaker

from relay_api import fine_tunes

log = logging.getLogger(__name__)

# How long the writer gathers notes before one statement writes them: well inside the
# reconciler's grace (at least a few seconds), and a handful of round trips a second under load.
BATCH_SECONDS = 0.05


class EnqueuedNotes:
    def __init__(self, db_sessions: sessionmaker[Session]) -> None:
        self._db_sessions = db_sessions
        self._pending: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="relay-enqueued-notes", daemon=True)
        self._thread.start()

    def note(self, job_id: str) -> None:
        self._pending.put(job_id)

    def close(self) -> None:
        """Write what is pending and stop."""
        self._pending.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._pending.get()
            if first is None:
                break
            batch = [first]
            try:
                while True:
                    item = self._pending.get(timeout=BATCH_SECONDS)
                    if item is None:
                        stopping = True
                        break
                    batch.append(item)
            except queue.Empty:
                pass
            try:
                with self._db_sessions() as db:
                    fine_tunes.mark_enqueued(db, batch)
            except Exception:  # the reconciler publishes these jobs again; a duplicate is harmless
                log.warning("could not note %d jobs as enqueued", len(batch), exc_info=True)
