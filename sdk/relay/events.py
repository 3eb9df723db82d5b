"""The contract of a job's reports: its events and the recipe's result, one definition for the engine
that produces them, the worker that stores them, the API that serves them and the SDK, CLI and
console that read them. Pure Python and pydantic: every package may import it.

An event is a dict of its wire keys, exactly as jobs have reported them since the first release: a
metrics event's figures at the top level (``{"step": 10, "loss": 0.21, "grad_norm": 0.9, "lr":
2.4e-6, "skipped": 0.0, ...}``), any other event's name under ``"event"`` with its details beside it
(``{"step": 20, "event": "checkpoint", "seconds": 1.2}``). Each kind is a class of its own with its
fields typed as attributes (``event.loss``), and its ``kind`` as a class attribute that typed readers
dispatch on. On the wire (``to_wire``: the engine's stdout, the worker's journal, the API's answers)
``"kind"`` rides along as one more key; a report without it (an older row) is read by its
``"event"``, or as metrics (``parse_event``).

Events are dicts, not pydantic models, because that is what every reader has had since the first
release (``Trainer.events``, ``relay local train --json``, callbacks that index them); pydantic
checks each one as it is built and gives the API's document its shape per kind
(relay_api.schemas.EventOut).

A new kind (video, serving, evaluation reports) is one class below, added to the ``Event`` union.
"""

from __future__ import annotations

import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Literal, NotRequired, Union

from pydantic import ConfigDict, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from relay.formatting import number_text

METRICS = "metrics"
# A recipe's metrics event comes every this many steps (and at its last step): the window its means cover.
METRICS_EVERY = 10


class EventBase(dict[str, Any]):
    """One report of a job: a dict of its wire keys, with its fields as typed attributes.

    A field typed ``X | None`` may be absent (its attribute reads None): the engine leaves out what it
    did not measure (a CPU run's ``gpu_memory_bytes``), and older rows lack fields added since (the
    engine always reports a metrics event's ``loss``, ``grad_norm``, ``lr`` and ``skipped``)."""

    kind: ClassVar[str]
    step: int

    def __init__(self, **fields: Any) -> None:
        """Checked against the class's fields (a ValueError names the field); numbers as Python
        numbers, a non-finite one as None, so that the event is JSON as it stands."""
        plain = {name: _plain(value) for name, value in fields.items()}
        if type(self).kind != METRICS:
            plain = {"step": plain.pop("step", None), "event": type(self).kind, **plain}
        try:
            _fields_adapter(type(self)).validate_python({**plain, "kind": type(self).kind})
        except ValidationError as error:
            raise ValueError(f"bad {type(self).kind} event: {error}") from None
        super().__init__(plain)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self:
            return self[name]
        if name in _field_types(type(self)):
            return None  # an optional field left out
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def to_wire(self) -> dict[str, Any]:
        """The event as it crosses a process or a network: its keys, and its kind."""
        return wire_form(self)


class MetricsEvent(EventBase):
    """Every `log_every` steps: the window's means (``loss`` and ``grad_norm`` over the steps that
    were taken; ``skipped``: the share that were not), the speed, and a GPU run's memory."""

    kind: ClassVar[str] = "metrics"
    loss: float | None
    grad_norm: float | None
    lr: float | None
    skipped: float | None
    steps_per_second: float | None
    samples_per_second: float | None
    data_wait: float | None  # the share of the window's time spent waiting for batches
    gpu_memory_bytes: int | None


class CheckpointEvent(EventBase):
    """A complete checkpoint at `step` (in the directory ``checkpoint_dir(step)``); ``seconds``: how
    long it took to write."""

    kind: ClassVar[str] = "checkpoint"
    seconds: float | None


def checkpoint_dir(step: int) -> str:
    """The name of the checkpoint directory of `step`: ``step-00001000`` (a job's files list it under
    ``checkpoints/``)."""
    return f"step-{step:08d}"


class ResumedEvent(EventBase):
    """The run resumed from the checkpoint at `step`; ``attempt``: the service job's attempt."""

    kind: ClassVar[str] = "resumed"
    attempt: int | None

    @classmethod
    def of_attempt(cls, step: int, attempt: int) -> ResumedEvent:
        """A service job's resume names its attempt; a local run's (attempt 0) names none."""
        return cls(step=step, attempt=attempt) if attempt > 0 else cls(step=step)


class RetryEvent(EventBase):
    """The reconciler hands the job to attempt ``attempt``: the last one ended with ``reason``."""

    kind: ClassVar[str] = "retry"
    attempt: int
    reason: str


