"""/v1/deployments: models served to robots (docs/serving.md, "Deployments").

A deployment is created `starting` and published to the serving queue; a serving worker loads the
model into a policy server of its own (relay_worker.serving) and marks it `ready`. The API checks
the caller's key, the deployment's owner and the size of what is sent, and relays the rest to that
server: ``POST .../actions`` as it is, and the websocket (openpi's protocol) both ways. While the
deployment is not ready, or its worker cannot be reached, the answer is a 503 with Retry-After,
at once: the connection to the worker has a short timeout, so a robot is never left hanging.
While the database is away, the key and the deployment's route are taken as this process last
read them (relay_api.outage_memory), so robots keep their answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Body, Request, WebSocket
from fastapi.responses import Response
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from relay.errors import ConfigError
from relay.serving import status as st
from relay.serving.config import DeploymentConfig
from relay_api import deployments, schemas
from relay_api.db import is_outage
from relay_api.deps import CurrentUser, DbDep, PublisherDep, SettingsDep, read_db
from relay_api.errors import APIProblem, database_unavailable, error_body
from relay_api.guard import api_key_header, authenticate
from relay_api.openapi import inline_schema
from relay_api.outage_memory import OutageMemory
from relay_api.params import ID_PATTERN, DeploymentId, EventAfter, IdempotencyKey, PageAfter, PageLimit
from relay_api.responses import JSONResponse
from relay_api.settings import Settings

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/deployments", tags=["deployments"], responses=schemas.ERRORS)
# The websocket, on a router of its own: the /v1 routers' query check reads an HTTP request.
websocket_router = APIRouter(prefix="/v1/deployments")

# How long a client is told to wait before trying again while a deployment starts or restarts.
RETRY_AFTER_SECONDS = 2
# Websocket close codes (RFC 6455): the peer broke a rule; a message too big; try again later.
POLICY_VIOLATION = 1008
MESSAGE_TOO_BIG = 1009
TRY_AGAIN_LATER = 1013


def _base_url(request: Request | WebSocket) -> str:
    """The API's address as the client reaches it: RELAY_PUBLIC_URL, else the request's own."""
    settings: Settings = request.app.state.settings
    if settings.public_url:
        return settings.public_url
    base = str(request.base_url)
    if isinstance(request, WebSocket):  # the websocket's base URL has its ws scheme
        base = base.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
    return base


@router.post(
    "",
    summary="Deploy a model",
    responses={200: {"model": schemas.DeploymentOut}, **schemas.IDEMPOTENCY_CONFLICT, **schemas.NOT_FOUND},
    # The body is parsed by DeploymentConfig itself (for its messages); the document shows its schema.
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inline_schema(DeploymentConfig)}},
        }
    },
)
def create_deployment(
    request: Request,
    user: CurrentUser,
    db: DbDep,
    publisher: PublisherDep,
    settings: SettingsDep,
    body: Annotated[Any, Body(include_in_schema=False)] = None,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Answer at once with the deployment (`starting`); poll it until a serving worker has it `ready`."""
    try:
        config = DeploymentConfig.parse(body)
    except ConfigError as error:
        raise APIProblem(400, error.message, param=error.param, code=error.code) from None
    source = deployments.model_source(db, user, config, settings)
    row, replayed = deployments.create(db, user, config, source, idempotency_key)
    if not replayed:
        try:
            publisher.deployment(row["id"])
        except Exception as error:
            log.warning("could not publish deployment %s", row["id"], exc_info=True)
            deployments.end_unpublished(
                db, row["id"], f"the service's queue is unreachable ({error}); try again"
            )
            raise APIProblem(
                503,
                f"cannot deploy now: the service's queue is unreachable ({error})",
                code="queue_unavailable",
            ) from None
    headers = {"idempotent-replayed": "true"} if replayed else None
    return JSONResponse(deployments.deployment_object(row, _base_url(request)), headers=headers)


