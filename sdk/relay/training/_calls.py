"""How a training client's calls travel: numbered, sent in order by one thread, results long-polled.

Each call is encoded in the caller's thread (so the caller may reuse its arrays at once), numbered
and queued; the sender thread POSTs calls one after another, so the next call is on its way while
the GPU runs this one. The service keeps them in that order and the worker runs them in it. A
call's number is its idempotency key: a retried POST that had arrived is not run twice.

The sender keeps at most `max_in_flight` calls ahead of the worker (when that many wait, it waits
until half of them have run), and the local queue holds as many again: a loop that runs far ahead
of the GPU waits in its call rather than filling memory on both sides.

A heartbeat thread tells the service the client is alive while the session is open; a session
without contact for the idle timeout is closed by its worker.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from relay import http_client
from relay.errors import APIError, RequestFailedError
from relay.training import wire
from relay.training.futures import APIFuture
from relay.training.status import ENDED

log = logging.getLogger("relay.training")

SESSIONS = "/v1/sessions"
POLL_SECONDS = 30.0  # how long one long-poll waits on the service
SEND_PATIENCE_SECONDS = 120.0  # how long the sender retries a call the service does not take
MAX_IN_FLIGHT = 8


@dataclass(frozen=True)
class Result:
    value: Any
    request_id: str | None


class Call:
    """One call: its number once sent, and its outcome once known (a Result or an exception)."""

    def __init__(self, name: str, body: bytes | None) -> None:
        self.name = name
        self.body = body
        self.seq: int | None = None
        self.request_id: str | None = None
        self.sent = threading.Event()  # set once the service holds it, or sending failed
        self.outcome: Result | BaseException | None = None
        self.lock = threading.Lock()

    def fail(self, error: BaseException) -> None:
        self.body = None
        if self.outcome is None:
            self.outcome = error
        self.sent.set()


_STOP = object()


class CallStream:
    """The calls of one session, and its heartbeat."""

    def __init__(
        self,
        http: http_client.Client,
        session_id: str,
        heartbeat_seconds: float,
        *,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.http = http
        self.session_id = session_id
        self.path = f"{SESSIONS}/{session_id}"
        self.max_in_flight = max_in_flight
        # Held while numbering and queueing a call; forward_backward_custom holds it across its
        # two calls so that nothing comes between them.
        self.order = threading.RLock()
        self._next_seq = 1
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_in_flight)
        self._sent: collections.deque[Call] = collections.deque()
        self._done_seq = 0  # every call up to here has run
        self._ended: BaseException | None = None  # set once the session can take no more calls
        self._closed = False
        self._sender = threading.Thread(target=self._send_loop, name=f"relay-send-{session_id}", daemon=True)
        self._sender.start()
        self._heartbeat = _Heartbeat(self, heartbeat_seconds)
        self._heartbeat.start()

    # -- submitting -------------------------------------------------------------------------------

    def submit(self, name: str, message: dict[str, Any], convert: Callable[[Any], Any]) -> APIFuture[Any]:
        """Encode the call here and queue it; a call that cannot be encoded fails its own future."""
        try:
            body = wire.encode(message)
        except ValueError as error:  # types.DatumError, wire.WireError
            return failed(name, RequestFailedError(str(error), category="user", call=name), convert)
        call = Call(name, body)
        with self.order:
            if self._closed:
                call.fail(
                    RequestFailedError(
                        f"training client {self.session_id} is closed",
                        category="user",
                        call=name,
                        code="session_closed",
                    )
                )
            else:
                call.seq = self._next_seq
                self._next_seq += 1
                self._queue.put(call)  # blocks while the loop is far ahead of the GPU
        return APIFuture(self, call, convert)

    def _send_loop(self) -> None:
        while True:
            call = self._queue.get()
            if call is _STOP:
                return
            if self._ended is not None:
                call.fail(self._ended)
                continue
            try:
                if call.name != "close":  # a close waits for nothing
                    self._wait_for_room(call)
                self._post(call)
            except _SessionEnded as ended:
                self._ended = ended.error
                call.fail(ended.error)
            except Exception as error:
                call.fail(error)

    def _wait_for_room(self, call: Call) -> None:
        assert call.seq is not None
        if call.seq - self._done_seq <= self.max_in_flight:
            return
        # The window is full: wait until half of it has run (not just the oldest call), so that a
        # loop far ahead of the GPU costs one look-up every few calls rather than one a call.
        target = call.seq - self.max_in_flight // 2
        reached: Call | None = None
        while self._sent and (self._sent[0].seq or 0) <= target:
            reached = self._sent.popleft()
        if reached is not None and reached.outcome is None:
            # Its own future reports a failure; here it only has to be over.
            with contextlib.suppress(Exception):
                self.outcome(reached, None)

    def _post(self, call: Call) -> None:
        assert call.seq is not None and call.body is not None
        headers = {"content-type": wire.MEDIA_TYPE, "x-relay-seq": str(call.seq)}
        give_up = time.monotonic() + SEND_PATIENCE_SECONDS
        attempt = 0
        while True:
            try:
                response = self.http.send(
                    "POST", f"{self.path}/calls", content=call.body, headers=headers, retry=False
                )
                break
            except APIError as error:
                retryable = error.status is None or error.status in http_client.RETRY_STATUSES
                if retryable and time.monotonic() < give_up:
                    time.sleep(min(0.2 * 2**attempt, 5.0))
                    attempt += 1
                    continue
                if error.status in (404, 409, 410):
                    raise _SessionEnded(_call_error(error, call)) from None
                raise _call_error(error, call) from None
        call.request_id = response.json().get("request_id")
        call.body = None
        self._sent.append(call)
        call.sent.set()

    # -- results ----------------------------------------------------------------------------------

    def outcome(self, call: Call, deadline: float | None) -> Result | BaseException:
        """The call's outcome, long-polling the service until `deadline` (TimeoutError after it)."""
        if not call.sent.wait(_remaining(deadline)):
            raise TimeoutError(f"{call.name} is still waiting to be sent (its session is busy)")
        with call.lock:
            while call.outcome is None:
                remaining = _remaining(deadline)
                wait = POLL_SECONDS if remaining is None else max(0.0, min(POLL_SECONDS, remaining))
                try:
                    response = self.http.send(
                        "GET",
                        f"{self.path}/calls/{call.seq}",
                        params={"wait": round(wait, 3)},
                        timeout=wait + 30.0,
                    )
                except APIError as error:
                    if error.status in (404, 410):
                        call.outcome = _call_error(error, call)
                        break
                    raise
                if response.status_code == 200:
                    call.outcome = _read_result(response.content, call)
                    assert call.seq is not None
                    self._done_seq = max(self._done_seq, call.seq)
                elif deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"{call.name} (call {call.seq}) has not finished yet")
            return call.outcome

    # -- closing ----------------------------------------------------------------------------------

    def close(self, *, drain: bool) -> None:
        """Stop taking calls and end the session. With `drain`, calls already made are sent first
        (and run before the session ends); without, those not yet sent fail.

        The last call is a close, so the worker lets go as soon as it has run the calls before it;
        the close request to the API makes it durable (the worker also ends a session whose close
        was asked for once no calls are left, should the close call not arrive)."""
        with self.order:
            if self._closed:
                return
            self._closed = True
            if not drain:
                self._fail_queued("the training client was closed before this call was sent")
            last = Call("close", wire.encode({"op": "close"}))
            last.seq = self._next_seq
            self._next_seq += 1
            self._queue.put(last)
            self._queue.put(_STOP)
        self._heartbeat.stop()
        self._sender.join(timeout=None if drain else 10.0)
        try:
            self.http.send("POST", f"{self.path}/close", retry=True)
        except APIError as error:
            log.warning("could not close session %s: %s (it ends when idle)", self.session_id, error)

    def _fail_queued(self, message: str) -> None:
        while True:
            try:
                call = self._queue.get_nowait()
            except queue.Empty:
                return
            if call is not _STOP:
                call.fail(
                    RequestFailedError(
                        message, category="user", call=call.name, seq=call.seq, code="session_closed"
                    )
                )

    @property
    def closed(self) -> bool:
        return self._closed


