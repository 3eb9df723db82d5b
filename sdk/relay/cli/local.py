"""`relay local train|eval`: the recipe's loop on this machine, no service."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import typer

from relay import families
from relay.catalog import LORA_RANK_MAX, STRATEGIES
from relay.checkpoints import is_fine_tune_id, job_id_needs_the_service
from relay.cli._common import (
    MIX_OPTION_HELP,
    checkpoint_name,
    dataset_name,
    fail,
    mixture_of_options,
    parse_pairs,
    split_targets,
)
from relay.cli._common import console as make_console
from relay.cli._extras import require
from relay.cli._launch import Launch, rank, run_launched
from relay.episodes import parse_episodes as episodes_of_text
from relay.events import (
    CHUNKS_PER_FRAME,
    DatasetEvent,
    EvalEvent,
    Event,
    MetricsEvent,
    ResumedEvent,
    SnapshotEvent,
    StageEvent,
    TrackerEvent,
    ValidationEvent,
    WeightsEvent,
    parse_known,
    validation_line,
)
from relay.formatting import number_text
from relay.integrations import (
    INTEGRATION_OPTION_HELP,
    MLFLOW_EXPERIMENT_OPTION_HELP,
    MLFLOW_URI_OPTION_HELP,
    WANDB_PROJECT_OPTION_HELP,
    integrations_of_options,
)
from relay.progress import ProgressReport
from relay.sft.config import BATCH_SIZE_MAX, CHECKPOINT_EVERY_DEFAULT, STEPS_MAX, SFTConfig

app = typer.Typer(
    help="Train and evaluate on this machine, with the same engine the service runs.", no_args_is_help=True
)
console = make_console(stderr=True)


def parse_episodes(spec: str | None) -> list[int] | None:
    """'0-39,45' -> [0, ..., 39, 45] (relay.episodes' syntax, the same as validation_episodes')."""
    if spec is None:
        return None
    try:
        return episodes_of_text(spec)
    except ValueError as error:
        raise typer.BadParameter(f"{spec!r}: {error}") from None


class StopOnInterrupt:
    """The first Ctrl-C asks the loop to stop after the current step and save a checkpoint there;
    a second one aborts."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        console.print("stopping after this step and saving a checkpoint (Ctrl-C again to abort)")


