"""/v1/sessions: training-loop sessions (docs/sessions.md) and their calls.

A session is created `starting` and published to the sessions queue; a worker loads the model
and marks it `ready`. Calls are POSTed in order with the client's number (``x-relay-seq``), as
Relay's binary frames (relay.training.wire), and appended to the session's channel untouched; their
results are long-polled (``GET .../calls/{seq}?wait=30``: 200 with the result, 202 while it runs).
The call and result routes are async: a long-poll holds no thread while it waits.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from relay.errors import ConfigError
from relay.training import status as st
from relay.training import wire
from relay.training.config import SessionConfig
from relay_api import fine_tunes, schemas, sessions
from relay_api.channel import ApiChannel, ChannelUnavailable, ResultGone, TooManyPending
from relay_api.deps import CurrentUser, DbDep, PublisherDep, SettingsDep, read_db
from relay_api.errors import APIProblem
from relay_api.openapi import inline_schema
from relay_api.params import CallNumber, CallNumberHeader, IdempotencyKey, PageAfter, PageLimit, SessionId
from relay_api.responses import JSONResponse
from relay_api.settings import Settings

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/sessions", tags=["training sessions"], responses=schemas.ERRORS)


@router.post(
    "",
    summary="Start a training session",
    responses={200: {"model": schemas.SessionOut}, **schemas.IDEMPOTENCY_CONFLICT},
    # The body is parsed by SessionConfig itself (for its messages); the document shows its schema.
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inline_schema(SessionConfig)}},
        }
    },
)
def create_session(
    user: CurrentUser,
    db: DbDep,
    publisher: PublisherDep,
    settings: SettingsDep,
    body: Annotated[Any, Body(include_in_schema=False)] = None,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Answer at once with the session (`starting`); poll it until a worker has it `ready`."""
    try:
        config = SessionConfig.parse(body)
    except ConfigError as error:
        raise APIProblem(400, error.message, param=error.param, code=error.code) from None
    fine_tunes.check_session_model(db, config.base_model, settings)
    fine_tunes.check_checkpoint(db, user, config.base_model, config.from_checkpoint, settings)
    row, replayed = sessions.create(db, user, config, idempotency_key, settings)
    if not replayed:
        try:
            publisher.session(row["id"])
        except Exception as error:
            log.warning("could not publish session %s", row["id"], exc_info=True)
            sessions.end_unpublished(
                db, row["id"], f"the service's queue is unreachable ({error}); try again"
            )
            raise APIProblem(
                503,
                f"cannot start a session now: the service's queue is unreachable ({error})",
                code="queue_unavailable",
            ) from None
    headers = {"idempotent-replayed": "true"} if replayed else None
    return JSONResponse(sessions.session_object(row, settings), headers=headers)


@router.get(
    "",
    summary="List your training sessions, newest first",
    responses={200: {"model": schemas.SessionList}, **schemas.NOT_FOUND},
)
def list_sessions(
    user: CurrentUser,
    request: Request,
    settings: SettingsDep,
    after: PageAfter = None,
    limit: PageLimit = 20,
) -> Response:
    with read_db(request) as db:
        rows, has_more = sessions.list_page(db, user, after, limit)
    data = [sessions.session_object(r, settings) for r in rows]
    return JSONResponse({"object": "list", "data": data, "has_more": has_more})


@router.get(
    "/{session_id}",
    summary="Retrieve a training session",
    responses={200: {"model": schemas.SessionOut}, **schemas.NOT_FOUND},
)
def retrieve_session(session_id: SessionId, user: CurrentUser, db: DbDep, settings: SettingsDep) -> Response:
    row = sessions.end_if_worker_lost(db, sessions.get(db, user, session_id))
    return JSONResponse(sessions.session_object(row, settings))


@router.post(
    "/{session_id}/heartbeat",
    summary="Keep a session open",
    responses={200: {"model": schemas.SessionOut}, **schemas.NOT_FOUND},
)
def heartbeat(session_id: SessionId, user: CurrentUser, db: DbDep, settings: SettingsDep) -> Response:
    """The SDK sends one every 30 s (at most a quarter of the idle timeout) while a session is open."""
    return JSONResponse(sessions.session_object(sessions.heartbeat(db, user, session_id), settings))


@router.post(
    "/{session_id}/close",
    summary="Close a training session",
    responses={200: {"model": schemas.SessionOut}, **schemas.NOT_FOUND},
)
def close_session(
    session_id: SessionId, request: Request, user: CurrentUser, db: DbDep, settings: SettingsDep
) -> Response:
    """A starting session ends at once; a ready one once its worker has run the calls sent before."""
    row, _ = sessions.request_close(db, user, session_id)
    request.app.state.ready_sessions.note(row)
    return JSONResponse(sessions.session_object(row, settings))


