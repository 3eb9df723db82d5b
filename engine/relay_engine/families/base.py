"""What a model family gives the engine: `Family`, and what it prepares for a recipe (`PreparedRecipe`).

The recipe driver (relay_engine.recipe) owns everything a job does whatever it trains: resuming
(the fingerprint check, the checkpoint's loop state and data position), the seeded batch order,
checkpoints, the `resumed` event, the loop, the stop with a checkpoint and the result. A family
owns what only it knows: its data, its model and learner, the optimizer's settings, how its
checkpoints are laid out and how its output directory is written. Sessions (`open_session`), the
local evaluator (`evaluate`), saved models (`load_model`) and synthetic data (`synthesize`) ask
the family of the model too.
"""

from __future__ import annotations

import contextlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from relay.events import CHUNKS_PER_FRAME, Event
from relay.families import FamilySpec
from relay.optimizer import AdamParams
from relay_engine.core.checkpoint import CheckpointStore
from relay_engine.core.data import BatchOrder, DataPosition, EpochSamples
from relay_engine.core.learner import Learner
from relay_engine.errors import ConfigError, EngineError

if TYPE_CHECKING:
    from relay_engine.acting import ActingPolicy
    from relay_engine.core.group import GroupCollectives, World
    from relay_engine.core.session import Session
    from relay_engine.recipe import Recipe
    from relay_engine.serving.served import ServedModel


@dataclass(frozen=True)
class RecipeRun:
    """Where a recipe runs: its work directory, its device and, under torch.distributed.run, its group."""

    recipe: Recipe
    work_dir: Path
    device: torch.device
    world: World | None = None
    dataset_cache_dir: Path | None = None
    # The keys of the recipe's trackers the service held apart from the job, by environment variable
    # (relay.integrations.tracker_secrets); never shown (repr=False).
    tracker_secrets: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def rank(self) -> int:
        return self.world.rank if self.world is not None else 0

    @property
    def processes(self) -> int:
        return self.world.size if self.world is not None else 1


# This process's batches from a position of the seeded order on: the driver moves the position.
BatchSource = Callable[[BatchOrder, DataPosition], Iterator[Any]]


@dataclass
class PreparedRecipe:
    """A family's part of a recipe job, ready to train."""

    learner: Learner[Any]
    # How many samples the seeded order shuffles, and how many make a step's batch.
    samples: int
    batch_size: int
    batches: BatchSource
    adam: AdamParams
    # Writes the trained model into the output directory (every process calls it; the family
    # decides which one writes).
    write_output: Callable[[Path], None]
    parallel: GroupCollectives | None = None
    # Which samples an epoch reads, when not each index once (a mixture's draw at its shares).
    epoch_samples: EpochSamples | None = None
    # What the result says beyond the step and loss (pi05: processes and strategy).
    extra: dict[str, Any] = field(default_factory=dict)
    # What the run read (pi05: a DatasetEvent), reported once at the step it starts from.
    data_read: Callable[[int], Event] | None = None
    # Where the starting weights came from (pi05 with from_checkpoint: a WeightsEvent), reported once
    # at the step it starts from, after data_read.
    weights_read: Callable[[int], Event] | None = None
    # The held-out scores at a step (pi05 with validation_episodes: a ValidationEvent), after each
    # checkpoint; every process calls it, rank 0 reports it.
    validate: Callable[[int], Event] | None = None
    # The recipe's `eval` block (pi05): the policy run in a simulator at a step (an EvalEvent), at
    # the end and, with eval.at_checkpoints, after each checkpoint; rank 0 alone runs it. Its
    # second argument is the run's should_stop, asked between two environment steps: None when it
    # stopped the evaluation (a cancel), which then reports nothing.
    evaluate_in_env: Callable[[int, Callable[[], bool]], Event | None] | None = None
    evaluate_at_checkpoints: bool = False

    def save_checkpoint(self, store: CheckpointStore, step: int, meta: dict[str, object]) -> None:
        """The learner's state in one complete checkpoint (a family laid out otherwise overrides it)."""
        store.save(step, self.learner.save_state, meta=meta)

    def load_checkpoint(self, directory: Path) -> None:
        self.learner.load_state(directory)


