"""The policy server: one loaded model behind HTTP: a robot policy, pi05's or a tuned SmolVLA (also
over openpi's websocket protocol), or a tuned RT-J answering predictions for entity rows of its
database.

A deployment's worker runs it (the API proxies to it) and `relay serve` runs it on the user's
own machine. `start_policy_server(model)` loads the model once, starts the inference thread
(`relay_engine.serving.Batcher`: requests from every client batched into one forward pass) and
serves in a background thread (uvicorn), returning once it listens.

Endpoints (all need `Authorization: Bearer TOKEN` or `Authorization: Api-Key TOKEN` when a
token is set):
- `POST /actions`: `{"observation": {...}, "seed": 7}` -> `{"actions": [[...], ...], "seed",
  "timing"}`, or `{"observations": [...], "seeds": [...]}` -> a list of chunks and `seeds`.
  Images are base64 PNG or JPEG. Errors are OpenAI-style bodies naming the field.
- websocket `/`: openpi's protocol. The metadata goes out as the first (msgpack) frame; each
  binary frame is an observation dict (images as uint8 arrays, an optional "seed") answered by
  `{"actions": ndarray, "server_timing": {...}}`; a problem is answered by a text frame (the
  error body as JSON), which `openpi_client` raises, and the connection stays open.
- `POST /predictions` (an RT-J model): `{"rows": [{"primary_key": "customer_3", "time":
  "2021-06-01T00:00:00Z"}, ...]}` -> `{"predictions": [{"primary_key", "time", "prediction",
  "score"}, ...], "timing"}`; a key the entity table lacks is a 404 naming the field.
- `GET /metadata`, `GET /stats`, `GET /healthz`.

A robot policy's server answers `/predictions` with a 400 saying to use `/actions`; an RT-J's
answers `/actions` with a 400 and refuses the websocket (HTTP 400, or close 1008 where the
server cannot answer a handshake with HTTP) saying to use `/predictions`.

Bodies and websocket messages over `max_body_bytes` are refused before they are parsed (413;
websocket close 1009), and a request's images past MAX_REQUEST_PIXELS decoded pixels before they
are decoded (400 `too_many_pixels`). Hostile input (JSON nested past Python's recursion limit, a
lone surrogate in a prompt, a msgpack message that is no observation) is a 400 naming what is
wrong; no traceback ever goes on the wire, and no request's failure closes its connection or
touches the next request (a failure used to escape to Starlette, which dropped the keep-alive
connection after the 500: the API's next request on it then failed as unreachable, a 503).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from relay_api.errors import error_body
from relay_engine.errors import ConfigError
from relay_engine.serving import (
    ActionChunk,
    Batcher,
    PixelBudget,
    RowNotFound,
    RowPrediction,
    ServedModel,
    ServedPolicy,
    ServerStopped,
    WireError,
    check_seed,
    load_served_model,
    pack,
    unpack,
)

log = logging.getLogger(__name__)

# Observations one POST /actions may carry.
MAX_OBSERVATIONS_PER_REQUEST = 64
# Rows one POST /predictions may carry.
MAX_ROWS_PER_REQUEST = 256
STARTUP_TIMEOUT_S = 60.0
STOPPED_RETRY_AFTER_S = 5
REQUEST_FIELDS = ("observation", "seed", "observations", "seeds")
PREDICTION_FIELDS = ("rows",)
# What a served model answers (ServedModel.answers): observations or a database's rows.
ACTIONS, PREDICTIONS = "actions", "predictions"
# What a request to the other kind's endpoint is told.
# The websocket field besides the observation's own.
SEED_FIELD = "seed"


@dataclass(frozen=True)
class ServingOptions:
    max_batch: int = 8  # requests in one forward pass
    max_wait_ms: float = 2.0  # how long the first request waits for others to join it
    max_body_bytes: int = 16 * 2**20  # an HTTP body or a websocket message
    device: str = "auto"
    num_steps: int = 10  # the sampler's Euler steps
    # An RT-J's database and task; None: those its config.json records (refused for pi05).
    database: str | None = None
    task: str | None = None
    # The model's name as clients see it (metadata, /healthz); None: as it was given. A deployment
    # names it as its owner did (ft-..., pi05-tiny), not by the directory its worker loads.
    model_name: str | None = None
    # Every text a client sees (the metadata's values, error messages) passes through this; a
    # deployment's worker names its own directories in words here. None: as it is.
    shown: Callable[[str], str] | None = None


class _Problem(Exception):
    """An answer with an error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers

    @classmethod
    def of(cls, error: ConfigError) -> _Problem:
        status = 404 if isinstance(error, RowNotFound) else 400
        return cls(status, error.message, param=error.param, code=error.code)

    @classmethod
    def wrong_endpoint(cls, served: ServedModel) -> _Problem:
        return cls(400, served.use_instead, code="wrong_endpoint")

    def body(self, shown: Callable[[str], str] | None = None) -> dict[str, Any]:
        message = shown(self.message) if shown is not None else self.message
        return error_body(self.status, message, self.param, self.code)


