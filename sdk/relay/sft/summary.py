"""A fine-tune's results card, as one typed object: ``GET /v1/fine-tunes/{id}/summary``.

The API computes it from the job's row and events (relay_api.job_summary), so the console's job
page, ``FineTuneJob.summary()`` and ``relay fine-tunes retrieve`` show the same numbers. This
module holds its shape (which the API's document shows) and the "use this model" texts, with the
job's id filled in (``model_use``).

``validation`` and ``eval`` are left empty until the job reports events of those kinds: a held-out
validation split scored at each checkpoint, and closed-loop evaluation in a simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from relay import families
from relay.events import headline_action_error
from relay.model_use import any_model_use

JobStatus = Literal["queued", "running", "cancel_requested", "completed", "cancelled", "error"]


class LossAt(BaseModel):
    """A training loss (the mean over one metrics window) and the step its window ends at."""

    step: int
    loss: float


class TrainingLoss(BaseModel):
    """The training loss of the job's first and latest metrics events, and the lowest of any."""

    first: LossAt | None = None
    last: LossAt | None = None
    best: LossAt | None = None


class ValidationFigures(BaseModel):
    """One scoring of the held-out episodes at `step`: a ``validation`` event's figures
    (relay.events.ValidationEvent): ``validation_loss``, the error of the mean of ``chunks``
    sampled action chunks a frame (``mean_action_mse``, the headline), their spread
    (``action_spread``), one chunk's error (``action_mse``) and the blind baseline's
    (``blind_mse``), on ``frames`` of ``episodes``. A scoring from before the headline has
    ``action_mse`` alone."""

    model_config = ConfigDict(extra="allow")

    step: int
    validation_loss: float | None = None
    mean_action_mse: float | None = None
    action_spread: float | None = None
    action_mse: float | None = None
    blind_mse: float | None = None
    chunks: int | None = None
    frames: int | None = None
    episodes: int | None = None
    seconds: float | None = None


class ValidationSummary(BaseModel):
    """A job's validation split as scored so far: the job's ``validation`` block in
    ``GET /v1/fine-tunes/{id}`` and the card's ``validation`` slot, both made by
    `validation_summary`."""

    best: ValidationFigures = Field(
        description="The scoring with the lowest headline action error so far (`mean_action_mse`; "
        "a scoring from before it, its `action_mse`), the earliest of equals, with its step: the "
        "checkpoint to pick."
    )
    last: ValidationFigures = Field(description="The latest scoring: the latest checkpoint's, or the end's.")
    scored: int = Field(description="How many times the split has been scored.")


class EvalFigures(BaseModel):
    """A closed-loop evaluation at `step`: the share of episodes that succeeded, 0 to 1 (any other
    figures it reports ride along)."""

    model_config = ConfigDict(extra="allow")

    step: int
    success_rate: float | None = Field(None, ge=0, le=1)


class EvalSummary(BaseModel):
    """The closed-loop evaluations so far: the best (highest ``success_rate``, the earliest of
    equals), the latest, and how many."""

    best: EvalFigures
    last: EvalFigures
    evaluated: int


def validation_summary(scorings: Sequence[Mapping[str, Any]]) -> ValidationSummary | None:
    """The validation block of a job's ``validation`` events' figures, each with its step, oldest
    first; None before the first. The one definition of "best": the lowest headline action error
    (relay.events.headline_action_error)."""
    figures = [ValidationFigures.model_validate(scoring) for scoring in scorings]
    if not figures:
        return None
    best = _best(figures, lambda scoring: headline_action_error(scoring.model_dump()), lower=True)
    return ValidationSummary(best=best, last=figures[-1], scored=len(figures))


def eval_summary(reports: Sequence[Mapping[str, Any]]) -> EvalSummary | None:
    """The eval block of a job's ``eval`` events' figures, each with its step, oldest first; None
    before the first. Best: the highest success rate."""
    figures = [EvalFigures.model_validate(report) for report in reports]
    if not figures:
        return None
    best = _best(figures, lambda report: report.success_rate, lower=False)
    return EvalSummary(best=best, last=figures[-1], evaluated=len(figures))


Figures = TypeVar("Figures", ValidationFigures, EvalFigures)


def _best(reports: list[Figures], figure: Callable[[Figures], float | None], lower: bool) -> Figures:
    """The report whose `figure` is lowest (or highest), the earliest on a tie; the first when
    none has the figure."""
    best = reports[0]
    for report in reports[1:]:
        value, best_value = figure(report), figure(best)
        if value is None:
            continue
        if best_value is None or (value < best_value if lower else value > best_value):
            best = report
    return best


class CheckpointSummary(BaseModel):
    """A complete checkpoint and the training figures at its step, beside its files."""

    step: int
    path: str = Field(description="Its directory among the job's files: `checkpoints/step-00001000`.")
    kept: bool = Field(
        description="Whether its files are still there to download (a job keeps its newest two)."
    )
    created_at: str | None = None
    seconds: float | None = Field(None, description="How long it took to write.")
    metrics_step: int | None = Field(
        None,
        description="The step of the metrics event the figures below come from: the window that "
        "ends at the checkpoint's step (or the latest before it). Null when none came before it.",
    )
    loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    validation: ValidationFigures | None = None
    eval: EvalFigures | None = None


