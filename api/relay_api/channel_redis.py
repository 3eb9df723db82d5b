"""The session channel on Redis: a stream of calls, a key per result, a stream that says "done".

    relay:session:<id>:calls       stream; entry id "<seq>-0" (so a retried number is refused by
                                   Redis itself), fields r (request id) and p (the call's body) or,
                                   for a body of BIG_BODY bytes or more, b (the key holding it)
    relay:session:<id>:body:<n>    the body of a big call n, until the worker takes it
    relay:session:<id>:result:<n>  the result of call n, expiring after session_result_seconds
    relay:session:<id>:done        stream; entry "<n>-0" once call n's result is written

A big body (a batch of frames) lives in a plain key rather than in the stream: Redis moves a
string in and out with fewer copies than a stream entry (about a third less CPU for 10 MB).

A long-poll XREADs "done" from just below its call's number: Redis answers at once if the result
is there, else wakes the reader when it comes; readers never consume anything, so any number of
them (a retried poll, two threads) can wait on one call. The worker deletes each call it has run,
so the stream's length is the number of calls waiting.
"""

from __future__ import annotations

from typing import Any, cast

import redis
import redis.asyncio as aioredis

from relay_api.channel import (
    ApiChannel,
    ChannelUnavailable,
    QueuedCall,
    ResultGone,
    TooManyPending,
    WorkerChannel,
)
from relay_api.settings import Settings

DONE_KEPT = 1000  # "done" entries kept per session (only the newest matter)
BIG_BODY = 64 * 1024
# Longer than any blocking read here (the API's at most 5 s, the worker's 0.5 s); redis-py's
# default of 5 s would cut a 5 s XREAD short.
SOCKET_TIMEOUT = 30.0


def _prefix(session_id: str) -> str:
    return f"relay:session:{session_id}:"


def _calls(session_id: str) -> str:
    return _prefix(session_id) + "calls"


def _done(session_id: str) -> str:
    return _prefix(session_id) + "done"


def _body(session_id: str, seq: int) -> str:
    return _prefix(session_id) + f"body:{seq}"


def _result(session_id: str, seq: int) -> str:
    return _prefix(session_id) + f"result:{seq}"


class RedisApiChannel(ApiChannel):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = aioredis.Redis.from_url(settings.redis_url, socket_timeout=SOCKET_TIMEOUT)

    async def append(self, session_id: str, seq: int, request_id: str, payload: bytes) -> bool:
        try:
            return await self._append(session_id, seq, request_id, payload)
        except (redis.ConnectionError, redis.TimeoutError) as error:
            raise ChannelUnavailable(str(error)) from error

    async def _append(self, session_id: str, seq: int, request_id: str, payload: bytes) -> bool:
        key = _calls(session_id)
        # The cap is checked first: a call refused for it must stay sendable under its number. (Two
        # requests of one session at once may overshoot it by one; it is a guard, not a count.)
        if await self.redis.xlen(key) >= self.settings.session_max_pending_calls:
            raise TooManyPending(session_id)
        # The queue outlives a quiet spell, not an abandoned session.
        ttl = int(max(self.settings.session_result_seconds, self.settings.session_idle_seconds)) + 60
        async with self.redis.pipeline(transaction=False) as pipe:
            if len(payload) >= BIG_BODY:
                # Written before its entry, so the worker never finds an entry without its body. A
                # retry writes the same bytes again (and its entry is refused below).
                pipe.set(_body(session_id, seq), payload, ex=ttl)
                pipe.xadd(key, {"r": request_id, "b": _body(session_id, seq)}, id=f"{seq}-0")
            else:
                pipe.xadd(key, {"r": request_id, "p": payload}, id=f"{seq}-0")
            pipe.expire(key, ttl)
            *_, added, _ = await pipe.execute(raise_on_error=False)
        if isinstance(added, redis.ResponseError):
            if "equal or smaller" in str(added):  # Redis refuses a number at or below the newest
                return False
            raise added
        return True

    async def wait_result(self, session_id: str, seq: int, block_seconds: float) -> bytes | None:
        try:
            return await self._wait_result(session_id, seq, block_seconds)
        except (redis.ConnectionError, redis.TimeoutError) as error:
            raise ChannelUnavailable(str(error)) from error

    async def _wait_result(self, session_id: str, seq: int, block_seconds: float) -> bytes | None:
        block = int(block_seconds * 1000)
        # Entries after "<seq-1>-0": call seq's, or a later one's (results come in call order).
        found = await self.redis.xread({_done(session_id): f"{seq - 1}-0"}, count=1, block=block or None)
        if not found:
            return None
        payload = cast(bytes | None, await self.redis.get(_result(session_id, seq)))
        if payload is None:
            raise ResultGone(session_id, seq)
        return payload

    async def aclose(self) -> None:
        await self.redis.aclose()


class RedisWorkerChannel(WorkerChannel):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = redis.Redis.from_url(settings.redis_url, socket_timeout=SOCKET_TIMEOUT)

    def next_call(self, session_id: str, after: int, block_seconds: float) -> QueuedCall | None:
        try:
            return self._next_call(session_id, after, block_seconds)
        except (redis.ConnectionError, redis.TimeoutError) as error:
            raise ChannelUnavailable(str(error)) from error

    def _next_call(self, session_id: str, after: int, block_seconds: float) -> QueuedCall | None:
        block = int(block_seconds * 1000)
        found = self.redis.xread({_calls(session_id): f"{after}-0"}, count=1, block=block or None)
        if not found:
            return None
        # redis-py's types cover both decoded and raw answers; this client's are raw bytes.
        entry: tuple[bytes, dict[bytes, bytes]] = cast(Any, found)[0][1][0]
        entry_id, fields = entry
        seq = int(entry_id.split(b"-")[0])
        request_id = fields.get(b"r")
        payload = fields.get(b"p")
        if payload is None:
            payload = cast(bytes | None, self.redis.getdel(fields[b"b"]))
            if payload is None:  # expired: the session sat idle far past its timeout
                raise RuntimeError(f"the body of call {seq} of session {session_id} is gone")
        return QueuedCall(seq=seq, request_id=request_id.decode() if request_id else None, payload=payload)

    def put_result(self, session_id: str, seq: int, payload: bytes) -> None:
        try:
            self._put_result(session_id, seq, payload)
        except (redis.ConnectionError, redis.TimeoutError) as error:
            raise ChannelUnavailable(str(error)) from error

    def _put_result(self, session_id: str, seq: int, payload: bytes) -> None:
        ttl = int(self.settings.session_result_seconds)
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(_result(session_id, seq), payload, ex=ttl)
        pipe.xadd(_done(session_id), {"s": seq}, id=f"{seq}-0", maxlen=DONE_KEPT, approximate=True)
        pipe.expire(_done(session_id), ttl)
        pipe.xdel(_calls(session_id), f"{seq}-0")
        pipe.execute()

    def clear(self, session_id: str) -> None:
        bodies = [key for key in self.redis.scan_iter(match=_prefix(session_id) + "body:*", count=1000)]
        self.redis.delete(_calls(session_id), *bodies)

    def close(self) -> None:
        self.redis.close()
