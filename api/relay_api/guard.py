"""The door of /v1/: the caller's key is checked before a byte of the body is read, and a body over
its route's limit is refused, by its Content-Length and by the bytes that actually arrive.

Without this, a body was read and parsed before the key was looked at: 300 MB with no key took
13 s and about 1 GB of the API's memory to earn its 401. The limits are two settings: one for the
JSON routes (a recipe, a session's settings: a few kilobytes) and one for a session's calls, the
largest honest request (a batch with its frames, in binary frames).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relay_api.db import is_outage
from relay_api.errors import APIProblem, database_unavailable, error_body
from relay_api.keys import KeyCache
from relay_api.outage_memory import OutageMemory
from relay_api.settings import Settings

# POST /v1/sessions/{id}/calls carries a session's call in binary frames; every other body is JSON.
_CALL_PATH = re.compile(r"^/v1/sessions/[^/]+/calls/?$")
# POST /v1/deployments/{id}/actions carries observations with their images (base64).
_ACTIONS_PATH = re.compile(r"^/v1/deployments/[^/]+/actions/?$")
_UNAUTHORIZED = {"www-authenticate": "Bearer"}


def api_key_header(authorization: str | None) -> str | None:
    """An ``Authorization`` header as `bearer_key` reads it, taking openpi-client's ``Api-Key <key>``
    too (what a robot's WebsocketClientPolicy sends); None stays None."""
    if authorization is None:
        return None
    scheme, _, key = authorization.partition(" ")
    return f"Bearer {key}" if scheme.lower() == "api-key" else authorization


def bearer_key(authorization: str | None) -> str:
    """The key in an ``Authorization: Bearer <key>`` header; 401 when it is missing or malformed."""
    if not authorization:
        raise APIProblem(
            401,
            "missing API key: send the header Authorization: Bearer <key>",
            code="missing_api_key",
            headers=_UNAUTHORIZED,
        )
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise APIProblem(
            401,
            "the Authorization header must read: Bearer <key>",
            code="invalid_api_key",
            headers=_UNAUTHORIZED,
        )
    return key


async def authenticate(state: Any, authorization: str | None) -> int:
    """The id of the user whose key `authorization` carries (app.state holds the key cache and the
    database); 401 without a valid key, 503 when the database cannot be asked. While the database
    is away, a key this process found active before is taken as it was (`OutageMemory`): a robot
    keeps reaching its deployment, whose server needs no database."""
    key = bearer_key(authorization)
    cache: KeyCache = state.keys
    user_id = cache.known(key)
    if user_id is None:
        user_id = await run_in_threadpool(_look_up, state, cache, key)
    if user_id is None:
        raise APIProblem(401, "invalid API key", code="invalid_api_key", headers=_UNAUTHORIZED)
    return user_id


def _look_up(state: Any, cache: KeyCache, key: str) -> int | None:
    memory: OutageMemory = state.outage_memory
    if memory.skip_database() and (remembered := memory.user_of(key)) is not None:
        return remembered
    try:
        with state.readers() as db:
            user_id = cache.look_up(db, key)
    except SQLAlchemyError as error:
        if is_outage(error):
            memory.note_outage()
            remembered = memory.user_of(key)
            if remembered is not None:
                return remembered
        raise database_unavailable(error) from None
    memory.note_back()
    memory.remember_key(key, user_id)
    return user_id


def body_limit(settings: Settings, method: str, path: str) -> tuple[int, str, str]:
    """The largest body a request may carry, and what to tell (message, code) a caller who sends more."""
    if method == "POST" and _CALL_PATH.match(path):
        limit = settings.session_max_call_bytes
        message = (
            f"the call is larger than {limit} bytes (RELAY_SESSION_MAX_CALL_BYTES); send smaller batches "
            "(forward_backward accumulates gradients across calls)"
        )
        return limit, message, "call_too_large"
    if method == "POST" and _ACTIONS_PATH.match(path):
        limit = settings.serving_max_body_bytes
        message = (
            f"the observations are larger than {limit} bytes (RELAY_SERVING_MAX_BODY_BYTES); send "
            "smaller images, or fewer observations a request"
        )
        return limit, message, "body_too_large"
    limit = settings.max_json_body_bytes
    return (
        limit,
        f"the request body is larger than {limit} bytes (RELAY_MAX_JSON_BODY_BYTES)",
        "body_too_large",
    )


class BodyTooLarge(HTTPException):
    """Raised from `receive` when the bytes that arrived pass the limit; answered as a 413."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(413, message, headers={"connection": "close"})
        self.code = code


class Guard:
    """ASGI middleware for /v1/: authenticate first (the user id goes to ``scope["state"]``), then
    hold the body to its limit. A refused request's body is never read; the connection of any
    request answered before its body was read is closed (see `closing_if_unread`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        settings: Settings = state.settings
        headers = {name: value for name, value in scope["headers"] if name in _READ_HEADERS}
        declared = headers.get(b"content-length")
        body_read = declared in (None, b"0") and b"transfer-encoding" not in headers
        refusing = closing_if_unread(send, lambda: not body_read)
        authorization = headers.get(b"authorization")
        try:
            user_id = await authenticate(state, authorization.decode("latin-1") if authorization else None)
        except APIProblem as problem:
            await _refuse(
                scope, receive, refusing, problem.status, problem.message, problem.code, problem.headers
            )
            return
        scope.setdefault("state", {})["user_id"] = user_id

        limit, message, code = body_limit(settings, scope["method"], scope["path"])
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            if declared.isdigit():
                await _refuse(scope, receive, refusing, 413, message, code)
            else:
                await _refuse(scope, receive, refusing, 400, "bad Content-Length header", "invalid_value")
            return
        received = 0

        async def counted_receive() -> Message:
            nonlocal received, body_read
            message_in = await receive()
            if message_in["type"] == "http.request":
                received += len(message_in.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(message, code)
                body_read = body_read or not message_in.get("more_body", False)
            return message_in

        await self.app(scope, counted_receive, refusing)


_READ_HEADERS = (b"authorization", b"content-length", b"transfer-encoding")

# How long an answer given before its request's body was read waits, sent, before its connection
# closes. Closing a connection with unread bytes makes the kernel reset it, and a reset drops
# whatever of the answer is not on the wire yet (seen under load); meanwhile uvicorn reads at most
# 64 KiB more of the body (its flow control pauses a body no one reads).
LINGER_SECONDS = 0.1


def closing_if_unread(send: Send, unread: Callable[[], bool]) -> Send:
    """`send`, closing the connection after an answer given while `unread()`: without
    "connection: close" uvicorn would read the rest of the body (300 MB to a session that is gone)
    to use the connection again."""
    closing = False

    async def wrapped(message: Message) -> None:
        nonlocal closing
        if message["type"] == "http.response.start" and unread():
            closing = True
            kept = [(n, v) for n, v in message.get("headers", []) if n.lower() != b"connection"]
            message = {**message, "headers": [*kept, (b"connection", b"close")]}
        elif closing and message["type"] == "http.response.body" and not message.get("more_body"):
            await send({**message, "more_body": True})
            await asyncio.sleep(LINGER_SECONDS)
            message = {"type": "http.response.body", "body": b"", "more_body": False}
        await send(message)

    return wrapped


async def _refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    message: str,
    code: str | None,
    headers: dict[str, str] | None = None,
) -> None:
    # The body stays unread: `send` closes the connection, the only way to be rid of it.
    response = JSONResponse(error_body(status, message, None, code), status_code=status, headers=headers)
    await response(scope, receive, send)