class _PolicyApp:
    """The routes, around one Batcher."""

    def __init__(self, batcher: Batcher, token: str | None, options: ServingOptions) -> None:
        self.batcher = batcher
        self.policy: ServedModel = batcher.policy
        self.metadata = _public_metadata(self.policy.metadata(), options)
        self.token = token
        self.options = options
        self.clients = 0

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/actions", self._guarded(self.actions), methods=["POST"]),
                Route("/predictions", self._guarded(self.predictions), methods=["POST"]),
                Route("/metadata", self._guarded(self.get_metadata), methods=["GET"]),
                Route("/stats", self._guarded(self.get_stats), methods=["GET"]),
                Route("/healthz", self._guarded(self.healthz), methods=["GET"]),
                WebSocketRoute("/", self.websocket),
            ],
            exception_handlers={HTTPException: _http_error, Exception: _server_error},
        )

    # -- authentication

    def _authorized(self, header: str | None) -> bool:
        if self.token is None:
            return True
        scheme, _, key = (header or "").strip().partition(" ")
        if scheme.lower() not in ("bearer", "api-key") or not key.strip():
            return False
        return hmac.compare_digest(key.strip().encode(), self.token.encode())

    def _guarded(
        self, route: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            if not self._authorized(request.headers.get("authorization")):
                return _unauthorized()
            try:
                return await route(request)
            except _Problem as problem:
                return self._answer(problem)
            except Exception:  # the model's or the machine's fault: logged, answered, not re-raised
                log.exception("the policy server failed on %s %s", request.method, request.url.path)
                return self._answer(_Problem(500, "the policy server failed on this request"))

        return guarded

    def _answer(self, problem: _Problem) -> JSONResponse:
        return JSONResponse(problem.body(self.options.shown), problem.status, headers=problem.headers)

    # -- HTTP

    async def get_metadata(self, request: Request) -> Response:
        return JSONResponse(self.metadata)

    async def get_stats(self, request: Request) -> Response:
        return JSONResponse(self.batcher.stats.snapshot(clients=self.clients))

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.metadata["model"]})

    async def actions(self, request: Request) -> Response:
        started = time.perf_counter()
        policy = self.policy
        if policy.answers != ACTIONS or not isinstance(policy, ServedPolicy):
            raise _Problem.wrong_endpoint(self.policy)
        parsed = await self._json(request)
        observations, seeds, several = _request_parts(parsed)
        budget = PixelBudget()  # the request's images together
        try:
            decoded = await run_in_threadpool(lambda: [policy.decode(o, f, budget) for f, o in observations])
        except ConfigError as error:
            raise _Problem.of(error) from None
        chunks = await self._act(decoded, seeds)
        total_ms = (time.perf_counter() - started) * 1000
        for _ in chunks:
            self.batcher.stats.record_request(total_ms)
        if several:
            return JSONResponse(
                {
                    "actions": [chunk.actions.tolist() for chunk in chunks],
                    "seeds": [chunk.seed for chunk in chunks],
                    "timing": _timing(chunks, total_ms),
                }
            )
        return JSONResponse(
            {
                "actions": chunks[0].actions.tolist(),
                "seed": chunks[0].seed,
                "timing": _timing(chunks, total_ms),
            }
        )

    async def predictions(self, request: Request) -> Response:
        """An RT-J's predictions for entity rows of its database, in one batched pass."""
        started = time.perf_counter()
        if self.policy.answers != PREDICTIONS:
            raise _Problem.wrong_endpoint(self.policy)
        rows = _prediction_rows(await self._json(request))
        try:
            decoded = await run_in_threadpool(
                lambda: [self.policy.decode(row, f"rows[{i}]") for i, row in enumerate(rows)]
            )
        except ConfigError as error:
            raise _Problem.of(error) from None
        predictions: list[RowPrediction] = await self._act(decoded, [None] * len(decoded))
        total_ms = (time.perf_counter() - started) * 1000
        for _ in predictions:
            self.batcher.stats.record_request(total_ms)
        return JSONResponse(
            {"predictions": [p.as_dict() for p in predictions], "timing": _timing(predictions, total_ms)}
        )

    async def _json(self, request: Request) -> Any:
        body = await self._body(request)
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise _Problem(400, f"the body is not JSON: {error}", code="invalid_body") from None
        except RecursionError:
            raise _Problem(
                400,
                "the body is JSON nested too deeply to read (an observation is a few levels deep)",
                code="invalid_body",
            ) from None

    async def _body(self, request: Request) -> bytes:
        """The body, refused with 413 as soon as it is known to be too large (before parsing)."""
        limit = self.options.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        parts, size = [], 0
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise _too_large(limit)
            parts.append(part)
        return b"".join(parts)

    async def _act(self, decoded: list[Any], seeds: list[int | None]) -> list[Any]:
        futures = [
            asyncio.wrap_future(self.batcher.submit(o, s)) for o, s in zip(decoded, seeds, strict=True)
        ]
        try:
            return list(await asyncio.gather(*futures))
        except ServerStopped as error:
            raise _Problem(
                503, str(error), code="stopping", headers={"retry-after": str(STOPPED_RETRY_AFTER_S)}
            ) from None

    # -- websocket (openpi's protocol)

    async def websocket(self, websocket: WebSocket) -> None:
        if not self._authorized(websocket.headers.get("authorization")):
            if "websocket.http.response" in websocket.scope.get("extensions", {}):
                await websocket.send_denial_response(_unauthorized())
            else:
                await websocket.close(code=1008, reason="unauthorized")
            return
        if self.policy.answers != ACTIONS:  # openpi's protocol carries observations only
            problem = _Problem.wrong_endpoint(self.policy)
            if "websocket.http.response" in websocket.scope.get("extensions", {}):
                await websocket.send_denial_response(self._answer(problem))
            else:
                await websocket.close(code=1008, reason=problem.message)
            return
        await websocket.accept()
        self.clients += 1
        try:
            await websocket.send_bytes(pack(self.metadata))
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                answer = await self._ws_answer(message.get("bytes"))
                if isinstance(answer, str):
                    await websocket.send_text(answer)
                else:
                    await websocket.send_bytes(answer)
        except WebSocketDisconnect:
            return
        finally:
            self.clients -= 1

    async def _ws_answer(self, data: bytes | None) -> bytes | str:
        """One message's answer: msgpack bytes, or a text frame with the error body."""
        started = time.perf_counter()
        try:
            if data is None:
                raise _Problem(400, "send observations as binary msgpack frames", code="invalid_body")
            try:
                observation = await run_in_threadpool(unpack, data)
            except WireError as error:
                raise _Problem(400, str(error), code="invalid_body") from None
            if not isinstance(observation, dict):
                raise _Problem(400, "a message must be an observation (a map)", param="observation")
            observation = dict(observation)
            try:
                seed = check_seed(observation.pop(SEED_FIELD, None), SEED_FIELD)
                decoded = await run_in_threadpool(self.policy.decode, observation)
            except ConfigError as error:
                raise _Problem.of(error) from None
            (chunk,) = await self._act([decoded], [seed])
        except _Problem as problem:
            return json.dumps(problem.body(self.options.shown))
        except Exception:  # the model's or the machine's fault: logged here, never sent
            log.exception("the policy server failed on a websocket message")
            return json.dumps(error_body(500, "the policy server failed on this observation"))
        total_ms = (time.perf_counter() - started) * 1000
        self.batcher.stats.record_request(total_ms)
        timing = {**chunk.timing.as_dict(), "infer_ms": total_ms, "total_ms": total_ms}
        return pack({"actions": chunk.actions, "seed": chunk.seed, "server_timing": timing})


