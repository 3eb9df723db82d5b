"""`relay fine-tunes`: start, list, inspect, cancel, download and push recipe jobs (through the SDK)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from relay import sft
from relay.catalog import LORA_RANK_MAX
from relay.cli._common import (
    MIX_OPTION_HELP,
    checkpoint_name,
    clear_errors,
    console,
    dataset_name,
    err,
    mixture_of_options,
    parse_pairs,
    show_record,
    show_table,
    split_targets,
    status_text,
)
from relay.cli.watch import watch_events
from relay.errors import ConfigError
from relay.events import (
    MetricsEvent,
    PushedEvent,
    ValidationEvent,
    dataset_line,
    eval_report_path,
    headline_action_error,
    parse_known,
    validation_line,
    weights_line,
)
from relay.formatting import duration_text, number_text, size_text
from relay.integrations import (
    INTEGRATION_OPTION_HELP,
    MLFLOW_EXPERIMENT_OPTION_HELP,
    MLFLOW_URI_OPTION_HELP,
    WANDB_PROJECT_OPTION_HELP,
    integrations_of_options,
)
from relay.sft.config import BATCH_SIZE_MAX, STEPS_MAX, SFTConfig
from relay.sft.job import Event, FineTuneJob, interrupted_note
from relay.sft.summary import (
    EvalFigures,
    EvalSummary,
    FineTuneSummary,
    ModelUse,
    ValidationSummary,
)
from relay.sft.train import train

app = typer.Typer(
    help="Recipe jobs on Relay's GPUs: create, list, retrieve, cancel, events, download, push.",
    no_args_is_help=True,
)
out = console()


@contextmanager
def _exit_on_interrupt(job_id: str, said: bool = False) -> Iterator[None]:
    """Ctrl-C while following a job: a line on what it leaves (unless `said`), exit status 130."""
    try:
        yield
    except KeyboardInterrupt:
        if not said:
            err.print(interrupted_note(job_id), highlight=False, markup=False)
        raise typer.Exit(130) from None


@app.command()
def create(
    model: str | None = typer.Option(
        None,
        help="Required (here or in --config). Base model: pi05, pi05-tiny (CPU), rt-j or rt-j-tiny (CPU).",
    ),
    dataset: str | None = typer.Option(
        None,
        "--dataset",
        "--dataset-name",
        help="Required (here or in --config). LeRobot dataset on the Hub (lerobot/pusht_image) "
        "or a local directory; for rt-j models a database directory or URL (postgresql://host/db).",
    ),
    dataset_revision: str | None = typer.Option(
        None,
        help="A Hub dataset's branch, tag or commit to read (default: v2.1, else a v3.0 default branch).",
    ),
    mix: list[str] | None = typer.Option(None, "--mix", help=MIX_OPTION_HELP),
    batch_size: int | None = typer.Option(
        None,
        help=f"Samples per step, 1 to {BATCH_SIZE_MAX} (default {SFTConfig.default_text('batch_size')}).",
    ),
    learning_rate: float | None = typer.Option(
        None, help=f"Peak learning rate (default {SFTConfig.default_text('learning_rate')})."
    ),
    steps: int | None = typer.Option(
        None, help=f"Optimizer steps, 1 to {STEPS_MAX:,} (default {SFTConfig.default('steps')})."
    ),
    finetune: str | None = typer.Option(
        None, help=f"lora or full (default {SFTConfig.default_text('finetune')})."
    ),
    lora_rank: int | None = typer.Option(
        None, help=f"LoRA rank, 1 to {LORA_RANK_MAX} (default {SFTConfig.default('lora_rank')})."
    ),
    lora_alpha: float | None = typer.Option(None, help="LoRA alpha (default: the rank)."),
    target: list[str] | None = typer.Option(
        None,
        "--target",
        "--targets",
        help="Where training goes (see `relay models info`): repeatable, or comma-separated.",
    ),
    camera: list[str] | None = typer.Option(
        None, "--camera", help="MODEL_CAMERA=DATASET_FEATURE, repeatable."
    ),
    task: str | None = typer.Option(
        None, help="rt-j models (required for them): the task table of the database to train on."
    ),
    tasks_dir: Path | None = typer.Option(
        None,
        "--tasks-dir",
        help="rt-j models: a directory on the workers' disk holding the database's tasks "
        "(a schema.json with their definitions, and <task>/train.parquet ...).",
    ),
    from_checkpoint: str | None = typer.Option(
        None,
        "--from-checkpoint",
        help="Start from these weights instead of the model's base: a Hub model repo with an optional "
        "@revision (lerobot/pi05_libero, team/my-pi05@v2), a local directory (lerobot's PI05Policy "
        "format or a Relay output), or a completed fine-tune's id (ft-...). --model names their "
        "architecture.",
    ),
    normalization: str | None = typer.Option(
        None,
        help="Normalize with the new dataset's statistics (dataset, the default) or the ones the "
        "--from-checkpoint weights were trained with (checkpoint).",
    ),
    name: str | None = typer.Option(None, help="A name for the job."),
    validation_episodes: str | None = typer.Option(
        None,
        help="Hold these episodes out of training and score them at each checkpoint and at the end: "
        "episodes like 40-49 or 3,7,9, or a fraction of the episodes like 0.1 (default: none).",
    ),
    integration: list[str] | None = typer.Option(None, "--integration", help=INTEGRATION_OPTION_HELP),
    wandb_project: str | None = typer.Option(None, "--wandb-project", help=WANDB_PROJECT_OPTION_HELP),
    mlflow_uri: str | None = typer.Option(None, "--mlflow-uri", help=MLFLOW_URI_OPTION_HELP),
    mlflow_experiment: str | None = typer.Option(
        None, "--mlflow-experiment", help=MLFLOW_EXPERIMENT_OPTION_HELP
    ),
    config_file: Path | None = typer.Option(
        None, "--config", help="A JSON file with the config's fields; options given here override it."
    ),
    idempotency_key: str | None = typer.Option(None, help="Send the same key again to get the same job."),
    wait: bool = typer.Option(
        False, "--wait", help="Wait for the job, showing progress (a bar, or a line every few seconds)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the job as JSON."),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="Print only the job's id (for scripts: JOB=$(... --quiet))."
    ),
) -> None:
    """Start a fine-tune; prints the job at once (or, with --wait, when it ends)."""
    with clear_errors():
        fields = _config_file_fields(config_file)
        given = {
            "model": model,
            "dataset_name": dataset_name(dataset) if dataset else None,
            "dataset_revision": dataset_revision,
            "datasets": mixture_of_options(mix),
            "batch_size": batch_size,
            "learning_rate": learning_rate,
            "steps": steps,
            "finetune": finetune,
            "lora_rank": lora_rank,
            "lora_alpha": lora_alpha,
            "targets": split_targets(target),
            "cameras": parse_pairs(camera, "camera") if camera else None,
            "task": task,
            "tasks_dir": str(tasks_dir.expanduser().resolve()) if tasks_dir is not None else None,
            "name": name,
            "validation_episodes": validation_episodes,
            "from_checkpoint": checkpoint_name(from_checkpoint) if from_checkpoint else None,
            "normalization": normalization,
            "integrations": _integrations(integration, wandb_project, mlflow_uri, mlflow_experiment),
        }
        fields.update({k: v for k, v in given.items() if v is not None})  # the options override the file
        job = train(SFTConfig.parse(fields), idempotency_key=idempotency_key)
        if wait:
            with _exit_on_interrupt(job.id, said=True):  # job.wait() says what Ctrl-C leaves
                job.wait(poll=5, progress=not (as_json or quiet))
        if quiet:
            print(job.id)
        else:
            _show_job(job, as_json)


def _integrations(
    given: list[str] | None,
    wandb_project: str | None,
    mlflow_uri: str | None = None,
    mlflow_experiment: str | None = None,
) -> list[Any] | None:
    try:
        return integrations_of_options(given, wandb_project, mlflow_uri, mlflow_experiment)
    except ValueError as error:
        raise ConfigError(str(error), "integrations") from None


def _config_file_fields(config_file: Path | None) -> dict[str, Any]:
    """The config's fields from the --config file (none without one)."""
    fields: dict[str, Any] = {}
    if config_file is not None:
        try:
            fields.update(json.loads(config_file.read_text()))
        except (OSError, ValueError) as error:
            raise ConfigError(f"cannot read --config {config_file}: {error}") from None
    return fields