class Family(ABC):
    """One model family: its spec (the SDK's rules) and its engine."""

    spec: FamilySpec
    # Whether a name or directory that no family claims is this family's to try (pi05's
    # load_policy reads Hub repos and output directories).
    reads_other_models: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    def recipe_context(self, run: RecipeRun) -> contextlib.AbstractContextManager[None]:
        """What holds while a recipe of this family runs (rt-j-tiny: one torch thread)."""
        return contextlib.nullcontext()

    @abstractmethod
    def prepare_recipe(self, run: RecipeRun) -> PreparedRecipe:
        """Open the recipe's data, build its model and learner: everything but the loop."""

    @abstractmethod
    def open_session(self, config: Mapping[str, Any], device: torch.device | str) -> Session[Any]:
        """A training-loop session's model, from a validated SessionConfig's fields."""

    def owns_model(self, name_or_dir: str) -> bool:
        """Whether a base model's name or a saved model's directory is this family's."""
        return name_or_dir in self.spec.models

    def evaluate(
        self, request: EvaluationRequest, on_progress: Callable[[int, int], None] | None = None
    ) -> dict[str, Any]:
        """`relay local eval`: the family's metrics of a model on a dataset; `on_progress(done, of)`
        hears how far it is, where it takes long."""
        raise EngineError(f"{self.name} models have no evaluation")

    def describe(self, name: str) -> ModelDescription:
        """`relay models info` of a named model that trains every weight (no tuning settings)."""
        raise EngineError(f"{self.name} models have no description")

    def evaluation_lines(self, report: dict[str, Any], request: EvaluationRequest) -> list[str]:
        """The evaluation's report as `relay local eval` prints it."""
        return [json.dumps(report)]

    def load_model(self, name_or_dir: str, device: torch.device | str = "cpu") -> Any:
        """A base model by name, or a model saved in a recipe's output directory."""
        raise EngineError(f"{self.name} models cannot be loaded here")

    def synthesize(self, directory: Path, **options: Any) -> Any:
        """Synthetic training data for the family, written to `directory`."""
        raise EngineError(f"{self.name} has no synthetic data")

    def acting_policy(self, name_or_dir: str, device: torch.device) -> ActingPolicy:
        """The model as a policy that acts on observations (what closed-loop evaluation and
        serving run); a ConfigError for a family whose models do not act."""
        raise ConfigError(
            f"{name_or_dir} is a {self.name} model; only robot policies act on observations "
            "(in an environment, or served)"
        )

    def served_model(
        self,
        model: str | os.PathLike[str],
        *,
        device: str,
        num_steps: int,
        database: str | os.PathLike[str] | None,
        task: str | None,
    ) -> ServedModel:
        """The model loaded for the policy server (`relay serve`, deployments): `num_steps` is a
        robot policy's, `database` and `task` a model's that predicts a database's task."""
        raise ConfigError(f"{model}: {self.name} models are not served", param="model")


@dataclass(frozen=True)
class ModelDescription:
    """What `relay models info` shows of a model: the JSON report, or as text a headline, the
    weights per part and notes (rich markup)."""

    report: dict[str, Any]
    headline: str
    parts: dict[str, int]
    notes: list[str]


@dataclass(frozen=True)
class EvaluationRequest:
    """What `relay local eval` asks: a model (a name or a directory) on a dataset's examples."""

    model: str
    dataset: str
    device: str = "auto"
    seed: int = 0
    # pi05's: which episodes, and the blind baseline's.
    episodes: list[int] | None = None
    blind_from: list[int] | None = None
    blind_from_text: str | None = None  # as the user wrote the episodes, for the report
    batch_size: int = 32
    num_steps: int = 10
    chunks: int = CHUNKS_PER_FRAME  # chunks sampled per frame: their mean is scored
    # The robot families': score in the units of this model directory's norm_stats.json (a base
    # compared with a tuned model in the tuned one's units); None: the model's own, else the dataset's.
    norm_stats_from: str | None = None
    # RT-J's: the task (default: the model's) and its split.
    task: str | None = None
    split: str = "val"
    tasks_dir: str | None = None  # where the database's tasks are kept, when apart from it
