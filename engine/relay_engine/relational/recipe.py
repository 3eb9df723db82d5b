"""An RT-J recipe job: the engine's loop on contexts sampled from a relational database.

What `run_recipe` runs when the recipe's model is rt-j or rt-j-tiny, with the same events,
checkpoints (every weight, the optimizer, the RNGs and the data position: a resumed run takes the
steps an uninterrupted one would), stop requests and output directory as a pi05 job. The output
is an RT-J checkpoint (config.json + model.safetensors) whose config also records how its contexts
were made (`relay` in config.json), so `relay local eval` and the constructor reproduce them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from relay.events import CheckpointEvent, Event, RecipeResult, ResumedEvent
from relay.optimizer import AdamParams
from relay_engine.errors import ConfigError
from relay_engine.relational.database import open_database
from relay_engine.relational.encoding import default_text_embedder
from relay_engine.relational.evaluation import auroc, evaluate, label_frequency_baseline
from relay_engine.relational.learner import LabelledBatch, RelationalLearner
from relay_engine.relational.sampling import ContextSampler
from relay_engine.relational.transformer import RelationalTransformer
from relay_engine.training.checkpoint import CheckpointStore
from relay_engine.training.data import BatchOrder, DataPosition
from relay_engine.training.loop import LoopState, MetricsWindow, run_loop
from relay_engine.training.schedule import learning_rate

if TYPE_CHECKING:
    from relay_engine.recipe import Recipe

# Contexts of jobs: RT samples 1,024 cells; a quarter of that keeps a CPU step short and holds the
# seed, its customer and its recent history on the databases we train on here.
CONTEXT_LENGTH = 256
TINY_MODELS = ("rt-j-tiny",)
MAX_CHILDREN = 32
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
    dataset: str, task: str, settings: dict[str, Any], d_text: int, seed: int
) -> ContextSampler:
    """The sampler of a database directory's task, with a model's context settings."""
    database = open_database(Path(dataset).expanduser())
    prefer = "hash" if settings["text_encoder"].startswith("hash") else "auto"
    embedder = default_text_embedder(d_text, prefer=prefer)
    return ContextSampler(
        database,
        task,
        embedder,
        context_length=settings["context_length"],
        max_children=settings["max_children"],
        seed=seed,
    )


def run_relational_recipe(
    recipe: Recipe,
    work_dir: Path,
    on_event: Callable[[Event], None],
    should_stop: Callable[[], bool],
    output_dir: Path,
    checkpoint_on_stop: bool = False,
) -> RecipeResult:
    from relay_engine.recipe import pick_device

    threads = torch.get_num_threads()
    # rt-j-tiny's matrices are too small for threads to pay: on a busy 2-core machine, 10 steps took
    # 92 s with torch's 2 threads waiting on each other, and 3.3 s with one.
    if recipe.config.model in TINY_MODELS and pick_device(recipe.device).type == "cpu":
        torch.set_num_threads(1)
    try:
        return _run(recipe, work_dir, on_event, should_stop, output_dir, checkpoint_on_stop)
    finally:
        torch.set_num_threads(threads)


def _run(
    recipe: Recipe,
    work_dir: Path,
    on_event: Callable[[Event], None],
    should_stop: Callable[[], bool],
    output_dir: Path,
    checkpoint_on_stop: bool,
) -> RecipeResult:
    from relay_engine.recipe import pick_device

    config = recipe.config
    if not config.task:
        raise ConfigError(f"{config.model} trains on a task: name the task table of the database")
    device = pick_device(recipe.device)
    model = RelationalTransformer(config.model, device=device, seed=recipe.seed)
    settings = context_settings(model.config)
    sampler = build_sampler(
        config.dataset_name, config.task, settings, model.model.config.d_text, recipe.seed
    )
    examples = sampler.examples("train")
    problem_type = sampler.spec.problem_type
    learner = RelationalLearner(model.model, problem_type, seed=recipe.seed, device=device)
    torch.manual_seed(recipe.seed)

    store = CheckpointStore(work_dir / "checkpoints", attempt=recipe.attempt)
    state, position = LoopState(), DataPosition()
    resumed_from = None
    latest = store.latest()
    if latest is not None:
        manifest = store.manifest(latest)
        if manifest.get("recipe") != recipe.fingerprint():
            raise ConfigError(f"{work_dir} holds checkpoints of a different recipe; use a new directory")
        learner.load_state(latest)
        window = cast(dict[str, Any], manifest["window"])
        state = LoopState(step=int(cast(int, manifest["step"])), window=MetricsWindow.from_dict(window))
        state.last_loss = cast(float | None, manifest.get("loss"))
        position = DataPosition.from_dict(cast(dict[str, int], manifest["data_position"]))
        resumed_from = state.step

    order = BatchOrder(len(examples), min(config.batch_size, len(examples)), recipe.seed, span_epochs=True)

    def next_step_batches() -> list[LabelledBatch]:
        nonlocal position
        indices, position = order.next_batch(position)
        return [LabelledBatch.of([examples[i] for i in indices])]

    def save_checkpoint(loop_state: LoopState) -> None:
        store.save(
            loop_state.step,
            learner.save_state,
            meta={
                "recipe": recipe.fingerprint(),
                "data_position": position.to_dict(),
                "window": loop_state.window.to_dict(),
                "loss": loop_state.last_loss,
            },
        )

    if resumed_from is not None:
        on_event(ResumedEvent.of_attempt(resumed_from, recipe.attempt))

    result = run_loop(
        cast(Any, learner),  # the loop needs forward_backward, optim_step and device: a Learner's interface
        cast(Any, next_step_batches),
        state=state,
        total_steps=config.steps,
        learning_rate_at=lambda step: learning_rate(step, config.steps, config.learning_rate),
        adam=RELATIONAL_ADAM,
        on_event=on_event,
        should_stop=should_stop,
        save_checkpoint=save_checkpoint,
        checkpoint_every=recipe.checkpoint_every,
        log_every=recipe.log_every,
    )
    if result.status != "completed":
        latest = store.latest()
        saved = None if latest is None else int(cast(int, store.manifest(latest)["step"]))
        if checkpoint_on_stop and state.step > 0 and saved != state.step:
            save_checkpoint(state)
            on_event(CheckpointEvent(step=state.step))
        return RecipeResult(result.status, result.step, result.loss, None, resumed_from)

    model.model.eval()
    model.config = {
        **model.config,
        "model_type": "rt-j",
        "base_model": config.model,
        "problem_type": problem_type,
        "relay": {
            "task": config.task,
            "context_length": settings["context_length"],
            "max_children": settings["max_children"],
            "text_encoder": sampler.embedder.name,
            "label_mean": sampler.label_scale.mean,
            "label_std": sampler.label_scale.std,
        },
    }
    model.save_pretrained(output_dir)
    return RecipeResult("completed", result.step, result.loss, output_dir, resumed_from)


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


def evaluate_split(
    model_name_or_dir: str, dataset: str, task: str | None, split: str, *, device: str = "auto", seed: int = 0
) -> dict[str, Any]:
    """The task's metrics on one split (AUROC for binary, MAE and nMAE for regression), and for
    binary tasks the label-frequency baseline's AUROC on the same rows."""
    from relay_engine.recipe import pick_device

    model = RelationalTransformer(model_name_or_dir, device=pick_device(device), seed=seed)
    settings = context_settings(model.config)
    chosen = task or model.config.get("relay", {}).get("task")
    if not chosen:
        raise ConfigError(f"name the task to evaluate {model_name_or_dir} on (--task)")
    sampler = build_sampler(dataset, chosen, settings, model.model.config.d_text, seed)
    examples = sampler.examples(split)
    if not examples:
        raise ConfigError(f"the {split} split of task {chosen} has no rows")
    result = evaluate(model, examples, sampler.spec.problem_type, sampler.label_scale)
    report: dict[str, Any] = {
        "model": model_name_or_dir,
        "task": chosen,
        "split": split,
        "problem_type": result.problem_type,
        "examples": result.examples,
        **result.metrics,
    }
    if sampler.spec.problem_type == "binary":
        labels = np.asarray([e.label for e in examples])
        report["label_frequency_auroc"] = auroc(labels, label_frequency_baseline(sampler, split))
    return report