@router.get(
    "",
    summary="List your deployments, newest first",
    responses={200: {"model": schemas.DeploymentList}, **schemas.NOT_FOUND},
)
def list_deployments(
    user: CurrentUser, request: Request, after: PageAfter = None, limit: PageLimit = 20
) -> Response:
    with read_db(request) as db:
        rows, has_more = deployments.list_page(db, user, after, limit)
    base = _base_url(request)
    data = [deployments.deployment_object(r, base) for r in rows]
    return JSONResponse({"object": "list", "data": data, "has_more": has_more})


@router.get(
    "/{deployment_id}",
    summary="Retrieve a deployment",
    responses={200: {"model": schemas.DeploymentOut}, **schemas.NOT_FOUND},
)
def retrieve_deployment(deployment_id: DeploymentId, user: CurrentUser, request: Request) -> Response:
    with read_db(request) as db:
        row = deployments.get(db, user, deployment_id)
    return JSONResponse(deployments.deployment_object(row, _base_url(request)))


@router.delete(
    "/{deployment_id}",
    summary="Stop a deployment",
    responses={200: {"model": schemas.DeploymentOut}, **schemas.NOT_FOUND},
)
def stop_deployment(deployment_id: DeploymentId, user: CurrentUser, db: DbDep, request: Request) -> Response:
    """One no worker holds stops at once; a ready one within its worker's next lease renewal
    (`status` reads `stopped` then). Stopping again is harmless."""
    row = deployments.request_stop(db, user, deployment_id)
    return JSONResponse(deployments.deployment_object(row, _base_url(request)))


@router.get(
    "/{deployment_id}/events",
    summary="A deployment's events",
    responses={200: {"model": schemas.DeploymentEventList}, **schemas.NOT_FOUND},
)
def deployment_events(
    deployment_id: DeploymentId,
    user: CurrentUser,
    request: Request,
    after: EventAfter = None,
    limit: PageLimit = 100,
) -> Response:
    """Its moves between statuses, oldest first: starting, ready, stopped, error, each with why."""
    with read_db(request) as db:
        rows, has_more = deployments.events_page(db, user, deployment_id, after, limit)
    return JSONResponse({"object": "list", "data": rows, "has_more": has_more})


@router.post(
    "/{deployment_id}/actions",
    summary="Actions for observations",
    responses={
        200: {"description": '`{"actions": [[...], ...], "timing": {...}}`: the action chunk, raw units.'},
        **schemas.NOT_FOUND,
        **schemas.DEPLOYMENT_ENDED,
        **schemas.DEPLOYMENT_UNAVAILABLE,
    },
)
async def actions(deployment_id: DeploymentId, request: Request, user: CurrentUser) -> Response:
    """`{"observation": {"images": {CAMERA: base64 PNG or JPEG}, "state": [...], "prompt": "..."},
    "seed": 7}`, or `"observations": [...]` with `"seeds"`: relayed to the deployment's policy
    server, which batches it with other robots' requests (docs/serving.md)."""
    return await _relayed(deployment_id, request, user, "actions")


@router.post(
    "/{deployment_id}/predictions",
    summary="Predictions for entity rows (RT-J)",
    responses={
        200: {"description": '`{"predictions": [{"primary_key", "time", "prediction", "score"}], "timing"}`'},
        **schemas.NOT_FOUND,
        **schemas.DEPLOYMENT_ENDED,
        **schemas.DEPLOYMENT_UNAVAILABLE,
    },
)
async def predictions(deployment_id: DeploymentId, request: Request, user: CurrentUser) -> Response:
    """A tuned RT-J's predictions: `{"rows": [{"primary_key": ..., "time": "2021-06-01T00:00:00Z"}]}`
    (rows of its task's entity table; `time` defaults to the database's latest), relayed to the
    deployment's server, which batches them with other clients' (docs/serving.md)."""
    return await _relayed(deployment_id, request, user, "predictions")