class ModelUse(BaseModel):
    """How to use the job's output, with its id filled in: the commands and code to copy."""

    ready: bool = Field(description="Whether the output exists to download: the job has completed.")
    note: str | None = Field(None, description="Why the output is not there yet (or will never be).")
    directory: str = Field(description="Where the commands below put the output (named by the id).")
    download: str = Field(description="The shell command that downloads the output, sha256-checked.")
    python: str = Field(description="The same download from Python, and loading it with Relay's engine.")
    lerobot: str | None = Field(
        None, description="Loading it in lerobot (`PI05Policy`); null where lerobot cannot: `lerobot_note`."
    )
    lerobot_note: str | None = None
    deploy: str = Field(description="How to serve it: a deployment on the service, or `relay serve` locally.")


class WeightsRead(BaseModel):
    """Where a job's starting weights came from (a recipe's from_checkpoint; its `weights` event): the
    `model` they are, and a Hub repo's `repo`, the `revision` asked for (null: the default branch) and
    the commit `sha` read; a local directory's `path`; or the fine-tune `job` whose output they are."""

    model_config = ConfigDict(extra="forbid")

    model: str
    repo: str | None = None
    revision: str | None = None
    sha: str | None = None
    path: str | None = None
    job: str | None = None


class HubPushed(BaseModel):
    """Where a recipe's ``hub`` block pushed the output: its ``pushed`` event (relay.events.PushedEvent)."""

    step: int
    repo_id: str
    revision: str
    private: bool
    commit: str | None = Field(None, description="The commit the Hub made; null when the push failed.")
    url: str | None = None
    error: str | None = Field(None, description="Why the push failed (the job keeps its output).")


class FineTuneSummary(BaseModel):
    """A fine-tune's results: its pace, its training loss, its checkpoints with their figures, the
    validation and closed-loop figures once reported, and how to use the model."""

    object: Literal["fine_tune.summary"] = "fine_tune.summary"
    id: str
    status: JobStatus
    step: int
    steps: int
    progress: float = Field(description="step / steps, 0 to 1.")
    queued_seconds: float | None = Field(
        None, description="From creation until a worker started it (until now while it waits)."
    )
    elapsed_seconds: float | None = Field(
        None, description="Since a worker started it: until now while it runs, until its end once ended."
    )
    duration_seconds: float | None = Field(
        None, description="From start to end, once it has ended (null if it never started)."
    )
    eta_seconds: float | None = Field(
        None,
        description="While running: the steps left at the recent pace (`latest_steps_per_second`); "
        "the final export is not counted.",
    )
    steps_per_second: float | None = Field(
        None,
        description="Training pace over the whole run: the metrics windows' steps over the time they "
        "took (opening the data and writing checkpoints left out).",
    )
    samples_per_second: float | None = Field(None, description="The same in samples (steps x batch size).")
    latest_steps_per_second: float | None = Field(
        None,
        description="The recent pace, what the ETA divides by: steps over wall-clock time across the "
        "metrics events of the last minute (at least the latest two), checkpoints and validation "
        "included; with one report so far, that window's own pace. The CLI's and the local "
        "trainer's progress use the same rule.",
    )
    loss: TrainingLoss
    metrics_note: str | None = Field(
        None, description="Why the job has no metrics yet (null once it has): what the charts wait for."
    )
    checkpoints: list[CheckpointSummary]
    validation: ValidationSummary | None = Field(
        None, description="Held-out validation: the best and latest `validation` events (null until one)."
    )
    eval: EvalSummary | None = Field(
        None, description="Closed-loop evaluation: the best and latest success rates (null until one)."
    )
    weights: WeightsRead | None = Field(
        None,
        description="Where the starting weights came from, for a job with from_checkpoint (null until "
        "the worker loaded them, and for a job from its model's base).",
    )
    use: ModelUse
    pushed: HubPushed | None = Field(
        None,
        description="A recipe with a `hub` block: where the output was pushed, or why it was not "
        "(null until the job completed, and without the block).",
    )


def model_use(job_id: str, model: str, dataset_name: str, status: str, task: str | None = None) -> ModelUse:
    """The "use this model" block of a job of `model` on `dataset_name` (an RT-J job's `task`), in
    `status`, with its id filled in."""
    directory = job_id
    family = families.family_of(model)
    download = f"relay fine-tunes download {job_id} --dir {directory}"
    fetch = (
        "from relay.sft import retrieve\n\n"
        f'retrieve("{job_id}").download("{directory}")  # every file checked against its sha256\n\n'
    )
    use_text = family.use_text if family is not None and family.use_text is not None else any_model_use
    use = use_text(model, directory, dataset_name, task)
    deploy = (
        f"`relay deployments create {job_id}` keeps it loaded on a serving worker ({use.served_as}, "
        f"your API key); `relay serve {directory}` serves the downloaded output on your own machine. "
        f"`{use.score}` scores it on a dataset (held-out episodes: --episodes)."
    )
    return ModelUse(
        ready=status == "completed",
        note=_not_ready_note(status),
        directory=directory,
        download=download,
        python=fetch + use.python,
        lerobot=use.lerobot,
        lerobot_note=use.lerobot_note,
        deploy=deploy,
    )


def _not_ready_note(status: str) -> str | None:
    if status == "completed":
        return None
    if status in ("cancelled", "error"):
        return (
            f"this job ended {status}, so it has no output; the checkpoints it kept download with "
            "--checkpoints"
        )
    return "the output is written when the job completes"
