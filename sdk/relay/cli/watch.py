"""A job's events followed on a terminal: the lines scroll by above a live panel with a progress bar
and a sparkline of the loss so far. Piped output never gets here: it stays plain lines, one per event.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Sequence

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from relay.cli._common import status_text
from relay.events import CancelledEvent, ErrorEvent, EventBase, FinishedEvent, MetricsEvent, parse_known
from relay.formatting import number_text
from relay.sft import status as job_status
from relay.sft.job import Event, FineTuneJob

BLOCKS = "▁▂▃▄▅▆▇█"
# The status an event leaves the job in; other events (retry, resumed, checkpoint) leave it running.
STATUS_AFTER: dict[type[EventBase], str] = {
    FinishedEvent: job_status.COMPLETED,
    CancelledEvent: job_status.CANCELLED,
    ErrorEvent: job_status.ERROR,
}
# How often the live panel asks the API for the job's status: a job leaves `queued` with no event
# (its first metrics come 10 steps later, minutes for a large model), and the panel must say so.
STATUS_REFRESH_SECONDS = 5.0


def sparkline(values: Sequence[float], width: int) -> str:
    """`values` as at most `width` block characters, lowest ▁ to highest █. A longer history is
    squeezed, each cell the mean of an equal run of values, so the whole run stays in view."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite or width < 1:
        return ""
    if len(finite) > width:
        cells = []
        for cell in range(width):
            start, end = cell * len(finite) // width, (cell + 1) * len(finite) // width
            run = finite[start:end]
            cells.append(sum(run) / len(run))
        finite = cells
    low, high = min(finite), max(finite)
    if high - low <= 1e-12 * max(1.0, abs(high)):
        return BLOCKS[0] * len(finite)
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[round((v - low) / (high - low) * top)] for v in finite)


class LossPanel:
    """What the live panel shows: status, step / steps as a bar, the last loss and its sparkline."""

    def __init__(self, job: FineTuneJob) -> None:
        self.job_id = job.id
        self.steps = job.steps
        self.step = job.step or 0
        self.status = job.status
        self.losses: list[float] = []

    def add(self, event: Event) -> None:
        self.step = max(self.step, int(event.get("step") or 0))
        typed = parse_known(event)  # None for a kind unknown here (a newer worker's): its step alone counts
        if isinstance(typed, MetricsEvent) and isinstance(typed.loss, int | float):
            self.losses.append(float(typed.loss))
            self.status = job_status.RUNNING
        elif typed is not None and type(typed) in STATUS_AFTER:
            self.status = STATUS_AFTER[type(typed)]

    def update_from(self, job: FineTuneJob) -> None:
        """The job as the API reports it now; an end already seen in the events stays."""
        if self.status not in job_status.TERMINAL:
            self.status = job.status
        self.step = max(self.step, job.step or 0)

    def __rich__(self) -> RenderableType:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(ratio=1)
        grid.add_column(no_wrap=True)
        bar = ProgressBar(total=max(self.steps, 1), completed=min(self.step, self.steps))
        grid.add_row(f"{self.job_id} {status_text(self.status)}", bar, f"step {self.step}/{self.steps}")
        if self.losses:
            line = Text.assemble(
                ("loss ", "bold"),
                f"{number_text(self.losses[-1])} ",
                (sparkline(self.losses, 60), "cyan"),
                f" min {number_text(min(self.losses))}",
            )
        else:
            line = Text("loss - (no metrics yet)", style="dim")
        return Group(grid, line)


def watch_events(
    job: FineTuneJob,
    events: Iterable[Event],
    print_event: Callable[[Event], None],
    console: Console,
    refresh_every: float = STATUS_REFRESH_SECONDS,
) -> LossPanel:
    """Print each event (through `print_event`, on `console`) above a live panel until `events` ends;
    the job's status is asked for every `refresh_every` seconds meanwhile."""
    panel = LossPanel(job)
    stop = threading.Event()
    poller = threading.Thread(target=_keep_status, args=(job, panel, stop, refresh_every), daemon=True)
    with Live(panel, console=console, refresh_per_second=8, transient=False) as live:
        poller.start()
        try:
            for event in events:
                panel.add(event)
                print_event(event)
                live.refresh()
        finally:
            stop.set()
    return panel


def _keep_status(job: FineTuneJob, panel: LossPanel, stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        try:
            panel.update_from(job.refresh())
        except Exception:  # a missed refresh leaves the status as it was; the stream reports failures
            continue
