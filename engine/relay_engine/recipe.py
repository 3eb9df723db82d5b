"""A recipe job: the engine's loop driven by an SFTConfig.

A Recipe is a validated SFTConfig (the user's settings, their rules and defaults declared there
once) plus the engine's own settings that a job's user does not choose.

`run_recipe` opens the dataset, loads and tunes the model, resumes from the work directory's last
complete checkpoint if there is one, runs the fixed schedule and writes the merged output. It is
what a worker runs for `POST /v1/fine-tunes` and what `relay local train` runs on a laptop.

Under torch.distributed.run (`relay local train --nproc-per-node N`, or a worker's launcher) it
runs as one process of a group: each process reads its part of every global batch, the model
trains under DDP or FSDP (relay_engine.distributed), and rank 0 alone reports events and writes
the output. Checkpoints are sharded, so a run resumes on any number of processes.

Work directory layout:
    checkpoints/step-00001000/ ...   complete checkpoints, and `latest` naming the newest
    output/                          once completed: model.safetensors (adapters merged),
                                     config.json, norm_stats.json
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relay.catalog import ACTION_HORIZON, RELATIONAL_MODELS
from relay.events import CheckpointEvent, Event, RecipeResult, ResumedEvent
from relay.optimizer import AdamParams
from relay.sft.config import SFTConfig
from relay_engine.datasets import open_dataset
from relay_engine.distributed import Parallel, World, choose_strategy, gathered_policy, join, launched, leave
from relay_engine.distributed.checkpoint import STATE_DIR, load_sharded, save_sharded
from relay_engine.distributed.group import batch_slice
from relay_engine.errors import ConfigError
from relay_engine.models import load_policy
from relay_engine.training.checkpoint import CheckpointStore
from relay_engine.training.data import BatchOrder, DataPosition, batch_loader, select
from relay_engine.training.export import write_output
from relay_engine.training.learner import Learner
from relay_engine.training.loop import LoopState, MetricsWindow, run_loop
from relay_engine.training.schedule import learning_rate
from relay_engine.tuning import apply_tuning

# The fixed part of the recipe (docs/recipe-jobs.md, "What is fixed"): AdamW with AdamParams'
# defaults (betas 0.9 and 0.95, eps 1e-8, no weight decay, gradients clipped to norm 1); the rate is
# the schedule's at each step. openpi's weight decay (1e-10) is none in effect, so we use none.
RECIPE_ADAM = AdamParams(learning_rate=0.0)
LOG_EVERY = 10
# SFTConfig's fields when checkpoints began to carry a recipe's fingerprint (name aside).
FINGERPRINTED_FIELDS = frozenset(
    {"model", "dataset_name", "batch_size", "learning_rate", "steps", "finetune", "lora_rank"}
    | {"lora_alpha", "targets", "cameras"}
)


@dataclass(frozen=True)
class Recipe:
    """The user's validated recipe and the engine's settings that are not the user's to choose in a job."""

    config: SFTConfig
    action_horizon: int = ACTION_HORIZON
    checkpoint_every: int = 1000
    log_every: int = LOG_EVERY
    seed: int = 0
    # Which episodes to train on (None: all); `relay local train --episodes` keeps some back.
    episodes: list[int] | None = None
    num_workers: int | None = None  # data-loading processes; None: 0 on the CPU, more on a GPU
    device: str = "auto"
    # How a run of many processes shares the model: auto (FSDP for full, DDP for LoRA), ddp or fsdp.
    strategy: str = "auto"
    # The service job's attempt (its fencing token; 0 for a local run). It names this run's temporary
    # checkpoint directories, so that an older attempt's tidying never removes this one's writes.
    attempt: int = 0

    @classmethod
    def from_config(cls, config: SFTConfig | Mapping[str, Any], **engine_settings: Any) -> Recipe:
        """From an SFTConfig, or the fields of one (a stored job's config), validated here.

        Raises ConfigError naming the field and the rule if they break one."""
        checked = config if isinstance(config, SFTConfig) else SFTConfig.parse(config)
        return cls(checked, **engine_settings)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for another process: the config's fields under "config", then the engine's."""
        engine = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "config"}
        return {"config": self.config.model_dump(mode="json"), **engine}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recipe:
        """The inverse of to_dict (the config validated again)."""
        settings = dict(data)
        return cls.from_config(settings.pop("config"), **settings)

    def fingerprint(self) -> str:
        """What must not change between a checkpoint and a resume: the recipe but its name, and the
        engine settings that shape training. Where it runs, how often it reports, and how many
        processes run it and share the model may change (checkpoints reshard)."""
        recipe = self.config.model_dump(exclude={"name", "gpus"})
        fixed = {
            # Fields added to SFTConfig since checkpoints carried a fingerprint count only when set
            # away from their default, so that those checkpoints still resume.
            **{k: v for k, v in recipe.items() if k in FINGERPRINTED_FIELDS or v != SFTConfig.default(k)},
            "action_horizon": self.action_horizon,
            "checkpoint_every": self.checkpoint_every,
            "seed": self.seed,
            "episodes": self.episodes,
        }
        return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16]


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def run_recipe(
    recipe: Recipe,
    work_dir: Path,
    *,
    on_event: Callable[[Event], None],
    should_stop: Callable[[], bool],
    dataset_cache_dir: Path | None = None,
    output_dir: Path | None = None,
    checkpoint_on_stop: bool = False,
) -> RecipeResult:
    """Run the recipe here; under torch.distributed.run, as this process's part of the group.

    A resumed run first reports `{"step": N, "event": "resumed"}`. With `checkpoint_on_stop`, a
    run stopped by `should_stop` saves a checkpoint at the step it reached (a local run's
    Ctrl-C), so that the same command again loses nothing."""
    stopping = checkpoint_on_stop
    if recipe.config.model in RELATIONAL_MODELS:  # RT-J: one process, its own data and step
        from relay_engine.relational.recipe import run_relational_recipe

        output = Path(output_dir) if output_dir is not None else Path(work_dir) / "output"
        return run_relational_recipe(
            recipe, Path(work_dir), on_event, should_stop, output, checkpoint_on_stop
        )
    if not launched():
        return _run(recipe, work_dir, None, on_event, should_stop, dataset_cache_dir, output_dir, stopping)
    # A caller that joined the group itself (to run several recipes in one launch) keeps it.
    joined_here = not torch.distributed.is_initialized()
    world = join(recipe.device)
    try:
        return _run(recipe, work_dir, world, on_event, should_stop, dataset_cache_dir, output_dir, stopping)
    finally:
        if joined_here:
            leave()


def _run(
    recipe: Recipe,
    work_dir: Path,
    world: World | None,
    on_event: Callable[[Event], None],
    should_stop: Callable[[], bool],
    dataset_cache_dir: Path | None,
    output_dir: Path | None,
    checkpoint_on_stop: bool,
) -> RecipeResult:
    config = recipe.config
    work_dir = Path(work_dir)
    output_dir = Path(output_dir) if output_dir is not None else work_dir / "output"
    device = world.device if world is not None else pick_device(recipe.device)
    rank, processes = (world.rank, world.size) if world is not None else (0, 1)
    main = rank == 0
    if config.batch_size < processes:
        raise ConfigError(
            f"bad batch_size: {config.batch_size} (must be at least the number of processes, {processes}: "
            "each process trains on its part of every batch)"
        )
    strategy = choose_strategy(recipe.strategy, config.finetune)

    dataset = open_dataset(
        config.dataset_name,
        cameras=config.cameras,
        action_horizon=recipe.action_horizon,
        cache_dir=dataset_cache_dir,
    )
    indices = _training_indices(dataset, recipe.episodes)
    policy = load_policy(config.model, device=device, action_horizon=recipe.action_horizon, seed=recipe.seed)
    policy.config = policy.config.replace(robot_action_dim=dataset.summary.action_dim)
    model = apply_tuning(policy, config.finetune, config.targets, config.lora_rank, config.lora_alpha)
    parallel = Parallel(model, world, strategy) if world is not None else None
    learner = Learner(model, seed=recipe.seed, device=device, parallel=parallel)

    store = CheckpointStore(work_dir / "checkpoints", attempt=recipe.attempt)
    state, position = LoopState(), DataPosition()
    resumed_from = None
    latest = store.latest()
    if latest is not None:
        manifest = store.manifest(latest)
        if manifest.get("recipe") != recipe.fingerprint():
            raise ConfigError(f"{work_dir} holds checkpoints of a different recipe; use a new directory")
        if (latest / STATE_DIR).is_dir():
            load_sharded(latest, learner, parallel)
        else:  # a checkpoint written before checkpoints were sharded
            learner.load_state(latest)
        state = LoopState(
            step=int(manifest["step"]),
            window=MetricsWindow.from_dict(manifest["window"]),
            last_loss=manifest.get("loss"),
        )
        position = DataPosition.from_dict(manifest["data_position"])
        resumed_from = state.step

    order = BatchOrder(len(indices), config.batch_size, recipe.seed, span_epochs=True)
    subset = select(dataset, indices.tolist()) if recipe.episodes is not None else dataset
    num_workers = recipe.num_workers if recipe.num_workers is not None else (0 if device.type == "cpu" else 8)
    batches = batch_loader(
        subset, order, position, policy.collate, num_workers, part=lambda n: batch_slice(n, rank, processes)
    )

    def next_step_batches() -> list[Any]:
        nonlocal position
        _, position = order.next_batch(position)
        return [next(batches)]

    def save_checkpoint(loop_state: LoopState) -> None:
        meta: dict[str, object] = {
            "recipe": recipe.fingerprint(),
            "data_position": position.to_dict(),
            "window": loop_state.window.to_dict(),
            "loss": loop_state.last_loss,
        }
        save_sharded(store, loop_state.step, learner, meta, parallel)

    def report(event: Event) -> None:
        if main:  # one process speaks for the group
            on_event(event)

    if resumed_from is not None:
        report(ResumedEvent.of_attempt(resumed_from, recipe.attempt))

    def stop_agreed() -> bool:
        # A stop asked of any process (rank 0 hears the service's cancel) stops all at the same step.
        wanted = should_stop()
        return parallel.any(wanted) if parallel is not None else wanted

    result = run_loop(
        learner,
        next_step_batches,
        state=state,
        total_steps=config.steps,
        learning_rate_at=lambda step: learning_rate(step, config.steps, config.learning_rate),
        adam=RECIPE_ADAM,
        on_event=report,
        should_stop=stop_agreed,
        save_checkpoint=save_checkpoint,
        checkpoint_every=recipe.checkpoint_every,
        log_every=recipe.log_every,
    )
    if result.status != "completed":
        if checkpoint_on_stop and state.step > 0 and _latest_step(store) != state.step:
            save_checkpoint(state)
            report(CheckpointEvent(step=state.step))
        return RecipeResult(result.status, result.step, result.loss, None, resumed_from)

    whole = gathered_policy(model, parallel)
    if whole is not None:
        write_output(whole, output_dir, dataset)
    if parallel is not None:
        parallel.barrier()  # the output is whole before any process reports completion
    return RecipeResult(
        "completed",
        result.step,
        result.loss,
        output_dir,
        resumed_from,
        extra={"processes": processes, "strategy": strategy if parallel is not None else None},
    )


def _latest_step(store: CheckpointStore) -> int | None:
    latest = store.latest()
    return None if latest is None else int(store.manifest(latest)["step"])


def _training_indices(dataset: Any, episodes: Iterable[int] | None) -> np.ndarray:
    if episodes is None:
        return np.arange(len(dataset))
    indices = dataset.indices_of_episodes(episodes)
    if len(indices) == 0:
        raise ConfigError("the selected episodes hold no frames")
    return indices
