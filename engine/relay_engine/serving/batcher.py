"""Requests from any number of clients, answered in batches by one inference thread.

`Batcher.submit(observation, seed)` queues a decoded observation and returns a Future of its
`ActionChunk`. The inference thread takes the first waiting request, lets others join it for up
to `max_wait_ms` (those already waiting join at once) up to `max_batch`, runs ONE batched
`ServedPolicy.act` and answers each. `ServingStats` keeps what the server reports: requests per
second over the last minute, latency percentiles, batches and their mean size.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from relay_engine.errors import ConfigError
from relay_engine.serving.observations import DecodedObservation
from relay_engine.serving.policy import ActionChunk, ServedPolicy

log = logging.getLogger(__name__)

MAX_BATCH_LIMIT = 256
RATE_WINDOW_S = 60.0
LATENCIES_KEPT = 10_000


class ServerStopped(RuntimeError):
    """The batcher stopped before it answered the request."""


@dataclass
class _Request:
    observation: DecodedObservation
    seed: int | None
    future: Future[ActionChunk]


class ServingStats:
    """Counters of a policy server; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self._requests = 0
        self._batches = 0
        self._batched = 0
        self._finished: deque[float] = deque()  # monotonic times within the rate window
        self._latencies: deque[float] = deque(maxlen=LATENCIES_KEPT)
        self._last_request_at: float | None = None

    def record_request(self, latency_ms: float) -> None:
        now = time.monotonic()
        with self._lock:
            self._requests += 1
            self._finished.append(now)
            self._latencies.append(latency_ms)
            self._last_request_at = time.time()
            self._trim(now)

    def record_batch(self, size: int) -> None:
        with self._lock:
            self._batches += 1
            self._batched += size

    def _trim(self, now: float) -> None:
        while self._finished and self._finished[0] < now - RATE_WINDOW_S:
            self._finished.popleft()

    def snapshot(self, clients: int = 0) -> dict[str, Any]:
        """requests, requests_per_second (over the last 60 s, or since the start when shorter),
        latency_ms {p50, p90, p99} of the last 10,000 requests, clients, batches, mean_batch,
        last_request_at (unix seconds, or None)."""
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            window = max(min(RATE_WINDOW_S, now - self.started), 1e-3)
            latencies = np.asarray(self._latencies, dtype=np.float64)
            percentiles = (
                {f"p{q}": float(np.percentile(latencies, q)) for q in (50, 90, 99)}
                if latencies.size
                else {"p50": None, "p90": None, "p99": None}
            )
            return {
                "requests": self._requests,
                "requests_per_second": len(self._finished) / window,
                "latency_ms": percentiles,
                "clients": clients,
                "batches": self._batches,
                "mean_batch": self._batched / self._batches if self._batches else None,
                "last_request_at": self._last_request_at,
            }


class Batcher:
    """One inference thread in front of a ServedPolicy."""

    def __init__(self, policy: ServedPolicy, *, max_batch: int = 8, max_wait_ms: float = 2.0) -> None:
        if (
            isinstance(max_batch, bool)
            or not isinstance(max_batch, int)
            or not 1 <= max_batch <= MAX_BATCH_LIMIT
        ):
            raise ConfigError(
                f"max_batch must be 1 to {MAX_BATCH_LIMIT}, got {max_batch!r}", param="max_batch"
            )
        if not 0 <= max_wait_ms <= 10_000:
            raise ConfigError(f"max_wait_ms must be 0 to 10000, got {max_wait_ms!r}", param="max_wait_ms")
        self.policy = policy
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000
        self.stats = ServingStats()
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relay-inference", daemon=True)
        self._thread.start()

    def submit(self, observation: DecodedObservation, seed: int | None = None) -> Future[ActionChunk]:
        future: Future[ActionChunk] = Future()
        if self._stopped.is_set():
            future.set_exception(ServerStopped("the policy server is stopping"))
            return future
        self._queue.put(_Request(observation, seed, future))
        return future

    def act(
        self, observations: Sequence[DecodedObservation], seeds: Sequence[int | None]
    ) -> list[ActionChunk]:
        """Submit several and wait for them all (they may share a batch with other clients')."""
        futures = [self.submit(o, s) for o, s in zip(observations, seeds, strict=True)]
        return [f.result() for f in futures]

    def stop(self, timeout: float = 30.0) -> None:
        """Answer what is queued, then end the thread."""
        self._stopped.set()
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                break
            batch, stop = self._gather(first)
            self._answer(batch)
            if stop:
                break
        self._fail_waiting()

    def _gather(self, first: _Request) -> tuple[list[_Request], bool]:
        batch = [first]
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch:
            try:
                # Those already waiting join without a wait; then up to the deadline.
                item = self._queue.get_nowait()
            except queue.Empty:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    item = self._queue.get(timeout=left)
                except queue.Empty:
                    break
            if item is None:
                return batch, True
            batch.append(item)
        return batch, False

    def _answer(self, batch: list[_Request]) -> None:
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            chunks = self.policy.act([r.observation for r in live], [r.seed for r in live])
        except Exception as error:  # checks passed, so a fault of the model or the machine
            if len(live) > 1:  # one request's fault must not fail the others': each alone
                log.warning("a batch of %d failed (%s); answering its requests one by one", len(live), error)
                for request in live:
                    self._answer_alone(request)
                return
            log.exception("a request failed")
            live[0].future.set_exception(error)
            return
        self.stats.record_batch(len(live))
        for request, chunk in zip(live, chunks, strict=True):
            request.future.set_result(chunk)

    def _answer_alone(self, request: _Request) -> None:
        try:
            (chunk,) = self.policy.act([request.observation], [request.seed])
        except Exception as error:
            log.exception("a request failed")
            request.future.set_exception(error)
            return
        self.stats.record_batch(1)
        request.future.set_result(chunk)

    def _fail_waiting(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None and item.future.set_running_or_notify_cancel():
                item.future.set_exception(ServerStopped("the policy server stopped"))
