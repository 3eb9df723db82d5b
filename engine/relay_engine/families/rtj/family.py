"""RT-J as a family: the engine's loop on contexts sampled from a relational database
(relay_engine.families.base.Family).

A recipe of rt-j or rt-j-tiny runs through the same driver as a pi05 job (relay_engine.recipe),
with the same events, checkpoints (every weight, the optimizer, the RNGs and the data position: a
resumed run takes the steps an uninterrupted one would), stop requests and output directory, in
one process. The output is an RT-J checkpoint (config.json + model.safetensors) whose config also
records how its contexts were made (`relay` in config.json), so `relay local eval` and the
constructor reproduce them.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from relay import families as sdk_families
from relay.dataset_names import is_database_url, is_relational_source, redacted_url
from relay.optimizer import AdamParams
from relay_engine.core.checkpoint import CheckpointStore
from relay_engine.core.data import BatchOrder, DataPosition
from relay_engine.errors import ConfigError
from relay_engine.families.base import EvaluationRequest, Family, ModelDescription, PreparedRecipe, RecipeRun
from relay_engine.families.rtj.database import open_database, read_snapshot_record
from relay_engine.families.rtj.encoding import default_text_embedder
from relay_engine.families.rtj.learner import LabelledBatch, RelationalLearner
from relay_engine.families.rtj.sampling import ContextSampler
from relay_engine.families.rtj.trainer import RelationalExample
from relay_engine.families.rtj.transformer import RelationalTransformer
from relay_engine.paths import cache_dir_or_default

if TYPE_CHECKING:
    from relay_engine.families.rtj.session import RelationalSession
    from relay_engine.serving.served import ServedModel

# Contexts of jobs: RT samples 1,024 cells; a quarter of that keeps a CPU step short and holds the
# seed, its customer and its recent history on the databases we train on here.
CONTEXT_LENGTH = 256
TINY_MODELS = ("rt-j-tiny",)
MAX_CHILDREN = 32
# In a job's work directory: the snapshot of a database URL the job trains on (its path), which a
# resumed run reads again.
SNAPSHOT_POINTER = "database-snapshot.txt"
# AdamW as the RelationalTrainer runs it (torch's betas, weight decay 0.01), clipped at 1.
RELATIONAL_ADAM = AdamParams(
    learning_rate=0.0, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, grad_clip_norm=1.0
)


def context_settings(config: dict[str, Any]) -> dict[str, Any]:
    """How a saved model's contexts were made; the job defaults for a base model."""
    saved = config.get("relay", {})
    return {
        "context_length": int(saved.get("context_length", CONTEXT_LENGTH)),
        "max_children": int(saved.get("max_children", MAX_CHILDREN)),
        "text_encoder": str(saved.get("text_encoder", "auto")),
    }


def build_sampler(
    dataset: str,
    task: str,
    settings: dict[str, Any],
    d_text: int,
    seed: int,
    *,
    tasks_dir: str | None = None,
    cache_dir: Path | None = None,
) -> ContextSampler:
    """The sampler of a database's task (a directory, or a snapshot of the SQL database a URL
    names, taken now under `cache_dir`), with a model's context settings."""
    from relay_engine.families.rtj.sampling import ContextSampler

    source: str | Path = dataset if is_relational_source(dataset) else Path(dataset).expanduser()
    # (the tables memory-mapped from Arrow copies in the cache, as the sampler's arrays are)
    database = open_database(source, tasks_dir, cache_dir=cache_dir_or_default(cache_dir))
    prefer = "hash" if settings["text_encoder"].startswith("hash") else "auto"
    embedder = default_text_embedder(d_text, prefer=prefer)
    return ContextSampler(
        database,
        task,
        embedder,
        context_length=settings["context_length"],
        max_children=settings["max_children"],
        seed=seed,
        cache_dir=cache_dir_or_default(cache_dir),
    )