@app.command()
def train(
    model: str = typer.Option(..., help="Base model: " + ", ".join(families.model_names()) + "."),
    dataset: str | None = typer.Option(
        None,
        help="Required unless --mix names a mixture. A Hub dataset repo id or a local dataset directory "
        "(rt-j: a database directory, or a database URL such as sqlite:///shop.db or postgresql://host/db).",
    ),
    mix: list[str] | None = typer.Option(None, "--mix", help=MIX_OPTION_HELP),
    task: str | None = typer.Option(None, help="rt-j models: the database's task to train on."),
    tasks_dir: str | None = typer.Option(
        None,
        "--tasks-dir",
        help="rt-j models: a directory holding the database's tasks (schema.json's tasks, "
        "<task>/train.parquet...), when they are not in the database.",
    ),
    dataset_revision: str | None = typer.Option(
        None,
        help="A Hub dataset's branch, tag or commit to read (default: v2.1, else a v3.0 default branch).",
    ),
    from_checkpoint: str | None = typer.Option(
        None,
        "--from-checkpoint",
        help="Start from these weights instead of the model's base: a Hub model repo with an optional "
        "@revision (lerobot/pi05_libero, team/my-pi05@v2) or a local directory (lerobot's PI05Policy "
        "format or a Relay output); a fine-tune's id needs the service: download its weights first "
        "(relay fine-tunes download). --model names their architecture.",
    ),
    normalization: str | None = typer.Option(
        None,
        help="Normalize with the new dataset's statistics (dataset, the default) or the ones the "
        "--from-checkpoint weights were trained with (checkpoint).",
    ),
    steps: int = typer.Option(SFTConfig.default("steps"), help=f"Optimizer steps, 1 to {STEPS_MAX:,}."),
    output_dir: Path = typer.Option(..., help="Where checkpoints and the merged model go."),
    # No default here for the settings whose default depends on the model (SFTConfig fills them in).
    batch_size: int | None = typer.Option(
        None,
        help=f"Samples per step, 1 to {BATCH_SIZE_MAX} (default {SFTConfig.default_text('batch_size')}).",
    ),
    learning_rate: float | None = typer.Option(
        None,
        help=f"The peak learning rate, after warmup (default {SFTConfig.default_text('learning_rate')}).",
    ),
    finetune: str | None = typer.Option(
        None,
        help=f"lora or full (default {SFTConfig.default('finetune')}; full for "
        + ", ".join(m for m in families.model_names() if families.model_defaults(m).get("finetune") == "full")
        + ").",
    ),
    lora_rank: int | None = typer.Option(
        None, help=f"LoRA rank, 1 to {LORA_RANK_MAX} (default {SFTConfig.default('lora_rank')})."
    ),
    lora_alpha: float | None = typer.Option(None, help="LoRA alpha (default: the rank)."),
    targets: list[str] | None = typer.Option(
        None,
        "--target",
        "--targets",
        help="Where training goes (see `relay models info`): repeatable, or comma-separated.",
    ),
    cameras: list[str] | None = typer.Option(
        None, "--camera", help="MODEL_CAMERA=DATASET_FEATURE, repeatable."
    ),
    episodes: str | None = typer.Option(None, help="Train on these episodes only, like 0-39."),
    validation_episodes: str | None = typer.Option(
        None,
        help="Hold these episodes out of training and score them at each checkpoint and at the end: "
        "episodes like 40-49 or 3,7,9, or a fraction of the episodes like 0.1 (default: none).",
    ),
    eval_block: str | None = typer.Option(
        None,
        "--eval",
        help="Run the trained policy in a simulator at the end (a recipe's eval block, as JSON: "
        '\'{"env": "relay/Dot-v0", "episodes": 10, "at_checkpoints": true}\'); reports and videos go '
        "to OUTPUT_DIR/eval/.",
    ),
    integration: list[str] | None = typer.Option(None, "--integration", help=INTEGRATION_OPTION_HELP),
    wandb_project: str | None = typer.Option(None, "--wandb-project", help=WANDB_PROJECT_OPTION_HELP),
    mlflow_uri: str | None = typer.Option(None, "--mlflow-uri", help=MLFLOW_URI_OPTION_HELP),
    mlflow_experiment: str | None = typer.Option(
        None, "--mlflow-experiment", help=MLFLOW_EXPERIMENT_OPTION_HELP
    ),
    seed: int = typer.Option(0, help="Seeds the data order, the initialisation and the noise."),
    checkpoint_every: int = typer.Option(CHECKPOINT_EVERY_DEFAULT, help="Steps between checkpoints."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    json_lines: bool = typer.Option(
        False, "--json", help="Print one JSON object per event instead of progress."
    ),
    nproc_per_node: int = typer.Option(
        1, "--nproc-per-node", help="Processes on this host, one per GPU (gloo on the CPU without CUDA)."
    ),
    nnodes: int = typer.Option(1, "--nnodes", help="Hosts in the job; run the command on each."),
    node_rank: int = typer.Option(0, "--node-rank", help="This host's place, 0 to --nnodes - 1."),
    rdzv_endpoint: str | None = typer.Option(
        None,
        "--rdzv-endpoint",
        help="HOST:PORT where the hosts meet (c10d rendezvous); needed with --nnodes.",
    ),
    strategy: str = typer.Option(
        "auto", help="How processes share the model: auto (fsdp for full, ddp for lora), ddp or fsdp."
    ),
) -> None:
    """Run the recipe's loop here, showing progress (a bar on a terminal, else a line every few
    seconds). Ctrl-C saves a checkpoint; the same command again resumes from it.

    With --nproc-per-node (and --nnodes) the loop runs as a group of processes started by
    torch.distributed.run; `--batch-size` stays the global batch, split across them.
    """
    launch = Launch(nproc_per_node, nnodes, node_rank, rdzv_endpoint)
    problem = launch.problem()
    if problem is not None:
        fail(problem)
    if strategy not in STRATEGIES:
        fail(f"bad --strategy: {strategy!r} (must be one of {', '.join(STRATEGIES)})")
    given: dict[str, Any] = {
        "batch_size": batch_size,
        "learning_rate": learning_rate,
        "finetune": finetune,
        "lora_rank": lora_rank,
        "lora_alpha": lora_alpha,
        "targets": split_targets(targets),
        "cameras": parse_pairs(cameras, "camera") if cameras else None,
        "task": task,
        "tasks_dir": _absolute(tasks_dir),
        "dataset_revision": dataset_revision,
        "validation_episodes": validation_episodes,
        "eval": _eval_json(eval_block),
        "from_checkpoint": checkpoint_name(from_checkpoint) if from_checkpoint else None,
        "normalization": normalization,
        "integrations": _integrations(integration, wandb_project, mlflow_uri, mlflow_experiment),
    }
    if from_checkpoint is not None and is_fine_tune_id(from_checkpoint):
        fail(job_id_needs_the_service(from_checkpoint))
    config = _recipe_config(model, dataset, mix, steps, given)
    if episodes is not None and config.datasets is not None:
        # Refused before anything loads (the engine refuses it too, after loading the model).
        fail(
            "bad --episodes: it selects episodes of one dataset; a mixture (--mix) trains on all of "
            "each one's"
        )
    _check_processes(config, nproc_per_node * nnodes)
    if launch.needed:
        raise typer.Exit(run_launched(launch, sys.argv[1:]))
    engine_settings = {
        "seed": seed,
        "checkpoint_every": checkpoint_every,
        "episodes": parse_episodes(episodes),
        "device": device,
        "strategy": strategy,
    }
    _train_here(config, engine_settings, output_dir, json_lines)


def _absolute(directory: str | None) -> str | None:
    """A directory as the job will find it, wherever it runs from."""
    return str(Path(directory).expanduser().absolute()) if directory is not None else None


def _integrations(
    given: list[str] | None,
    wandb_project: str | None,
    mlflow_uri: str | None = None,
    mlflow_experiment: str | None = None,
) -> list[Any] | None:
    try:
        return integrations_of_options(given, wandb_project, mlflow_uri, mlflow_experiment)
    except ValueError as error:
        fail(str(error))


def _eval_json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        fail(f'bad --eval: not JSON ({error.msg}); give an object such as \'{{"env": "relay/Dot-v0"}}\'')


def _recipe_config(
    model: str, dataset: str | None, mix: list[str] | None, steps: int, given: dict[str, Any]
) -> SFTConfig:
    """The recipe of the command's options; the options not given take the model's defaults."""
    if dataset is None and not mix:
        fail("missing --dataset (or --mix, repeated, for a mixture of datasets)")
    fields: dict[str, Any] = {"model": model, "steps": steps, "datasets": mixture_of_options(mix)}
    if dataset is not None:
        fields["dataset_name"] = dataset_name(dataset)
    fields.update({field: value for field, value in given.items() if value is not None})
    try:
        return SFTConfig.parse(fields)
    except ValueError as error:
        fail(str(error))


def _check_processes(config: SFTConfig, processes: int) -> None:
    spec = families.family_of(config.model)
    if spec is not None and spec.one_process and processes > 1:
        fail(f"bad --nproc-per-node/--nnodes: {config.model} trains in one process")
    if config.batch_size < processes:
        fail(
            f"bad --batch-size: {config.batch_size} (must be at least the {processes} processes: "
            "each trains on its part of every batch)"
        )


def _snapshot_note(event: SnapshotEvent) -> str:
    tables = ", ".join(f"{name} {count:,}" for name, count in event.row_counts.items())
    return f"reading a snapshot of {event.source} ({tables} rows) at {event.path}"


class _TrainingProgress:
    """What the run shows: a progress report on a terminal (rank 0), or JSON lines with --json."""

    def __init__(self, steps: int, output_dir: Path, json_lines: bool) -> None:
        self.output_dir = output_dir
        self.report = ProgressReport("training", steps, stream=sys.stderr) if not json_lines else None
        self.window_loss: float | None = None
        self.validation: dict[str, Any] | None = None  # the latest validation event

    def on_event(self, event: dict[str, Any]) -> None:
        typed = parse_known(event)  # None for a kind unknown here (a newer engine's): printed, not noted
        match typed:
            case MetricsEvent():
                self.window_loss = typed.loss
            case ValidationEvent():
                self.validation = dict(event)
        if self.report is None:
            print(json.dumps(event), flush=True)
        else:
            self._show(typed, self.report)

    def _show(self, typed: Event | None, report: ProgressReport) -> None:
        """An event on the progress report: a step's figures or a stage on its line, the rest as notes."""
        match typed:
            case MetricsEvent():
                detail = (
                    f"loss {number_text(typed.loss)} (10-step mean)  "
                    f"grad_norm {number_text(typed.grad_norm)}  lr {number_text(typed.lr)}"
                )
                report.update(typed.step, detail, description="training")
                if typed.skipped:
                    report.note(
                        f"step {typed.step}: {typed.skipped:.0%} of steps skipped (non-finite gradient)"
                    )
            case StageEvent():  # a wait between steps: say what it is
                report.update(typed.step, "", description=typed.describe())
            # What the run read before its first step:
            case DatasetEvent():
                report.note(f"reading {typed.describe()}")
            case WeightsEvent():
                report.note(f"starting from {typed.describe()}")
            case SnapshotEvent():
                report.note(_snapshot_note(typed))
            case ValidationEvent():
                report.note(f"step {typed.step}: validation: {typed.describe()}")
            case EvalEvent():
                report.note(f"step {typed.step}: closed loop: {typed.describe()}")
            case TrackerEvent():
                report.note(f"step {typed.step}: {typed.describe()}")
            case ResumedEvent():
                where = self.output_dir / "checkpoints"
                report.note(f"resuming from step {typed.step} (the last checkpoint in {where})")
                report.update(typed.step)

    def close(self) -> None:
        if self.report is not None:
            self.report.close()


def _train_here(
    config: SFTConfig, engine_settings: dict[str, Any], output_dir: Path, json_lines: bool
) -> None:
    """Run the recipe in this process (one of a group under torch.distributed.run) and say how it ended."""
    recipe_module = require("relay_engine.recipe")
    errors = require("relay_engine.errors")
    recipe = recipe_module.Recipe.from_config(config, **engine_settings)
    # In a group, rank 0 alone speaks (the engine reports events on rank 0 only).
    speaks = rank() == 0
    stop = StopOnInterrupt()
    previous_handler = signal.signal(signal.SIGINT, stop)
    progress = _TrainingProgress(config.steps, output_dir, json_lines or not speaks)
    try:
        result = recipe_module.run_recipe(
            recipe,
            output_dir,
            output_dir=output_dir,
            on_event=progress.on_event,
            should_stop=lambda: stop.requested,
            checkpoint_on_stop=True,
        )
    except errors.EngineError as error:
        fail(str(error))
    finally:
        signal.signal(signal.SIGINT, previous_handler)
        progress.close()
    if not speaks:
        raise typer.Exit(130 if result.status == "stopped" else 0)
    _say_how_it_ended(result, progress, json_lines)


def _say_how_it_ended(result: Any, progress: _TrainingProgress, json_lines: bool) -> None:
    if result.status == "stopped":
        console.print(
            f"stopped at step {result.step} with a checkpoint there; "
            "run the same command again to resume from it"
        )
        raise typer.Exit(130)
    window_loss, validation = progress.window_loss, progress.validation
    summary = {
        "status": result.status,
        "step": result.step,
        "loss": window_loss,
        "output_dir": str(result.output_dir),
    }
    if validation is not None:
        summary["validation"] = validation
    if json_lines:
        print(json.dumps(summary), flush=True)
        return
    console.print(
        f"completed {result.step} steps, loss {number_text(window_loss)} (mean of the last 10 steps); "
        f"model in {result.output_dir}"
    )
    if validation is not None:
        console.print(f"validation at step {validation['step']}: {validation_line(validation)}")


@app.command("eval")
def evaluate(
    model: str = typer.Option(..., help="A base model name (pi05-tiny) or an output directory."),
    dataset: str = typer.Option(
        ...,
        help="A Hub dataset repo id or a local dataset directory (rt-j: a database directory or URL).",
    ),
    episodes: str | None = typer.Option(None, help="Evaluate on these episodes only, like 40-49."),
    blind_from: str | None = typer.Option(
        None,
        help="Also score the blind baseline: always the mean chunk of these (training) episodes, "
        "like 0-39. A policy that looks must beat it.",
    ),
    batch_size: int = typer.Option(
        32, help="Chunks sampled per batch (frames x --chunks, at least one frame): what bounds memory."
    ),
    num_steps: int = typer.Option(10, help="Euler steps of the sampler."),
    chunks: int = typer.Option(
        CHUNKS_PER_FRAME,
        min=1,
        help="pi05: chunks sampled per frame, each from its own noise; the error of their mean is the "
        "headline, their spread is shown beside it (validation samples as many).",
    ),
    seed: int = typer.Option(0, help="Seeds the sampler's noise."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    task: str | None = typer.Option(None, help="rt-j: the database's task [default: the model's]."),
    split: str = typer.Option("val", help="rt-j: the task's split, train, val or test."),
    tasks_dir: str | None = typer.Option(
        None, "--tasks-dir", help="rt-j: a directory holding the database's tasks, when apart from it."
    ),
) -> None:
    """pi05: the mean squared error, in normalized units, of the mean of --chunks sampled action
    chunks per frame against the dataset's, their spread, and one chunk's error. rt-j: AUROC
    (binary tasks) or MAE and nMAE (regression) on a task's split."""
    registry = require("relay_engine.families")
    errors = require("relay_engine.errors")
    # The family of the model's name or directory; a task names a relational model's (rt-j).
    family = registry.family_owning(model, takes_task=task is not None)
    request = registry.EvaluationRequest(
        model=model,
        dataset=dataset_name(dataset),
        device=device,
        seed=seed,
        episodes=parse_episodes(episodes),
        blind_from=parse_episodes(blind_from),
        blind_from_text=blind_from,
        batch_size=batch_size,
        num_steps=num_steps,
        chunks=chunks,
        task=task,
        split=split,
        tasks_dir=_absolute(tasks_dir),
    )
    progress = _EvaluationProgress(shown=not json_output)
    try:
        report = family.evaluate(request, on_progress=progress.update)
    except (errors.EngineError, ValueError) as error:
        fail(str(error))
    finally:
        progress.close()
    if json_output:
        print(json.dumps(report))
        return
    for line in family.evaluation_lines(report, request):
        print(line)


class _EvaluationProgress:
    """Sampling takes minutes on a CPU: progress on stderr, as `relay local train` shows it."""

    def __init__(self, shown: bool) -> None:
        self.shown = shown
        self.report: ProgressReport | None = None

    def update(self, done: int, total: int) -> None:
        if not self.shown:
            return
        if self.report is None:
            self.report = ProgressReport("evaluating", total, stream=sys.stderr, unit="frame")
        if done > 0:
            self.report.update(done)

    def close(self) -> None:
        if self.report is not None:
            self.report.close()
