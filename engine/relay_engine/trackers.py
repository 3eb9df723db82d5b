"""The experiment trackers of a recipe's ``integrations`` (relay.integrations): Weights & Biases and
TensorBoard, fed by the recipe run's own events, on rank 0, so that a service job and
``relay local train`` log the same things (docs/integrations.md).

What each tracker gets: the recipe as the run's config (with the job's id, its attempt and the
dataset's and weights' Hub revisions when the run reports them), every metrics event under
``train/``, every validation event under ``validation/``, every evaluation under ``eval/``, each
checkpoint's step (``checkpoint/seconds`` at that step) and, at the end, the run's summary.

A tracker never fails or slows the run. Each has a thread and a queue of its own: `Trackers.feed`
only appends (the queue keeps at most `RECORDS_KEPT` records, dropping the oldest past that), and
the thread opens the tracker and sends. A tracker that cannot be opened or written to is retried,
its record kept at the head of the queue, after a back-off that doubles from 1 s to
`RETRY_SECONDS_MAX`; the first failure becomes one `TrackerEvent` (the run reports it at its next
event, from its own thread). At the end the run waits at most `flush_seconds()` for the queues to
empty and the trackers to close, then goes on without them.

A resumed run continues the same tracker run, never a second one: W&B's run id is the job's
(``relay-<job id>``) or, for a run with no job id (``relay local train``), one kept in the work
directory (``trackers/wandb.json``), opened with ``resume="allow"``; the steps the resumed run
trains again (after its checkpoint, up to where the last one stopped) are not logged to W&B
again, since W&B cannot rewind a run's history (they are the same figures: the resume is exact).
TensorBoard's writer purges the steps after the checkpoint (``purge_step``), so each step is there
once.

Secrets are never the recipe's: W&B reads WANDB_API_KEY from this process's environment.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from relay import __version__
from relay.errors import ConfigError
from relay.events import (
    TENSORBOARD_FILES,
    CheckpointEvent,
    DatasetEvent,
    EvalEvent,
    Event,
    MetricsEvent,
    RecipeResult,
    ResumedEvent,
    TrackerEvent,
    ValidationEvent,
    WeightsEvent,
)
from relay.integrations import (
    TENSORBOARD,
    TRACKER_PACKAGES,
    TRACKERS_EXTRA,
    WANDB,
    TensorBoardIntegration,
    WandbIntegration,
)
from relay.sft.config import SFTConfig

log = logging.getLogger("relay_engine.trackers")

# Records a tracker's queue keeps while it cannot send: a metrics event every 10 steps of at most
# 100,000 steps is 10,000; past the bound the oldest are dropped (and counted in the log).
RECORDS_KEPT = 20_000
RETRY_SECONDS_MIN = 1.0
RETRY_SECONDS_MAX = 30.0
# How long the end of a run waits for the trackers to send what they hold and close.
FLUSH_SECONDS = "RELAY_TRACKER_FLUSH_SECONDS"
FLUSH_SECONDS_DEFAULT = 30.0
# How long wandb.init waits for the W&B server (W&B's own variable; its default is 90 s).
WANDB_INIT_TIMEOUT = "WANDB_INIT_TIMEOUT"
WANDB_INIT_TIMEOUT_DEFAULT = 30.0
# Where TensorBoard's event files go in the work directory: a job's files list them.
TENSORBOARD_DIR = TENSORBOARD_FILES
# The trackers' own state in the work directory (W&B's run id and the last step it was sent).
STATE_DIR = "trackers"


def flush_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get(FLUSH_SECONDS, FLUSH_SECONDS_DEFAULT)))
    except ValueError:
        return FLUSH_SECONDS_DEFAULT


def check_installed(config: SFTConfig) -> None:
    """Refuse, before anything is loaded, a recipe naming a tracker whose library this machine
    lacks: a ConfigError naming the extra, which ends a job in error in these words."""
    missing = [
        entry.type
        for entry in config.integrations
        if importlib.util.find_spec(TRACKER_PACKAGES[entry.type]) is None
    ]
    if missing:
        packages = ", ".join(TRACKER_PACKAGES[kind] for kind in missing)
        raise ConfigError(
            f"bad integrations: {', '.join(missing)} needs the {packages} package on the machine that "
            f"trains, which it lacks: install relay-intelligence[{TRACKERS_EXTRA}] there",
            "integrations",
            "invalid_value",
        )


class _Tracker(Protocol):
    """One tracker's connection, used only from its own thread."""

    name: str

    def open(self, config: Mapping[str, Any]) -> None: ...
    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...
    def update_config(self, values: Mapping[str, Any]) -> None: ...
    def summary(self, values: Mapping[str, Any]) -> None: ...
    def close(self) -> None: ...


