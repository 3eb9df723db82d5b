"""Progress of a long run, for a person watching a terminal or reading a log.

On a terminal: a rich progress bar. Anywhere else (output piped to a file, CI, `nohup`): a plain
line every few seconds, so a long run never looks hung. `RELAY_PROGRESS_SECONDS` sets the
interval (default 5).
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

DEFAULT_EVERY = 5.0


def line_interval() -> float:
    try:
        return max(0.0, float(os.environ.get("RELAY_PROGRESS_SECONDS") or DEFAULT_EVERY))
    except ValueError:
        return DEFAULT_EVERY


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


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
    ) -> None:
        self.description = description
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.every = line_interval() if every is None else every
        self.started = time.monotonic()
        self._last_line_at: float | None = None
        self._last_line: str | None = None
        self._step = 0
        self._detail = ""
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self._bar: Any = None
        if live if live is not None else isatty:
            self._bar = _Bar(description, total, self.stream)

    def update(self, step: int, detail: str = "", description: str | None = None) -> None:
        self._step, self._detail = step, detail
        if description is not None:
            self.description = description
        if self._bar is not None:
            self._bar.update(step, detail, self.description)
            return
        now = time.monotonic()
        if self._last_line_at is None or now - self._last_line_at >= self.every or step >= self.total:
            self._line(now)

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
            self._line(time.monotonic())

    def _format(self) -> str:
        detail = f"  {self._detail}" if self._detail else ""
        return f"{self.description}  step {self._step}/{self.total}{detail}"

    def _line(self, now: float) -> None:
        text = self._format()
        print(f"{text}  {_elapsed(now - self.started)}", file=self.stream, flush=True)
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
