"""A training session's statuses (docs/sessions.md, "Statuses").

starting: accepted; waiting for a free worker, then loading the model on it (``worker`` names it)
ready:    the model is loaded; calls run
closed:   ended by ``close()``, or after the idle timeout without contact from the client
error:    could not start, or its worker was lost or shut down (``error`` says which)
"""

from __future__ import annotations

STARTING = "starting"
READY = "ready"
CLOSED = "closed"
ERROR = "error"

STATUSES: tuple[str, ...] = (STARTING, READY, CLOSED, ERROR)
LIVE: tuple[str, ...] = (STARTING, READY)
ENDED: frozenset[str] = frozenset({CLOSED, ERROR})
