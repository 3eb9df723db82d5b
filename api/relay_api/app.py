"""The FastAPI application: routes, error answers in the peers' shape, a request id on every response.

Run it with ``uvicorn --factory relay_api.app:create_app`` (settings from RELAY_* variables).
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relay import __version__
from relay.sft.config import SFTConfig
from relay_api import (
    console,
    dataset_routes,
    deployment_routes,
    openapi,
    params,
    routes,
    session_routes,
    states,
    webhook_routes,
)
from relay_api.channel import api_channel
from relay_api.db import api_pool_sizes, is_outage, read_session_factory, session_factory
from relay_api.enqueued import EnqueuedNotes
from relay_api.errors import APIProblem, database_unavailable, error_body
from relay_api.files import ChecksumCache
from relay_api.guard import Guard
from relay_api.inspectors import Inspectors
from relay_api.keys import KeyCache
from relay_api.metrics import Metrics, RequestMetrics
from relay_api.outage_memory import OutageMemory
from relay_api.queue import Publisher
from relay_api.sessions import ReadyCache
from relay_api.settings import Settings, get_settings

log = logging.getLogger(__name__)

DESCRIPTION = """Fine-tune pi0.5 robot policies on LeRobot datasets from a recipe, or drive the training
loop yourself in a session (`relay.training`).