class _TensorBoard:
    name = TENSORBOARD

    def __init__(self, work_dir: Path, resumed_from: int | None) -> None:
        self.log_dir = work_dir / TENSORBOARD_DIR
        # The steps after the checkpoint were written by the run that stopped: purged, so that the
        # steps trained again are there once.
        self.purge_step = None if resumed_from is None else resumed_from + 1
        self.writer: Any = None
        self.step = resumed_from or 0

    def open(self, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=self.purge_step)
        self.writer.add_text("relay/config", _json_block(config), global_step=self.step)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.step = step
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step)

    def update_config(self, values: Mapping[str, Any]) -> None:
        self.writer.add_text("relay/config", _json_block(values), global_step=self.step)

    def summary(self, values: Mapping[str, Any]) -> None:
        self.writer.add_text("relay/summary", _json_block(values), global_step=self.step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class _Wandb:
    name = WANDB

    def __init__(
        self, settings: WandbIntegration, work_dir: Path, job_id: str | None, fallback_name: str
    ) -> None:
        self.settings = settings.wandb
        self.work_dir = work_dir
        self.state_path = work_dir / STATE_DIR / "wandb.json"
        state = _read_json(self.state_path)
        # The service's job id names the run (every attempt finds it); a local run keeps its own.
        self.run_id = (
            _run_id(job_id) if job_id else str(state.get("run_id") or f"relay-{uuid.uuid4().hex[:16]}")
        )
        # What an earlier run of this work directory sent: W&B keeps a step once, so a resumed run
        # sends only the steps after it.
        self.sent_through = int(state.get("step") or 0) if state.get("run_id") == self.run_id else 0
        self.last_sent = self.sent_through
        self.display_name = self.settings.name or fallback_name
        self.run: Any = None
        # Kept before the first step, so that a run stopped early still leaves its id to the next.
        try:
            self._write_state()
        except OSError as error:  # the tracker's trouble, never the run's: its thread retries it
            log.warning("wandb: cannot keep the run's id in %s: %s", self.state_path, error)

    def open(self, config: Mapping[str, Any]) -> None:
        import wandb

        try:
            timeout = float(os.environ.get(WANDB_INIT_TIMEOUT, WANDB_INIT_TIMEOUT_DEFAULT))
        except ValueError:
            timeout = WANDB_INIT_TIMEOUT_DEFAULT
        # As the environment says now: wandb's process-wide setup keeps what it read first.
        now: dict[str, Any] = {
            name: os.environ[variable]
            for name, variable in (("mode", "WANDB_MODE"), ("base_url", "WANDB_BASE_URL"))
            if os.environ.get(variable)
        }
        self.run = wandb.init(
            project=self.settings.project,
            entity=self.settings.entity,
            name=self.display_name,
            tags=list(self.settings.tags) or None,
            id=self.run_id,
            resume="allow",
            dir=str(self.work_dir),
            config=dict(config),
            reinit="create_new",  # a worker runs job after job in one process
            # No console capture (a launched rank 0's stdout carries the events), no code or git.
            settings=wandb.Settings(
                console="off",
                silent=True,
                init_timeout=timeout,
                save_code=False,
                disable_git=True,
                **now,
            ),
        )

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        if step <= self.sent_through:
            return
        self.run.log(dict(values), step=step)
        if step > self.last_sent:
            self.last_sent = step
            self._write_state()

    def update_config(self, values: Mapping[str, Any]) -> None:
        self.run.config.update(dict(values), allow_val_change=True)

    def summary(self, values: Mapping[str, Any]) -> None:
        self.run.summary.update(dict(values))

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()

    def _write_state(self) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.state_path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"run_id": self.run_id, "step": self.last_sent}))
        os.replace(temporary, self.state_path)