@router.post(
    "/{session_id}/calls",
    summary="Send a call (in order)",
    responses={
        200: {"model": schemas.CallAccepted},
        409: {
            "model": schemas.ErrorOut,
            "description": "The session is still starting (`session_starting`).",
        },
        429: {"model": schemas.ErrorOut, "description": "Too many calls wait already; send again shortly."},
        **schemas.NOT_FOUND,
        **schemas.SESSION_ENDED,
    },
)
async def submit_call(
    session_id: SessionId,
    request: Request,
    user: CurrentUser,
    seq: CallNumberHeader,
) -> Response:
    """The body is a call in Relay's binary frames (relay.training.wire). A number sent again (a
    retry) is acknowledged with `replayed` and not run twice."""
    settings: Settings = request.app.state.settings
    row = await _cached_row(request, user, session_id)
    if row["status"] != st.READY or row["close_requested_at"] is not None:
        raise _not_taking_calls(row)
    body = await request.body()  # held to RELAY_SESSION_MAX_CALL_BYTES by relay_api.guard
    try:
        wire.check(body)
    except wire.WireError as error:
        raise APIProblem(400, str(error), code="invalid_body") from None
    request_id: str = request.scope["state"]["request_id"]
    channel: ApiChannel = request.app.state.channel
    try:
        appended = await channel.append(session_id, seq, request_id, body)
    except ChannelUnavailable as error:
        raise _unavailable(error) from None
    except TooManyPending:
        raise APIProblem(
            429,
            f"session {session_id} has {settings.session_max_pending_calls} calls waiting already; "
            "wait for some results before sending more",
            code="too_many_pending_calls",
            headers={"retry-after": "1"},
        ) from None
    return JSONResponse(
        {
            "object": "session.call",
            "session_id": session_id,
            "seq": seq,
            "request_id": request_id,
            "replayed": not appended,
        }
    )


@router.get(
    "/{session_id}/calls/{seq}",
    summary="A call's result (long-poll)",
    responses={
        200: {
            "content": {wire.MEDIA_TYPE: {}},
            "description": "The call's outcome, in Relay's binary frames.",
        },
        202: {"model": schemas.CallPending, "description": "Not done within `wait` seconds; ask again."},
        404: {
            "model": schemas.ErrorOut,
            "description": "No session of yours has this id, or the result is kept no more (`result_gone`).",
        },
        410: {"model": schemas.ErrorOut, "description": "The session ended before the call ran."},
    },
)
async def call_result(
    session_id: SessionId,
    seq: CallNumber,
    request: Request,
    user: CurrentUser,
    wait: Annotated[float, Query(ge=0, le=60, description="Seconds to wait for the result.")] = 30.0,
) -> Response:
    """The outcome of call `seq`: its value, or its error with a category (`user` for a problem in
    the call, such as a malformed datum; `server` otherwise) and the id of the request that sent it."""
    settings: Settings = request.app.state.settings
    factory: sessionmaker[Session] = request.app.state.db_sessions
    channel: ApiChannel = request.app.state.channel
    await _cached_row(request, user, session_id)  # 404 unless the caller's
    deadline = time.monotonic() + wait
    # Between waits, look at the session: a worker that died writes no more results.
    look_every = max(0.2, min(5.0, settings.lease_seconds / 2))
    while True:
        block = max(0.0, min(look_every, deadline - time.monotonic()))
        payload = await _result(channel, session_id, seq, block, settings)
        if payload is not None:
            return Response(payload, media_type=wire.MEDIA_TYPE)
        row = await run_in_threadpool(_live_row, factory, user, session_id)
        request.app.state.ready_sessions.note(row)
        if row["status"] in st.ENDED:
            # The worker may have written this result just before it let go.
            payload = await _result(channel, session_id, seq, 0.0, settings)
            if payload is not None:
                return Response(payload, media_type=wire.MEDIA_TYPE)
            raise _ended_before(row, seq)
        if time.monotonic() >= deadline:
            return JSONResponse({"object": "session.call", "seq": seq, "status": "pending"}, status_code=202)


async def _result(
    channel: ApiChannel, session_id: str, seq: int, block: float, settings: Settings
) -> bytes | None:
    try:
        return await channel.wait_result(session_id, seq, block)
    except ChannelUnavailable as error:
        raise _unavailable(error) from None
    except ResultGone:
        raise APIProblem(
            404,
            f"no result for call {seq} of session {session_id}: results are kept "
            f"{settings.session_result_seconds:.0f} s after their call ran, and this call may never "
            "have arrived",
            param="seq",
            code="result_gone",
        ) from None


async def _cached_row(request: Request, user: int, session_id: str) -> dict[str, Any]:
    """The caller's session: from the cache of ready sessions, else from the database."""
    cache: sessions.ReadyCache = request.app.state.ready_sessions
    row = cache.get(user, session_id)
    if row is None:
        row = await run_in_threadpool(_live_row, request.app.state.db_sessions, user, session_id)
        cache.note(row)
    return row


def _live_row(factory: sessionmaker[Session], user: int, session_id: str) -> dict[str, Any]:
    """The caller's session, ended in `error` first if its worker is gone."""
    with factory() as db:
        return sessions.end_if_worker_lost(db, sessions.get(db, user, session_id))


def _not_taking_calls(row: dict[str, Any]) -> APIProblem:
    session_id = row["id"]
    if row["status"] == st.STARTING:
        return APIProblem(
            409, f"session {session_id} is still starting; wait until it is ready", code="session_starting"
        )
    if row["status"] == st.READY:
        return APIProblem(
            410, f"session {session_id} is closing; it takes no more calls", code="session_closed"
        )
    return _ended(row, f"session {session_id} has ended")


def _ended_before(row: dict[str, Any], seq: int) -> APIProblem:
    return _ended(row, f"session {row['id']} ended before call {seq} ran")


def _ended(row: dict[str, Any], opening: str) -> APIProblem:
    reason = row["error"] or row["status"]
    if row["status"] == st.ERROR:
        code = "worker_lost" if row["error"] == sessions.WORKER_LOST else "session_error"
        return APIProblem(410, f"{opening}: {reason}", code=code)
    return APIProblem(410, f"{opening}: it was closed ({reason})", code="session_closed")


def _unavailable(error: ChannelUnavailable) -> APIProblem:
    log.warning("session channel unavailable: %s", error)
    return APIProblem(
        503,
        "the service's channel to its workers is unavailable; try again shortly",
        code="channel_unavailable",
        headers={"retry-after": "1"},
    )
