"""The experiment trackers of a recipe's ``integrations`` (relay.integrations): Weights & Biases,
TensorBoard and MLflow, fed by the recipe run's own events, on rank 0, so that a service job and
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
once. MLflow's run id is kept in the work directory (``trackers/mlflow.json``) and the run carries
a ``relay.job_id`` tag, by which another attempt that lacks the file finds it; like W&B's, the steps
already sent are not sent again (MLflow would keep both values of a step).

MLflow is spoken to through its tracking server's REST API with httpx (``/api/2.0/mlflow/...``),
not its client library: the mlflow package pulls some 40 packages into the environment that trains.

A tracker's key is the recipe's own (``wandb.api_key``, ``mlflow.token``: a local run's), else the
one the service held for the job (run_recipe's ``tracker_secrets``), else this process's
environment's: WANDB_API_KEY; MLFLOW_TRACKING_TOKEN (a bearer token), or MLFLOW_TRACKING_USERNAME
and MLFLOW_TRACKING_PASSWORD (basic auth), as MLflow's own client reads them.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import logging
import math
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
    MLFLOW,
    TENSORBOARD,
    TRACKER_PACKAGES,
    TRACKERS_EXTRA,
    WANDB,
    MlflowIntegration,
    TensorBoardIntegration,
    WandbIntegration,
    tracker_secrets,
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
        self,
        settings: WandbIntegration,
        work_dir: Path,
        job_id: str | None,
        fallback_name: str,
        api_key: str | None = None,
    ) -> None:
        self.settings = settings.wandb
        self._api_key = api_key
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
        if self._api_key:  # given for this run: never the key another run of this process used
            now["api_key"] = self._api_key
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


# MLflow's limits on one log-batch request, and on a param's and a tag's value.
MLFLOW_BATCH_METRICS = 1000
MLFLOW_BATCH_PARAMS = 100
MLFLOW_BATCH_TAGS = 100
MLFLOW_PARAM_VALUE_MAX = 6000
MLFLOW_TAG_VALUE_MAX = 5000
# Seconds one request to the tracking server may take: the thread retries it after its back-off.
MLFLOW_REQUEST_SECONDS = 15.0
MLFLOW_JOB_TAG = "relay.job_id"
# How a run's summary status ends the MLflow run (a stopped run is resumed into RUNNING again).
MLFLOW_END_STATUS = {"completed": "FINISHED", "failed": "FAILED"}


class MlflowError(RuntimeError):
    """A tracking server's refusal: its error code and message (never the request's headers)."""


class _Mlflow:
    name = MLFLOW

    def __init__(
        self,
        settings: MlflowIntegration,
        work_dir: Path,
        job_id: str | None,
        fallback_name: str,
        token: str | None = None,
    ) -> None:
        self.settings = settings.mlflow
        self._token = token
        self.job_id = job_id
        self.display_name = fallback_name
        self.state_path = work_dir / STATE_DIR / "mlflow.json"
        self.state = _read_json(self.state_path)
        self.client: Any = None
        self.run_id: str | None = None
        self.sent_through = 0
        self.last_sent = 0

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        url = "/api/2.0/mlflow/" + path
        if method == "GET":
            response = self.client.get(url, params=body)
        else:
            response = self.client.post(url, content=json.dumps(body or {}, default=str))
        if response.status_code >= 400:
            try:
                error = response.json()
                said = f"{error.get('error_code', response.status_code)}: {error.get('message', '')}"
            except ValueError:
                said = f"HTTP {response.status_code}: {response.text[:200]}"
            raise MlflowError(f"{path}: {said}")
        return response.json() if response.content else {}

    def open(self, config: Mapping[str, Any]) -> None:
        import httpx

        token = self._token
        user = os.environ.get("MLFLOW_TRACKING_USERNAME")
        password = os.environ.get("MLFLOW_TRACKING_PASSWORD")
        headers = {"Content-Type": "application/json", "User-Agent": f"relay/{__version__}"}
        auth: Any = None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif user and password:
            auth = httpx.BasicAuth(user, password)
        if self.client is None:
            self.client = httpx.Client(
                base_url=self.settings.tracking_uri.rstrip("/"),
                headers=headers,
                auth=auth,
                timeout=MLFLOW_REQUEST_SECONDS,
            )
        self.run_id = self._find_run()
        if self.run_id is None:
            self.run_id = self._create_run(config)
            self.sent_through = 0
        self.last_sent = self.sent_through
        self._write_state()
        if not self.state.get("params"):
            # Params cannot change once logged: the recipe's, once, from the run that created it.
            self._log_batch(params=_params(config.get("recipe") or {}))
            self.state["params"] = True
            self._write_state()
        self._log_batch(tags=_tags({k: v for k, v in config.items() if k != "recipe"}))

    def _find_run(self) -> str | None:
        """The run an earlier attempt made: the one the work directory keeps, else the one tagged
        with the job's id; reopened (RUNNING), with the last step it holds."""
        run_id = self.state.get("run_id")
        if isinstance(run_id, str) and run_id:
            try:
                run = self._call("GET", "runs/get", {"run_id": run_id})["run"]
            except MlflowError as error:
                if "RESOURCE_DOES_NOT_EXIST" not in str(error):
                    raise
                run = None  # deleted on the server: a new run, the file's steps are not its
                self.state = {}
            if run is not None:
                self.sent_through = int(self.state.get("step") or 0)
                self._reopen(run)
                return run_id
        if self.job_id is None or "'" in self.job_id:
            return None
        experiment_id = self._experiment_id()
        found = (
            self._call(
                "POST",
                "runs/search",
                {
                    "experiment_ids": [experiment_id],
                    "filter": f"tags.`{MLFLOW_JOB_TAG}` = '{self.job_id}'",
                    "max_results": 1,
                    "order_by": ["attributes.start_time ASC"],
                },
            ).get("runs")
            or []
        )
        if not found:
            return None
        run = found[0]
        # The work directory's file is gone: what the run holds says which steps it has.
        self.sent_through = max(
            [int(m.get("step") or 0) for m in run.get("data", {}).get("metrics", [])] or [0]
        )
        self.state = {"params": True}
        self._reopen(run)
        return str(run["info"]["run_id"])

    def _reopen(self, run: Mapping[str, Any]) -> None:
        if run["info"].get("status") != "RUNNING":
            self._call("POST", "runs/update", {"run_id": run["info"]["run_id"], "status": "RUNNING"})

    def _experiment_id(self) -> str:
        name = self.settings.experiment
        try:
            found = self._call("GET", "experiments/get-by-name", {"experiment_name": name})
            return str(found["experiment"]["experiment_id"])
        except MlflowError as error:
            if "RESOURCE_DOES_NOT_EXIST" not in str(error):
                raise
        try:
            return str(self._call("POST", "experiments/create", {"name": name})["experiment_id"])
        except MlflowError as error:  # another job created it meanwhile
            if "RESOURCE_ALREADY_EXISTS" not in str(error):
                raise
            found = self._call("GET", "experiments/get-by-name", {"experiment_name": name})
            return str(found["experiment"]["experiment_id"])

    def _create_run(self, config: Mapping[str, Any]) -> str:
        tags = [{"key": "mlflow.runName", "value": self.display_name[:250]}]
        tags.append({"key": "mlflow.source.name", "value": "relay"})
        if self.job_id:
            tags.append({"key": MLFLOW_JOB_TAG, "value": self.job_id})
        created = self._call(
            "POST",
            "runs/create",
            {
                "experiment_id": self._experiment_id(),
                "run_name": self.display_name[:250],
                "start_time": _now_ms(),
                "tags": tags,
            },
        )
        run_id = str(created["run"]["info"]["run_id"])
        # Kept at once: a run stopped before its first step still leaves its id to the next.
        self.state = {"run_id": run_id, "step": 0}
        return run_id

    def _log_batch(
        self,
        metrics: list[dict[str, Any]] | None = None,
        params: list[dict[str, str]] | None = None,
        tags: list[dict[str, str]] | None = None,
    ) -> None:
        metrics, params, tags = metrics or [], params or [], tags or []
        while metrics or params or tags:
            body = {
                "run_id": self.run_id,
                "metrics": metrics[:MLFLOW_BATCH_METRICS],
                "params": params[:MLFLOW_BATCH_PARAMS],
                "tags": tags[:MLFLOW_BATCH_TAGS],
            }
            self._call("POST", "runs/log-batch", body)
            metrics = metrics[MLFLOW_BATCH_METRICS:]
            params = params[MLFLOW_BATCH_PARAMS:]
            tags = tags[MLFLOW_BATCH_TAGS:]

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        if step <= self.sent_through:
            return
        at = _now_ms()
        self._log_batch(
            metrics=[
                {"key": key, "value": _metric_value(value), "timestamp": at, "step": step}
                for key, value in values.items()
            ]
        )
        if step > self.last_sent:
            self.last_sent = step
            self._write_state()

    def update_config(self, values: Mapping[str, Any]) -> None:
        self._log_batch(tags=_tags(values))

    def summary(self, values: Mapping[str, Any]) -> None:
        self._log_batch(tags=_tags(values, prefix="relay.summary."))
        status = MLFLOW_END_STATUS.get(str(values.get("status")), "KILLED")
        self._call("POST", "runs/update", {"run_id": self.run_id, "status": status, "end_time": _now_ms()})

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def _write_state(self) -> None:
        self.state.update({"run_id": self.run_id, "step": self.last_sent})
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.state_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.state))
        os.replace(temporary, self.state_path)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _metric_value(value: float) -> float | str:
    # JSON has no NaN or infinity; the server's protobuf JSON reader takes them as these strings.
    number = float(value)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    return number


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _params(recipe: Mapping[str, Any]) -> list[dict[str, str]]:
    """The recipe's fields as MLflow params, one a field (unset ones left out), values as JSON."""
    return [
        {"key": key, "value": _text(value)[:MLFLOW_PARAM_VALUE_MAX]}
        for key, value in recipe.items()
        if value is not None
    ]


