"""What the API remembers so that robots are answered while the database is away.

A deployment's policy server needs nothing of the database once it serves. A robot's request
needs it for two answers only: whose key it carries, and where that user's deployment is served
(its worker's address and secret). The API keeps both from its last successful reads and answers
from them while the database cannot be reached (docs/serving.md, "When the database is away");
every route that needs the database for more still answers 503.

While the database is found away, the API stops asking it for a moment (`OutageMemory.
skip_database`), so that each robot request does not wait for a connection that will fail (up to
the connect timeout behind a dead network); one request at a time tries it again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from relay_api.keys import hash_key

# How long the API answers from memory before it tries the database again (one request does).
RETRY_DATABASE_SECONDS = 2.0
# At most this many keys and deployments are remembered (a process serves far fewer).
MEMORY_LIMIT = 10_000
# What a deployment's relay reads of its row (relay_api.deployment_routes).
ROUTE_FIELDS = (
    "id",
    "user_id",
    "status",
    "error",
    "attempt",
    "internal_url",
    "internal_token",
    "stop_requested_at",
)


class OutageMemory:
    """The users of keys and the routes of deployments, as last read from the database, and
    whether the database was found away a moment ago."""

    def __init__(self, retry_seconds: float = RETRY_DATABASE_SECONDS, limit: int = MEMORY_LIMIT) -> None:
        self.retry_seconds = retry_seconds
        self.limit = limit
        self._users: dict[str, int] = {}  # key digest -> user id
        self._routes: dict[str, dict[str, Any]] = {}  # deployment id -> ROUTE_FIELDS
        self._away_until: float | None = None  # monotonic; None: the database answered last
        self._lock = threading.Lock()

    def skip_database(self) -> bool:
        """Whether to answer from memory without asking the database: it was found away less than
        `retry_seconds` ago. When that has passed, this caller is let through to try it again (and
        the others keep answering from memory meanwhile)."""
        with self._lock:
            if self._away_until is None:
                return False
            now = time.monotonic()
            if now < self._away_until:
                return True
            self._away_until = now + self.retry_seconds
            return False

    def note_outage(self) -> None:
        with self._lock:
            self._away_until = time.monotonic() + self.retry_seconds

    def note_back(self) -> None:
        with self._lock:
            self._away_until = None

    def remember_key(self, key: str, user_id: int | None) -> None:
        """What the database said of `key` (None: no active key, which is forgotten)."""
        digest = hash_key(key)
        with self._lock:
            if user_id is None:
                self._users.pop(digest, None)
                return
            if len(self._users) >= self.limit:
                self._users.clear()
            self._users[digest] = user_id

    def user_of(self, key: str) -> int | None:
        with self._lock:
            return self._users.get(hash_key(key))

    def remember_deployment(self, row: Mapping[str, Any]) -> None:
        with self._lock:
            if len(self._routes) >= self.limit:
                self._routes.clear()
            self._routes[str(row["id"])] = {name: row[name] for name in ROUTE_FIELDS}

    def deployment(self, user_id: int, deployment_id: str) -> dict[str, Any] | None:
        """The user's deployment as last read; None if it was not read, or is another user's."""
        with self._lock:
            route = self._routes.get(deployment_id)
        return dict(route) if route is not None and route["user_id"] == user_id else None
