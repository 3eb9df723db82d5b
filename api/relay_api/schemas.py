"""The shapes of the API's answers, for /docs. Routes build these dicts directly (fine_tunes.job_object
and event_object) and skip re-validating them on the way out."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class FineTuneOut(BaseModel):
    id: str
    object: Literal["fine_tune"] = "fine_tune"
    status: Literal["queued", "running", "cancel_requested", "completed", "cancelled", "error"]
    step: int
    loss: float | None
    error: str | None
    output_dir: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    attempts: int
    model: str
    dataset_name: str
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


class FineTuneList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuneOut]
    has_more: bool


class EventOut(BaseModel):
    """The engine's report: ``step`` and ``loss``, ``grad_norm``, ``lr``, ``skipped`` every 10 steps,
    or ``event`` ("checkpoint", "finished", "retry", "cancelled", "error") with its details."""

    model_config = ConfigDict(extra="allow")

    id: int
    object: Literal["fine_tune.event"] = "fine_tune.event"
    created_at: str
    step: int
    event: str | None = None


class EventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EventOut]
    has_more: bool


class FileOut(BaseModel):
    path: str
    bytes: int
    sha256: str | None


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


ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorOut, "description": "A bad request: the message names the field and the rule."},
    401: {"model": ErrorOut, "description": "A missing or wrong API key."},
    404: {"model": ErrorOut, "description": "No such fine-tune among yours."},
}


class SessionOut(BaseModel):
    """A training session: ``starting`` (waiting for a worker, then loading on ``worker``), ``ready``,
    ``closed`` or ``error`` (``error`` says why it ended)."""

    id: str
    object: Literal["training_session"] = "training_session"
    status: Literal["starting", "ready", "closed", "error"]
    base_model: str
    finetune: str
    rank: int
    alpha: float | None
    targets: list[str]
    action_horizon: int
    codec: str
    info: dict[str, object] | None
    error: str | None
    worker: str | None
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
