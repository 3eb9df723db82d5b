"""The SDK's HTTP plumbing: one httpx client per (base URL, key), errors, retries, SSE, downloads."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from relay import __version__, client_config
from relay.errors import APIError

if TYPE_CHECKING:
    from relay.webhooks import Webhooks

# Statuses worth another try: the server was busy or restarting, not wrong.
RETRY_STATUSES = frozenset({408, 429, 502, 503, 504})


class Client:
    """Talks to one Relay API with one key. Thread-safe (httpx.Client is)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 2,
    ) -> None:
        settings = client_config.resolve(base_url, api_key)
        self.base_url = settings.base_url
        self.api_key = settings.api_key
        self.max_retries = max_retries
        headers = {"user-agent": f"relay-python/{__version__}"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    @property
    def webhooks(self) -> Webhooks:
        """The user's webhooks: ``client.webhooks.create(url=...)``, ``.list()``, ``.deliveries(id)``."""
        # Imported here: relay.webhooks imports this module (for its type), and most clients never use it.
        from relay.webhooks import Webhooks

        return Webhooks(self)

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        retry: bool | None = None,
    ) -> Any:
        """Send a request and return its JSON body; raise APIError for an error answer.

        GETs are retried on connection errors and busy answers; other methods only when the caller
        says a repeat is harmless (`retry=True`, e.g. a create that carries an Idempotency-Key).
        """
        response = self.send(method, path, json_body=json_body, params=params, headers=headers, retry=retry)
        return response.json()

    def send(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        retry: bool | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """`request`, returning the response itself (for binary bodies and answers other than 200)."""
        self._require_key(method, path)
        retry = method == "GET" if retry is None else retry
        params = {k: v for k, v in (params or {}).items() if v is not None}
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method, path, json=json_body, content=content, params=params, headers=headers, **extra
                )
            except httpx.TransportError as error:
                if retry and attempt < self.max_retries:
                    attempt = self._backoff(attempt)
                    continue
                message = f"cannot reach {self.base_url}: {error} ({client_config.where_looked()})"
                raise APIError(method, path, None, message) from None
            if response.status_code in RETRY_STATUSES and retry and attempt < self.max_retries:
                attempt = self._backoff(attempt)
                continue
            if response.is_error:
                raise error_from_response(method, path, response)
            return response

    def stream_events(self, path: str, params: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Follow a server-sent event stream; yield each event's JSON data until the server's [DONE]."""
        self._require_key("GET", path)
        params = {k: v for k, v in (params or {}).items() if v is not None}
        last_id: str | None = None
        reconnects = 0
        while True:
            headers = {"accept": "text/event-stream"}
            if last_id is not None:
                headers["last-event-id"] = last_id
            try:
                with self._http.stream("GET", path, params=params, headers=headers, timeout=None) as response:
                    if response.is_error:
                        response.read()
                        raise error_from_response("GET", path, response)
                    data: list[str] = []
                    event_id: str | None = None
                    for line in response.iter_lines():
                        if line.startswith("data:"):
                            data.append(line[5:].lstrip(" "))
                        elif line.startswith("id:"):
                            event_id = line[3:].strip()
                        elif line == "" and data:
                            payload = "\n".join(data)
                            data = []
                            if payload == "[DONE]":
                                return
                            if event_id is not None:
                                last_id = event_id
                            reconnects = 0
                            yield json.loads(payload)
            except httpx.TransportError as error:
                if reconnects >= self.max_retries:
                    message = f"event stream from {self.base_url} broke: {error}"
                    raise APIError("GET", path, None, message) from None
                reconnects = self._backoff(reconnects)

    def download(
        self,
        path: str,
        destination: Path,
        *,
        on_bytes: Callable[[int], None] | None = None,
    ) -> str:
        """Download a file to `destination`, resuming a partial copy with a range request, and
        check it against the server's sha256. Returns the sha256."""
        self._require_key("GET", path)
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_name(destination.name + ".part")
        for attempt in range(self.max_retries + 1):
            have = partial.stat().st_size if partial.exists() else 0
            headers = {"range": f"bytes={have}-"} if have else {}
            try:
                with self._http.stream("GET", path, headers=headers, timeout=None) as response:
                    if response.status_code == 416:  # the partial copy is stale: start over
                        partial.unlink()
                        continue
                    if response.is_error:
                        response.read()
                        raise error_from_response("GET", path, response)
                    expected = response.headers.get("x-checksum-sha256")
                    mode = "ab" if response.status_code == 206 else "wb"
                    if on_bytes is not None and mode == "ab":
                        on_bytes(have)
                    with open(partial, mode) as file:
                        for chunk in response.iter_bytes(1 << 20):
                            file.write(chunk)
                            if on_bytes is not None:
                                on_bytes(len(chunk))
            except httpx.TransportError as error:
                if attempt < self.max_retries:
                    self._backoff(attempt)
                    continue
                raise APIError("GET", path, None, f"download from {self.base_url} broke: {error}") from None
            digest = sha256_of(partial)
            if expected and digest != expected:
                partial.unlink()
                if attempt < self.max_retries:
                    continue
                message = f"checksum mismatch: got sha256 {digest}, the server says {expected}"
                raise APIError("GET", path, None, message)
            partial.replace(destination)
            return digest
        raise AssertionError("unreachable")

    def _require_key(self, method: str, path: str) -> None:
        if not self.api_key:
            raise APIError(
                method,
                path,
                None,
                "no API key: set RELAY_API_KEY, or start a local server with `relay server` "
                f"(it writes one to {client_config.client_file()}, where this client looked)",
            )

    @staticmethod
    def _backoff(attempt: int) -> int:
        time.sleep(min(0.5 * 2**attempt, 8.0))
        return attempt + 1


def error_from_response(method: str, path: str, response: httpx.Response) -> APIError:
    """An APIError from an error answer in the peers' shape ``{"error": {message, type, param, code}}``."""
    request_id = response.headers.get("x-request-id")
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return APIError(
            method,
            path,
            response.status_code,
            error["message"],
            type=error.get("type"),
            param=error.get("param"),
            code=error.get("code"),
            request_id=request_id,
        )
    text = response.text.strip()[:300] or response.reason_phrase
    return APIError(method, path, response.status_code, text, request_id=request_id)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


_clients: dict[tuple[str, str | None], Client] = {}
_clients_lock = threading.Lock()


def default_client() -> Client:
    """The client for the current settings (env vars or the local client file), reused across calls."""
    settings = client_config.resolve()
    key = (settings.base_url, settings.api_key)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = Client(settings.base_url, settings.api_key)
        return client
