"""pi05 as a family: a LeRobot dataset, the tuned policy and its learner, sharded checkpoints, and
the merged output (relay_engine.families.base.Family).

Under torch.distributed.run it runs as one process of a group: each process reads its part of
every global batch, the model trains under DDP or FSDP (`parallel.py`), and rank 0
alone writes the output. Checkpoints are sharded, so a run resumes on any number of processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from relay import families as sdk_families
from relay.optimizer import AdamParams
from relay_engine.core.checkpoint import CheckpointStore
from relay_engine.errors import ConfigError, EngineError
from relay_engine.families.base import EvaluationRequest, Family, PreparedRecipe, RecipeRun
from relay_engine.families.lerobot_data import (
    dataset_read,
    lerobot_batches,
    open_recipe_data,
    training_frames,
)

if TYPE_CHECKING:
    from relay_engine.acting import ActingPolicy
    from relay_engine.families.pi05.learner import Pi05Learner
    from relay_engine.families.pi05.parallel import Parallel
    from relay_engine.families.pi05.session import TrainingSession
    from relay_engine.models.checkpoints import Checkpoint
    from relay_engine.models.pi05 import Pi05Policy
    from relay_engine.serving.served import ServedModel

# The fixed part of the recipe (docs/recipe-jobs.md, "What is fixed"): AdamW with AdamParams'
# defaults (betas 0.9 and 0.95, eps 1e-8, no weight decay, gradients clipped to norm 1); the rate is
# the schedule's at each step. openpi's weight decay (1e-10) is none in effect, so we use none.
RECIPE_ADAM = AdamParams(learning_rate=0.0)


class Pi05Recipe(PreparedRecipe):
    """pi05's checkpoints are sharded (sharded_checkpoint.py), so any number of processes resumes."""

    def save_checkpoint(self, store: CheckpointStore, step: int, meta: dict[str, object]) -> None:
        from relay_engine.families.pi05.sharded_checkpoint import save_sharded

        save_sharded(store, step, self._learner(), meta, self._parallel())

    def load_checkpoint(self, directory: Path) -> None:
        from relay_engine.families.pi05.sharded_checkpoint import STATE_DIR, load_sharded

        if (directory / STATE_DIR).is_dir():
            load_sharded(directory, self._learner(), self._parallel())
        else:  # a checkpoint written before checkpoints were sharded
            self.learner.load_state(directory)

    def _parallel(self) -> Parallel | None:
        from relay_engine.families.pi05.parallel import Parallel

        assert self.parallel is None or isinstance(self.parallel, Parallel)
        return self.parallel

    def _learner(self) -> Pi05Learner:
        from relay_engine.families.pi05.learner import Pi05Learner

        assert isinstance(self.learner, Pi05Learner)
        return self.learner


