"""What a job's results card folds from its many metrics events (and its resumed events, which
restart the pace): the pace, the training loss, and the reports the ETA's pace is taken over.

One fold for both ways the card is made: `relay_api.job_summary.summarize` folds every event of the
job (the reference), and `relay_api.event_rows.insert_event_row` folds each event as it is written
into the job's row of ``fine_tune_cards`` (`CardState.to_json`), so that the card of a job of a
million events reads that row rather than the million. Each rule (a window's length after a resume,
the samples of a window without a sample rate, the best loss on a tie) is written once, here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from relay.events import METRICS, METRICS_EVERY, ResumedEvent
from relay.progress import RATE_WINDOW_SECONDS, recent_rate

# The event kinds the card folds; every other kind it reads as the rows themselves (a few a job).
FOLDED_KINDS = frozenset({METRICS, ResumedEvent.kind})
# The stored form's version: a row of another (older) form is folded again from the events.
VERSION = 1
# The most recent reports a stored card keeps. recent_rate only looks back a minute, but a job that
# reports more often than this in a minute would make each metrics write rewrite a long list; such a
# job's card reads its events instead (CardState.recent_is_complete).
MAX_RECENT = 512


def window_rate(window: Mapping[str, Any]) -> float | None:
    """A metrics window's own pace (its compute alone), if it says one."""
    rate = window.get("steps_per_second")
    return float(rate) if isinstance(rate, int | float) and rate > 0 else None


class Pace:
    """The run's training pace from its metrics windows: each window's steps over the time its
    ``steps_per_second`` says they took. A window is at most METRICS_EVERY steps: after a resume a
    lost attempt's events may be missing, and the gap is no window of the one that resumed."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.window_start = 0
        self.steps = 0
        self.samples = 0.0
        self.seconds = 0.0

    def restart_at(self, step: int) -> None:
        self.window_start = step

    def add_window(self, step: int, data: Mapping[str, Any]) -> None:
        length = min(step - self.window_start, METRICS_EVERY)
        self.window_start = step
        rate = data.get("steps_per_second")
        if not isinstance(rate, int | float) or rate <= 0:
            return
        if length <= 0:
            return
        seconds = length / rate
        self.steps += length
        self.seconds += seconds
        sample_rate = data.get("samples_per_second")
        if isinstance(sample_rate, int | float):
            self.samples += sample_rate * seconds
        else:  # an event without it: the recipe's batch at the window's pace
            self.samples += length * self.batch_size

    def steps_per_second(self) -> float | None:
        return self.steps / self.seconds if self.seconds > 0 else None

    def samples_per_second(self) -> float | None:
        return self.samples / self.seconds if self.seconds > 0 else None

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Pace:
        pace = cls(int(stored["batch_size"]))
        pace.window_start, pace.steps = int(stored["window_start"]), int(stored["steps"])
        pace.samples, pace.seconds = stored["samples"], stored["seconds"]
        return pace


StepLoss = tuple[int, float]  # (step, loss)


class Losses:
    """The first and latest training loss reported, and the lowest (the earliest on a tie)."""

    def __init__(self) -> None:
        self.first: StepLoss | None = None
        self.last: StepLoss | None = None
        self.best: StepLoss | None = None

    def add(self, step: int, loss: float | None) -> None:
        if loss is None:
            return
        self.last = (step, loss)
        if self.first is None:
            self.first = self.last
        if self.best is None or loss < self.best[1]:
            self.best = self.last

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "last": self.last, "best": self.best}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Losses:
        losses = cls()
        # JSON has lists, not tuples: (step, loss) back as the tuple the fold writes.
        losses.first, losses.last, losses.best = (
            None if stored[name] is None else (int(stored[name][0]), stored[name][1])
            for name in ("first", "last", "best")
        )
        return losses


class CardState:
    """The card's figures folded from a job's metrics and resumed events, oldest first (`add`).

    `keep_all_reports`: keep every report of the attempt for the ETA's pace, as the reference
    (summarize) does; a stored card keeps the latest that recent_rate can still use."""

    def __init__(self, batch_size: int, keep_all_reports: bool = False) -> None:
        self.pace = Pace(batch_size)
        self.losses = Losses()
        self.metrics = 0  # metrics events: none, and the card says why (job_summary._no_metrics_note)
        self.last_rate: float | None = None  # the latest metrics window's own pace
        self.reports = 0  # metrics events since the latest resume: the ETA's pace is this attempt's
        self.recent: list[tuple[int, float]] = []  # the latest of them: (step, written at), oldest first
        self.keep_all_reports = keep_all_reports

    def add(self, kind: str, step: int, data: Mapping[str, Any], written: float) -> None:
        """Fold one event of kind `kind` (as shown: "resumed", not "resumed:2"), written at the
        POSIX time `written`; kinds other than FOLDED_KINDS change nothing."""
        if kind == METRICS:
            self.metrics += 1
            self.losses.add(step, data.get("loss"))
            self.pace.add_window(step, data)
            self.last_rate = window_rate(data)
            self.reports += 1
            self.recent.append((step, written))
            if not self.keep_all_reports:
                self._forget_old_reports()
        elif kind == ResumedEvent.kind:
            self.pace.restart_at(step)
            self.reports = 0
            self.recent.clear()

    def _forget_old_reports(self) -> None:
        """Drop the oldest report while the next is over a minute older than the latest: recent_rate
        walks back from the latest and stops at the first such report, and reports written later
        (at later times) leave it over a minute older. Three are kept at least: the walk starts at
        the second latest, so the report it stops at must be before that (recent_is_complete)."""
        latest = self.recent[-1][1]
        drop = 0
        while len(self.recent) - drop > 3 and (
            latest - self.recent[drop + 1][1] > RATE_WINDOW_SECONDS or len(self.recent) - drop > MAX_RECENT
        ):
            drop += 1
        del self.recent[:drop]

    def recent_is_complete(self) -> bool:
        """Whether the kept reports give recent_rate's answer over all the attempt's reports: none
        was dropped, or recent_rate's walk back from the latest stops within them (at a report over
        a minute older than the latest, before the second latest, where the walk starts). Not so
        when reports were written out of time order, or more than MAX_RECENT in a minute."""
        if self.reports == len(self.recent):
            return True
        latest = self.recent[-1][1]
        return any(latest - written > RATE_WINDOW_SECONDS for _, written in self.recent[:-2])

    def latest_rate(self) -> float | None:
        """The ETA's pace: recent_rate over the attempt's reports; until its second report, the
        first window's own pace (its compute alone) stands in."""
        return recent_rate(self.recent) or (self.last_rate if self.reports == 1 else None)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "pace": self.pace.to_json(),
            "losses": self.losses.to_json(),
            "metrics": self.metrics,
            "last_rate": self.last_rate,
            "reports": self.reports,
            "recent": self.recent,
        }

    @classmethod
    def from_json(cls, stored: Mapping[str, Any] | None) -> CardState | None:
        """The state stored by to_json; None for none yet, or one of another version."""
        if stored is None or stored.get("version") != VERSION:
            return None
        pace = Pace.from_json(stored["pace"])
        state = cls(pace.batch_size)
        state.pace, state.losses = pace, Losses.from_json(stored["losses"])
        state.metrics, state.last_rate = int(stored["metrics"]), stored["last_rate"]
        state.reports = int(stored["reports"])
        state.recent = [(int(step), written) for step, written in stored["recent"]]
        return state
