"""The session channel on the SQL database, for the embedded server (SQLite, no Redis).

Calls and results are rows of `session_messages`, keyed by (session, kind, number), so a retried
call number is refused by the primary key. Both sides poll, a few milliseconds apart while a
session is busy and up to 50 ms apart while it is quiet: right for one laptop, not for a fleet
(production uses Redis, which wakes readers instead).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time

from sqlalchemy import delete, func, insert, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from relay_api.channel import (
    ApiChannel,
    ChannelUnavailable,
    QueuedCall,
    ResultGone,
    TooManyPending,
    WorkerChannel,
)
from relay_api.db import session_factory, utcnow
from relay_api.models import session_messages as messages
from relay_api.settings import Settings

CALL, RESULT = "call", "result"
FIRST_WAIT, LONGEST_WAIT = 0.002, 0.05


def _backoff(wait: float) -> float:
    return min(wait * 2, LONGEST_WAIT)


class SqlApiChannel(ApiChannel):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db_sessions = session_factory(settings)

    async def append(self, session_id: str, seq: int, request_id: str, payload: bytes) -> bool:
        try:
            return await run_in_threadpool(self._append, session_id, seq, request_id, payload)
        except OperationalError as error:
            raise ChannelUnavailable(str(error)) from error

    def _append(self, session_id: str, seq: int, request_id: str, payload: bytes) -> bool:
        with self.db_sessions() as db:
            waiting = db.scalar(
                select(func.count())
                .select_from(messages)
                .where(messages.c.session_id == session_id, messages.c.kind == CALL)
            )
            if (waiting or 0) >= self.settings.session_max_pending_calls:
                raise TooManyPending(session_id)
            newest = db.scalar(select(func.max(messages.c.seq)).where(messages.c.session_id == session_id))
            if newest is not None and seq <= newest:  # already queued (and perhaps run): a retry
                return False
            try:
                db.execute(
                    insert(messages).values(
                        session_id=session_id,
                        kind=CALL,
                        seq=seq,
                        request_id=request_id,
                        payload=payload,
                        created_at=utcnow(),
                    )
                )
                db.commit()
            except IntegrityError:
                return False
        return True

    async def wait_result(self, session_id: str, seq: int, block_seconds: float) -> bytes | None:
        deadline = time.monotonic() + block_seconds
        wait = FIRST_WAIT
        while True:
            try:
                payload = await run_in_threadpool(self._result, session_id, seq)
            except OperationalError as error:
                raise ChannelUnavailable(str(error)) from error
            if payload is not None:
                return payload
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(min(wait, max(0.0, deadline - time.monotonic())))
            wait = _backoff(wait)

    def _result(self, session_id: str, seq: int) -> bytes | None:
        with self.db_sessions() as db:
            found = db.execute(
                select(messages.c.seq, messages.c.payload)
                .where(messages.c.session_id == session_id, messages.c.kind == RESULT, messages.c.seq >= seq)
                .order_by(messages.c.seq)
                .limit(1)
            ).first()
        if found is None:
            return None
        if found.seq != seq:  # a later call has its result: this one's is gone
            raise ResultGone(session_id, seq)
        return bytes(found.payload)

    async def aclose(self) -> None:
        return None


class SqlWorkerChannel(WorkerChannel):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db_sessions = session_factory(settings)

    def next_call(self, session_id: str, after: int, block_seconds: float) -> QueuedCall | None:
        try:
            return self._next_call(session_id, after, block_seconds)
        except OperationalError as error:
            raise ChannelUnavailable(str(error)) from error

    def _next_call(self, session_id: str, after: int, block_seconds: float) -> QueuedCall | None:
        deadline = time.monotonic() + block_seconds
        wait = FIRST_WAIT
        while True:
            with self.db_sessions() as db:
                found = db.execute(
                    select(messages.c.seq, messages.c.request_id, messages.c.payload)
                    .where(
                        messages.c.session_id == session_id, messages.c.kind == CALL, messages.c.seq > after
                    )
                    .order_by(messages.c.seq)
                    .limit(1)
                ).first()
            if found is not None:
                return QueuedCall(seq=found.seq, request_id=found.request_id, payload=bytes(found.payload))
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
            wait = _backoff(wait)

    def put_result(self, session_id: str, seq: int, payload: bytes) -> None:
        try:
            self._put_result(session_id, seq, payload)
        except OperationalError as error:
            raise ChannelUnavailable(str(error)) from error

    def _put_result(self, session_id: str, seq: int, payload: bytes) -> None:
        with self.db_sessions() as db:
            db.execute(
                insert(messages).values(
                    session_id=session_id,
                    kind=RESULT,
                    seq=seq,
                    request_id=None,
                    payload=payload,
                    created_at=utcnow(),
                )
            )
            db.execute(
                delete(messages).where(
                    messages.c.session_id == session_id, messages.c.kind == CALL, messages.c.seq == seq
                )
            )
            if seq % 500 == 0:
                self._expire(db)
            db.commit()

    def clear(self, session_id: str) -> None:
        with self.db_sessions() as db:
            db.execute(delete(messages).where(messages.c.session_id == session_id, messages.c.kind == CALL))
            self._expire(db)
            db.commit()

    def _expire(self, db: Session) -> None:
        expired = utcnow() - dt.timedelta(seconds=self.settings.session_result_seconds)
        db.execute(delete(messages).where(messages.c.kind == RESULT, messages.c.created_at < expired))
