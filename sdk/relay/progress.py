"""Progress of a long run, for a person watching a terminal or reading a log: the one helper that
`job.wait()`, `relay local train|eval`, `relay fine-tunes events --follow` (piped) and the local
Trainer report through.

On a terminal: a rich progress bar. Anywhere else (output piped to a file, CI, `nohup`): plain
lines, one when something changed (the step, the status, the loss) but at most one every
`RELAY_PROGRESS_SECONDS` (default 5), and while nothing changes one every 10 s, so a long run
never looks hung and a slow one does not repeat itself. Every line and the bar show the rate
(steps/s) and the time left, at the recent pace (`recent_rate`: the one ETA of every view).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from relay.formatting import duration_text

DEFAULT_EVERY = 5.0
# With nothing new to say, a line this often (or every RELAY_PROGRESS_SECONDS, if longer).
HEARTBEAT_SECONDS = 10.0


def line_interval() -> float:
    try:
        return max(0.0, float(os.environ.get("RELAY_PROGRESS_SECONDS") or DEFAULT_EVERY))
    except ValueError:
        return DEFAULT_EVERY


# The pace an ETA divides by, one definition for the results card (the API and the console), the
# CLI and the local trainer: steps over wall-clock time across the latest RATE_WINDOW_SECONDS of
# reported steps (checkpoints, validation and slow steps included, as they will be again), and
# across at least the two latest reports, so that a job reporting less often still has a pace.
RATE_WINDOW_SECONDS = 60.0


def recent_rate(points: Sequence[tuple[int, float]], window: float = RATE_WINDOW_SECONDS) -> float | None:
    """Steps per second over `points` (step, seconds on any one clock; oldest first) within
    `window` seconds of the latest, or over the latest two when only one is that recent."""
    if len(points) < 2:
        return None
    latest_step, latest_at = points[-1]
    first = len(points) - 2
    while first > 0 and latest_at - points[first - 1][1] <= window:
        first -= 1
    step, at = points[first]
    if latest_at <= at or latest_step <= step:
        return None
    return (latest_step - step) / (latest_at - at)


class Rate:
    """The pace of a run watched as it goes (`recent_rate` over the steps seen, each at the time it
    was first seen), and the time left at it. It starts when the step first moves: the step found
    at the start may have waited in a queue or behind a warm-up. A step going back (a resumed
    run) starts it anew."""

    def __init__(self) -> None:
        self._points: list[tuple[int, float]] = []
        self._last_step: int | None = None

    def add(self, step: int, now: float) -> None:
        moved = self._last_step is not None and step != self._last_step
        if self._points and step < self._points[-1][0]:
            self._points.clear()
        self._last_step = step
        if moved:
            self._points.append((step, now))
            # Only what the window can use: the points within it and one before.
            while len(self._points) > 2 and now - self._points[1][1] > RATE_WINDOW_SECONDS:
                self._points.pop(0)

    def per_second(self) -> float | None:
        return recent_rate(self._points)

    def text(self, step: int, total: int, unit: str = "step") -> str:
        rate = self.per_second()
        if rate is None or rate <= 0:
            return f"- {unit}s/s"
        shown = f"{rate:.3g} {unit}s/s"
        return shown if step >= total else f"{shown}, {duration_text((total - step) / rate)} left"


class ProgressReport:
    """`update(step, detail)` as work advances, `close()` at the end.

    `live=None` draws a bar when `stream` is a terminal and prints lines otherwise.
    """

    def __init__(
        self,
        description: str,
        total: int,
        *,
        stream: IO[str] | None = None,
        live: bool | None = None,
        every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        unit: str = "step",
    ) -> None:
        self.description = description
        self.unit = unit  # what is counted: "step 10/100", "12 steps/s"
        self.clock = clock  # a parameter so a test can step time without sleeping
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.every = line_interval() if every is None else every
        self.started = clock()
        self.rate = Rate()
        self._last_line_at: float | None = None
        self._last_line: str | None = None
        self._step = 0
        self._detail = ""
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self._bar: Any = None
        if live if live is not None else isatty:
            self._bar = _Bar(description, total, self.stream)

    def update(self, step: int, detail: str = "", description: str | None = None) -> None:
        now = self.clock()
        self._step, self._detail = step, detail
        self.rate.add(step, now)
        if description is not None:
            self.description = description
        if self._bar is not None:
            self._bar.update(step, self._with_rate(detail), self.description)
            return
        if self._line_due(now):
            self._line(now)

    def _line_due(self, now: float) -> bool:
        if self._last_line_at is None:
            return True
        since = now - self._last_line_at
        if self._format() != self._last_line:
            return since >= self.every or self._step >= self.total
        return since >= max(HEARTBEAT_SECONDS, self.every)

    def note(self, message: str) -> None:
        """A one-off message (resumed, a skipped step...), above the bar or as its own line."""
        if self._bar is not None:
            self._bar.console.print(message, highlight=False, markup=False)
        else:
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self._last_line != self._format():
            self._line(self.clock())

    def _with_rate(self, detail: str) -> str:
        rate = self.rate.text(self._step, self.total, self.unit)
        return f"{detail}  {rate}" if detail else rate

    def _format(self) -> str:
        detail = f"  {self._detail}" if self._detail else ""
        return f"{self.description}  {self.unit} {self._step}/{self.total}{detail}"

    def _line(self, now: float) -> None:
        text = self._format()
        rate = self.rate.text(self._step, self.total, self.unit)
        print(f"{text}  {rate}  {duration_text(now - self.started)}", file=self.stream, flush=True)
        self._last_line_at, self._last_line = now, text


class _Bar:
    def __init__(self, description: str, total: int, stream: IO[str]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(file=stream)
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self._progress.start()
        self._task = self._progress.add_task(description, total=total, detail="")

    def update(self, step: int, detail: str, description: str) -> None:
        self._progress.update(self._task, completed=step, description=description, detail=detail)

    def stop(self) -> None:
        self._progress.stop()