class CancelledEvent(EventBase):
    """The job ended `cancelled` at `step` (a queued job at once, a running one at its next step)."""

    kind: ClassVar[str] = "cancelled"


class FinishedEvent(EventBase):
    """The loop took its last step; the output is written next."""

    kind: ClassVar[str] = "finished"


class ErrorEvent(EventBase):
    """The job ended in `error`; ``message`` says why (the job's ``error``)."""

    kind: ClassVar[str] = "error"
    message: str


class DatasetEvent(EventBase):
    """The dataset is open, at the `step` the run starts from: what was read. A Hub dataset's
    ``repo``, the ``revision`` read (the one named, ``v2.1``, or the default branch) and its commit
    ``sha``; a local one's ``path``. ``format``: its LeRobot codebase_version; ``frames`` and
    ``episodes``: how many it holds. A mixture (a recipe's ``datasets``) reports its first dataset
    so, and every dataset in ``mixture``: each one's fields as above and its ``share`` of the
    samples (relay.dataset_mixture)."""

    kind: ClassVar[str] = "dataset"
    repo: str | None
    path: str | None
    revision: str | None
    sha: str | None
    format: str | None
    frames: int
    episodes: int
    mixture: list[dict[str, Any]] | None

    def describe(self) -> str:
        return dataset_line(self)


def dataset_line(read: Mapping[str, Any]) -> str:
    """A dataset event's fields (or a job's ``dataset``) as one line: ``lerobot/pusht_image at v2.1
    (commit 1a2b3c4d), LeRobot v2.1, 206 episodes, 25,650 frames`` (the console's job page matches it)."""
    if read.get("repo"):
        where = f"{read['repo']} at {read.get('revision')} (commit {str(read.get('sha') or '?')[:8]})"
    else:
        where = str(read.get("path"))
    version = f"LeRobot {read['format']}" if read.get("format") else "no codebase_version"
    line = f"{where}, {version}, {read.get('episodes', 0):,} episodes, {read.get('frames', 0):,} frames"
    mixture = read.get("mixture")
    if mixture:
        share = mixture[0].get("share")
        line += f" ({share:.0%} of samples)" if isinstance(share, int | float) else ""
        others = len(mixture) - 1
        line += f", mixed with {others} more dataset{'' if others == 1 else 's'}"
    return line


class WeightsEvent(EventBase):
    """Where a job's starting weights came from (a recipe with from_checkpoint), at the step the run
    starts from: the ``model`` (architecture) they are, and a Hub repo's ``repo``, the ``revision``
    asked for (null: the default branch) and the commit ``sha`` read; a local directory's ``path``;
    or the fine-tune ``job`` whose output they are (``path`` then null: that output lies on the
    service, whose paths no answer shows)."""

    kind: ClassVar[str] = "weights"
    model: str
    repo: str | None
    revision: str | None
    sha: str | None
    path: str | None
    job: str | None

    def describe(self) -> str:
        return weights_line(self)


def weights_line(read: Mapping[str, Any]) -> str:
    """A weights event's fields (or a job's ``weights``) as one line: ``pi05-tiny weights of
    team/my-pi05 at v2 (commit 1a2b3c4d)``, ``... of fine-tune ft-...``, ``... of /models/pick``."""
    if read.get("job"):
        where = f"fine-tune {read['job']}"
    elif read.get("repo"):
        revision = read.get("revision") or "the default branch"
        where = f"{read['repo']} at {revision} (commit {str(read.get('sha') or '?')[:8]})"
    else:
        where = str(read.get("path"))
    return f"{read.get('model')} weights of {where}"


class SnapshotEvent(EventBase):
    """A database job's snapshot, taken at its start in one transaction: the ``source`` URL (its
    password masked), where the snapshot is (``path``), when it was taken (``taken_at``, ISO 8601)
    and each table's rows (``row_counts``). Every attempt of the job reads this snapshot."""

    kind: ClassVar[str] = "snapshot"
    source: str
    path: str
    taken_at: str
    row_counts: dict[str, int]


# Action chunks sampled per held-out frame, each from its own noise, by validation and by default
# `relay local eval` (relay_engine.families.robot_scores): their mean is scored, their spread
# reported beside it. Four cut the sampling spread's share of the mean's error to a quarter at
# four times the denoising (the prefix pass, the costly part, runs once per frame).
CHUNKS_PER_FRAME = 4


