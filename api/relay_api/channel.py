"""The channel between the API and the worker holding a session: calls in order, results back.

The API appends each call to the session's ordered queue under the number its client gave it (a
repeated number is a retry, and is not queued twice); the worker takes calls in that order, runs
each, and leaves its result, which the API hands to the client's long-poll. Results are written in
call order, so a result for call N means every call before N has run.

Two implementations, one interface: Redis streams and keys (production and the tests: the broker's
Redis, no second queue system), and the SQL database, polled (the embedded server, which has no
Redis). `Settings.session_channel` picks one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from relay_api.settings import Settings


@dataclass(frozen=True)
class QueuedCall:
    seq: int
    request_id: str | None
    payload: bytes


class ResultGone(Exception):
    """The call ran, but its result is no longer kept (or the call never arrived)."""


class TooManyPending(Exception):
    """The session already has the most calls waiting that it may have."""


class ChannelUnavailable(Exception):
    """Redis (or the database) cannot be reached now; the caller may try again shortly."""


class ApiChannel(ABC):
    """The API's side. Async: a long-poll waits without holding a thread."""

    @abstractmethod
    async def append(self, session_id: str, seq: int, request_id: str, payload: bytes) -> bool:
        """Queue call `seq`; False if a call with this number was queued already (a retry).
        Raise TooManyPending when the session's queue is full."""

    @abstractmethod
    async def wait_result(self, session_id: str, seq: int, block_seconds: float) -> bytes | None:
        """Call `seq`'s result, waiting up to `block_seconds` for it (None if it has not come).
        Raise ResultGone if it ran but its result is gone."""

    @abstractmethod
    async def aclose(self) -> None: ...


class WorkerChannel(ABC):
    """The worker's side."""

    @abstractmethod
    def next_call(self, session_id: str, after: int, block_seconds: float) -> QueuedCall | None:
        """The first call numbered above `after`, waiting up to `block_seconds` for one."""

    @abstractmethod
    def put_result(self, session_id: str, seq: int, payload: bytes) -> None:
        """Leave call `seq`'s result (kept for `session_result_seconds`); the call leaves the queue."""

    @abstractmethod
    def clear(self, session_id: str) -> None:
        """The session has ended: drop the calls that will never run (results stay until they expire)."""

    def close(self) -> None:  # noqa: B027 (nothing to release by default)
        """Release connections."""


def api_channel(settings: Settings) -> ApiChannel:
    if settings.session_channel == "redis":
        from relay_api.channel_redis import RedisApiChannel

        return RedisApiChannel(settings)
    from relay_api.channel_sql import SqlApiChannel

    return SqlApiChannel(settings)


def worker_channel(settings: Settings) -> WorkerChannel:
    if settings.session_channel == "redis":
        from relay_api.channel_redis import RedisWorkerChannel

        return RedisWorkerChannel(settings)
    from relay_api.channel_sql import SqlWorkerChannel

    return SqlWorkerChannel(settings)
