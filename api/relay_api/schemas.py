"""The shapes of the API's answers: one model per resource, which the routes build their answers
with (fine_tunes.job_object, sessions.session_object) and /openapi.json shows. Events are built as
plain dicts on their hot path (event_rows.event_object) and match EventOut (tests/service): one
model per kind of relay.events, each made from that kind's fields."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    SerializerFunctionWrapHandler,
    create_model,
    model_serializer,
)

from relay.dataset_mixture import MixtureDataset
from relay.env_evaluation import JobEval
from relay.events import EVENT_KINDS, METRICS, EventBase, admits_none, fields_of
from relay.hub_target import HubTarget
from relay.integrations import Integration

# A job's results card (GET /v1/fine-tunes/{id}/summary): its shape is the SDK's, which reads it back.
from relay.sft.summary import FineTuneSummary as FineTuneSummary
from relay.sft.summary import ValidationSummary, WeightsRead
from relay.webhooks import Webhook, WebhookDelivery
from relay.webhooks import WebhookDeliveryList as WebhookDeliveryList
from relay.webhooks import WebhookList as WebhookList

# Webhooks' shapes are the SDK's, which reads them back (relay.webhooks).
WebhookOut = Webhook
WebhookDeliveryOut = WebhookDelivery


class DatasetRead(BaseModel):
    """What the job's engine read of one dataset: a Hub dataset's repo, the revision read and its
    commit, or a local directory; the LeRobot format, episodes and frames."""

    model_config = ConfigDict(extra="forbid")

    repo: str | None = None
    path: str | None = None
    revision: str | None = None
    sha: str | None = None
    format: str | None = None
    frames: int
    episodes: int


class MixturePartRead(DatasetRead):
    """One dataset of a mixture as the engine read it, and its share of the samples."""

    share: float


class DatasetReadOut(DatasetRead):
    """What the job's engine read (its latest `dataset` event)."""

    mixture: list[MixturePartRead] | None = Field(
        None,
        description="A mixture's datasets (the recipe's `datasets`), each as read, with its `share` of "
        "the samples; the fields above are then its first dataset's. Absent for one dataset.",
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        # One dataset's read shows as it did before mixtures: without the field.
        shown = handler(self)
        if isinstance(shown, dict) and shown.get("mixture") is None:
            shown.pop("mixture", None)
        return shown


class FineTuneOut(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a field the routes add must be declared here first

    id: str
    object: Literal["fine_tune"] = "fine_tune"
    status: Literal["queued", "running", "cancel_requested", "completed", "cancelled", "error"]
    step: int
    loss: float | None = Field(
        description="The mean training loss over the latest metrics window (the last 10 steps): "
        "the latest metrics event's `loss`. Null before the first event."
    )
    error: str | None
    output_dir: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    attempts: int
    lease_lapsed_seconds: float | None = Field(
        description="For a running job whose worker stopped renewing its lease: seconds since the lease "
        "lapsed, also once it has been handed on to a new attempt that no worker has taken yet "
        "(another worker resumes it within seconds; a growing number means no worker is alive)."
    )
    dataset: DatasetReadOut | None = Field(
        None,
        description="What the engine read once the dataset was open (the latest `dataset` event): the "
        "Hub repo, the revision and its commit sha, or the local path; the format, episodes and frames. "
        "Null until then, and for jobs that read no LeRobot dataset.",
    )
    validation: ValidationSummary | None = Field(
        None,
        description="A job with `validation_episodes`: the held-out scores, best and last (its "
        "`validation` events, at each checkpoint and at the end). Null before the first, and for "
        "jobs without a validation split.",
    )
    weights: WeightsRead | None = Field(
        None,
        description="Where the starting weights came from (the `weights` event of a job with "
        "from_checkpoint): the model, and the Hub repo, revision and commit sha, or the local path, or "
        "the fine-tune `job`. Null until the worker loaded them, and for a job from its model's base.",
    )
    model: str
    dataset_name: str
    dataset_revision: str | None = None
    datasets: list[MixtureDataset] | None = Field(
        None,
        description="A mixture: the datasets trained on together, each with its revision, weight and "
        "cameras (`dataset_name` is then the first of them). Null for one dataset.",
    )
    batch_size: int
    learning_rate: float
    steps: int
    finetune: str
    lora_rank: int
    lora_alpha: float | None
    targets: list[str] | None
    cameras: dict[str, str] | None
    name: str | None
    gpus: int | None = None  # the processes (GPUs) the job runs on; None only for jobs older than the field
    task: str | None = None
    tasks_dir: str | None = None  # rt-j: where the database's tasks are kept, when apart from it
    validation_episodes: list[int] | float | str | None = None
    eval: JobEval | None = None
    from_checkpoint: str | None = None
    normalization: Literal["dataset", "checkpoint"] = "dataset"
    integrations: list[Integration] = Field(
        default_factory=list,
        description="The experiment trackers the job also logs to (docs/integrations.md); no key is "
        "ever part of it.",
    )
    hub: HubTarget | None = Field(
        None,
        description="Where the worker pushes the output, with a model card, when the job completes "
        "(the summary's `pushed` says where it went); no token is ever part of it.",
    )


class FineTuneList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuneOut]
    has_more: bool


class EventEnvelope(BaseModel):
    """What the API adds to each of the engine's reports: its id (the cursor of `after` and
    `Last-Event-ID`) and when it was written."""

    model_config = ConfigDict(extra="forbid")

    id: int
    object: Literal["fine_tune.event"] = "fine_tune.event"
    created_at: str
    step: int


def _event_out(kind: type[EventBase]) -> type[EventEnvelope]:
    """The answer's shape for one kind: the envelope, ``kind``, a named event's ``event``, its fields."""
    declared: dict[str, Any] = {"kind": (Literal[kind.kind], ...)}
    if kind.kind != METRICS:
        declared["event"] = (Literal[kind.kind], ...)
    for name, hint in fields_of(kind).items():
        if name != "step":
            declared[name] = (hint, None) if admits_none(hint) else (hint, ...)
    return create_model(
        kind.__name__ + "Out", __base__=EventEnvelope, __doc__=kind.__doc__ or kind.__name__, **declared
    )


EVENT_OUTS = tuple(_event_out(kind) for kind in EVENT_KINDS.values())
if TYPE_CHECKING:
    EventOutChoice = EventEnvelope
else:  # the union of the kinds' models, told apart by `kind`
    EventOutChoice = Annotated[Union[EVENT_OUTS], Field(discriminator="kind")]  # noqa: UP007


class EventOut(RootModel[EventOutChoice]):
    """The engine's report: every 10 steps a metrics event (``step`` and ``loss``, ``grad_norm``,
    ``lr``, ``skipped``, the speed), or an event named by ``event`` ("checkpoint", "resumed",
    "retry", "cancelled", "finished", "error", "dataset", "weights", "snapshot", "validation", "eval",
    "stage") with its details; ``kind`` names either."""

    @property
    def id(self) -> int:
        return self.root.id


class EventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EventOut]
    has_more: bool


