"""A recipe job: the engine's loop driven by an SFTConfig.

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
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from relay.optimizer import AdamParams
from relay_engine.datasets import open_dataset
from relay_engine.distributed import Parallel, World, choose_strategy, gathered_policy, join, launched, leave
from relay_engine.distributed.checkpoint import STATE_DIR, load_sharded, save_sharded
from relay_engine.distributed.group import batch_slice
from relay_engine.errors import ConfigError
from relay_engine.models import load_policy
from relay_engine.training.checkpoint import CheckpointStore
from relay_engine.training.data import BatchOrder, DataPosition, batch_loader
from relay_engine.training.export import write_output
from relay_engine.training.learner import Learner
from relay_engine.training.loop import Event, LoopState, MetricsWindow, run_loop
from relay_engine.training.schedule import learning_rate
from relay_engine.tuning import apply_tuning

# The fixed part of the recipe (docs/recipe-jobs.md, "What is fixed"). Weight decay is not
# named there; openpi's default (1e-10) is none in effect, so we use none.
RECIPE_ADAM = AdamParams(
    learning_rate=0.0, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0, grad_clip_norm=1.0
)
LOG_EVERY = 10


@dataclass(frozen=True)
class Recipe:
    # The user's recipe: SFTConfig's fields (validated by SFTConfig before they get here).
    model: str
    dataset_name: str
    batch_size: int = 128
    learning_rate: float = 2.5e-5
    steps: int = 6000
    finetune: str = "lora"
    lora_rank: int = 32
    lora_alpha: float | None = None
    targets: list[str] | None = None
    cameras: dict[str, str] | None = None
    # Engine settings that are not the user's to choose in a job.
    action_horizon: int = 10
    checkpoint_every: int = 1000
    log_every: int = LOG_EVERY
    seed: int = 0
    # Which episodes to train on (None: all); `relay local train --episodes` keeps some back.
    episodes: list[int] | None = None
    num_workers: int | None = None  # data-loading processes; None: 0 on the CPU, more on a GPU
    device: str = "auto"
    # How a run of many processes shares the model: auto (FSDP for full, DDP for LoRA), ddp or fsdp.
    strategy: str = "auto"

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **engine_settings: Any) -> Recipe:
        """From SFTConfig.model_dump() (fields the engine does not use, like `name`, are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in known}, **engine_settings)

    def fingerprint(self) -> str:
        """What must not change between a checkpoint and a resume."""
        # How many processes run it, and how they share the model, may change: checkpoints reshard.
        free = ("num_workers", "device", "log_every", "strategy")
        fixed = {k: v for k, v in asdict(self).items() if k not in free}
        return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RecipeResult:
    status: Literal["completed", "stopped"]
    step: int
    loss: float | None
    output_dir: Path | None
    resumed_from: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


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
) -> RecipeResult:
    """Run the recipe here; under torch.distributed.run, as this process's part of the group."""
    if not launched():
        return _run(recipe, work_dir, None, on_event, should_stop, dataset_cache_dir, output_dir)
    # A caller that joined the group itself (to run several recipes in one launch) keeps it.
    joined_here = not torch.distributed.is_initialized()
    world = join(recipe.device)
    try:
        return _run(recipe, work_dir, world, on_event, should_stop, dataset_cache_dir, output_dir)
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
) -> RecipeResult:
    work_dir = Path(work_dir)
    output_dir = Path(output_dir) if output_dir is not None else work_dir / "output"
    device = world.device if world is not None else pick_device(recipe.device)
    rank, processes = (world.rank, world.size) if world is not None else (0, 1)
    main = rank == 0
    if recipe.batch_size < processes:
        raise ConfigError(
            f"bad batch_size: {recipe.batch_size} (must be at least the number of processes, {processes}: "
            "each process trains on its part of every batch)"
        )
    strategy = choose_strategy(recipe.strategy, recipe.finetune)

    dataset = open_dataset(
        recipe.dataset_name,
        cameras=recipe.cameras,
        action_horizon=recipe.action_horizon,
        cache_dir=dataset_cache_dir,
    )
    indices = _training_indices(dataset, recipe.episodes)
    policy = load_policy(recipe.model, device=device, action_horizon=recipe.action_horizon, seed=recipe.seed)
    policy.config = policy.config.replace(robot_action_dim=dataset.summary.action_dim)
    model = apply_tuning(policy, recipe.finetune, recipe.targets, recipe.lora_rank, recipe.lora_alpha)
    parallel = Parallel(model, world, strategy) if world is not None else None
    learner = Learner(model, seed=recipe.seed, device=device, parallel=parallel)

    store = CheckpointStore(work_dir / "checkpoints")
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

    order = BatchOrder(len(indices), recipe.batch_size, recipe.seed, span_epochs=True)
    subset = torch.utils.data.Subset(dataset, indices.tolist()) if recipe.episodes is not None else dataset
    num_workers = recipe.num_workers if recipe.num_workers is not None else (0 if device.type == "cpu" else 8)
    batches = batch_loader(
        subset, order, position, policy.collate, num_workers, part=lambda n: batch_slice(n, rank, processes)
    )

    def next_step_batches() -> list[Any]:
        nonlocal position
        _, position = order.next_batch(position)
        return [next(batches)]

    def save_checkpoint(loop_state: LoopState) -> None:
        meta = {
            "recipe": recipe.fingerprint(),
            "data_position": position.to_dict(),
            "window": loop_state.window.to_dict(),
            "loss": loop_state.last_loss,
        }
        save_sharded(store, loop_state.step, learner, meta, parallel)

    def report(event: Event) -> None:
        if main:  # one process speaks for the group
            on_event(event)

    def stop_agreed() -> bool:
        # A stop asked of any process (rank 0 hears the service's cancel) stops all at the same step.
        wanted = should_stop()
        return parallel.any(wanted) if parallel is not None else wanted

    result = run_loop(
        learner,
        next_step_batches,
        state=state,
        total_steps=recipe.steps,
        learning_rate_at=lambda step: learning_rate(step, recipe.steps, recipe.learning_rate),
        adam=RECIPE_ADAM,
        on_event=report,
        should_stop=stop_agreed,
        save_checkpoint=save_checkpoint,
        checkpoint_every=recipe.checkpoint_every,
        log_every=recipe.log_every,
    )
    if result.status != "completed":
        return RecipeResult(result.status, result.step, result.loss, None, resumed_from)

    whole = gathered_policy(model, parallel)
    if whole is not None:
        write_output(whole, output_dir, dataset.norm_stats.to_json())
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


def _training_indices(dataset: Any, episodes: Iterable[int] | None) -> np.ndarray:
    if episodes is None:
        return np.arange(len(dataset))
    indices = dataset.indices_of_episodes(episodes)
    if len(indices) == 0:
        raise ConfigError("the selected episodes hold no frames")
    return indices
