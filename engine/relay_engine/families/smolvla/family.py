"""SmolVLA as a family: a LeRobot dataset (every camera under its own name, state and actions
normalized by mean and std), lerobot's default training (the action expert and the projections),
and lerobot's files as the output (relay_engine.families.base.Family).

One process per job (`FamilySpec.max_gpus`): SmolVLA's 450M weights train on one GPU.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from relay import families as sdk_families
from relay.optimizer import AdamParams
from relay_engine.errors import ConfigError
from relay_engine.families.base import EvaluationRequest, Family, ModelDescription, PreparedRecipe, RecipeRun
from relay_engine.families.lerobot_data import dataset_read, lerobot_batches

if TYPE_CHECKING:
    from relay.events import Event
    from relay_engine.acting import ActingPolicy
    from relay_engine.core.session import Session
    from relay_engine.datasets import NormStats
    from relay_engine.families.smolvla.policy import SmolVLAPolicy
    from relay_engine.families.smolvla.processor import SmolVLAProcessor
    from relay_engine.models.checkpoints import Checkpoint
    from relay_engine.serving.served import ServedModel

# lerobot's SmolVLA optimizer (optimizer_betas, optimizer_eps, optimizer_weight_decay,
# optimizer_grad_clip_norm); the rate is the schedule's at each step.
RECIPE_ADAM = AdamParams(learning_rate=0.0, weight_decay=1e-10, grad_clip_norm=10.0)


class SmolVLAFamily(Family):
    spec = sdk_families.family_spec(sdk_families.SMOLVLA)

    def prepare_recipe(self, run: RecipeRun) -> PreparedRecipe:
        from relay_engine.datasets import open_dataset
        from relay_engine.families.robot_validation import Validator, split_frames
        from relay_engine.families.smolvla.learner import (
            ScoredSmolVLA,
            SmolVLACollate,
            SmolVLALearner,
            validation_loss,
        )

        recipe, config = run.recipe, run.recipe.config
        torch.manual_seed(recipe.seed)
        # The checkpoint first: a wrong architecture or a missing repo is said before any dataset is read.
        checkpoint = self._checkpoint(config.from_checkpoint, config.model, recipe.checkpoint_output)
        policy, backbone_dir = (
            self.base_policy(config.model)
            if checkpoint is None
            else self._checkpoint_policy(checkpoint, config.model)
        )
        # The tokenizer before the dataset: a missing one is said at once.
        tokenizer = self.tokenizer(policy, backbone_dir)
        dataset = open_dataset(
            config.dataset_name,
            action_horizon=policy.config.chunk_size,
            cache_dir=run.dataset_cache_dir,
            revision=config.dataset_revision,
            normalization="mean_std",
            camera_names="dataset",
        )
        if checkpoint is not None and config.normalization == "checkpoint":
            from relay_engine.models.checkpoints import use_checkpoint_norm_stats

            use_checkpoint_norm_stats(dataset, checkpoint)
        summary = dataset.summary
        if not summary.cameras:
            raise ConfigError(f"dataset_name: {config.dataset_name} has no camera; SmolVLA reads images")
        cameras = {name: (3, height, width) for name, (height, width) in summary.cameras.items()}
        policy.for_robot(cameras, summary.state_dim, summary.action_dim)
        if config.finetune == "lora":
            from relay_engine.families.smolvla.tuning import apply_lora

            assert config.lora_alpha is not None  # SFTConfig spells it out
            apply_lora(policy, config.lora_rank, config.lora_alpha, recipe.seed)
        policy.to(run.device)
        stats = dataset.norm_stats
        processor = self.processor(policy, tokenizer, stats)
        learner = SmolVLALearner(policy, seed=recipe.seed, device=run.device)
        # The held-out episodes (validation_episodes) leave the frames the sampler shuffles.
        split = split_frames(dataset, recipe.episodes, config.validation_episodes, recipe.seed)
        collate = SmolVLACollate(processor, policy.cameras)
        validator = (
            Validator(
                ScoredSmolVLA(policy, processor),
                validation_loss(policy, collate),
                dataset,
                split,
                recipe.seed,
            )
            if split.validates
            else None
        )

        return PreparedRecipe(
            learner=learner,
            samples=len(split.training),
            batch_size=config.batch_size,
            batches=lerobot_batches(run, dataset, split.training, collate),
            adam=RECIPE_ADAM,
            write_output=_output_writer(run, policy, stats, backbone_dir),
            extra={"processes": run.processes},
            data_read=dataset_read(dataset),
            weights_read=(lambda step: checkpoint.event(step, config.model))
            if checkpoint is not None
            else None,
            validate=validator,
            evaluate_in_env=_evaluator(run, policy, processor, stats),
            evaluate_at_checkpoints=config.eval is not None and config.eval.at_checkpoints,
        )

    @staticmethod
    def _checkpoint(value: str | None, model: str, job_output: str | None) -> Checkpoint | None:
        """A recipe's from_checkpoint resolved (a directory, a fine-tune's output, a Hub repo fetched
        into the Hub cache), refused naming both models when it holds another model's weights."""
        from relay.checkpoints import architecture_mismatch, checkpoint_model
        from relay_engine.models.checkpoints import resolve_checkpoint

        if value is None:
            return None
        checkpoint = resolve_checkpoint(value, Path(job_output) if job_output is not None else None)
        found = checkpoint_model(checkpoint.directory)
        if found != model:
            if found is None:
                raise ConfigError(
                    f"bad from_checkpoint: {value} holds no SmolVLA (no lerobot config.json of type smolvla)",
                    param="from_checkpoint",
                )
            raise ConfigError(architecture_mismatch(model, found, value), param="from_checkpoint")
        return checkpoint

    def _checkpoint_policy(self, checkpoint: Checkpoint, model: str) -> tuple[SmolVLAPolicy, Path | None]:
        """The checkpoint's weights, loaded strictly, with its own backbone files (a Relay output's
        vlm/), else the base's (the same architecture: checkpoint_model said so; the base's weights
        are not fetched for them)."""
        from relay_engine.families.smolvla.files import BACKBONE_DIR, base_backbone
        from relay_engine.families.smolvla.policy import SmolVLAPolicy

        own = checkpoint.directory / BACKBONE_DIR
        backbone_dir = own if own.is_dir() else base_backbone(model)
        return SmolVLAPolicy.from_lerobot(checkpoint.directory, backbone_dir), backbone_dir

    def base_policy(self, model: str) -> tuple[SmolVLAPolicy, Path | None]:
        from relay_engine.families.smolvla.files import base_files
        from relay_engine.families.smolvla.policy import SmolVLAPolicy

        directory, backbone_dir = base_files(model)
        return SmolVLAPolicy.from_lerobot(directory, backbone_dir), backbone_dir

    @staticmethod
    def tokenizer(policy: SmolVLAPolicy, backbone_dir: Path | None) -> Any:
        from relay_engine.families.smolvla.processor import load_tokenizer

        return load_tokenizer(backbone_dir or Path(policy.config.vlm_model_name).expanduser())

    def evaluate(
        self, request: EvaluationRequest, on_progress: Callable[[int, int], None] | None = None
    ) -> dict[str, Any]:
        """As pi05's: the error of the mean of sampled chunks against the dataset's, in the units
        the model was trained in (mean and std), and the blind baseline's."""
        from relay_engine.datasets import open_dataset
        from relay_engine.families import robot_scores as evaluation
        from relay_engine.families.smolvla.learner import ScoredSmolVLA
        from relay_engine.recipe import pick_device

        policy = self.load_model(request.model, pick_device(request.device))
        data = open_dataset(
            request.dataset,
            action_horizon=policy.config.chunk_size,
            normalization="mean_std",
            camera_names="dataset",
        )
        evaluation.with_norm_stats(data, Path(request.norm_stats_from or request.model).expanduser())
        if request.model in self.spec.models:  # a base acts for the dataset's robot
            summary = data.summary
            cameras = {name: (3, height, width) for name, (height, width) in summary.cameras.items()}
            policy.for_robot(cameras, summary.state_dim, summary.action_dim)
        missing = [camera for camera in policy.cameras if camera not in data.camera_map]
        if missing:
            raise ConfigError(
                f"dataset: {request.dataset} lacks the model's camera {missing[0]} "
                f"(its cameras: {', '.join(data.camera_map)})",
                param="dataset",
            )
        tokenizer = self.tokenizer(policy, self._backbone_of(request.model))
        scored = ScoredSmolVLA(policy, self.processor(policy, tokenizer, data.norm_stats))
        return evaluation.score_request(scored, data, request, on_progress)

    def evaluation_lines(self, report: dict[str, Any], request: EvaluationRequest) -> list[str]:
        from relay_engine.families import robot_scores as evaluation

        return evaluation.report_lines(report, request)

    @staticmethod
    def processor(policy: SmolVLAPolicy, tokenizer: Any, stats: NormStats) -> SmolVLAProcessor:
        from relay_engine.families.smolvla.processor import SmolVLAProcessor

        return SmolVLAProcessor(
            policy.config,
            tokenizer,
            {"observation.state": stats.state.to_dict(), "action": stats.actions.to_dict()},
        )

    def _backbone_of(self, name_or_dir: str) -> Path | None:
        from relay_engine.families.smolvla.files import BACKBONE_DIR, base_files

        if name_or_dir in self.spec.models:
            return base_files(name_or_dir)[1]
        backbone = Path(name_or_dir).expanduser() / BACKBONE_DIR
        return backbone if backbone.is_dir() else None

    def acting_policy(self, name_or_dir: str, device: torch.device) -> ActingPolicy:
        """A tuned SmolVLA acting on observations (closed-loop evaluation): it reads the cameras it
        was trained with, by name, normalized by its own mean and std."""
        from relay_engine.acting import read_norm_stats
        from relay_engine.families.smolvla.learner import ActingSmolVLA

        if name_or_dir in self.spec.models:
            raise ConfigError(
                f"{name_or_dir} acts once a job has tuned it for a robot's cameras: name the job's output",
                param="model",
            )
        directory = Path(name_or_dir).expanduser()
        policy = self.load_model(name_or_dir, device)
        stats = read_norm_stats(directory)
        tokenizer = self.tokenizer(policy, self._backbone_of(name_or_dir))
        return ActingSmolVLA(policy, self.processor(policy, tokenizer, stats), name_or_dir)

    def served_model(
        self,
        model: str | os.PathLike[str],
        *,
        device: str,
        num_steps: int,
        database: str | os.PathLike[str] | None,
        task: str | None,
    ) -> ServedModel:
        """A tuned SmolVLA answering observations with chunks in the robot's units (`relay serve`,
        deployments), over HTTP and openpi's websocket as pi05's policies are."""
        from relay_engine.serving.policy import serve_robot_policy

        return serve_robot_policy(model, device=device, num_steps=num_steps, database=database, task=task)

    def open_session(self, config: Mapping[str, Any], device: torch.device | str) -> Session[Any]:
        """A training-loop session on a SmolVLA base: what lerobot trains by default, on datums."""
        from relay_engine.families.smolvla.session import SmolVLASession

        lora = config.get("finetune") == "lora"
        return SmolVLASession(
            self,
            config["base_model"],
            device=device,
            lora=(int(config["lora_rank"]), float(config["lora_alpha"])) if lora else None,
        )

    def owns_model(self, name_or_dir: str) -> bool:
        import json

        if name_or_dir in self.spec.models:
            return True
        try:
            data = json.loads((Path(name_or_dir).expanduser() / "config.json").read_text())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get("type") == "smolvla"

    def load_model(self, name_or_dir: str, device: torch.device | str = "cpu") -> SmolVLAPolicy:
        """A base by name, or lerobot's files in a directory (a Relay output: its backbone in vlm/)."""
        from relay_engine.families.smolvla.policy import SmolVLAPolicy

        if name_or_dir in self.spec.models:
            policy, _ = self.base_policy(name_or_dir)
        else:
            policy = SmolVLAPolicy.from_lerobot(
                Path(name_or_dir).expanduser(), self._backbone_of(name_or_dir)
            )
        return policy.to(device)

    def describe(self, name: str) -> ModelDescription:
        """The weights per part, and what lerobot's default training trains of them."""
        policy, _ = self.base_policy(name)
        joint = policy.model.vlm_with_expert
        trained = {id(p) for p in policy.trainable()}
        total = sum(p.numel() for p in policy.parameters())
        vision = sum(p.numel() for p in joint.vlm.model.vision_model.parameters())
        backbone = sum(p.numel() for p in joint.vlm.parameters())
        expert = sum(p.numel() for p in joint.lm_expert.parameters())
        parts = {
            "vision": vision,
            "language": backbone - vision,
            "action_expert": expert,
            "projections": total - backbone - expert,  # state, action and time
        }
        trains = sum(p.numel() for p in policy.parameters() if id(p) in trained)
        report = {"model": name, "parameters": total, "trained": trains, "parts": parts}
        headline = (
            f"[bold]{name}[/bold]: {total:,} weights; lerobot's default training trains "
            f"{trains:,} of them (the action expert and the projections)"
        )
        return ModelDescription(report, headline, parts, [f"chunk of {policy.config.chunk_size} actions"])


