"""FineTuneJob: a recipe job as the API last reported it, and what can be done with it."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from relay import events, http_client
from relay.formatting import number_text
from relay.progress import ProgressReport
from relay.sft import status as job_status
from relay.sft.config import SFTConfig
from relay.sft.summary import FineTuneSummary

if TYPE_CHECKING:
    from relay.hub_push import PushedRepo

FINE_TUNES = "/v1/fine-tunes"
CONFIG_FIELDS: tuple[str, ...] = tuple(SFTConfig.model_fields)
EVENTS_PAGE = 1000


def interrupted_note(job_id: str) -> str:
    """What Ctrl-C while waiting on a job leaves: the job itself runs on, on the service."""
    return (
        f"interrupted: fine-tune {job_id} keeps running on the service. "
        f"Follow it again: relay fine-tunes events {job_id} --follow; "
        f"cancel it: relay fine-tunes cancel {job_id}"
    )


class Event(dict[str, Any]):
    """One event as the engine reports it (``{"step": 10, "loss": 0.21, ...}``), with the API's ``id``
    (the cursor for ``events(after=...)``), ``created_at`` and ``kind`` ("metrics", "checkpoint",
    ...) as attributes; ``typed`` is the same event as its kind's class in ``relay.events``."""

    id: int
    created_at: str | None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Event:
        body = {k: v for k, v in data.items() if k not in ("id", "object", "created_at", "kind")}
        event = cls(body)
        event.id = int(data["id"])
        event.created_at = data.get("created_at")
        return event

    @property
    def kind(self) -> str:
        """What the event reports: "metrics", or its ``event`` ("checkpoint", "finished", ...)."""
        return events.kind_of(self)

    @property
    def typed(self) -> events.Event:
        """The event as its kind's class (``MetricsEvent``, ``CheckpointEvent``, ...): typed fields,
        and a class to match on. ValueError for a kind this SDK does not know (a newer worker's);
        ``relay.events.parse_known(event)`` gives None for it instead."""
        return events.parse_event(self)