async def _relayed(deployment_id: str, request: Request, user: int, path: str) -> Response:
    """The body, relayed to the deployment's policy server at `path`; its answer, as it is."""
    row = await run_in_threadpool(_row, request.app.state, user, deployment_id)
    url = _serving_url(row)
    body = await request.body()  # held to RELAY_SERVING_MAX_BODY_BYTES by relay_api.guard
    client: httpx.AsyncClient = request.app.state.serving_http
    try:
        answer = await client.post(
            f"{url}/{path}",
            content=body,
            headers={
                "authorization": f"Bearer {row['internal_token']}",
                "content-type": request.headers.get("content-type", "application/json"),
            },
        )
    except httpx.HTTPError as error:
        raise _unreachable(deployment_id, error) from None
    if answer.status_code in (401, 403):  # the server is not this deployment's (a port reused)
        raise _unreachable(deployment_id, RuntimeError(f"the worker answered {answer.status_code}"))
    return Response(
        answer.content,
        status_code=answer.status_code,
        media_type=answer.headers.get("content-type", "application/json"),
    )


@router.get(
    "/{deployment_id}/ws",
    summary="openpi's websocket (connect with a websocket client)",
    responses={
        101: {"description": "Switching Protocols: a websocket handshake to a ready deployment."},
        426: {
            "model": schemas.ErrorOut,
            "description": "A plain GET of a ready deployment's websocket (`upgrade_required`): connect "
            "with a websocket client, such as openpi-client's WebsocketClientPolicy.",
        },
        **schemas.NOT_FOUND,
        **schemas.DEPLOYMENT_ENDED,
        **schemas.DEPLOYMENT_UNAVAILABLE,
    },
)
def websocket_handshake(deployment_id: DeploymentId, user: CurrentUser, request: Request) -> Response:
    """The websocket's address (`websocket_url`), answered over plain HTTP as its handshake is: 404
    for none of yours, 410 once it has ended, 503 with Retry-After while it starts; a ready one
    needs a websocket client (426). Messages: openpi's protocol, relayed to the deployment's server."""
    _serving_url(_row(request.app.state, user, deployment_id))
    raise APIProblem(
        426,
        f"deployment {deployment_id} is ready: connect to this address with a websocket client "
        "(openpi-client's WebsocketClientPolicy), not plain HTTP",
        code="upgrade_required",
        headers={"upgrade": "websocket"},
    )


def _row(state: Any, user: int, deployment_id: str) -> dict[str, Any]:
    """The caller's deployment, to relay to: read from the database, or, while it is away, as this
    process last read it (a deployment's server needs no database: its robots keep their answers)."""
    memory: OutageMemory = state.outage_memory
    if memory.skip_database() and (remembered := memory.deployment(user, deployment_id)) is not None:
        return remembered
    try:
        with state.db_sessions() as db:
            row = deployments.get(db, user, deployment_id)
    except SQLAlchemyError as error:
        if not is_outage(error):
            raise
        memory.note_outage()
        remembered = memory.deployment(user, deployment_id)
        if remembered is None:
            raise database_unavailable(error) from None
        return remembered
    memory.note_back()
    memory.remember_deployment(row)
    return row


def _serving_url(row: dict[str, Any]) -> str:
    """The worker's policy server, or the 503 that tells the client to wait (or the 410 that tells it
    the deployment has ended)."""
    if row["status"] in st.ENDED:
        reason = row["error"] or row["status"]
        raise APIProblem(
            410, f"deployment {row['id']} has {row['status']}: {reason}", code=f"deployment_{row['status']}"
        )
    if row["status"] != st.READY or not row["internal_url"] or row["stop_requested_at"] is not None:
        what = "is stopping" if row["stop_requested_at"] is not None else "is starting"
        if row["attempt"] > 1 and row["status"] == st.STARTING:
            what = "is restarting (its worker was lost)"
        raise APIProblem(
            503,
            f"deployment {row['id']} {what}; try again in {RETRY_AFTER_SECONDS} s",
            code="deployment_not_ready",
            headers={"retry-after": str(RETRY_AFTER_SECONDS)},
        )
    return str(row["internal_url"])