class Pi05Family(Family):
    spec = sdk_families.family_spec(sdk_families.PI05)
    reads_other_models = True

    def prepare_recipe(self, run: RecipeRun) -> PreparedRecipe:
        from relay_engine.families.job_eval import JobEvaluator
        from relay_engine.families.pi05.evaluate import validation_loss
        from relay_engine.families.pi05.export import write_output
        from relay_engine.families.pi05.learner import Pi05Learner
        from relay_engine.families.pi05.parallel import Parallel, choose_strategy
        from relay_engine.families.pi05.sharded_checkpoint import gathered_policy
        from relay_engine.families.robot_validation import robot_validator, split_frames
        from relay_engine.models import image_fit
        from relay_engine.models.checkpoints import use_checkpoint_norm_stats
        from relay_engine.tuning import apply_tuning

        recipe, config = run.recipe, run.recipe.config
        if config.batch_size < run.processes:
            raise ConfigError(
                f"bad batch_size: {config.batch_size} (must be at least the number of processes, "
                f"{run.processes}: each process trains on its part of every batch)"
            )
        strategy = choose_strategy(recipe.strategy, config.finetune)
        # The checkpoint first: a wrong architecture or a missing repo is said before any dataset is read.
        policy, checkpoint = _starting_policy(run)
        # The tokenizer before the dataset and the rest: its absence (the PaliGemma repo is gated)
        # is said at once, not at the first batch after the setup.
        policy.tokenizer.ensure_loaded()
        data = open_recipe_data(run, image_fit(policy.config.vision.image_size))
        dataset = data.first  # the robot the output describes (a mixture's first dataset)
        if checkpoint is not None and config.normalization == "checkpoint":
            use_checkpoint_norm_stats(dataset, checkpoint)
            data.use_norm_stats(dataset.norm_stats)
        held_out = config.validation_episodes
        splits = [split_frames(part, recipe.episodes, held_out, recipe.seed) for part in data.parts]
        policy.config = policy.config.replace(robot_action_dim=dataset.summary.action_dim)
        model = apply_tuning(policy, config.finetune, config.targets, config.lora_rank, config.lora_alpha)
        parallel = Parallel(model, run.world, strategy) if run.world is not None else None
        learner = Pi05Learner(model, seed=recipe.seed, device=run.device, parallel=parallel)

        def write(output_dir: Path) -> None:
            whole = gathered_policy(model, parallel)
            if whole is not None:
                write_output(whole, output_dir, dataset)

        validator = robot_validator(
            model, validation_loss(model), data.parts, splits, recipe.seed, learner.evaluating
        )
        training = training_frames(data, splits, recipe.seed)
        evaluator = (
            JobEvaluator(model, dataset.norm_stats, config.eval, run.work_dir, context=learner.evaluating)
            if config.eval is not None
            else None
        )
        return Pi05Recipe(
            learner=learner,
            samples=training.samples,
            epoch_samples=training.epoch_samples,
            batch_size=config.batch_size,
            batches=lerobot_batches(run, training.dataset, training.indices, policy.collate),
            adam=RECIPE_ADAM,
            write_output=write,
            parallel=parallel,
            extra={"processes": run.processes, "strategy": strategy if parallel is not None else None},
            data_read=dataset_read(data),
            weights_read=(
                (lambda step: checkpoint.event(step, config.model)) if checkpoint is not None else None
            ),
            validate=validator,
            evaluate_in_env=evaluator,
            evaluate_at_checkpoints=config.eval is not None and config.eval.at_checkpoints,
        )

    def open_session(self, config: Mapping[str, Any], device: torch.device | str) -> TrainingSession:
        from relay_engine.families.pi05.session import SessionSpec, TrainingSession

        spec = SessionSpec(
            base_model=config["base_model"],
            finetune=config["finetune"],
            targets=config["targets"],
            lora_rank=config["lora_rank"],
            lora_alpha=config["lora_alpha"],
            action_horizon=config["action_horizon"],
            from_checkpoint=config.get("from_checkpoint"),
            checkpoint_output=config.get("checkpoint_output"),
        )
        return TrainingSession(spec, device=device)

    def evaluate(
        self, request: EvaluationRequest, on_progress: Callable[[int, int], None] | None = None
    ) -> dict[str, Any]:
        """The mean squared error, in normalized units, of the mean of `request.chunks` action
        chunks sampled per frame against the dataset's chunk (the headline, `mean_action_mse`),
        their spread (`action_spread`), one chunk's error (`mse`), and (with `blind_from`) the
        blind baseline's (see families/robot_scores.py)."""
        from relay_engine.datasets import open_dataset
        from relay_engine.families import robot_scores as evaluation
        from relay_engine.models import image_fit
        from relay_engine.recipe import pick_device

        policy = self.load_model(request.model, pick_device(request.device))
        data = open_dataset(
            request.dataset,
            action_horizon=policy.config.action_horizon,
            image_fit=image_fit(policy.config.vision.image_size),
        )
        # A trained model is scored in the units it was trained in (its norm_stats.json).
        evaluation.with_norm_stats(data, Path(request.norm_stats_from or request.model).expanduser())
        return evaluation.score_request(policy, data, request, on_progress)

    def evaluation_lines(self, report: dict[str, Any], request: EvaluationRequest) -> list[str]:
        from relay_engine.families import robot_scores as evaluation

        return evaluation.report_lines(report, request)

    def load_model(self, name_or_dir: str, device: torch.device | str = "cpu") -> Any:
        from relay_engine.models import load_policy

        return load_policy(name_or_dir, device=device)

    def acting_policy(self, name_or_dir: str, device: torch.device) -> ActingPolicy:
        from relay_engine.models import Pi05Policy

        policy = self.load_model(name_or_dir, device)
        if not isinstance(policy, Pi05Policy):
            raise EngineError(f"{name_or_dir}: the pi05 family loaded a {type(policy).__name__}")
        return policy

    def served_model(
        self,
        model: str | os.PathLike[str],
        *,
        device: str,
        num_steps: int,
        database: str | os.PathLike[str] | None,
        task: str | None,
    ) -> ServedModel:
        from relay_engine.serving.policy import serve_robot_policy

        return serve_robot_policy(model, device=device, num_steps=num_steps, database=database, task=task)


def _starting_policy(run: RecipeRun) -> tuple[Pi05Policy, Checkpoint | None]:
    """The policy a recipe trains from: its base model, or its from_checkpoint resolved (a
    directory, a fine-tune's output, a Hub repo) and loaded as the recipe's model, cutting the
    recipe's chunks; and that checkpoint, whose read the job reports."""
    from relay_engine.models import load_policy
    from relay_engine.models.checkpoints import load_checkpoint, resolve_checkpoint

    recipe, config = run.recipe, run.recipe.config
    if config.from_checkpoint is None:
        policy = load_policy(
            config.model, device=run.device, action_horizon=recipe.action_horizon, seed=recipe.seed
        )
        return policy, None
    output = Path(recipe.checkpoint_output) if recipe.checkpoint_output is not None else None
    checkpoint = resolve_checkpoint(config.from_checkpoint, output)
    policy = load_checkpoint(
        checkpoint,
        model=config.model,
        action_horizon=recipe.action_horizon,
        device=run.device,
        seed=recipe.seed,
    )
    return policy, checkpoint