class ValidationEvent(EventBase):
    """The held-out episodes (a recipe's ``validation_episodes``) scored at a checkpoint's `step`
    and at the end, on the same ``frames`` every time with the same seeded noise, so checkpoints
    compare: ``validation_loss``, the flow-matching loss (the training loss's definition) on those
    frames; ``mean_action_mse``, the headline: the mean squared error, in normalized units, of the
    mean of ``chunks`` action chunks sampled per frame against the dataset's chunk;
    ``action_spread``, those chunks' mean squared distance from their mean (the policy's sampling
    spread, same units); ``action_mse``, one sampled chunk's error (averaged over the chunks: the
    headline plus the spread); ``blind_mse``, the error of the blind baseline (always the training
    frames' mean chunk), which a policy that looks must beat: it samples nothing, so its one chunk
    is its mean chunk and it compares with the headline as it stands. ``episodes``: how many are
    held out; ``seconds``: how long the scoring took. A mixture's scoring holds out episodes of each
    dataset and reports each one in ``datasets`` (its ``dataset`` name and the figures above); the
    figures beside them are over all the scored frames (each dataset's weighted by its frames).
    (Not ``loss``: a metrics event is the one
    with a ``loss``.) Events from before the headline lack ``mean_action_mse``, ``action_spread``
    and ``chunks``: their ``action_mse`` was one chunk's error, and stands as their headline
    (`headline_action_error`)."""

    kind: ClassVar[str] = "validation"
    validation_loss: float | None
    mean_action_mse: float | None
    action_spread: float | None
    action_mse: float | None
    blind_mse: float | None
    chunks: int | None
    frames: int
    episodes: int
    seconds: float | None
    datasets: list[dict[str, Any]] | None

    def describe(self) -> str:
        return validation_line(self)


def headline_action_error(scored: Mapping[str, Any]) -> float | None:
    """A validation scoring's headline action error, what "best" and "x better than blind" read:
    the error of the mean of the sampled chunks; for a scoring from before it was reported, its one
    chunk's error (``action_mse``), the only one it has."""
    mean = scored.get("mean_action_mse")
    return scored.get("action_mse") if mean is None else mean


def validation_line(scored: Mapping[str, Any]) -> str:
    """A validation event's figures (or one of a job's ``validation`` block) as one line:
    ``action error 0.01 (mean of 4 chunks) vs blind 0.0281 (2.81x better), one chunk 0.0123,
    spread 0.0023, validation loss 0.104, 48 frames of 4 episodes``; a scoring from before the
    mean was reported: ``action error 0.0123 (one chunk) vs blind ...`` (the console's job page
    matches it)."""
    action, blind = headline_action_error(scored), scored.get("blind_mse")
    mean = scored.get("mean_action_mse")
    if mean is None:
        what = "one chunk"
    else:
        chunks = scored.get("chunks")
        what = "mean of chunks" if chunks is None else f"mean of {chunks} chunk{'' if chunks == 1 else 's'}"
    parts = [f"action error {number_text(action)} ({what})"]
    if blind is not None:
        parts[0] += f" vs blind {number_text(blind)}"
        if isinstance(action, int | float) and action > 0:
            ratio = blind / action
            parts[0] += f" ({ratio:.2f}x better)" if ratio >= 1 else f" ({1 / ratio:.2f}x worse)"
    if mean is not None:
        parts.append(f"one chunk {number_text(scored.get('action_mse'))}")
        parts.append(f"spread {number_text(scored.get('action_spread'))}")
    parts.append(f"validation loss {number_text(scored.get('validation_loss'))}")
    episodes = int(scored.get("episodes") or 0)
    frames = int(scored.get("frames") or 0)
    parts.append(f"{frames:,} frames of {episodes:,} episode{'' if episodes == 1 else 's'}")
    line = ", ".join(parts)
    for dataset in scored.get("datasets") or ():  # a mixture's: each dataset's headline
        line += f"; {dataset_label(str(dataset.get('dataset')))}: {_versus_blind(dataset)}"
    return line


def _versus_blind(scored: Mapping[str, Any]) -> str:
    action, blind = headline_action_error(scored), scored.get("blind_mse")
    text = f"action error {number_text(action)}"
    if blind is not None:
        text += f" vs blind {number_text(blind)}"
        if isinstance(action, int | float) and action > 0:
            ratio = blind / action
            text += f" ({ratio:.2f}x better)" if ratio >= 1 else f" ({1 / ratio:.2f}x worse)"
    return text + f" on {int(scored.get('frames') or 0):,} frames"


def dataset_label(name: str) -> str:
    """A dataset's name as a line shows it: a Hub repo id as it is, a directory by its last part."""
    if name.startswith(("/", "~", ".", "file:")):
        return Path(name.rstrip("/")).name or name
    return name


