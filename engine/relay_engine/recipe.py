"""A recipe job: the engine's loop driven by an SFTConfig.

A Recipe is a validated SFTConfig (the user's settings, their rules and defaults declared there
once) plus the engine's own settings that a job's user does not choose.

`run_recipe` opens the dataset, loads and tunes the model, resumes from the work directory's last
complete checkpoint if there is one, runs the fixed schedule and writes the merged output. It is
what a worker runs for `POST /v1/fine-tunes` and what `relay local train` runs on a laptop.

Work directory layout:
    checkpoints/step-00001000/ ...   complete checkpoints, and `latest` naming the newest
    output/                          once completed: model.safetensors (adapters merged),
                                     config.json, norm_stats.json
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from relay.catalog import ACTION_HORIZON
from relay.optimizer import AdamParams
from relay.sft.config import SFTConfig
from relay_engine.datasets import open_dataset
from relay_engine.errors import ConfigError
from relay_engine.models import load_policy
from relay_engine.training.checkpoint import CheckpointStore
from relay_engine.training.data import BatchOrder, DataPosition, batch_loader, select
from relay_engine.training.export import write_output
from relay_engine.training.learner import Learner
from relay_engine.training.loop import Event, LoopState, MetricsWindow, run_loop
from relay_engine.training.schedule import learning_rate
from relay_engine.tuning import apply_tuning

# The fixed part of the recipe: AdamW with AdamParams' defaults (betas 0.9 and 0.95, eps 1e-8, no
# weight decay, gradients clipped to norm 1); the rate is the schedule's at each step. openpi's
# weight decay (1e-10) is none in effect, so we use none.
RECIPE_ADAM = AdamParams(learning_rate=0.0)
LOG_EVERY = 10


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

    @classmethod
    def from_config(cls, config: SFTConfig | Mapping[str, Any], **engine_settings: Any) -> Recipe:
        """From an SFTConfig, or the fields of one (a stored job's config), validated here.

        Raises ConfigError naming the field and the rule if they break one."""
        checked = config if isinstance(config, SFTConfig) else SFTConfig.parse(config)
        return cls(checked, **engine_settings)

    def fingerprint(self) -> str:
        """What must not change between a checkpoint and a resume: the recipe but its name, and the
        engine settings that shape training (not where it runs or how often it reports)."""
        fixed = {
            **self.config.model_dump(exclude={"name"}),
            "action_horizon": self.action_horizon,
            "checkpoint_every": self.checkpoint_every,
            "seed": self.seed,
            "episodes": self.episodes,
        }
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
    config = recipe.config
    work_dir = Path(work_dir)
    output_dir = Path(output_dir) if output_dir is not None else work_dir / "output"
    device = pick_device(recipe.device)

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
    learner = Learner(model, seed=recipe.seed, device=device)

    store = CheckpointStore(work_dir / "checkpoints")
    state, position = LoopState(), DataPosition()
    resumed_from = None
    latest = store.latest()
    if latest is not None:
        manifest = store.manifest(latest)
        if manifest.get("recipe") != recipe.fingerprint():
            raise ConfigError(f"{work_dir} holds checkpoints of a different recipe; use a new directory")
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
    batches = batch_loader(subset, order, position, policy.collate, num_workers)

    def next_step_batches() -> list[Any]:
        nonlocal position
        _, position = order.next_batch(position)
        return [next(batches)]

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

    result = run_loop(
        learner,
        next_step_batches,
        state=state,
        total_steps=config.steps,
        learning_rate_at=lambda step: learning_rate(step, config.steps, config.learning_rate),
        adam=RECIPE_ADAM,
        on_event=on_event,
        should_stop=should_stop,
        save_checkpoint=save_checkpoint,
        checkpoint_every=recipe.checkpoint_every,
        log_every=recipe.log_every,
    )
    if result.status != "completed":
        return RecipeResult(result.status, result.step, result.loss, None, resumed_from)

    write_output(model, output_dir, dataset.norm_stats.to_json())
    return RecipeResult("completed", result.step, result.loss, output_dir, resumed_from)


def _training_indices(dataset: Any, episodes: Iterable[int] | None) -> np.ndarray:
    if episodes is None:
        return np.arange(len(dataset))
    indices = dataset.indices_of_episodes(episodes)
    if len(indices) == 0:
        raise ConfigError("the selected episodes hold no frames")
    return indices