class FineTuneJob:
    """A recipe job. Attributes: ``id``, ``status``, ``step``, ``loss``, ``error``, ``output_dir``,
    ``created_at``, ``started_at``, ``finished_at``, ``attempts``, ``lease_lapsed_seconds`` (a running
    job whose worker stopped renewing its lease: how long ago it lapsed), ``dataset`` (what the engine
    read: the Hub revision and commit, or the directory; the format, episodes and frames), ``weights``
    (a job with ``from_checkpoint``: where its starting weights came from, relay.sft.summary.WeightsRead),
    ``validation`` (with ``validation_episodes``: the held-out scores, ``{"best": ..., "last": ...,
    "scored": n}``, each a validation event's fields) and the config's fields.

    ``loss`` is the mean training loss over the latest metrics window (the last 10 steps), the
    same number as the latest metrics event's ``loss``."""

    id: str
    status: str
    step: int
    loss: float | None
    error: str | None
    output_dir: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    attempts: int
    lease_lapsed_seconds: float | None
    # What the engine read once the dataset was open (repo or path, revision, sha, format, frames,
    # episodes); None until then.
    dataset: dict[str, Any] | None
    # Where the starting weights came from (from_checkpoint): model, and repo, revision and sha, or
    # path, or the fine-tune `job`; None until the worker loaded them, and for a job from its base.
    weights: dict[str, Any] | None
    # The validation split's scores so far: best (lowest headline action error, mean_action_mse,
    # with its step), last, and how many times scored; None without validation_episodes, or before
    # the first checkpoint.
    validation: dict[str, Any] | None
    gpus: int | None
    task: str | None
    tasks_dir: str | None
    model: str
    dataset_name: str
    dataset_revision: str | None
    # A mixture's datasets (relay.dataset_mixture: name, revision, weight, cameras), each as its
    # JSON; None for one dataset. `dataset` then says what was read of each, under "mixture".
    datasets: list[dict[str, Any]] | None
    batch_size: int
    learning_rate: float
    steps: int
    finetune: str
    lora_rank: int
    lora_alpha: float | None
    targets: list[str] | None
    cameras: dict[str, str] | None
    name: str | None
    validation_episodes: list[int] | float | str | None
    # The recipe's `eval` block (relay.env_evaluation.JobEval's fields), or None.
    eval: dict[str, Any] | None
    from_checkpoint: str | None
    normalization: str
    # The experiment trackers it logs to (relay.integrations), each as its JSON: [] for none.
    integrations: list[dict[str, Any]]
    # The recipe's `hub` block (relay.hub_target.HubTarget's fields: repo_id, private, revision),
    # or None; where it went is the results card's `pushed`.
    hub: dict[str, Any] | None

    def __init__(self, data: dict[str, Any], client: http_client.Client | None = None) -> None:
        self._client = client or http_client.default_client()
        self._update(data)

    def _update(self, data: dict[str, Any]) -> None:
        self._data = dict(data)
        for key, value in data.items():
            if key != "object":
                setattr(self, key, value)

    def __repr__(self) -> str:
        loss = "None" if self.loss is None else f"{self.loss:.4g}"
        progress = f"{self.step}/{self.steps}"
        return f"FineTuneJob(id={self.id!r}, status={self.status!r}, step={progress}, loss={loss})"

    def to_dict(self) -> dict[str, Any]:
        """The job as the API reported it."""
        return dict(self._data)

    @property
    def config(self) -> SFTConfig:
        return SFTConfig.parse({f: self._data.get(f) for f in CONFIG_FIELDS})

    @property
    def done(self) -> bool:
        return self.status in job_status.TERMINAL

    def refresh(self) -> FineTuneJob:
        """Bring the job up to date."""
        self._update(self._client.request("GET", f"{FINE_TUNES}/{self.id}"))
        return self

    def summary(self) -> FineTuneSummary:
        """The job's results card, as the API computes it from the job and its events: duration,
        elapsed and ETA while running, steps and samples per second, the first, last and best
        training loss, each checkpoint with the figures at its step, validation and closed-loop
        results once reported, and how to use the model (``summary.use``: commands with the id)."""
        return FineTuneSummary.model_validate(self._client.request("GET", f"{FINE_TUNES}/{self.id}/summary"))

    def cancel(self) -> FineTuneJob:
        """Ask the job to stop: a queued job is cancelled at once, a running one within a step or so."""
        self._update(self._client.request("POST", f"{FINE_TUNES}/{self.id}/cancel", retry=True))
        return self

    def wait(
        self, poll: float = 30, *, timeout: float | None = None, progress: bool | None = None
    ) -> FineTuneJob:
        """Block until the job is completed or cancelled; raise RuntimeError if it failed.

        Ctrl-C (KeyboardInterrupt) stops the wait, not the job: it says so on stderr, with how to
        follow and cancel the job, and the KeyboardInterrupt goes on to the caller.

        Polls at most every `poll` seconds, and sooner while the wait is young (a quarter of the time
        waited so far, at least half a second), so a short job returns promptly. Shows progress on
        stderr: a bar on a terminal, else a plain line every few seconds (RELAY_PROGRESS_SECONDS);
        `progress=False` shows nothing.
        """
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        report = ProgressReport(self.id, self.steps) if progress is not False else None
        stage = _StageWatch(self)
        try:
            while True:
                self.refresh()
                if report is not None:
                    loss = "" if self.loss is None else f"loss {number_text(self.loss)} (10-step mean)"
                    doing = stage.now() if self.status == job_status.RUNNING else None
                    shown = f"{self.id} {self.status}" + (f": {doing}" if doing else "")
                    report.update(self.step or 0, loss, description=shown)
                if self.done:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"fine-tune {self.id} is still {self.status} after {timeout} s")
                waited = time.monotonic() - started
                time.sleep(min(poll, max(0.5, waited / 4)))
        except KeyboardInterrupt:
            if report is not None:
                report.close()
                report = None
            print(interrupted_note(self.id), file=sys.stderr, flush=True)
            raise
        finally:
            if report is not None:
                report.close()
        if self.status == job_status.ERROR:
            raise RuntimeError(f"fine-tune {self.id} failed: {self.error}")
        return self

    def evaluations(self) -> list[events.EvalEvent]:
        """The job's closed-loop evaluations so far (its `eval` events), oldest first: at each
        checkpoint if its `eval` block asks, and at the end. Each one's whole report is the job's
        file `eval/step-N.json` (relay.events.eval_report_path)."""
        return [
            typed
            for event in self.events()
            if isinstance(typed := events.parse_known(event), events.EvalEvent)
        ]

    def events(self, after: int | None = None) -> list[Event]:
        """The job's events so far, oldest first; with `after`, only those after that event id."""
        found: list[Event] = []
        while True:
            page = self._client.request(
                "GET", f"{FINE_TUNES}/{self.id}/events", params={"after": after, "limit": EVENTS_PAGE}
            )
            found.extend(Event.from_api(item) for item in page["data"])
            if not page.get("has_more") or not page["data"]:
                return found
            after = found[-1].id

    def follow(self, after: int | None = None) -> Iterator[Event]:
        """Yield the job's events as they happen (server-sent events), until the job ends."""
        for item in self._client.stream_events(f"{FINE_TUNES}/{self.id}/events", {"after": after}):
            yield Event.from_api(item)

    def files(self, checkpoints: bool = False) -> list[dict[str, Any]]:
        """The job's files: its output (and with `checkpoints`, its checkpoints), with sizes and sha256."""
        page = self._client.request("GET", f"{FINE_TUNES}/{self.id}/files")
        return [f for f in page["data"] if checkpoints or f["path"].startswith("output/")]

    def download(self, dir: str | Path, *, checkpoints: bool = False, progress: bool | None = None) -> Path:
        """Download the output (model.safetensors, configs, processors, norm stats) into `dir`,
        each checked against its sha256; with `checkpoints`, also checkpoints/. Returns `dir`."""
        if not checkpoints:
            self.refresh()
            if self.status != job_status.COMPLETED:
                raise RuntimeError(f"fine-tune {self.id} is {self.status}: its output exists once completed")
        target = Path(dir)
        files = self.files(checkpoints=checkpoints)
        show = sys.stderr.isatty() if progress is None else progress
        bar = _DownloadBar(sum(f["bytes"] for f in files)) if show else None
        try:
            for item in files:
                relative = PurePosixPath(item["path"])
                if relative.is_absolute() or ".." in relative.parts:
                    raise RuntimeError(f"refusing to write {item['path']!r} outside {target}")
                # The output lands in `dir` itself; checkpoints keep their checkpoints/ prefix.
                in_output = relative.parts[0] == "output"
                local = target.joinpath(*relative.parts[1:]) if in_output else target / relative
                self._client.download(
                    f"{FINE_TUNES}/{self.id}/files/{item['path']}",
                    local,
                    on_bytes=bar.advance if bar is not None else None,
                )
        finally:
            if bar is not None:
                bar.close()
        return target

    def push_to_hub(
        self,
        repo_id: str,
        *,
        private: bool = True,
        revision: str | None = None,
        token: str | None = None,
        endpoint: str | None = None,
    ) -> PushedRepo:
        """Push the completed job's output to the Hub model repo `repo_id` (owner/name; created
        private unless `private` is False) at the branch `revision` (None: main; created if absent),
        with a model card (README.md: base, dataset and their revisions, recipe, validation and
        evaluation figures, Relay's version). The output is downloaded through the API first. The
        token and Hub: `token` and `endpoint`, else HF_TOKEN and HF_ENDPOINT, else huggingface_hub's
        saved login; the token goes to the Hub alone. Needs huggingface_hub (relay.hub_push)."""
        from relay.hub_push import push_job

        return push_job(self, repo_id, private=private, revision=revision, token=token, endpoint=endpoint)


class _DownloadBar:
    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

        self._progress = Progress(
            BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=Console(stderr=True)
        )
        self._progress.start()
        self._task = self._progress.add_task("download", total=total)

    def advance(self, count: int) -> None:
        self._progress.advance(self._task, count)

    def close(self) -> None:
        self._progress.stop()


class _StageWatch:
    """What a running job is doing between steps (validating, evaluating, writing its output), from
    its latest events: the newest stage event, until an event after it ends the stage."""

    def __init__(self, job: FineTuneJob) -> None:
        self.job = job
        self.after: int | None = None
        self.stage: str | None = None

    def now(self) -> str | None:
        for event in self.job.events(self.after):
            self.after = event.id
            typed = events.parse_known(event)  # None for a kind unknown here: it ends a stage too
            self.stage = typed.describe() if isinstance(typed, events.StageEvent) else None
        return self.stage
