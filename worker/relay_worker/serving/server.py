"""The policy server: one loaded pi05 model behind HTTP and openpi's websocket protocol.

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
- `GET /metadata`, `GET /stats`, `GET /healthz`.

Bodies and websocket messages over `max_body_bytes` are refused before they are parsed (413;
websocket close 1009), and no traceback ever goes on the wire.
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
from collections.abc import Awaitable, Callable
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
    ServedPolicy,
    ServerStopped,
    WireError,
    check_seed,
    pack,
    unpack,
)

log = logging.getLogger(__name__)

# Observations one POST /actions may carry.
MAX_OBSERVATIONS_PER_REQUEST = 64
STARTUP_TIMEOUT_S = 60.0
STOPPED_RETRY_AFTER_S = 5
REQUEST_FIELDS = ("observation", "seed", "observations", "seeds")
# The websocket field besides the observation's own.
SEED_FIELD = "seed"


@dataclass(frozen=True)
class ServingOptions:
    max_batch: int = 8  # requests in one forward pass
    max_wait_ms: float = 2.0  # how long the first request waits for others to join it
    max_body_bytes: int = 16 * 2**20  # an HTTP body or a websocket message
    device: str = "auto"
    num_steps: int = 10  # the sampler's Euler steps


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
        return cls(400, error.message, param=error.param, code=error.code)

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


class _PolicyApp:
    """The routes, around one Batcher."""

    def __init__(self, batcher: Batcher, token: str | None, options: ServingOptions) -> None:
        self.batcher = batcher
        self.policy: ServedPolicy = batcher.policy
        self.metadata = self.policy.metadata()
        self.token = token
        self.options = options
        self.clients = 0

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/actions", self._guarded(self.actions), methods=["POST"]),
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
                return JSONResponse(problem.body(), problem.status, headers=problem.headers)

        return guarded

    # -- HTTP

    async def get_metadata(self, request: Request) -> Response:
        return JSONResponse(self.metadata)

    async def get_stats(self, request: Request) -> Response:
        return JSONResponse(self.batcher.stats.snapshot(clients=self.clients))

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.metadata["model"]})

    async def actions(self, request: Request) -> Response:
        started = time.perf_counter()
        body = await self._body(request)
        try:
            parsed = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise _Problem(400, f"the body is not JSON: {error}", code="invalid_body") from None
        observations, seeds, several = _request_parts(parsed)
        try:
            decoded = await run_in_threadpool(lambda: [self.policy.decode(o, f) for f, o in observations])
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

    async def _act(self, decoded: list[Any], seeds: list[int | None]) -> list[ActionChunk]:
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
            return json.dumps(problem.body())
        except Exception:  # the model's or the machine's fault: logged here, never sent
            log.exception("the policy server failed on a websocket message")
            return json.dumps(error_body(500, "the policy server failed on this observation"))
        total_ms = (time.perf_counter() - started) * 1000
        self.batcher.stats.record_request(total_ms)
        timing = {**chunk.timing.as_dict(), "infer_ms": total_ms, "total_ms": total_ms}
        return pack({"actions": chunk.actions, "seed": chunk.seed, "server_timing": timing})


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


def _timing(chunks: list[ActionChunk], total_ms: float) -> dict[str, float]:
    """A request's time by stage: its observations' decode, preprocess and postprocess added up,
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
    """Load the model once (a job's output dir, a work dir, a base model name such as pi05-tiny),
    serve it in a background thread (uvicorn), return once it listens. port=0 picks a free port."""
    import uvicorn

    if token is not None and not token.strip():
        raise ConfigError("token: must not be empty (None serves without authentication)", param="token")
    policy = ServedPolicy.load(model, device=options.device, num_steps=options.num_steps)
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
