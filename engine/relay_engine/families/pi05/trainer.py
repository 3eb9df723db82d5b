"""The local trainer: the engine's loop as a library, for a user's own GPU.

    from relay_engine import Trainer, TrainingArguments, load_policy, open_dataset

    model = load_policy("pi05-tiny")
    args = TrainingArguments(output_dir="models/pick-fork", num_train_epochs=3, per_device_train_batch_size=8)
    trainer = Trainer(model=model, args=args, train_dataset=open_dataset("/data/pick-fork"))
    print(trainer.train())          # {'train_loss': 0.31..., 'steps': 42}
    tuned = load_policy("models/pick-fork")

Each epoch reads the dataset in a fresh seeded order; `gradient_accumulation_steps` mini-batches
make one optimizer step, clipped to `max_grad_norm`, at the recipe's warmup + cosine rate.

Under torchrun (`torchrun --nproc-per-node 4 train.py`) the Trainer joins the launcher's group:
each process takes its GPU, reads `per_device_train_batch_size` samples of every mini-batch
(so a mini-batch is that times the number of processes, as in transformers' Trainer), the model
trains under DDP or FSDP (`strategy`), and rank 0 alone writes the output.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch

from relay.checkpoints import parse_checkpoint
from relay.episodes import validation_episodes_value
from relay.events import Event, MetricsEvent, ValidationEvent
from relay.formatting import number_text
from relay.optimizer import AdamParams
from relay.progress import ProgressReport
from relay.sft.config import SFTConfig
from relay_engine.core.data import BatchOrder, DataPosition, MapDataset, batch_loader, select
from relay_engine.core.group import batch_slice, join, launched
from relay_engine.core.loop import LoopResult, LoopState, run_loop
from relay_engine.core.schedule import learning_rate
from relay_engine.datasets import LeRobotDataset
from relay_engine.errors import ConfigError
from relay_engine.families.pi05.evaluate import validation_loss
from relay_engine.families.pi05.export import write_output
from relay_engine.families.pi05.learner import Pi05Learner
from relay_engine.families.pi05.parallel import Parallel, choose_strategy
from relay_engine.families.pi05.sharded_checkpoint import gathered_policy
from relay_engine.families.robot_validation import FrameSplit, Validator, split_frames
from relay_engine.models import Pi05Batch, Pi05Policy
from relay_engine.models.checkpoints import load_checkpoint, resolve_checkpoint
from relay_engine.models.lerobot_files import DescribesRobot
from relay_engine.tuning import apply_tuning

# Where the trainer and a recipe job mean the same thing, the trainer takes the recipe's default
# (SFTConfig's) or AdamParams'; batch size, seed and epochs follow Hugging Face's Trainer instead.
_ADAM = AdamParams(learning_rate=0.0)


@dataclass
class TrainingArguments:
    output_dir: str
    num_train_epochs: int | None = None  # give this or max_steps
    max_steps: int | None = None
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    # None: the model's default, as a recipe's (SFTConfig.default(field, model); pi05-tiny's differ).
    learning_rate: float | None = None
    weight_decay: float = _ADAM.weight_decay
    max_grad_norm: float = _ADAM.grad_clip_norm
    seed: int = 42
    save_strategy: Literal["no", "epoch"] = "no"
    # "torch" runs eagerly; "triton" compiles forward and backward with torch.compile
    # (TorchInductor's Triton kernels), which needs CUDA.
    training_backend: Literal["torch", "triton"] = "torch"
    finetune: Literal["lora", "full"] | None = None
    lora_rank: int = SFTConfig.default("lora_rank")
    lora_alpha: float | None = None
    targets: list[str] | None = None
    logging_steps: int = 10
    # Hugging Face's name: True turns off the progress shown on stderr (a bar on a terminal, lines
    # otherwise, every logging_steps).
    disable_tqdm: bool = False
    dataloader_num_workers: int = 0
    # Under torchrun: auto (fsdp for full, ddp for lora), ddp or fsdp.
    strategy: str = "auto"
    # Episodes of train_dataset held out of training and scored after each epoch and at the end
    # (a recipe's validation_episodes: a list, a text such as "40-49", or a fraction such as 0.1).
    validation_episodes: list[int] | float | str | None = None
    # The weights training starts from, in place of the model's own (a recipe's from_checkpoint):
    # a Hub repo at an optional revision ("team/my-pi05@v2") or a directory, in lerobot's or Relay's
    # format. The model passed gives the architecture, which the checkpoint must be (a job id needs
    # the service: download its output and name the directory).
    from_checkpoint: str | None = None

    def __post_init__(self) -> None:
        if (self.num_train_epochs is None) == (self.max_steps is None):
            raise ConfigError("give exactly one of num_train_epochs and max_steps")
        for name in (
            "num_train_epochs",
            "max_steps",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"bad {name}: {value} (must be at least 1)")
        if self.learning_rate is not None and self.learning_rate <= 0:
            raise ConfigError(f"bad learning_rate: {self.learning_rate} (must be > 0)")
        if self.from_checkpoint is not None:
            try:
                parse_checkpoint(self.from_checkpoint)
            except ValueError as error:
                raise ConfigError(
                    f"bad from_checkpoint: {self.from_checkpoint!r} ({error})", "from_checkpoint"
                ) from None
        if self.save_strategy not in ("no", "epoch"):
            raise ConfigError(f"bad save_strategy: {self.save_strategy!r} (must be 'no' or 'epoch')")
        if self.training_backend not in ("torch", "triton"):
            raise ConfigError(
                f"bad training_backend: {self.training_backend!r} (must be 'torch' or 'triton')"
            )
        try:
            self.validation_episodes = validation_episodes_value(self.validation_episodes)
        except ValueError as error:
            raise ConfigError(
                f"bad validation_episodes: {self.validation_episodes!r} ({error})", "validation_episodes"
            ) from None


class Trainer:
    def __init__(self, model: Pi05Policy, args: TrainingArguments, train_dataset: MapDataset) -> None:
        if args.training_backend == "triton" and not torch.cuda.is_available():
            raise RuntimeError("training_backend='triton' compiles Triton CUDA kernels and needs a CUDA GPU")
        self.args = args
        if args.from_checkpoint is not None:
            # The checkpoint's weights, as the given model's architecture and chunk length.
            model = load_checkpoint(
                resolve_checkpoint(args.from_checkpoint),
                model=model.config.model,
                action_horizon=model.config.action_horizon,
                device=next(model.parameters()).device if not _on_meta(model) else "cpu",
                seed=args.seed,
            )
        self.policy = model
        self.train_dataset = train_dataset
        # What the loop reads: train_dataset, less the episodes a validation split holds out.
        self.training_data, split = _held_out(train_dataset, args)
        self.world = join("auto") if launched() else None
        if self.world is not None and self.world.device != next(model.parameters()).device:
            model = model.to(self.world.device)
        self.device = next(model.parameters()).device
        summary = getattr(getattr(train_dataset, "dataset", train_dataset), "summary", None)
        if summary is not None:  # a LeRobot dataset (or a Subset of one) knows the robot's action width
            model.config = model.config.replace(robot_action_dim=summary.action_dim)
        # The settings left to the model's default, resolved where a recipe resolves them.
        own = model.config.model
        self.learning_rate: float = (
            SFTConfig.default("learning_rate", own) if args.learning_rate is None else args.learning_rate
        )
        self.finetune: str = SFTConfig.default("finetune", own) if args.finetune is None else args.finetune
        self.model = apply_tuning(model, self.finetune, args.targets, args.lora_rank, args.lora_alpha)
        if args.training_backend == "triton":
            # Compiling flow_outputs compiles its forward graph and, through AOTAutograd, the backward.
            self.model.flow_outputs = torch.compile(self.model.flow_outputs)  # type: ignore[method-assign]
        self.parallel = (
            Parallel(self.model, self.world, choose_strategy(args.strategy, self.finetune))
            if self.world is not None
            else None
        )
        self.learner = Pi05Learner(self.model, seed=args.seed, device=self.device, parallel=self.parallel)
        self.validator = (
            None
            if split is None
            else Validator(
                self.model,
                validation_loss(self.model),
                split.dataset,
                split.frames,
                args.seed,
                self.learner.evaluating,
            )
        )
        self.losses: list[float] = []  # every mini-batch's loss
        self.events: list[Event] = []  # metrics and, with a validation split, validation events

    def _steps_per_epoch(self, order: BatchOrder) -> int:
        return math.ceil(order.batches_per_epoch() / self.args.gradient_accumulation_steps)

    def train(self) -> dict[str, float | int]:
        args = self.args
        rank, processes = (self.world.rank, self.world.size) if self.world is not None else (0, 1)
        order = BatchOrder(
            len(self.training_data),
            args.per_device_train_batch_size * processes,
            args.seed,
            span_epochs=False,
        )
        steps_per_epoch = self._steps_per_epoch(order)
        total_steps = (
            args.max_steps if args.max_steps is not None else steps_per_epoch * (args.num_train_epochs or 0)
        )
        batches = batch_loader(
            self.training_data,
            order,
            DataPosition(),
            self.policy.collate,
            args.dataloader_num_workers,
            part=lambda n: batch_slice(n, rank, processes),
        )
        position = DataPosition()
        output_dir = Path(args.output_dir)

        def next_step_batches() -> list[Any]:
            # An optimizer step never spans epochs: the epoch's last step takes what is left.
            nonlocal position
            micro: list[Pi05Batch] = []
            epoch = position.epoch
            while len(micro) < args.gradient_accumulation_steps and position.epoch == epoch:
                _, position = order.next_batch(position)
                micro.append(next(batches))
            return micro

        report = None if args.disable_tqdm or rank != 0 else ProgressReport("training", total_steps)

        def on_event(event: Event) -> None:
            self.events.append(event)
            if report is not None and isinstance(event, MetricsEvent) and event.loss is not None:
                report.update(event.step, f"loss {number_text(event.loss)}")
            if report is not None and isinstance(event, ValidationEvent):
                report.note(f"step {event.step}: validation: {event.describe()}")

        def after_step(state: LoopState) -> None:
            epoch_ended = position.offset == 0 and position.epoch > 0
            if args.save_strategy == "epoch" and epoch_ended:
                self._write(output_dir / f"checkpoint-epoch-{position.epoch}")
            if self.validator is not None and (epoch_ended or state.step == total_steps):
                on_event(self.validator(state.step))

        try:
            result = self._run(next_step_batches, total_steps, after_step, on_event)
        finally:
            if report is not None:
                report.close()
        self._write(output_dir)
        return self._summary(result)

    def _summary(self, result: LoopResult) -> dict[str, float | int]:
        """What train() returns: the mean loss, the steps and, with a validation split, the end's scores."""
        summary: dict[str, float | int] = {
            "train_loss": sum(self.losses) / len(self.losses),
            "steps": result.step,
        }
        validations = [event for event in self.events if isinstance(event, ValidationEvent)]
        if validations:
            last = validations[-1]
            scores = {
                "validation_loss": last.validation_loss,
                "validation_mean_action_mse": last.mean_action_mse,
                "validation_action_spread": last.action_spread,
                "validation_action_mse": last.action_mse,
                "validation_blind_mse": last.blind_mse,
            }
            summary.update({key: value for key, value in scores.items() if value is not None})
        return summary

    def _run(
        self,
        next_step_batches: Callable[[], list[Any]],
        total_steps: int,
        after_step: Callable[[LoopState], None],
        on_event: Callable[[Event], None],
    ) -> LoopResult:
        args = self.args
        return run_loop(
            self.learner,
            next_step_batches,
            state=LoopState(),
            total_steps=total_steps,
            learning_rate_at=lambda step: learning_rate(step, total_steps, self.learning_rate),
            adam=AdamParams(
                learning_rate=self.learning_rate,
                weight_decay=args.weight_decay,
                grad_clip_norm=args.max_grad_norm,
            ),
            on_event=on_event,
            should_stop=lambda: False,
            log_every=args.logging_steps,
            on_batch_loss=self.losses.append,
            after_step=after_step,
        )

    def _write(self, directory: Path) -> None:
        whole = gathered_policy(self.model, self.parallel)
        if whole is not None:
            write_output(whole, directory, self._robot())
        if self.parallel is not None:
            self.parallel.barrier()

    def _robot(self) -> DescribesRobot | None:
        """The training dataset, when it is a robot's (a LeRobot dataset): its stats and features
        go into the output; any other map-style dataset gives weights and configs only."""
        dataset = self.train_dataset
        if all(hasattr(dataset, name) for name in ("norm_stats", "camera_map", "summary")):
            return cast(DescribesRobot, dataset)
        return None


@dataclass(frozen=True)
class _HeldOut:
    dataset: LeRobotDataset
    frames: FrameSplit


def _held_out(dataset: MapDataset, args: TrainingArguments) -> tuple[MapDataset, _HeldOut | None]:
    """The frames to train on and, with args.validation_episodes, the split that holds some out."""
    if args.validation_episodes is None:
        return dataset, None
    if not isinstance(dataset, LeRobotDataset):
        raise ConfigError(
            "bad validation_episodes: it holds out episodes of train_dataset, which must then be a whole "
            "LeRobot dataset (open_dataset's), not a subset or another dataset",
            "validation_episodes",
        )
    split = split_frames(dataset, None, args.validation_episodes, args.seed)
    return select(dataset, split.training.tolist()), _HeldOut(dataset, split)


def _on_meta(model: torch.nn.Module) -> bool:
    """Whether the model holds no values (build_policy(..., device="meta"): an architecture only)."""
    return next(model.parameters()).is_meta