class _SessionEnded(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _Heartbeat(threading.Thread):
    """Tells the service every `interval` seconds that the client is alive; warns when it cannot."""

    def __init__(self, stream: CallStream, interval: float) -> None:
        super().__init__(name=f"relay-heartbeat-{stream.session_id}", daemon=True)
        self.stream = stream
        self.interval = interval
        self._stopping = threading.Event()

    def run(self) -> None:
        last_contact = time.monotonic()
        warned = False
        while not self._stopping.wait(self.interval):
            try:
                status = self.stream.http.request("POST", f"{self.stream.path}/heartbeat", retry=True)[
                    "status"
                ]
            except APIError as error:
                if error.status in (404, 410):
                    return
                if not warned and time.monotonic() - last_contact > 4 * self.interval:
                    log.warning(
                        "cannot reach the service for session %s (%s); if this lasts, the session is "
                        "closed for inactivity",
                        self.stream.session_id,
                        error,
                    )
                    warned = True
                continue
            last_contact, warned = time.monotonic(), False
            if status in ENDED:
                return

    def stop(self) -> None:
        self._stopping.set()


def _read_result(content: bytes, call: Call) -> Result | BaseException:
    message = wire.decode(content)
    request_id = message.get("request_id")
    if message.get("ok"):
        return Result(message.get("value"), request_id)
    error = message.get("error") or {}
    return RequestFailedError(
        str(error.get("message", "the call failed")),
        category=str(error.get("category", "server")),
        request_id=request_id,
        call=call.name,
        seq=call.seq,
        code=error.get("code"),
    )


# The service's faults; anything else the API refuses (a closed session, a body too large) is the caller's.
SERVER_CODES = frozenset({"worker_lost", "session_error"})


def _call_error(error: APIError, call: Call) -> RequestFailedError:
    server = error.status is None or error.status >= 500 or error.code in SERVER_CODES
    category = "server" if server else "user"
    return RequestFailedError(
        error.message,
        category=category,
        request_id=error.request_id,
        call=call.name,
        seq=call.seq,
        code=error.code,
    )


def failed(name: str, error: BaseException, convert: Callable[[Any], Any]) -> APIFuture[Any]:
    """A future that failed before its call was sent."""
    call = Call(name, None)
    call.fail(error)
    return APIFuture(None, call, convert)


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())