def _output_writer(
    run: RecipeRun, policy: SmolVLAPolicy, stats: NormStats, backbone_dir: Path | None
) -> Callable[[Path], None]:
    """What writes a job's output (rank 0 alone, whole or not at all): lerobot's SmolVLA folder
    (weights, config, processors), our norm_stats.json and relay_config.json, and the backbone's
    config and tokenizer when the policy came with them, so that the output loads anywhere."""
    from relay_engine.core.checkpoint import write_whole
    from relay_engine.families.smolvla.files import BACKBONE_DIR, write_processors, write_relay_config

    def files(directory: Path) -> None:
        policy.save_lerobot(directory)
        assert policy.lerobot_config is not None  # save_lerobot wrote it
        write_processors(directory, policy.lerobot_config, stats)
        (directory / "norm_stats.json").write_text(stats.to_json())
        write_relay_config(directory, run.recipe.config.model)
        if backbone_dir is not None:
            shutil.copytree(backbone_dir, directory / BACKBONE_DIR, dirs_exist_ok=True)

    def write(output_dir: Path) -> None:
        if run.rank == 0:
            write_whole(output_dir, files)

    return write


def _evaluator(
    run: RecipeRun, policy: SmolVLAPolicy, processor: SmolVLAProcessor, stats: NormStats
) -> Callable[[int, Callable[[], bool]], Event | None] | None:
    """The recipe's `eval` block as the job's closed-loop evaluation of the policy it trains (None
    without one)."""
    config = run.recipe.config
    if config.eval is None:
        return None
    from relay_engine.families.job_eval import JobEvaluator
    from relay_engine.families.smolvla.learner import ActingSmolVLA

    return JobEvaluator(ActingSmolVLA(policy, processor, config.model), stats, config.eval, run.work_dir)