Authenticate with `Authorization: Bearer <key>` (`relay keys create --user NAME` makes one).
Errors answer `{"error": {"message", "type", "param", "code"}}`; every response carries `x-request-id`.
"""


def create_app(settings: Settings | None = None, publisher: Publisher | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.gc_freeze:
            freeze_startup_objects()
        yield
        app.state.enqueued.close()
        app.state.inspectors.close()
        await app.state.channel.aclose()
        await app.state.serving_http.aclose()

    app = FastAPI(
        title="Relay",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served from the package's own files by relay_api.console
        redoc_url=None,
    )
    app.openapi = functools.partial(openapi.document, app)  # type: ignore[method-assign]
    _open_state(app, settings, publisher)
    _add_api(app)
    _add_middleware(app, settings)
    console.install(app)
    _add_service_routes(app, settings)
    return app


def _open_state(app: FastAPI, settings: Settings, publisher: Publisher | None) -> None:
    """What the routes share, on app.state: the settings, the database pools, the broker and caches."""
    app.state.settings = settings
    # Two pools within the process's db_pool_size: transactions, and autocommit reads.
    transactions, reads = api_pool_sizes(settings.db_pool_size)
    app.state.db_sessions = session_factory(settings, transactions)
    app.state.readers = read_session_factory(settings, reads)
    app.state.read_engine = app.state.readers.kw["bind"]
    app.state.publisher = publisher or Publisher(settings)
    app.state.enqueued = EnqueuedNotes(app.state.db_sessions)
    app.state.keys = KeyCache(settings.auth_cache_seconds)
    # Keys' users and deployments' routes as last read, for robots while the database is away.
    app.state.outage_memory = OutageMemory()
    app.state.checksums = ChecksumCache()
    app.state.channel = api_channel(settings)
    app.state.ready_sessions = ReadyCache()
    # The API's connections to deployments' policy servers: a short connect timeout, so a worker
    # that is gone is a quick 503, not a robot left hanging.
    app.state.serving_http = httpx.AsyncClient(
        timeout=httpx.Timeout(
            settings.serving_request_timeout_seconds, connect=settings.serving_connect_timeout_seconds
        )
    )
    app.state.inspectors = Inspectors()  # the engine processes that describe datasets, started on first use


def _add_api(app: FastAPI) -> None:
    """The /v1 routes, and the answers to the errors they raise."""
    # Every /v1 route refuses a query parameter it does not take.
    known_query = [Depends(params.known_query_parameters)]
    app.include_router(routes.router, dependencies=known_query)
    app.include_router(session_routes.router, dependencies=known_query)
    app.include_router(states.router, dependencies=known_query)
    app.include_router(dataset_routes.router, dependencies=known_query)
    app.include_router(deployment_routes.router, dependencies=known_query)
    app.include_router(deployment_routes.websocket_router)
    app.include_router(webhook_routes.router, dependencies=known_query)
    app.add_exception_handler(APIProblem, _problem_answer)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_answer)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_answer)  # type: ignore[arg-type]
    app.add_exception_handler(SQLAlchemyError, _database_answer)  # type: ignore[arg-type]


def _add_middleware(app: FastAPI, settings: Settings) -> None:
    """The guard, the request metrics (when on) and the request id, around every answer."""
    # The last added runs first: every answer, the guard's too, carries the request id (and is
    # counted, when metrics are on).
    app.add_middleware(Guard)
    if settings.metrics:
        app.state.metrics = Metrics(app.state.readers, settings)
        app.add_middleware(RequestMetrics, metrics=app.state.metrics)
    app.add_middleware(RequestId)


def _add_service_routes(app: FastAPI, settings: Settings) -> None:
    """/metrics (Prometheus' text when metrics are on; not in the OpenAPI document) and /healthz."""

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        if not settings.metrics:
            raise APIProblem(404, "metrics are off on this server (RELAY_METRICS=true turns them on)")
        return Response(generate_latest(app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", tags=["health"], summary="Whether the API can reach its database")
    def healthz() -> dict[str, str]:
        with app.state.readers() as db:
            db.execute(text("SELECT 1"))
        return {"status": "ok"}


def freeze_startup_objects() -> None:
    """Leave what the process holds once started out of the cyclic garbage collector's work.

    An API process holds some 150,000 container objects once its modules are imported, and a
    full collection walks every one while holding the GIL: every request in flight waits for it
    (0.1 to 0.18 s on our bench machine). Objects made after the freeze are collected as before;
    a frozen one that later becomes cyclic garbage is never freed, but nearly all of them are
    modules and the app, which live as long as the process. Collecting first keeps startup's
    garbage out of the frozen set. Once per process: a second app in the same process (tests
    build many) would freeze the first one's leftovers.
    """
    if gc.get_freeze_count():
        return
    gc.collect()
    gc.freeze()


def _answer(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


async def _problem_answer(_request: Request, problem: APIProblem) -> JSONResponse:
    return _answer(problem.status, problem.message, problem.param, problem.code, problem.headers)


async def _http_answer(request: Request, error: HTTPException) -> JSONResponse:
    message = error.detail if isinstance(error.detail, str) else json.dumps(error.detail)
    headers = getattr(error, "headers", None)
    if error.status_code == 404 and message == "Not Found":
        message = "no such endpoint; see /docs"
    if error.status_code == 405:
        allowed = _allowed_methods(request)
        message = f"{request.method} is not allowed here; allowed: {', '.join(allowed)}"
        headers = {name: value for name, value in (headers or {}).items() if name.lower() != "allow"}
        headers["allow"] = ", ".join(allowed)
    return _answer(error.status_code, message, code=getattr(error, "code", None), headers=headers)


# The path parameters that span slashes ({path:path} of a job's files, {name:path} of a dataset),
# which the document writes as plain {path} and {name}; each is its template's last.
SPANNING_PARAMETERS = ("{path}", "{name}")


def _allowed_methods(request: Request) -> list[str]:
    """Every method the document lists for this path (Starlette's 405 names only the first route's)."""
    methods: set[str] = set()
    for template, operations in request.app.openapi()["paths"].items():
        pattern = re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template))
        if template.endswith(SPANNING_PARAMETERS):
            pattern = pattern.removesuffix("[^/]+") + ".+"
        if re.fullmatch(pattern, request.url.path):
            methods |= {method.upper() for method in operations}
    return sorted(methods)


async def _database_answer(request: Request, error: SQLAlchemyError) -> JSONResponse:
    """503 with Retry-After while the database is away (a restart, a network cut); other database
    errors are bugs, and stay 500s."""
    if is_outage(error):
        request.app.state.outage_memory.note_outage()
        return await _problem_answer(request, database_unavailable(error))
    raise error


async def _validation_answer(request: Request, error: RequestValidationError) -> JSONResponse:
    """400 with the first broken rule, in the words SFTConfig uses for it; 415 for a body that was
    not sent as JSON (`curl -d` without a Content-Type sends a form, which FastAPI does not read)."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    about_the_body = any((item.get("loc") or ("",))[0] == "body" for item in error.errors())
    if (
        about_the_body
        and media_type
        and media_type != "application/json"
        and not media_type.endswith("+json")
    ):
        return _answer(
            415,
            f"the request body must be JSON, sent as Content-Type: application/json (it came as "
            f"{media_type[:80]}; with curl: -H 'Content-Type: application/json', or --json)",
            None,
            "unsupported_media_type",
        )
    body_errors, other_errors = [], []
    for item in error.errors():
        loc = tuple(item.get("loc") or ())
        if loc and loc[0] == "body":
            body_errors.append({**item, "loc": loc[1:]})
        else:
            other_errors.append({**item, "loc": loc})
    if other_errors:
        item = other_errors[0]
        name = str(item["loc"][-1]) if item["loc"] else "request"
        given = json.dumps(item.get("input")) if item.get("input") is not None else "nothing"
        rule = str(item.get("msg", "invalid")).lower()
        return _answer(400, f"bad {name}: {given} ({rule})", name, "invalid_value")
    if body_errors[0].get("type") == "json_invalid":
        return _answer(400, "the request body is not valid JSON", None, "invalid_json")
    found = SFTConfig.problems(body_errors, error.body)
    return _answer(400, "; ".join(p.message for p in found), found[0].param, found[0].code)


_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class RequestId:
    """Gives each request an id (the caller's ``x-request-id`` if sane), returns it in ``x-request-id``,
    and turns an unhandled error into a 500 in the peers' shape that quotes it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = "req_" + secrets.token_hex(12)
        for name, value in scope.get("headers", []):
            if name == b"x-request-id":
                candidate = value.decode("latin-1")
                if _CLIENT_ID.match(candidate):
                    request_id = candidate
                break
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"x-request-id", request_id.encode())
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("request %s failed", request_id)
            if started:
                raise
            body: dict[str, Any] = error_body(500, f"internal error; quote request id {request_id}")
            response = JSONResponse(body, status_code=500)
            await response(scope, receive, send_with_id)