def _run_id(job_id: str) -> str:
    # W&B run ids: letters, digits, - and _.
    return "relay-" + re.sub(r"[^A-Za-z0-9_-]", "-", job_id)[:58]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _json_block(values: Mapping[str, Any]) -> str:
    # TensorBoard's text plugin reads Markdown: a code block keeps the JSON as it is.
    return "```json\n" + json.dumps(values, indent=2, sort_keys=True, default=str) + "\n```"


# A record for a tracker's thread: (what, step, values).
_Record = tuple[str, int, dict[str, Any]]


class _Sender(threading.Thread):
    """One tracker's thread: opens it, then sends its queue in order; a failure keeps the record
    and retries after a back-off, and its first one becomes the run's one warning of it."""

    def __init__(
        self, tracker: _Tracker, config: dict[str, Any], warn: Callable[[str, str, int], None]
    ) -> None:
        super().__init__(name=f"tracker-{tracker.name}", daemon=True)
        self.tracker = tracker
        self.config = config
        self.warn = warn
        self.queue: collections.deque[_Record] = collections.deque()
        self.dropped = 0
        self.wake = threading.Condition()
        self.closing = False
        self.deadline = float("inf")
        self.opened = False
        self.failed = False

    def put(self, record: _Record) -> None:
        with self.wake:
            if len(self.queue) >= RECORDS_KEPT:
                self.queue.popleft()
                self.dropped += 1
            self.queue.append(record)
            self.wake.notify()

    def close(self, deadline: float) -> None:
        with self.wake:
            self.closing = True
            self.deadline = deadline
            self.wake.notify()

    def run(self) -> None:
        delay = RETRY_SECONDS_MIN
        while True:
            with self.wake:
                while not self.queue and not self.closing and self.opened:
                    self.wake.wait()
                if self.closing and (not self.queue or time.monotonic() >= self.deadline):
                    break
                record = self.queue[0] if self.queue else None
            try:
                if not self.opened:
                    self.tracker.open(self.config)
                    self.opened = True
                if record is not None:
                    self._send(record)
                    with self.wake:
                        if self.queue and self.queue[0] is record:
                            self.queue.popleft()
                delay = RETRY_SECONDS_MIN
            except Exception as error:  # a tracker's failure is its own, never the run's
                self._failed(error, record)
                self._back_off(delay)
                delay = min(delay * 2, RETRY_SECONDS_MAX)
        if self.dropped:
            log.warning("%s: %d records dropped past the queue's bound", self.tracker.name, self.dropped)
        if self.opened:
            try:
                self.tracker.close()
            except Exception as error:
                self._failed(error, None)

    def _back_off(self, seconds: float) -> None:
        """Wait `seconds` before trying again: new records do not cut it short (they wait in the
        queue), the close does (one more try), and it never runs past the close's deadline."""
        until = time.monotonic() + seconds
        with self.wake:
            closing_already = self.closing
            while not (self.closing and not closing_already):
                left = min(until, self.deadline) - time.monotonic()
                if left <= 0:
                    return
                self.wake.wait(left)

    def _send(self, record: _Record) -> None:
        what, step, values = record
        if what == "scalars":
            self.tracker.scalars(step, values)
        elif what == "config":
            self.tracker.update_config(values)
        elif what == "summary":
            self.tracker.summary(values)

    def _failed(self, error: Exception, record: _Record | None) -> None:
        log.warning("%s: %s", self.tracker.name, error)
        if not self.failed:
            self.failed = True
            step = record[1] if record is not None else -1
            doing = "could not be opened" if not self.opened else "could not be written to"
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            self.warn(self.tracker.name, f"{doing}: {first_line[:300]}", step)

    def unsent(self) -> int:
        with self.wake:
            return len(self.queue)


