"""A robot recipe's validation split (pi05's, SmolVLA's): which frames train, which held-out frames
are scored, and the scoring at each checkpoint (docs/evaluation.md, "Validation during training").

`split_frames` resolves a `validation_episodes` (relay.episodes) against the opened dataset: the
held-out episodes leave the frames the training sampler shuffles, so no step ever reads them.
`Validator` scores the held-out frames with the evaluator `relay local eval` uses
(families/robot_scores.py) and the family's own flow-matching loss (`ValidationLoss`): the loss,
the error of the mean of CHUNKS_PER_FRAME
sampled chunks (the headline), their spread, one chunk's error, and the blind baseline's, each with
the same seeded noise on the same frames every time, so checkpoints compare.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from relay.episodes import held_out_episodes
from relay.events import CHUNKS_PER_FRAME, ValidationEvent
from relay_engine.datasets import LeRobotDataset
from relay_engine.errors import ConfigError
from relay_engine.families.robot_scores import ActionChunks, blind_baseline, evaluate_actions

# The family's flow-matching loss on held-out frames (dataset, frame indices, seed) -> their mean:
# the same noise for the same frames every time, so checkpoints compare (pi05:
# families/pi05/evaluate.py:flow_loss).
ValidationLoss = Callable[[LeRobotDataset, Sequence[int], int], float]

# Held-out frames scored at each checkpoint, at most, evenly spaced over the held-out episodes:
# 256 frames keep a checkpoint's scoring to seconds (each frame's prefix pass, then 10 denoising
# passes for each of its CHUNKS_PER_FRAME chunks).
VALIDATION_FRAMES_MAX = 256
# The blind baseline's mean chunk is taken over at most this many training frames, evenly spaced
# (read without images, once per run).
BLIND_FRAMES_MAX = 10_000


@dataclass(frozen=True)
class FrameSplit:
    """The frames a run trains on and the held-out ones it scores."""

    training: np.ndarray  # frame indices, ascending: what the training sampler shuffles
    held_out_episodes: list[int]  # empty without a validation split
    scored: np.ndarray  # held-out frames scored at each checkpoint (at most VALIDATION_FRAMES_MAX)

    @property
    def validates(self) -> bool:
        return bool(self.held_out_episodes)


def evenly_spaced(indices: np.ndarray, limit: int) -> np.ndarray:
    """At most `limit` of `indices`, evenly spaced from the first to the last (all when they fit)."""
    if len(indices) <= limit:
        return indices
    return indices[np.linspace(0, len(indices) - 1, limit).round().astype(np.int64)]


def split_frames(
    dataset: LeRobotDataset,
    episodes: Sequence[int] | None,
    validation_episodes: list[int] | float | str | None,
    seed: int,
) -> FrameSplit:
    """The run's training frames (those of `episodes`, all by default, less the held-out episodes)
    and the held-out frames to score. ConfigError, naming the field, for held-out episodes the
    dataset lacks or a split that leaves nothing to train on."""
    training_episodes = None if episodes is None else np.unique(np.asarray(list(episodes), dtype=np.int64))
    held: list[int] = []
    if validation_episodes is not None:
        held = held_out_episodes(validation_episodes, dataset.episodes, seed, training=training_episodes)
    if training_episodes is None and not held:
        return FrameSplit(np.arange(len(dataset)), [], np.zeros(0, dtype=np.int64))
    pool = dataset.episodes if training_episodes is None else training_episodes
    training = dataset.indices_of_episodes(pool[~np.isin(pool, held)])
    if len(training) == 0:
        raise ConfigError("the selected episodes hold no frames")
    scored = evenly_spaced(dataset.indices_of_episodes(held), VALIDATION_FRAMES_MAX)
    return FrameSplit(training, held, scored)


class Validator:
    """Scores a policy on a split's held-out frames: `validator(step)` -> a ValidationEvent.

    The blind baseline (always the training frames' mean chunk) does not change as the policy
    trains: it is scored once, here. In a group every process scores the same frames (FSDP needs
    every process in each forward pass); rank 0 reports."""

    def __init__(
        self,
        policy: Any,
        loss: ValidationLoss,
        dataset: LeRobotDataset,
        split: FrameSplit,
        seed: int,
        context: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        self.policy = policy  # what evaluate_actions scores: `collate` and `sample_actions`
        self.loss = loss
        self.dataset = dataset
        self.frames = [int(i) for i in split.scored]
        self.episodes = len(split.held_out_episodes)
        self.seed = seed
        self.context = context  # where the policy runs as it trains (the learner's autocast)
        chunks = ActionChunks(dataset)
        training = evenly_spaced(split.training, BLIND_FRAMES_MAX)
        self.blind_mse = blind_baseline(chunks, training, chunks, self.frames).mse

    def __call__(self, step: int) -> ValidationEvent:
        started = time.perf_counter()
        with self.context():
            loss = self.loss(self.dataset, self.frames, self.seed)
            actions = evaluate_actions(
                self.policy, self.dataset, self.frames, seed=self.seed, chunks=CHUNKS_PER_FRAME
            )
        return ValidationEvent(
            step=step,
            validation_loss=loss,
            mean_action_mse=actions.mean_mse,
            action_spread=actions.spread,
            action_mse=actions.mse,
            blind_mse=self.blind_mse,
            chunks=actions.chunks,
            frames=len(self.frames),
            episodes=self.episodes,
            seconds=time.perf_counter() - started,
        )


class MixtureValidator:
    """A mixture's validation: each dataset's held-out episodes scored by its own Validator, reported
    in one ValidationEvent: each dataset's figures in ``datasets``, and beside them the figures over
    all the scored frames (each dataset's mean weighted by its frames)."""

    FIGURES = ("validation_loss", "mean_action_mse", "action_spread", "action_mse", "blind_mse")

    def __init__(self, validators: Sequence[tuple[str, Validator]]) -> None:
        self.validators = list(validators)

    def __call__(self, step: int) -> ValidationEvent:
        started = time.perf_counter()
        scored = [(name, validator(step)) for name, validator in self.validators]
        frames = sum(event.frames for _, event in scored)
        overall: dict[str, float | None] = {}
        for figure in self.FIGURES:
            values = [(event.get(figure), event.frames) for _, event in scored]
            known = [(float(value), count) for value, count in values if value is not None]
            overall[figure] = (
                sum(value * count for value, count in known) / sum(count for _, count in known)
                if known and len(known) == len(values)
                else None
            )
        datasets = [
            {"dataset": name, **{k: v for k, v in event.items() if k not in ("step", "event", "seconds")}}
            for name, event in scored
        ]
        return ValidationEvent(
            step=step,
            **overall,
            chunks=scored[0][1].chunks,
            frames=frames,
            episodes=sum(event.episodes for _, event in scored),
            seconds=time.perf_counter() - started,
            datasets=datasets,
        )


def robot_validator(
    policy: Any,
    loss: ValidationLoss,
    datasets: Sequence[LeRobotDataset],
    splits: Sequence[FrameSplit],
    seed: int,
    context: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
) -> Validator | MixtureValidator | None:
    """What scores a recipe's held-out episodes: one dataset's Validator, a mixture's MixtureValidator
    (each dataset's own), or None without a validation split."""
    validators = [
        (dataset.name, Validator(policy, loss, dataset, split, seed, context))
        for dataset, split in zip(datasets, splits, strict=True)
        if split.validates
    ]
    if not validators:
        return None
    return validators[0][1] if len(datasets) == 1 else MixtureValidator(validators)
