"""The session channel on Redis: a stream of calls, a key per result, a stream that says "done".

    relay:session:<id>:calls       stream; entry id "<seq>-0" (so a retried number is refused by
                                   Redis itself), fields r (request id) and p (the call's body)
    relay:session:<id>:result:<n>  the result of call n, expiring after session_result_seconds
    relay:session:<id>:done        stream; entry "<n>-0" once call n's result is written

A long-poll XREADs "done" from just below its call's number: Redis answers at once if the result
is there, else wakes the reader when it comes; readers never consume anything, so any number of
them (a retried poll, two threads) can wait on one call. The worker deletes each call it has run,
so the stream's length is the number of calls waiting.
"""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

from relay_api.channel import ApiChannel, QueuedCall, ResultGone, TooManyPending, WorkerChannel
from relay_api.settings import Settings

DONE_KEPT = 1000  # "done" entries kept per session (only the newest matter)

# Queue a call atomically: refuse a full queue (-1), report a repeated number (0), else add (1).
_APPEND = """
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[4]) then return -1 end
local added = redis.pcall('XADD', KEYS[1], ARGV[1], 'r', ARGV[2], 'p', ARGV[3])
if type(added) == 'table' and added.err then
  if string.find(added.err, 'equal or smaller') then return 0 end
  return redis.error_reply(added.err)
end
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


def _prefix(session_id: str) -> str:
    return f"relay:session:{session_id}:"


def _calls(session_id: str) -> str:
    return _prefix(session_id) + "calls"


def _done(session_id: str) -> str:
    return _prefix(session_id) + "done"


def _result(session_id: str, seq: int) -> str:
    return _prefix(session_id) + f"result:{seq}"


class RedisApiChannel(ApiChannel):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = aioredis.Redis.from_url(settings.redis_url)
        self._append = self.redis.register_script(_APPEND)

    async def append(self, session_id: str, seq: int, request_id: str, payload: bytes) -> bool:
        # The queue outlives a quiet spell, not an abandoned session.
        ttl = int(max(self.settings.session_result_seconds, self.settings.session_idle_seconds)) + 60
        outcome = await self._append(
            keys=[_calls(session_id)],
            args=[f"{seq}-0", request_id, payload, self.settings.session_max_pending_calls, ttl],
        )
        if outcome == -1:
            raise TooManyPending(session_id)
        return bool(outcome == 1)

    async def wait_result(self, session_id: str, seq: int, block_seconds: float) -> bytes | None:
        block = int(block_seconds * 1000)
        # Entries after "<seq-1>-0": call seq's, or a later one's (results come in call order).
        found = await self.redis.xread({_done(session_id): f"{seq - 1}-0"}, count=1, block=block or None)
        if not found:
            return None
        payload: bytes | None = await self.redis.get(_result(session_id, seq))
        if payload is None:
            raise ResultGone(session_id, seq)
        return payload

    async def aclose(self) -> None:
        await self.redis.aclose()


class RedisWorkerChannel(WorkerChannel):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = redis.Redis.from_url(settings.redis_url)

    def next_call(self, session_id: str, after: int, block_seconds: float) -> QueuedCall | None:
        block = int(block_seconds * 1000)
        found = self.redis.xread({_calls(session_id): f"{after}-0"}, count=1, block=block or None)
        if not found:
            return None
        entry_id, fields = found[0][1][0]
        request_id = fields.get(b"r")
        return QueuedCall(
            seq=int(entry_id.split(b"-")[0]),
            request_id=request_id.decode() if request_id else None,
            payload=fields[b"p"],
        )

    def put_result(self, session_id: str, seq: int, payload: bytes) -> None:
        ttl = int(self.settings.session_result_seconds)
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(_result(session_id, seq), payload, ex=ttl)
        pipe.xadd(_done(session_id), {"s": seq}, id=f"{seq}-0", maxlen=DONE_KEPT, approximate=True)
        pipe.expire(_done(session_id), ttl)
        pipe.xdel(_calls(session_id), f"{seq}-0")
        pipe.execute()

    def clear(self, session_id: str) -> None:
        self.redis.delete(_calls(session_id))

    def close(self) -> None:
        self.redis.close()