class Trackers:
    """The trackers of one run (rank 0's): `feed` every event the run reports, `finish` at the end.
    Both return the warnings (TrackerEvent) to report since the last call."""

    def __init__(self, senders: list[_Sender]) -> None:
        self.senders = senders
        self.step = 0
        self._warnings: list[TrackerEvent] = []
        self._lock = threading.Lock()
        self.latest: dict[str, Any] = {}  # the last validation and eval figures, for the summary
        for sender in senders:
            sender.warn = self._warn
            sender.start()

    def _warn(self, tracker: str, message: str, step: int) -> None:
        sender = next(s for s in self.senders if s.tracker.name == tracker)
        with self._lock:
            at = step if step >= 0 else self.step
            self._warnings.append(
                TrackerEvent(step=at, tracker=tracker, message=message, unsent=sender.unsent())
            )

    def _take_warnings(self) -> list[TrackerEvent]:
        with self._lock:
            taken, self._warnings = self._warnings, []
        return taken

    def feed(self, event: Event) -> list[TrackerEvent]:
        if not self.senders:
            return []
        self.step = max(self.step, event.step)
        for record in _records(event):
            if record[0] == "scalars":
                self.latest.update(record[2])
            for sender in self.senders:
                sender.put(record)
        return self._take_warnings()

    def finish(self, result: RecipeResult | None, seconds: float | None = None) -> list[TrackerEvent]:
        """The summary, then at most `seconds` (flush_seconds()) for every tracker to send and close."""
        if not self.senders:
            return []
        summary: dict[str, Any] = {
            "status": "failed" if result is None else result.status,
            "step": self.step if result is None else result.step,
            "final_loss": None if result is None else result.loss,
            "resumed_from": None if result is None else result.resumed_from,
            **{key: value for key, value in self.latest.items() if key.startswith(("validation/", "eval/"))},
        }
        for sender in self.senders:
            sender.put(("summary", self.step, summary))
        deadline = time.monotonic() + (flush_seconds() if seconds is None else seconds)
        for sender in self.senders:
            sender.close(deadline)
        for sender in self.senders:
            sender.join(max(0.0, deadline - time.monotonic()) + 1.0)
            if sender.is_alive() or sender.unsent():
                # Still blocked in the tracker's library, or still holding records: left behind
                # (a daemon thread); the run's warning says so if it has not said anything yet.
                log.warning(
                    "%s: %d records not sent by the end of the run", sender.tracker.name, sender.unsent()
                )
                if not sender.failed:
                    sender._failed(TimeoutError("not reached before the end of the run"), None)
        return self._take_warnings()


NO_TRACKERS = Trackers([])


def _records(event: Event) -> list[tuple[str, int, dict[str, Any]]]:
    """What a tracker logs of one event."""
    match event:
        case MetricsEvent():
            return [("scalars", event.step, _numbers(event, "train/"))]
        case ValidationEvent():
            return [("scalars", event.step, _numbers(event, "validation/"))]
        case EvalEvent():
            return [("scalars", event.step, _numbers(event, "eval/"))]
        case CheckpointEvent():
            return [("scalars", event.step, {"checkpoint/seconds": float(event.seconds or 0.0)})]
        case DatasetEvent():
            read = {
                k: event.get(k) for k in ("repo", "path", "revision", "sha", "format", "frames", "episodes")
            }
            return [("config", event.step, {"dataset": read})]
        case WeightsEvent():
            read = {k: event.get(k) for k in ("model", "repo", "revision", "sha", "path", "job")}
            return [("config", event.step, {"weights": read})]
        case ResumedEvent():
            return [("config", event.step, {"resumed_from": event.step})]
    return []


def _numbers(event: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {
        prefix + key: value
        for key, value in event.items()
        if key not in ("step", "event", "kind")
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    }


def open_trackers(
    config: SFTConfig,
    work_dir: Path,
    *,
    resumed_from: int | None,
    job_id: str | None,
    attempt: int,
    engine_settings: Mapping[str, Any] | None = None,
) -> Trackers:
    """The recipe's trackers, each started on its own thread (none: NO_TRACKERS)."""
    if not config.integrations:
        return NO_TRACKERS
    run_config: dict[str, Any] = {
        "recipe": config.model_dump(mode="json"),
        "job_id": job_id,
        "attempt": attempt,
        "relay_version": __version__,
        **({"engine": dict(engine_settings)} if engine_settings else {}),
    }
    fallback_name = config.name or job_id or work_dir.name
    senders: list[_Sender] = []
    for entry in config.integrations:
        tracker: _Tracker
        if isinstance(entry, WandbIntegration):
            tracker = _Wandb(entry, work_dir, job_id, fallback_name)
        elif isinstance(entry, TensorBoardIntegration):
            tracker = _TensorBoard(work_dir, resumed_from)
        else:  # pragma: no cover (relay.integrations refuses other types)
            continue
        senders.append(_Sender(tracker, run_config, lambda *_: None))
    return Trackers(senders)