class FileOut(BaseModel):
    path: str
    bytes: int
    sha256: str


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileOut]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorOut(BaseModel):
    error: ErrorDetail


Responses = dict[int | str, dict[str, Any]]

# What every /v1 route can answer (the routers'); each route adds its own below.
ERRORS: Responses = {
    400: {"model": ErrorOut, "description": "A bad request: the message names the field and the rule."},
    401: {"model": ErrorOut, "description": "A missing or wrong API key."},
    413: {"model": ErrorOut, "description": "The body is over the limit (the message says it)."},
    503: {
        "model": ErrorOut,
        "description": "The service's database (or its queue) is away for the moment; send the request "
        "again after `Retry-After` seconds.",
        "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait."}},
    },
}
IDEMPOTENCY_CONFLICT: Responses = {
    409: {"model": ErrorOut, "description": "The Idempotency-Key was used before with another body."}
}
NOT_FOUND: Responses = {
    404: {"model": ErrorOut, "description": "None of yours has this id (another user's is not found either)."}
}
SESSION_ENDED: Responses = {
    410: {
        "model": ErrorOut,
        "description": "The session has ended, or is closing (`session_closed`, `session_error`, "
        "`worker_lost`; the message says why).",
    }
}


class SessionOut(BaseModel):
    """A training session: ``starting`` (waiting for a worker, then loading on ``worker``), ``ready``,
    ``closed`` or ``error`` (``error`` says why it ended). ``calls``, ``steps`` (optimizer steps) and
    ``saved_states`` are counted by its worker and reported with each lease renewal and at the end."""

    model_config = ConfigDict(extra="forbid")

    id: str
    object: Literal["training_session"] = "training_session"
    status: Literal["starting", "ready", "closed", "error"]
    base_model: str
    finetune: str
    lora_rank: int
    lora_alpha: float | None
    targets: list[str]
    action_horizon: int
    codec: str
    problem_type: str | None = None  # rt-j sessions: "binary" or "regression"
    # pi05 sessions: the weights started from instead of the base's (a repo, directory or job id).
    from_checkpoint: str | None = None
    info: dict[str, Any] | None
    error: str | None
    worker: str | None
    calls: int
    steps: int
    saved_states: int
    idle_timeout_seconds: float
    created_at: str
    ready_at: str | None
    ended_at: str | None


class SessionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[SessionOut]
    has_more: bool


class StateOut(BaseModel):
    """A training state saved by a session's ``save_state(name)``; ``load_state(name)`` takes it back
    in a session with the same model, finetune method, targets and rank."""

    object: Literal["training_state"] = "training_state"
    name: str
    base_model: str | None
    finetune: str | None
    targets: list[str] | None
    lora_rank: int | None
    bytes: int
    saved_at: str


class StateList(BaseModel):
    object: Literal["list"] = "list"
    data: list[StateOut]
    has_more: bool


class CallAccepted(BaseModel):
    object: Literal["session.call"] = "session.call"
    session_id: str
    seq: int
    request_id: str
    replayed: bool


class CallPending(BaseModel):
    object: Literal["session.call"] = "session.call"
    seq: int
    status: Literal["pending"] = "pending"


class DeploymentStats(BaseModel):
    """A deployment's figures, as its worker last reported them (with each lease renewal)."""

    model_config = ConfigDict(extra="allow")

    requests: int = 0  # observations (or RT-J rows) answered: a request of several counts each
    requests_per_second: float = 0.0  # over the last 60 s
    latency_ms: dict[str, float | None] = {}  # p50, p90, p99
    clients: int = 0  # robots connected by websocket
    batches: int = 0
    mean_batch: float | None = None
    last_request_at: float | None = None  # unix seconds


class DeploymentOut(BaseModel):
    """A deployment: ``starting`` (waiting for a serving worker, or loading the model; again after
    its worker was lost), ``ready``, ``stopped`` or ``error`` (``error`` says why it ended).
    ``websocket_url`` is where openpi-client connects (with the API key); ``actions_url`` takes
    ``POST``s of observations."""

    model_config = ConfigDict(extra="forbid")

    id: str
    object: Literal["deployment"] = "deployment"
    status: Literal["starting", "ready", "stopped", "error"]
    model: str
    gpus: int
    max_batch: int
    max_wait_ms: float
    idle_timeout_seconds: float
    websocket_url: str
    actions_url: str
    info: dict[str, Any] | None
    stats: DeploymentStats | None
    error: str | None
    attempt: int
    created_at: str
    ready_at: str | None
    ended_at: str | None


class DeploymentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DeploymentOut]
    has_more: bool


class DeploymentEventOut(BaseModel):
    """A deployment's move between statuses (``event``: starting, ready, stopped, error) and why."""

    id: int
    object: Literal["deployment.event"] = "deployment.event"
    event: Literal["starting", "ready", "stopped", "error"]
    reason: str | None
    attempt: int
    created_at: str


class DeploymentEventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DeploymentEventOut]
    has_more: bool


DEPLOYMENT_ENDED: Responses = {
    410: {
        "model": ErrorOut,
        "description": "The deployment has ended: stopped (`deployment_stopped`) or in error "
        "(`deployment_error`); the message says why.",
    }
}
DEPLOYMENT_UNAVAILABLE: Responses = {
    503: {
        "model": ErrorOut,
        "description": "The deployment is not ready (starting, or restarting after its worker was lost), "
        "or its worker cannot be reached: send again after `Retry-After` seconds.",
    }
}
