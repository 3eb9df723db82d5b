"""The processes that describe datasets for `GET /v1/datasets/{name}`.

The API never imports the engine (pyproject.toml's import contracts), and describing a dataset is
the engine's work: it reads parquet and may fetch a Hub repo's meta files. So the API keeps a few
engine processes, `python -m relay_engine.datasets.describe_server --serve`, started on first use,
and writes each request to one of them as a JSON line; the answer is one JSON line back. A process
serves one request at a time, and is used again for the next, so a request costs no Python start.

A process is replaced when the API's environment has changed since it started (HF_ENDPOINT,
HF_TOKEN and RELAY_CACHE_DIR are read by the engine at each call, in its own environment). One that
takes longer than the limit is killed; one that dies is forgotten, and its last words on stderr go
into the answer. Each exits by itself after `idle_seconds` without a request, and when the API's
end of its stdin closes (the API stopped).
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# The engine's server of descriptions (relay_engine.datasets.describe_server).
SERVER_MODULE = "relay_engine.datasets.describe_server"
PROCESSES = 2
TIMEOUT_SECONDS = 120.0
IDLE_SECONDS = 300.0


class InspectionFailed(Exception):
    """No answer came: the process took longer than the limit (`timed_out`), or died."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass
class _Process:
    popen: subprocess.Popen[bytes]
    environment: dict[str, str]
    pending: bytes = b""
    last_words: deque[str] = field(default_factory=lambda: deque(maxlen=5))
    stderr_reader: threading.Thread | None = None

    def ask(self, request: bytes, deadline: float) -> bytes | None:
        """The answer line to `request`; None if the process closed its stdout first (it ended)."""
        assert self.popen.stdin is not None and self.popen.stdout is not None
        try:
            self.popen.stdin.write(request)
            self.popen.stdin.flush()
        except (BrokenPipeError, ValueError):
            return None
        descriptor = self.popen.stdout.fileno()
        while b"\n" not in self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([descriptor], [], [], remaining)
            if ready:
                chunk = os.read(descriptor, 1 << 16)
                if not chunk:
                    return None
                self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                stream.close()

    def ended(self) -> str:
        """How it ended, once its stdout closed (it is killed if it lingers), for a message: its
        exit status and its last words on stderr."""
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.popen.kill()
        status = self.popen.wait()
        if self.stderr_reader is not None:
            self.stderr_reader.join(timeout=5)
        words = " | ".join(self.last_words)
        return f"exit status {status}" + (f"; it said: {words}" if words else "")


class Inspectors:
    """Up to `processes` engine processes describing datasets, one request at a time each (the
    caller keeps to `processes` requests at once; more would start more processes)."""

    def __init__(
        self,
        *,
        processes: int = PROCESSES,
        timeout_seconds: float = TIMEOUT_SECONDS,
        idle_seconds: float = IDLE_SECONDS,
        command: list[str] | None = None,
    ) -> None:
        self.processes = processes
        self.timeout_seconds = timeout_seconds
        self.command = command or [
            sys.executable, "-m", SERVER_MODULE, "--serve", "--idle-seconds", f"{idle_seconds:g}",
        ]  # fmt: skip
        self._idle: list[_Process] = []
        self._lock = threading.Lock()
        self._closed = False

    def describe(self, name: str, revision: str | None, cache_dir: str | None) -> dict[str, Any]:
        """The engine's answer: `{"dataset": {...}}` or `{"error": {"reason", "message"}}`. Raises
        InspectionFailed when no answer comes within `timeout_seconds`, or the process dies."""
        request = json.dumps({"name": name, "revision": revision, "cache_dir": cache_dir}).encode() + b"\n"
        deadline = time.monotonic() + self.timeout_seconds
        for attempt in range(2):
            process = self._take()
            try:
                line = process.ask(request, deadline)
            except TimeoutError:
                process.stop()
                raise InspectionFailed(
                    f"describing dataset {name} took longer than {self.timeout_seconds:g} s", timed_out=True
                ) from None
            except BaseException:
                process.stop()
                raise
            if line is not None:
                self._give_back(process)
                try:
                    answer: dict[str, Any] = json.loads(line)
                except ValueError:
                    raise InspectionFailed(f"the engine process answered {line[:200]!r}") from None
                return answer
            how = process.ended()
            process.stop()
            # A process that ended by itself (idle, as the request was on its way) is replaced once.
            if attempt == 0 and process.popen.returncode == 0:
                continue
            raise InspectionFailed(f"the engine process describing dataset {name} ended ({how})")
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for process in idle:
            process.stop()

    def _take(self) -> _Process:
        """An idle process started in the environment the API has now, else a new one."""
        environment = dict(os.environ)
        stale: list[_Process] = []
        found: _Process | None = None
        with self._lock:
            while self._idle and found is None:
                process = self._idle.pop()
                if process.popen.poll() is None and process.environment == environment:
                    found = process
                else:
                    stale.append(process)
        for process in stale:
            process.stop()
        return found or self._start(environment)

    def _give_back(self, process: _Process) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.processes:
                self._idle.append(process)
                return
        process.stop()

    def _start(self, environment: dict[str, str]) -> _Process:
        popen = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**environment, "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
        )
        process = _Process(popen, environment)
        process.stderr_reader = threading.Thread(
            target=_read_stderr, args=(process,), name="inspector-stderr", daemon=True
        )
        process.stderr_reader.start()
        return process


def _read_stderr(process: _Process) -> None:
    """Log what the process says on stderr, keeping its last lines for a message."""
    assert process.popen.stderr is not None
    with process.popen.stderr:
        for raw in process.popen.stderr:
            line = raw.decode(errors="replace").rstrip()
            if line:
                process.last_words.append(line)
                log.warning("dataset inspector %d: %s", process.popen.pid, line)
