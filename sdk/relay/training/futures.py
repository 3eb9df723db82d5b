"""APIFuture: what every call of a training client returns at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from relay.training._calls import Call, CallStream

T = TypeVar("T")


class APIFuture(Generic[T]):
    """A call on its way to the GPU, or done there. ``.result()`` waits for its value (long-polling
    the service) and raises ``relay.errors.RequestFailedError`` if the call failed, or
    ``TimeoutError`` if `timeout` seconds pass first (the call goes on; ask again later)."""

    def __init__(self, stream: CallStream | None, call: Call, convert: Callable[[Any], T]) -> None:
        self._stream = stream
        self._call = call
        self._convert = convert
        self._lock = threading.Lock()
        self._value: tuple[T] | None = None

    @property
    def seq(self) -> int | None:
        """The call's number in its session (calls run in this order); None if it was never sent."""
        return self._call.seq

    def done(self) -> bool:
        """Whether the outcome is known here already (``result()`` would not wait)."""
        return self._call.outcome is not None

    def result(self, timeout: float | None = None) -> T:
        deadline = None if timeout is None else time.monotonic() + timeout
        outcome = self._call.outcome
        if outcome is None:
            assert self._stream is not None
            outcome = self._stream.outcome(self._call, deadline)
        if isinstance(outcome, BaseException):
            raise outcome
        with self._lock:
            if self._value is None:
                self._value = (self._convert(outcome.value),)
            return self._value[0]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error the call failed with, or None if it succeeded (waits like ``result``)."""
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except Exception as error:
            return error
        return None

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<APIFuture {self._call.name} call {self._call.seq} {state}>"
