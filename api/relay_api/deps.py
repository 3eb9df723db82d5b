"""Typed dependencies of the routes: the settings, a database session (`db`), the calling user."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from relay_api.enqueued import EnqueuedNotes
from relay_api.guard import authenticate
from relay_api.queue import Publisher
from relay_api.settings import Settings

# The dependencies are `async def` and do no blocking work on the event loop, so a request costs
# one trip to the thread pool (its route), not one per dependency.


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_publisher(request: Request) -> Publisher:
    publisher: Publisher = request.app.state.publisher
    return publisher


async def get_enqueued_notes(request: Request) -> EnqueuedNotes:
    notes: EnqueuedNotes = request.app.state.enqueued
    return notes


async def get_db(request: Request) -> AsyncIterator[Session]:
    """A database session for a request that writes: statements run in a transaction the route commits."""
    async for db in _db(request.app.state.db_sessions):
        yield db


async def _db(factory: sessionmaker[Session]) -> AsyncIterator[Session]:
    db = factory()  # connects lazily, in the route's thread
    try:
        yield db
    finally:
        if db.in_transaction():
            await run_in_threadpool(db.close)  # a rollback is a round trip: not on the loop
        else:
            db.close()


SettingsDep = Annotated[Settings, Depends(get_settings)]
DbDep = Annotated[Session, Depends(get_db)]
PublisherDep = Annotated[Publisher, Depends(get_publisher)]
EnqueuedNotesDep = Annotated[EnqueuedNotes, Depends(get_enqueued_notes)]


async def current_user(request: Request) -> int:
    """The id of the user whose key the request carries; 401 without a valid one. The guard
    (relay_api.guard) has checked it before the body was read; this only reads its answer.

    The key is documented as the bearer security scheme (relay_api.openapi), not as a parameter,
    and read from the request only where no guard ran: a declared header parameter cost every
    request FastAPI's parsing and validation of it, for a value that is rarely read."""
    user_id: int | None = getattr(request.state, "user_id", None)
    if user_id is None:
        user_id = await authenticate(request.app.state, request.headers.get("authorization"))
    return user_id


CurrentUser = Annotated[int, Depends(current_user)]


def read_db(request: Request) -> Connection:
    """A database connection for a request that only reads, or writes one statement (a create's
    INSERT is atomic by itself): each statement commits on its own, so a read or that write costs
    one round trip instead of three (BEGIN, the statement, COMMIT or ROLLBACK). Use it in the
    route's body, ``with read_db(request) as db:``; the block's end hands the connection back to
    the pool in the route's thread, before the response is sent.

    Not a dependency, and a connection rather than an ORM session, on purpose: these are the API's
    busiest routes, and FastAPI's generator dependencies and the session's bookkeeping cost each
    request more CPU than its query (docs/benchmarks.md)."""
    engine: Engine = request.app.state.read_engine
    return engine.connect()
