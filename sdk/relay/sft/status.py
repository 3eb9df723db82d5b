"""A recipe job's statuses and the only moves between them (docs/recipe-jobs.md, "Statuses")."""

from __future__ import annotations

QUEUED = "queued"  # accepted; waiting for a worker (its GPU is starting)
RUNNING = "running"
CANCEL_REQUESTED = "cancel_requested"
COMPLETED = "completed"
CANCELLED = "cancelled"
ERROR = "error"

STATUSES: tuple[str, ...] = (QUEUED, RUNNING, CANCEL_REQUESTED, COMPLETED, CANCELLED, ERROR)
TERMINAL: frozenset[str] = frozenset({COMPLETED, CANCELLED, ERROR})

# A terminal status never changes again. A running job whose worker is lost stays `running`
# while another attempt resumes it from its last checkpoint.
TRANSITIONS: dict[str, frozenset[str]] = {
    QUEUED: frozenset({RUNNING, CANCELLED}),
    RUNNING: frozenset({CANCEL_REQUESTED, COMPLETED, ERROR}),
    CANCEL_REQUESTED: frozenset({CANCELLED}),
    COMPLETED: frozenset(),
    CANCELLED: frozenset(),
    ERROR: frozenset(),
}
