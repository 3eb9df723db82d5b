"""RelationalTrainer: full fine-tuning of RT-J on labelled contexts, and head tuning, through the
engine's loop (relay_engine.core.loop.run_loop) and RT-J's learner.

Binary and regression tasks train every weight on the model's target_scores. Multiclass and
multilabel tasks train a linear head on the (frozen) target cell features; the head is saved under
`heads/<name>/` beside the model and reloads with it.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import torch

from relay.events import Event, MetricsEvent
from relay.optimizer import AdamParams
from relay_engine.core.loop import LoopState, run_loop
from relay_engine.families.rtj.batch import collate
from relay_engine.families.rtj.learner import LabelledBatch, RelationalLearner
from relay_engine.families.rtj.losses import PROBLEM_TYPES, SCALAR_PROBLEM_TYPES
from relay_engine.families.rtj.transformer import RelationalTransformer, TaskHead

TRAINING_BACKENDS: tuple[str, ...] = ("torch", "triton")
SAVE_STRATEGIES: tuple[str, ...] = ("epoch", "steps", "no")
# Where save_strategy="steps" writes the checkpoint of optimizer step N, under output_dir.
STEP_CHECKPOINT_DIR = "checkpoint-{step}"
# A head's name is its directory's under heads/: no separators, no leading dot.
_HEAD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass
class RelationalExample:
    """One labelled context: `input` is one context (batch size 1) in any form the model takes
    (RelationalTransformer.as_batch); `target` names the target cell(s) when it is an array of
    cells, a batch already marks them. `label`: 0/1 (binary), a number (regression, forecasting),
    a class index (multiclass) or a list of 0/1 (multilabel)."""

    input: Any
    label: Any
    target: int | Sequence[int] | None = None


class RelationalDataset(Sequence[RelationalExample]):
    """A non-empty list of RelationalExamples, checked once: what train_dataset and the
    evaluators take (any sequence of examples does)."""

    def __init__(self, examples: Iterable[RelationalExample]) -> None:
        self.examples = list(examples)
        if not self.examples:
            raise ValueError("examples: a RelationalDataset needs at least one example")
        strays = sorted({type(e).__name__ for e in self.examples if not isinstance(e, RelationalExample)})
        if strays:
            raise TypeError(f"examples: every item must be a RelationalExample, got {', '.join(strays)}")

    @classmethod
    def from_inputs(cls, inputs: Sequence[Any], labels: Sequence[Any]) -> RelationalDataset:
        """Examples pairing each input (anything the model takes) with its label."""
        if len(inputs) != len(labels):
            raise ValueError(
                f"inputs and labels must have the same length, got {len(inputs)} and {len(labels)}"
            )
        return cls(RelationalExample(value, label) for value, label in zip(inputs, labels, strict=True))

    @overload
    def __getitem__(self, index: int) -> RelationalExample: ...

    @overload
    def __getitem__(self, index: slice) -> list[RelationalExample]: ...

    def __getitem__(self, index: int | slice) -> RelationalExample | list[RelationalExample]:
        return self.examples[index]

    def __len__(self) -> int:
        return len(self.examples)


@dataclass
class RelationalTrainingArguments:
    output_dir: str = "relational_model"
    num_train_epochs: int = 1
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-5
    weight_decay: float = 1e-2
    max_grad_norm: float = 1.0
    seed: int = 42
    # Every this many optimizer steps (and at the last) the trainer appends the window's mean loss
    # to its log_history.
    logging_steps: int = 10
    save_strategy: str = "epoch"
    # With save_strategy="steps": a checkpoint every this many optimizer steps.
    save_steps: int = 500
    training_backend: str = "torch"
    # None: the loaded checkpoint's (regression, else binary).
    problem_type: str | None = None
    # The name a head-tuned task's head is saved under.
    head_name: str = "task"

    def __post_init__(self) -> None:
        positive = {
            "num_train_epochs": self.num_train_epochs,
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "logging_steps": self.logging_steps,
            "save_steps": self.save_steps,
        }
        for name, value in positive.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be greater than 0, got {self.learning_rate!r}")
        if self.weight_decay < 0 or not self.max_grad_norm > 0:
            raise ValueError("weight_decay must be at least 0 and max_grad_norm greater than 0")
        if self.save_strategy not in SAVE_STRATEGIES:
            raise ValueError(
                f"save_strategy must be one of {', '.join(SAVE_STRATEGIES)}, got {self.save_strategy!r}"
            )
        if self.training_backend not in TRAINING_BACKENDS:
            raise ValueError(
                f"training_backend must be one of {', '.join(TRAINING_BACKENDS)}, "
                f"got {self.training_backend!r}"
            )
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ValueError(
                f"problem_type must be one of {', '.join(PROBLEM_TYPES)}, got {self.problem_type!r}"
            )


class RelationalTrainer:
    def __init__(
        self,
        *,
        model: RelationalTransformer,
        args: RelationalTrainingArguments,
        train_dataset: Sequence[RelationalExample],
        task: str | None = None,
        problem_type: str | None = None,
    ) -> None:
        if model.backend_name != "torch":
            raise RuntimeError(f"fine-tuning requires the torch backend, not {model.backend_name!r}")
        if args.training_backend == "triton" and model.device.type != "cuda":
            raise RuntimeError("training_backend='triton' (torch.compile with Triton kernels) requires CUDA")
        self.transformer = model
        self.args = args
        self.train_dataset = list(train_dataset)
        if not self.train_dataset:
            raise ValueError("train_dataset must hold at least one example")
        self.problem_type = problem_type or args.problem_type or model.problem_type
        if self.problem_type not in PROBLEM_TYPES:
            raise ValueError(
                f"problem_type must be one of {', '.join(PROBLEM_TYPES)}, got {self.problem_type!r}"
            )
        if task is not None and not (isinstance(task, str) and _HEAD_NAME.fullmatch(task)):
            raise ValueError(
                "task must be None or a name of letters, digits, '_', '.' and '-' that starts with "
                f"a letter or digit (it names the head's directory), got {task!r}"
            )
        # The task's name; a head-tuned task's head is saved and served under it (when None, under
        # args.head_name).
        self.task = task
        self.head_name = task or args.head_name
        self.losses: list[float] = []
        # One entry every logging_steps optimizer steps: step, epoch, loss, grad_norm, learning_rate.
        self.log_history: list[dict[str, float]] = []

    def train(self) -> dict[str, float | int]:
        if self.problem_type in SCALAR_PROBLEM_TYPES:
            self._train_full()
        else:
            self._train_head()
        return {"train_loss": self.losses[-1], "steps": len(self.losses)}

    def _batches(self, rng: random.Random) -> list[list[RelationalExample]]:
        order = list(self.train_dataset)
        rng.shuffle(order)
        size = self.args.per_device_train_batch_size
        return [order[start : start + size] for start in range(0, len(order), size)]

    def _labels(self, examples: Sequence[RelationalExample]) -> torch.Tensor:
        return torch.as_tensor([example.label for example in examples], device=self.transformer.device)

    def _train_full(self) -> None:
        args, network = self.args, self.transformer.model
        torch.manual_seed(args.seed)
        forward = (
            torch.compile(network, backend="inductor", dynamic=True)
            if args.training_backend == "triton"
            else network
        )
        learner = self._learner(network, forward)

        def batch_of(examples: Sequence[RelationalExample]) -> LabelledBatch:
            contexts = [
                self.transformer.as_batch(example.input, target=example.target) for example in examples
            ]
            return LabelledBatch(collate(contexts), self._labels(examples))

        self._run(learner, batch_of, self._save_to)
        network.eval()

    def _train_head(self) -> None:
        """The backbone stays frozen: each context's target features are computed once."""
        args, transformer = self.args, self.transformer
        torch.manual_seed(args.seed)
        features = {id(example): _features(transformer, example) for example in self.train_dataset}
        labels = [example.label for example in self.train_dataset]
        num_labels = (
            int(max(int(label) for label in labels)) + 1
            if self.problem_type == "multiclass"
            else len(labels[0])
        )
        head = TaskHead(transformer.model.config.d_model, num_labels, self.problem_type).to(
            transformer.device
        )
        learner = self._learner(head, head)

        def batch_of(examples: Sequence[RelationalExample]) -> LabelledBatch:
            inputs = torch.stack([features[id(example)] for example in examples])
            return LabelledBatch(inputs, self._labels(examples))

        def save_to(directory: Path) -> None:
            head.eval()
            transformer.heads[self.head_name] = head
            self._save_to(directory)
            head.train()

        self._run(learner, batch_of, save_to)
        head.eval()
        transformer.heads[self.head_name] = head  # served at once, saved or not (save_strategy="no")

    def _learner(self, network: torch.nn.Module, forward: Callable[[Any], torch.Tensor]) -> RelationalLearner:
        return RelationalLearner(
            network,
            self.problem_type,
            seed=self.args.seed,
            device=self.transformer.device,
            accumulation=self.args.gradient_accumulation_steps,
            forward=forward,
        )

    def _run(
        self,
        learner: RelationalLearner,
        batch_of: Callable[[Sequence[RelationalExample]], LabelledBatch],
        save_to: Callable[[Path], None],
    ) -> None:
        """The engine's loop (run_loop) over the epochs: a step is one optimizer step, on up to
        `gradient_accumulation_steps` micro-batches of one epoch, at the constant rate. `save_to`
        writes a checkpoint where save_strategy says: output_dir after each epoch ("epoch"), or
        output_dir/checkpoint-<step> every save_steps steps ("steps")."""
        args = self.args
        steps = _EpochSteps(self, random.Random(args.seed))
        total_steps = steps.per_epoch * args.num_train_epochs
        adam = AdamParams(
            learning_rate=args.learning_rate,
            beta1=0.9,
            beta2=0.999,
            eps=1e-8,
            weight_decay=args.weight_decay,
            grad_clip_norm=args.max_grad_norm,
        )

        output_dir = Path(args.output_dir)

        def after_step(state: LoopState) -> None:
            if args.save_strategy == "epoch" and state.step % steps.per_epoch == 0:
                save_to(output_dir)
            elif args.save_strategy == "steps" and state.step % args.save_steps == 0:
                save_to(output_dir / STEP_CHECKPOINT_DIR.format(step=state.step))

        def log(event: Event) -> None:
            if isinstance(event, MetricsEvent) and event.loss is not None:
                entry = {"step": event.step, "epoch": event.step / steps.per_epoch, "loss": event.loss}
                if event.grad_norm is not None:
                    entry["grad_norm"] = event.grad_norm
                if event.lr is not None:
                    entry["learning_rate"] = event.lr
                self.log_history.append(entry)

        run_loop(
            learner,
            lambda: [batch_of(examples) for examples in steps.next_step()],
            state=LoopState(),
            total_steps=total_steps,
            learning_rate_at=lambda step: args.learning_rate,
            adam=adam,
            on_event=log,
            should_stop=lambda: False,
            log_every=args.logging_steps,
            on_batch_loss=self.losses.append,
            after_step=after_step,
        )

    def _save_to(self, directory: Path) -> None:
        self.transformer.config = {**self.transformer.config, "problem_type": self._saved_problem_type()}
        self.save_model(directory)

    def _saved_problem_type(self) -> str:
        # A head-tuned model's own score output is unchanged, so its checkpoint default is too.
        if self.problem_type in SCALAR_PROBLEM_TYPES:
            return self.problem_type
        return self.transformer.problem_type

    def save_model(self, directory: str | Path | None = None) -> None:
        self.transformer.save_pretrained(directory or self.args.output_dir)


def _features(transformer: RelationalTransformer, example: RelationalExample) -> torch.Tensor:
    """The frozen target features of one example's context, [d_model]."""
    features = transformer.encode(
        example.input, target=example.target, output_value="target_features", convert_to_numpy=False
    )
    assert isinstance(features, torch.Tensor)
    return features.squeeze(0).float()


class _EpochSteps:
    """The micro-batches of each optimizer step: an epoch's shuffled batches, in groups of
    `gradient_accumulation_steps` (the last group of an epoch may be short)."""

    def __init__(self, trainer: RelationalTrainer, rng: random.Random) -> None:
        self.trainer = trainer
        self.rng = rng
        self.accumulation = trainer.args.gradient_accumulation_steps
        batches = math.ceil(len(trainer.train_dataset) / trainer.args.per_device_train_batch_size)
        self.per_epoch = math.ceil(batches / self.accumulation)
        self._pending: list[list[RelationalExample]] = []

    def next_step(self) -> list[list[RelationalExample]]:
        if not self._pending:
            self._pending = self.trainer._batches(self.rng)
        group, self._pending = self._pending[: self.accumulation], self._pending[self.accumulation :]
        return group