def _tags(values: Mapping[str, Any], prefix: str = "relay.") -> list[dict[str, str]]:
    return [
        {"key": prefix + key, "value": _text(value)[:MLFLOW_TAG_VALUE_MAX]}
        for key, value in values.items()
        if value is not None
    ]


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
    secrets: Mapping[str, str] | None = None,
) -> Trackers:
    """The recipe's trackers, each started on its own thread (none: NO_TRACKERS). A tracker's key is
    the recipe's own (a local run's config that holds one), else `secrets`' (what the service held
    for the job, by environment variable), else this process's environment's."""
    if not config.integrations:
        return NO_TRACKERS
    keys = {**os.environ, **(secrets or {}), **tracker_secrets(config.integrations)}
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
            tracker = _Wandb(entry, work_dir, job_id, fallback_name, keys.get("WANDB_API_KEY"))
        elif isinstance(entry, TensorBoardIntegration):
            tracker = _TensorBoard(work_dir, resumed_from)
        elif isinstance(entry, MlflowIntegration):
            tracker = _Mlflow(entry, work_dir, job_id, fallback_name, keys.get("MLFLOW_TRACKING_TOKEN"))
        else:  # pragma: no cover (relay.integrations refuses other types)
            continue
        senders.append(_Sender(tracker, run_config, lambda *_: None))
    return Trackers(senders)