def _public_metadata(metadata: dict[str, Any], options: ServingOptions) -> dict[str, Any]:
    """The model's metadata as clients see it: named as `options.model_name` says, and every text in
    it through `options.shown` (an RT-J's database directory, a model's path)."""

    def shown(value: Any) -> Any:
        if isinstance(value, str):
            return options.shown(value) if options.shown is not None else value
        if isinstance(value, dict):
            return {key: shown(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [shown(item) for item in value]
        return value

    public = shown(metadata)
    if options.model_name is not None:
        public["model"] = options.model_name
    return dict(public)


def _request_parts(parsed: Any) -> tuple[list[tuple[str, Any]], list[int | None], bool]:
    """(field, observation) pairs, their seeds, and whether the request carried several."""
    if not isinstance(parsed, dict):
        raise _Problem(400, "the body must be a JSON object", code="invalid_body")
    for key in parsed:
        if key not in REQUEST_FIELDS:
            raise _Problem(
                400,
                f"{key}: unknown field; a request has observation and seed, or observations and seeds",
                param=key,
                code="unknown_field",
            )
    try:
        if "observations" in parsed:
            if "observation" in parsed or "seed" in parsed:
                raise _Problem(
                    400,
                    "give observation and seed, or observations and seeds, not both",
                    param="observations",
                )
            many = parsed["observations"]
            if not isinstance(many, list) or not 1 <= len(many) <= MAX_OBSERVATIONS_PER_REQUEST:
                raise _Problem(
                    400,
                    f"observations: must be a list of 1 to {MAX_OBSERVATIONS_PER_REQUEST} observations",
                    param="observations",
                )
            seeds = parsed.get("seeds")
            if seeds is None:
                seeds = [None] * len(many)
            if not isinstance(seeds, list) or len(seeds) != len(many):
                raise _Problem(400, f"seeds: must be a list of {len(many)} seeds (or null)", param="seeds")
            return (
                [(f"observations[{i}]", o) for i, o in enumerate(many)],
                [check_seed(s, f"seeds[{i}]") for i, s in enumerate(seeds)],
                True,
            )
        if "observation" not in parsed:
            raise _Problem(400, "observation: missing", param="observation", code="missing_field")
        if "seeds" in parsed:
            raise _Problem(400, "seeds: goes with observations; give seed with observation", param="seeds")
        return [("observation", parsed["observation"])], [check_seed(parsed.get("seed"))], False
    except ConfigError as error:
        raise _Problem.of(error) from None


def _prediction_rows(parsed: Any) -> list[Any]:
    """The rows of a POST /predictions body, each checked by the model's decode."""
    if not isinstance(parsed, dict):
        raise _Problem(400, "the body must be a JSON object", code="invalid_body")
    for key in parsed:
        if key not in PREDICTION_FIELDS:
            raise _Problem(400, f"{key}: unknown field; a request has rows", param=key, code="unknown_field")
    if "rows" not in parsed:
        raise _Problem(400, "rows: missing", param="rows", code="missing_field")
    rows = parsed["rows"]
    if not isinstance(rows, list) or not 1 <= len(rows) <= MAX_ROWS_PER_REQUEST:
        raise _Problem(400, f"rows: must be a list of 1 to {MAX_ROWS_PER_REQUEST} rows", param="rows")
    return rows


def _timing(chunks: Sequence[ActionChunk | RowPrediction], total_ms: float) -> dict[str, float]:
    """A request's time by stage: its observations' (or rows') decode, preprocess and postprocess added up,
    the model's longest pass (they usually share one), and the whole request's wall time."""
    return {
        "decode_ms": sum(c.timing.decode_ms for c in chunks),
        "preprocess_ms": sum(c.timing.preprocess_ms for c in chunks),
        "model_ms": max(c.timing.model_ms for c in chunks),
        "postprocess_ms": sum(c.timing.postprocess_ms for c in chunks),
        "total_ms": total_ms,
    }


def _unauthorized() -> JSONResponse:
    body = error_body(
        401,
        "missing or wrong key: send the header Authorization: Bearer <key> (or Api-Key <key>)",
        code="invalid_api_key",
    )
    return JSONResponse(body, 401, headers={"www-authenticate": "Bearer"})


def _too_large(limit: int) -> _Problem:
    return _Problem(413, f"the body is over the limit of {limit:,} bytes", code="body_too_large")


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    message = {404: "no such endpoint", 405: "method not allowed"}.get(error.status_code, str(error.detail))
    return JSONResponse(error_body(error.status_code, message), error.status_code, headers=error.headers)


async def _server_error(request: Request, error: Exception) -> Response:
    log.error("the policy server failed on %s %s", request.method, request.url.path, exc_info=error)
    return JSONResponse(error_body(500, "the policy server failed on this request"), 500)


class RunningPolicyServer:
    """A policy server listening in a background thread."""

    def __init__(
        self, url: str, metadata: dict[str, Any], app: _PolicyApp, server: Any, thread: threading.Thread
    ) -> None:
        self.url = url  # "http://HOST:PORT"; the websocket is at "ws://HOST:PORT/"
        self.metadata = metadata
        self._app = app
        self._server = server
        self._thread = thread

    @property
    def websocket_url(self) -> str:
        return "ws" + self.url.removeprefix("http") + "/"

    def stats(self) -> dict[str, Any]:
        """requests, requests_per_second (last 60 s), latency_ms {p50, p90, p99}, clients (open
        websockets), batches, mean_batch, last_request_at (unix s or None)."""
        return self._app.batcher.stats.snapshot(clients=self._app.clients)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self._app.batcher.stop()


def start_policy_server(
    model: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    options: ServingOptions = ServingOptions(),  # frozen, so one shared default is safe
) -> RunningPolicyServer:
    """Load the model once (a job's output dir, a work dir, a base model name such as pi05-tiny;
    a tuned RT-J with the database of its task, loaded once too), serve it in a background thread
    (uvicorn), return once it listens. port=0 picks a free port."""
    import uvicorn

    if token is not None and not token.strip():
        raise ConfigError("token: must not be empty (None serves without authentication)", param="token")
    policy = load_served_model(
        model,
        device=options.device,
        num_steps=options.num_steps,
        database=options.database,
        task=options.task,
    )
    batcher = Batcher(policy, max_batch=options.max_batch, max_wait_ms=options.max_wait_ms)
    routes = _PolicyApp(batcher, token, options)
    try:
        listener = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, reuse_port=False
        )
    except OSError as error:
        batcher.stop()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {error.strerror or error}", param="port"
        ) from None
    bound_port = listener.getsockname()[1]
    config = uvicorn.Config(
        routes.app(),
        log_level="warning",
        lifespan="off",
        ws="websockets-sansio",
        ws_max_size=options.max_body_bytes,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [listener]}, name="relay-policy-server", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            batcher.stop()
            raise RuntimeError(f"the policy server did not start on {host}:{bound_port}")
        time.sleep(0.01)
    shown_host = f"[{host}]" if ":" in host else host
    return RunningPolicyServer(f"http://{shown_host}:{bound_port}", routes.metadata, routes, server, thread)