class EvalEvent(EventBase):
    """A closed-loop evaluation of the policy at `step` (a recipe's ``eval`` block: at the end, and
    at each checkpoint if asked): ``episodes`` run in the Gymnasium environment ``env``, the share
    that succeeded (``success_rate``, 0 to 1), the mean of each episode's summed reward and its
    mean length in environment steps, and how long it took. The whole report is the job's file
    ``eval/step-N.json`` (`eval_report_path`), the first episodes' videos under ``eval/step-N/``."""

    kind: ClassVar[str] = "eval"
    env: str
    success_rate: float
    mean_reward: float
    mean_length: float
    episodes: int
    seconds: float
    videos: list[str] | None

    def describe(self) -> str:
        return eval_line(self)


def eval_line(report: Mapping[str, Any]) -> str:
    """An eval event's figures as one line: ``relay/Dot-v0: success 60% of 10 episodes, mean reward
    0.6, mean length 31.2 steps (4.1 s)``."""
    rate = report.get("success_rate")
    shown = "-" if rate is None else f"{rate:.0%}"
    return (
        f"{report.get('env')}: success {shown} of {report.get('episodes')} episodes, mean reward "
        f"{number_text(report.get('mean_reward'))}, mean length {number_text(report.get('mean_length'))} "
        f"steps ({number_text(report.get('seconds'))} s)"
    )


class StageEvent(EventBase):
    """What a run is doing between its steps, at `step`, where that takes more than a moment:
    ``validating`` the held-out episodes, ``evaluating`` the policy in a simulator, ``writing``
    the merged output. Validating and evaluating end with their report (a validation or eval
    event); writing follows the finished event and ends with the job's completion. Until then,
    progress lines say the stage (``detail`` adds what it covers)."""

    kind: ClassVar[str] = "stage"
    stage: Literal["validating", "evaluating", "writing"]
    detail: str | None

    def describe(self) -> str:
        return stage_text(self)


def stage_text(event: Mapping[str, Any]) -> str:
    """`validating`, `evaluating in relay/Dot-v0 (10 episodes)`, `writing the output`."""
    words = {"writing": "writing the output"}.get(str(event.get("stage")), str(event.get("stage")))
    detail = event.get("detail")
    return f"{words} {detail}" if detail else words


class TrackerEvent(EventBase):
    """An experiment tracker of the recipe's ``integrations`` (``tracker``: ``wandb``,
    ``tensorboard``) could not be written to, first at `step`: ``message`` says why. Reported once
    per tracker and run: training goes on, what was not sent is kept and tried again, and at the
    end the run waits a bounded time for it (docs/integrations.md). ``unsent``: how many records
    were waiting when this was reported."""

    kind: ClassVar[str] = "tracker"
    tracker: str
    message: str
    unsent: int | None

    def describe(self) -> str:
        return f"{self.tracker} is not being written to: {self.message} (training goes on)"


class PushedEvent(EventBase):
    """The output was pushed to the Hub (a recipe's ``hub`` block), at the last `step`: the model
    repo ``repo_id`` at the branch ``revision``, the ``commit`` made and its ``url``; ``private``:
    the visibility asked for (a repo that existed keeps its own). A push that failed has ``error``
    (why, in one line) and no commit: the job stays completed with its output, which `relay
    fine-tunes push` can push later."""

    kind: ClassVar[str] = "pushed"
    repo_id: str
    revision: str
    private: bool
    commit: str | None
    url: str | None
    error: str | None

    def describe(self) -> str:
        if self.error is not None:
            return f"not pushed to {self.repo_id} at {self.revision}: {self.error} (the job's output is kept)"
        return f"pushed to {self.repo_id} at {self.revision}, commit {str(self.commit)[:8]}: {self.url}"


# A job's TensorBoard event files among its files (a recipe whose integrations name TensorBoard).
TENSORBOARD_FILES = "tensorboard"


# A job's closed-loop evaluations among its files: eval/step-00001000.json, and the videos of its
# first episodes in eval/step-00001000/.
EVAL_FILES = "eval"


def eval_report_path(step: int) -> str:
    """The job's file of the evaluation at `step`: ``eval/step-00001000.json``."""
    return f"{EVAL_FILES}/{checkpoint_dir(step)}.json"


def eval_videos_dir(step: int) -> str:
    """Where the videos of the evaluation at `step` are among the job's files: ``eval/step-00001000``."""
    return f"{EVAL_FILES}/{checkpoint_dir(step)}"