def _unreachable(deployment_id: str, error: Exception) -> APIProblem:
    log.warning("deployment %s: its worker cannot be reached: %s", deployment_id, error)
    return APIProblem(
        503,
        f"deployment {deployment_id}'s worker cannot be reached (it may be restarting); "
        f"try again in {RETRY_AFTER_SECONDS} s",
        code="deployment_unreachable",
        headers={"retry-after": str(RETRY_AFTER_SECONDS)},
    )


@websocket_router.websocket("/{deployment_id}/ws")
async def deployment_websocket(websocket: WebSocket, deployment_id: str) -> None:
    """openpi's websocket protocol, relayed both ways to the deployment's policy server: the
    metadata frame on connect, then one msgpack observation per message, answered with its actions.
    Authenticated by ``Authorization: Api-Key KEY`` (openpi-client's) or ``Bearer KEY``; refused
    before the handshake completes (401, 404, 503 with Retry-After) where the server allows it."""
    state = websocket.app.state
    settings: Settings = state.settings
    try:
        user = await authenticate(state, api_key_header(websocket.headers.get("authorization")))
        if not re.fullmatch(ID_PATTERN, deployment_id):  # (a NUL byte would reach the database)
            raise APIProblem(404, "no deployment has this id", param="id", code="not_found")
        row = await run_in_threadpool(_row, state, user, deployment_id)
        url = _serving_url(row)
    except APIProblem as problem:
        await _deny(websocket, problem)
        return
    try:
        upstream = await connect(
            "ws://" + url.split("://", 1)[1] + "/",
            additional_headers={"authorization": f"Bearer {row['internal_token']}"},
            max_size=settings.serving_max_body_bytes,
            open_timeout=settings.serving_connect_timeout_seconds,
            compression=None,
        )
    except (OSError, TimeoutError, WebSocketException) as error:
        await _deny(websocket, _unreachable(deployment_id, error))
        return
    async with upstream:
        await websocket.accept()
        await _relay(websocket, upstream, settings.serving_max_body_bytes)


async def _deny(websocket: WebSocket, problem: APIProblem) -> None:
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        body = error_body(problem.status, problem.message, problem.param, problem.code)
        await websocket.send_denial_response(
            JSONResponse(body, status_code=problem.status, headers=problem.headers)
        )
    else:
        code = TRY_AGAIN_LATER if problem.status == 503 else POLICY_VIOLATION
        await websocket.close(code=code, reason=problem.message[:120])


async def _relay(websocket: WebSocket, upstream: ClientConnection, max_bytes: int) -> None:
    """Pass messages both ways until either side closes; a client message over `max_bytes` closes
    the connection (1009) before it is sent on."""

    async def client_to_server() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            if data is None:
                data = (message.get("text") or "").encode()
            if len(data) > max_bytes:
                await websocket.close(code=MESSAGE_TOO_BIG, reason=f"message over {max_bytes} bytes")
                return
            await upstream.send(message["bytes"] if message.get("bytes") is not None else message["text"])

    async def server_to_client() -> None:
        async for frame in upstream:
            if isinstance(frame, bytes):
                await websocket.send_bytes(frame)
            else:
                await websocket.send_text(frame)

    from_client = asyncio.create_task(client_to_server())
    from_server = asyncio.create_task(server_to_client())
    try:
        await asyncio.wait((from_client, from_server), return_when=asyncio.FIRST_COMPLETED)
    finally:
        server_ended = from_server.done()
        for task in (from_client, from_server):
            task.cancel()
            with contextlib.suppress(
                asyncio.CancelledError, ConnectionClosed, WebSocketDisconnect, RuntimeError
            ):
                await task
        # The worker went away (lost, or the deployment stopped): the robot may connect again.
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await websocket.close(code=TRY_AGAIN_LATER if server_ended else 1000)