@app.command("list")
def list_(
    limit: int = typer.Option(20, min=1, help="How many, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines."),
) -> None:
    """Your fine-tunes, newest first (--json: one JSON object a line, for scripts)."""
    with clear_errors():
        jobs = sft.list_jobs(limit=limit)
    if as_json:
        for job in jobs:
            print(json.dumps(job.to_dict()))
        return
    table = Table()
    for column in ("id", "status", "step", LOSS_LABEL, "model"):
        table.add_column(column, no_wrap=True, min_width=15 if column == "id" else None)
    table.add_column("dataset", overflow="fold")
    table.add_column("name", overflow="fold")
    table.add_column("created", no_wrap=True)
    for job in jobs:
        table.add_row(
            job.id,
            status_text(job.status),
            f"{job.step}/{job.steps}",
            number_text(job.loss),
            job.model,
            job.dataset_name,
            job.name or "",
            (job.to_dict().get("created_at") or "")[:19],
        )
    show_table(table, out, json_hint=True)


@app.command()
def retrieve(
    job_id: str,
    as_json: bool = typer.Option(
        False, "--json", help='Print the job as JSON, its results card under "summary".'
    ),
) -> None:
    """One fine-tune, as the API reports it now, and its results card: pace, elapsed and ETA (or
    duration), first/last/best training loss, checkpoints with the figures at their steps, and how
    to use the model."""
    with clear_errors():
        job = sft.retrieve(job_id)
        card = job.summary()
    if as_json:
        print(json.dumps({**job.to_dict(), "summary": card.model_dump(mode="json")}))
        return
    _show_job(job, as_json, card_follows=True)
    _show_card(card)