class RelationalFamily(Family):
    spec = sdk_families.family_spec(sdk_families.RTJ)

    @contextlib.contextmanager
    def recipe_context(self, run: RecipeRun) -> Iterator[None]:
        threads = torch.get_num_threads()
        # rt-j-tiny's matrices are too small for threads to pay: on a busy 2-core machine, 10 steps
        # took 92 s with torch's 2 threads waiting on each other, and 3.3 s with one.
        if run.recipe.config.model in TINY_MODELS and run.device.type == "cpu":
            torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def prepare_recipe(self, run: RecipeRun) -> PreparedRecipe:
        recipe, config = run.recipe, run.recipe.config
        if not config.task:
            raise ConfigError(f"{config.model} trains on a task: name the task table of the database")
        model = RelationalTransformer(config.model, device=run.device, seed=recipe.seed)
        settings = context_settings(model.config)
        dataset, tasks_dir = _job_database(run)
        sampler = build_sampler(
            dataset,
            config.task,
            settings,
            model.model.config.d_text,
            recipe.seed,
            tasks_dir=tasks_dir,
            cache_dir=run.dataset_cache_dir,
        )
        snapshot = sampler.database.snapshot if is_database_url(config.dataset_name) else None
        if snapshot is not None:
            run.work_dir.mkdir(parents=True, exist_ok=True)
            (run.work_dir / SNAPSHOT_POINTER).write_text(str(sampler.database.root) + "\n")
        examples = sampler.examples("train")
        problem_type = sampler.spec.problem_type
        learner = RelationalLearner(model.model, problem_type, seed=recipe.seed, device=run.device)
        torch.manual_seed(recipe.seed)

        def write(output_dir: Path) -> None:
            _write_output(model, sampler, config.model, config.task or "", settings, output_dir)

        return PreparedRecipe(
            learner=learner,
            samples=len(examples),
            batch_size=min(config.batch_size, len(examples)),
            batches=_batches_of(examples),
            adam=RELATIONAL_ADAM,
            write_output=write,
            # A database read by URL: the snapshot, reported (the service's jobs report theirs as
            # they take it, and train on it as a directory).
            data_read=snapshot.event if snapshot is not None else None,
        )

    def open_session(self, config: Mapping[str, Any], device: torch.device | str) -> RelationalSession:
        from relay_engine.families.rtj.session import RelationalSession, RelationalSessionSpec

        spec = RelationalSessionSpec(
            base_model=config["base_model"], problem_type=config.get("problem_type") or "binary"
        )
        return RelationalSession(spec, device=device)

    def owns_model(self, name_or_dir: str) -> bool:
        return name_or_dir in self.spec.models or is_relational_checkpoint(name_or_dir)

    def evaluate(
        self, request: EvaluationRequest, on_progress: Callable[[int, int], None] | None = None
    ) -> dict[str, Any]:
        """The task's metrics on one split (AUROC for binary, MAE and nMAE for regression)."""
        from relay_engine.families.rtj.evaluate import evaluate_split

        return evaluate_split(
            request.model,
            request.dataset,
            request.task,
            request.split,
            device=request.device,
            seed=request.seed,
            tasks_dir=request.tasks_dir,
        )

    def describe(self, name: str) -> ModelDescription:
        """RT-J is tuned in full: every weight trains, so the report is the counts per part."""
        from relay_engine.families.rtj.describe import describe_named

        report = describe_named(name)
        sizes = report["sizes"]
        headline = (
            f"[bold]{name}[/bold]: {sizes['num_blocks']} blocks, width {sizes['d_model']}, "
            f"{sizes['num_heads']} heads, FFN {sizes['d_ff']}, text width {sizes['d_text']}; "
            "full fine-tuning (every weight trains)"
        )
        boolean = ", ".join(f"{key} {count:,}" for key, count in report["boolean_channel"].items())
        notes = [
            f"Stanford layout (stanford-star/rt-j): [bold]{report['stanford_params']:,}[/bold] weights",
            f"RelativeDB layout (RelativeDB/rt-j-fp16): {report['relativedb_params']:,} weights: "
            f"{report['boolean_channel_params']:,} more for its boolean value channel ({boolean})",
        ]
        return ModelDescription(report, headline, report["parts"], notes)

    def evaluation_lines(self, report: dict[str, Any], request: EvaluationRequest) -> list[str]:
        where = f"{report['task']} {report['split']} ({report['examples']} rows)"
        if report["problem_type"] == "binary":
            lines = [
                f"AUROC {report['auroc']:.4f}, accuracy {report['accuracy']:.4f} on {where}; "
                f"label-frequency baseline AUROC {report['label_frequency_auroc']:.4f}"
            ]
            worse = "ranks the rows worse than each entity's past label frequency does"
        else:
            lines = [
                f"MAE {report['mae']:.4f}, nMAE {report['nmae']:.4f}, RMSE {report['rmse']:.4f} on {where}; "
                f"median baseline MAE {report['median_baseline_mae']:.4f}"
            ]
            worse = "errs more than predicting the train split's median label for every row"
        if report.get("below_baseline"):
            lines.append(f"Below the baseline: the model {worse}.")
        return lines

    def load_model(self, name_or_dir: str, device: torch.device | str = "cpu") -> RelationalTransformer:
        return RelationalTransformer(name_or_dir, device=device)

    def synthesize(self, directory: Path, **options: Any) -> Any:
        from relay_engine.families.rtj.synth import write_fake_shop

        return write_fake_shop(directory, **options)

    def served_model(
        self,
        model: str | os.PathLike[str],
        *,
        device: str,
        num_steps: int,
        database: str | os.PathLike[str] | None,
        task: str | None,
    ) -> ServedModel:
        from relay_engine.serving.relational import ServedRelationalModel

        return ServedRelationalModel.load(model, device=device, database=database, task=task)