Event = Union[  # noqa: UP007 (a runtime value too: typed readers match on its members)
    MetricsEvent,
    CheckpointEvent,
    ResumedEvent,
    RetryEvent,
    CancelledEvent,
    FinishedEvent,
    ErrorEvent,
    DatasetEvent,
    WeightsEvent,
    SnapshotEvent,
    ValidationEvent,
    EvalEvent,
    StageEvent,
    TrackerEvent,
    PushedEvent,
]
EVENT_KINDS: dict[str, type[EventBase]] = {
    kind.kind: kind for kind in typing.get_args(Event) if issubclass(kind, EventBase)
}


def kind_of(data: Mapping[str, Any]) -> str:
    """A wire event's kind: its ``kind``, else (an older report) its ``event``, else metrics."""
    return str(data.get("kind") or data.get("event") or METRICS)


def parse_event(data: Mapping[str, Any]) -> Event:
    """The typed event of a wire dict (with or without ``kind``); keys that are not the event's own
    (an API answer's ``id``, ``object``, ``created_at``) are left out. ValueError for an unknown
    kind or a field that breaks its type. An event already typed is returned as it is."""
    if isinstance(data, EventBase):
        return typing.cast(Event, data)
    kind = kind_of(data)
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown event kind {kind!r} (known: {', '.join(EVENT_KINDS)})")
    cls = EVENT_KINDS[kind]
    own = _field_types(cls)
    event = cls(**{name: value for name, value in data.items() if name in own})
    return typing.cast(Event, event)


def parse_known(data: Mapping[str, Any]) -> Event | None:
    """`parse_event` for a reader that shows events: None for one this version cannot read (a kind
    from a newer worker, or a field that breaks its type), which the reader then shows as it stands
    or passes over, rather than crash. ``match parse_known(event):`` puts it under ``case _:``."""
    try:
        return parse_event(data)
    except ValueError:
        return None


def wire_form(event: Mapping[str, Any]) -> dict[str, Any]:
    """An event's keys with its kind (a typed event's, or the one its keys imply)."""
    return {**event, "kind": kind_of(event)}


def event_line(event: Mapping[str, Any]) -> str:
    """One event as a line of JSON (the engine's stdout, the worker's journal)."""
    return json.dumps(wire_form(event), separators=(",", ":"))


def fields_of(kind: type[EventBase]) -> dict[str, Any]:
    """A kind's fields and their types (`step` among them): what an API's schema of it declares.
    A field whose type admits None may be absent."""
    return dict(_field_types(kind))


@cache
def _field_types(cls: type[EventBase]) -> dict[str, Any]:
    """The kind's fields (its annotations and the base's), without the class attributes."""
    hints = typing.get_type_hints(cls)
    return {name: hint for name, hint in hints.items() if typing.get_origin(hint) is not ClassVar}


@cache
def _fields_adapter(cls: type[EventBase]) -> TypeAdapter[Any]:
    """A pydantic TypedDict of the kind's wire form: what checks an event as it is built."""
    wire: dict[str, Any] = {"kind": Literal[cls.kind]}
    if cls.kind != METRICS:
        wire["event"] = Literal[cls.kind]
    for name, hint in _field_types(cls).items():
        wire[name] = NotRequired[hint] if admits_none(hint) else hint
    shape = _typed_dict(cls.__name__, wire)
    shape.__pydantic_config__ = ConfigDict(extra="forbid", title=cls.__name__)
    return TypeAdapter(shape)


# TypedDict's functional form, for a shape known only when the class is: a name mypy reads as Any.
_typed_dict: Any = TypedDict


def admits_none(hint: Any) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType) and type(None) in typing.get_args(hint)


def _plain(value: Any) -> Any:
    """A JSON-ready value: a numpy or torch scalar as a Python number, a non-finite float as None."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass(frozen=True)
class RecipeResult:
    """How a recipe run ended: `completed` (its output in `output_dir`) or `stopped` (asked to), at
    `step`, with the last step's `loss`; `resumed_from`: the checkpoint's step it resumed from."""

    status: Literal["completed", "stopped"]
    step: int
    loss: float | None
    output_dir: Path | None
    resumed_from: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "status": self.status,
                "step": self.step,
                "loss": _plain(self.loss),
                "output_dir": None if self.output_dir is None else str(self.output_dir),
                "resumed_from": self.resumed_from,
                "extra": self.extra,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> RecipeResult:
        data = json.loads(text)
        return cls(
            status=data["status"],
            step=int(data["step"]),
            loss=data.get("loss"),
            output_dir=None if data.get("output_dir") is None else Path(data["output_dir"]),
            resumed_from=data.get("resumed_from"),
            extra=dict(data.get("extra") or {}),
        )