@app.command()
def cancel(job_id: str, as_json: bool = typer.Option(False, "--json", help="Print the job as JSON.")) -> None:
    """Cancel a fine-tune: a queued one at once, a running one within a step."""
    with clear_errors():
        _show_job(sft.retrieve(job_id).cancel(), as_json)


@app.command()
def events(
    job_id: str,
    after: int | None = typer.Option(None, help="Only events after this event id."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream events until the job ends."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines (with event ids)."),
) -> None:
    """A fine-tune's events: metrics every 10 steps (loss, grad_norm and lr are means over those
    steps), checkpoints, the end. Each line starts with the event's id, for --after. With --follow
    on a terminal, a live progress bar and loss sparkline under them."""
    with clear_errors():
        job = sft.retrieve(job_id)
        with _exit_on_interrupt(job.id):
            if follow and not as_json and out.is_terminal:  # piped: the plain lines below
                watch_events(job, job.follow(after), lambda event: _print_event(event, False, job.steps), out)
                return
            stream = job.follow(after) if follow else iter(job.events(after))
            for event in stream:
                _print_event(event, as_json, job.steps)


@app.command("eval")
def eval_(
    job_id: str,
    as_json: bool = typer.Option(False, "--json", help="Print the evaluations as JSON, one object each."),
) -> None:
    """A fine-tune's closed-loop evaluations (its recipe's `eval` block): at each checkpoint if
    asked, and at the end, the success rate in the environment, mean reward and length, and the
    job's files of each (its report and the videos of its first episodes)."""
    with clear_errors():
        job = sft.retrieve(job_id)
        evaluations = job.evaluations()
    if as_json:
        print(json.dumps([{**event, "report": eval_report_path(event.step)} for event in evaluations]))
        return
    if not evaluations:
        why = "it has no eval block" if job.eval is None else f"none yet (the job is {job.status})"
        out.print(f"No closed-loop evaluations of {job.id}: {why}.", highlight=False)
        return
    table = Table()
    columns = ["step", "env", "success", "episodes", "mean reward", "mean length", "seconds", "files"]
    for column in columns:
        table.add_column(column)
    for event in evaluations:
        files = "\n".join([eval_report_path(event.step), *(event.videos or [])])
        table.add_row(
            str(event.step),
            event.env,
            f"{event.success_rate:.0%}",
            str(event.episodes),
            number_text(event.mean_reward),
            number_text(event.mean_length),
            number_text(event.seconds, 3),
            files,
        )
    show_table(table, json_hint=True)
    out.print(
        f"Download a file: relay fine-tunes download {job.id} (the output), or GET "
        f"/v1/fine-tunes/{job.id}/files/PATH",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def download(
    job_id: str,
    directory: Path | None = typer.Option(None, "--dir", help="Where to put the files (default: ./JOB_ID)."),
    checkpoints: bool = typer.Option(False, "--checkpoints", help="Also download the checkpoints."),
) -> None:
    """Download a completed fine-tune's output: weights, configs, processors and norm stats."""
    with clear_errors():
        job = sft.retrieve(job_id)
        target = job.download(directory or Path(job_id), checkpoints=checkpoints)
    for path in sorted(p for p in target.rglob("*") if p.is_file()):
        size = path.stat().st_size
        out.print(f"{path}  {size_text(size)} ({size:,} bytes)", highlight=False, soft_wrap=True)


@app.command()
def push(
    job_id: str,
    repo: str = typer.Argument(..., help="The Hub model repo, owner/name (created if absent)."),
    private: bool = typer.Option(
        True,
        "--private/--public",
        help="The visibility of a repo created now (an existing one keeps its own).",
    ),
    revision: str | None = typer.Option(None, "--revision", help="The branch to commit to (default main)."),
    as_json: bool = typer.Option(False, "--json", help="Print where it went as JSON."),
) -> None:
    """Push a completed fine-tune's output to a Hub model repo, with a model card: downloaded
    through the API, pushed from this machine with your Hub token (HF_TOKEN, or `hf auth login`'s)."""
    from relay.hub_push import push_job
    from relay.hub_target import check_branch, check_repo_id

    with clear_errors():
        # A malformed name is refused here, before the API or the Hub is asked anything.
        check_repo_id(repo, "repo")
        check_branch(revision, "--revision")
        job = sft.retrieve(job_id)
        pushed = push_job(job, repo, private=private, revision=revision, param="repo")
    if as_json:
        print(json.dumps(pushed.to_dict()))
        return
    # create_repo leaves an existing repo's visibility as it was: say what was asked.
    visibility = "private if new" if pushed.private else "public if new"
    removed = (
        f"\nremoved what the last push wrote there: {', '.join(pushed.removed)}" if pushed.removed else ""
    )
    out.print(
        f"pushed {job_id} to {pushed.repo_id} ({visibility}) at {pushed.revision}, commit "
        f"{pushed.commit[:8]}: {pushed.url}{removed}\n"
        f"start a job from it: from_checkpoint {pushed.checkpoint}",
        highlight=False,
        soft_wrap=True,
    )


def _show_job(job: FineTuneJob, as_json: bool, card_follows: bool = False) -> None:
    record = job.to_dict()
    if not as_json:  # say which loss this is (JSON keeps the API's field names)
        record = {LOSS_LABEL if key == "loss" else key: value for key, value in record.items()}
        if record.get("finetune") != "lora":  # a full (or RT-J) job trains no adapters
            record = {key: value for key, value in record.items() if key not in LORA_FIELDS}
        if record.get("dataset"):  # what the engine read, in one line
            record["dataset"] = dataset_line(record["dataset"])
        if record.get("weights"):  # where the starting weights came from, in one line
            record["weights"] = weights_line(record["weights"])
        if card_follows:  # the held-out scores are the card's (the same block): not twice
            record.pop("validation", None)
        elif record.get("validation"):  # the best scores and the last, a line each
            record["validation"] = validation_text(ValidationSummary.model_validate(record["validation"]))
    show_record(record, as_json)


def _show_card(card: FineTuneSummary) -> None:
    """The results card under the job's fields: the same figures as the console's job page."""
    out.print()
    out.print("[bold]Results[/bold]")
    table = Table(show_header=False, box=None)
    for key, value in _results_rows(card):
        table.add_row(f"[bold]{key}[/bold]", escape(value))
    show_table(table)
    if card.checkpoints:
        out.print()
        out.print("[bold]Checkpoints[/bold] (a job keeps its newest two)")
        show_table(_checkpoints_table(card))
    _show_use(card.use)


def _results_rows(card: FineTuneSummary) -> list[tuple[str, str]]:
    rows = [("progress", f"{card.step}/{card.steps} steps ({card.progress:.0%})")]
    if card.duration_seconds is not None:
        rows.append(("duration", _seconds_text(card.duration_seconds, card.queued_seconds)))
    elif card.elapsed_seconds is not None:
        rows.append(("elapsed", _seconds_text(card.elapsed_seconds, card.queued_seconds)))
    elif card.queued_seconds is not None:
        rows.append(("queued", duration_text(card.queued_seconds)))
    if card.eta_seconds is not None:
        pace = f"{number_text(card.latest_steps_per_second, 3)} steps/s (the last minute)"
        rows.append(("ETA", f"{duration_text(card.eta_seconds)} left at {pace}"))
    if card.steps_per_second is not None:
        pace = f"{number_text(card.steps_per_second, 3)} steps/s"
        rows.append(("pace", f"{pace}, {number_text(card.samples_per_second, 3)} samples/s (the whole run)"))
    loss = card.loss
    if loss.first and loss.last and loss.best:
        shown = [f"{name} {number_text(at.loss)} (step {at.step})" for name, at in loss]
        rows.append(("training loss", ", ".join(shown)))
    if card.metrics_note:
        rows.append(("metrics", card.metrics_note))
    if card.validation is not None:
        rows.append(("validation", validation_text(card.validation)))
    if card.eval is not None:
        rows.append(("closed loop", _eval_text(card.eval)))
    if card.weights is not None:
        rows.append(("started from", weights_line(card.weights.model_dump())))
    if card.pushed is not None:  # a recipe's hub block: the event's own line
        rows.append(("Hub", PushedEvent(**card.pushed.model_dump()).describe()))
    return rows


def _show_use(use: ModelUse) -> None:
    """The "use this model" block: each command or snippet as it is to be copied."""
    out.print()
    out.print("[bold]Use this model[/bold]" + (f" ({escape(use.note)})" if use.note else ""))
    blocks = [("download", use.download), ("python", use.python)]
    blocks += [("lerobot", use.lerobot or f"# {use.lerobot_note}"), ("deploy", use.deploy)]
    for name, text in blocks:
        out.print(f"  [bold]{name}[/bold]")
        for line in text.splitlines():
            out.print(f"    {escape(line)}", highlight=False, soft_wrap=True)


def _checkpoints_table(card: FineTuneSummary) -> Table:
    with_validation = any(c.validation for c in card.checkpoints)
    with_eval = any(c.eval for c in card.checkpoints)
    table = Table()
    columns = ["step", LOSS_LABEL, "grad_norm", "lr", "written in"]
    columns += ["validation action error"] * with_validation + ["success rate"] * with_eval + ["files"]
    for column in columns:
        table.add_column(column)
    for checkpoint in card.checkpoints:
        row = [
            str(checkpoint.step),
            number_text(checkpoint.loss),
            number_text(checkpoint.grad_norm),
            number_text(checkpoint.lr),
            "-" if checkpoint.seconds is None else f"{number_text(checkpoint.seconds, 3)} s",
        ]
        if with_validation:
            validation = checkpoint.validation
            row.append(number_text(headline_action_error(validation.model_dump()) if validation else None))
        if with_eval:
            rate = checkpoint.eval.success_rate if checkpoint.eval else None
            row.append("-" if rate is None else f"{rate:.0%}")
        row.append(f"{checkpoint.path}/" if checkpoint.kept else "pruned")
        table.add_row(*row)
    return table


def _seconds_text(seconds: float, queued: float | None) -> str:
    return duration_text(seconds) + ("" if queued is None else f" (queued {duration_text(queued)} before)")


def _eval_text(evaluation: EvalSummary) -> str:
    """`success 55% at step 2000 (best 60% at step 1000)`."""

    def rate(figures: EvalFigures) -> str:
        shown = "-" if figures.success_rate is None else f"{figures.success_rate:.0%}"
        return f"{shown} at step {figures.step}"

    text = f"success {rate(evaluation.last)}" if evaluation.last else "success -"
    if evaluation.best and evaluation.last and evaluation.best.step != evaluation.last.step:
        text += f" (best {rate(evaluation.best)})"
    return text


def _print_event(event: Event, as_json: bool, steps: int) -> None:
    if as_json:
        print(json.dumps({"id": event.id, "created_at": event.created_at, **event}), flush=True)
        return
    match parse_known(event):
        case MetricsEvent() as metrics:
            line = (
                f"id {event.id:>6}  step {metrics.step:>6}  loss {number_text(metrics.loss)}"
                f"  grad_norm {number_text(metrics.grad_norm)}  lr {number_text(metrics.lr)}"
                f"  skipped {_share(metrics.skipped)}  {_pace(metrics)}"
            )
        case ValidationEvent() as scored:
            line = (
                f"id {event.id:>6}  step {scored.step:>6}  validation  {validation_line(scored)}"
                f"  ({_value(scored.seconds)} s)"
            )
        case _:  # any other kind, one unknown here (a newer worker's) too: its keys as they stand
            details = "  ".join(f"{k} {_value(v)}" for k, v in event.items() if k not in ("step", "event"))
            line = f"id {event.id:>6}  step {event['step']:>6}  {event.kind}" + (
                f"  {details}" if details else ""
            )
    out.print(line, highlight=False, soft_wrap=True)
    sys.stdout.flush()


# The job's loss is a mean over the latest metrics window, like the events' loss: say so wherever it shows.
LOSS_LABEL = "loss (10-step mean)"
# The adapters' settings, shown only for a LoRA job.
LORA_FIELDS = ("lora_rank", "lora_alpha")


def _pace(event: MetricsEvent) -> str:
    """A metrics event's rate: the engine's, over its 10 steps' compute. (The time left is the
    progress bar's and the results card's, at the recent pace: relay.progress.recent_rate.)"""
    rate = event.steps_per_second
    if not isinstance(rate, int | float) or rate <= 0:
        return "- steps/s"
    return f"{number_text(rate, 3)} steps/s"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _value(value: Any) -> str:
    """An event's detail: a float to 4 significant digits (a checkpoint's seconds), the rest as is."""
    return number_text(value) if isinstance(value, float) else str(value)


def validation_text(block: ValidationSummary) -> str:
    """A job's validation block for people: the best scores and the last, a line each."""
    best, last = block.best, block.last
    lines = [f"best at step {best.step}: {validation_line(best.model_dump())}"]
    if last.step != best.step:
        lines.append(f"last at step {last.step}: {validation_line(last.model_dump())}")
    return "\n".join(lines)