def _job_database(run: RecipeRun) -> tuple[str, str | None]:
    """The dataset and tasks_dir a job opens. A job on a database URL that resumes from a checkpoint
    reads the snapshot its first run took (if it is still there), not the database as it is now, so
    a resumed job takes the steps an uninterrupted one would."""
    config = run.recipe.config
    if not is_database_url(config.dataset_name):
        return config.dataset_name, config.tasks_dir
    pointer = run.work_dir / SNAPSHOT_POINTER
    resuming = CheckpointStore(run.work_dir / "checkpoints", attempt=run.recipe.attempt).latest() is not None
    if resuming and pointer.is_file():
        taken = Path(pointer.read_text().strip())
        snapshot = read_snapshot_record(taken)
        if snapshot is not None and snapshot.source == redacted_url(config.dataset_name):
            return str(taken), None  # the snapshot holds its tasks, tasks_dir's included
    return config.dataset_name, config.tasks_dir


def _batches_of(
    examples: Sequence[RelationalExample],
) -> Callable[[BatchOrder, DataPosition], Iterator[Any]]:
    def batches(order: BatchOrder, position: DataPosition) -> Iterator[LabelledBatch]:
        while True:
            indices, position = order.next_batch(position)
            yield LabelledBatch.of([examples[i] for i in indices])

    return batches


def _write_output(
    model: RelationalTransformer,
    sampler: ContextSampler,
    base_model: str,
    task: str,
    settings: dict[str, Any],
    output_dir: Path,
) -> None:
    model.model.eval()
    database = sampler.database
    # The rows it was trained on: the directory (for a SQL database, the snapshot taken for the job,
    # which serving reads), where its tasks were, and the URL read (its password hidden).
    read_from: dict[str, str] = {"dataset": str(database.root.resolve())}
    if database.tasks_dir is not None:
        read_from["tasks_dir"] = str(database.tasks_dir.resolve())
    if database.snapshot is not None:
        read_from["dataset_source"] = database.snapshot.source
    model.config = {
        **model.config,
        "model_type": "rt-j",
        "base_model": base_model,
        "problem_type": sampler.spec.problem_type,
        "relay": {
            "task": task,
            # The database it was trained on: the policy server predicts its rows.
            **read_from,
            "context_length": settings["context_length"],
            "max_children": settings["max_children"],
            "text_encoder": sampler.embedder.name,
            "label_mean": sampler.label_scale.mean,
            "label_std": sampler.label_scale.std,
        },
    }
    model.save_pretrained(output_dir)


def is_relational_checkpoint(name_or_dir: str) -> bool:
    """Whether a directory holds an RT-J checkpoint (its config.json states RT-J's sizes)."""
    config = Path(name_or_dir).expanduser() / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text())
    except json.JSONDecodeError:
        return False
    return isinstance(data, dict) and "num_blocks" in data and "d_text" in data
