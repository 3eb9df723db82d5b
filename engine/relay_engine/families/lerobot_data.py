"""What the robot families (pi05, SmolVLA) share of a LeRobot dataset in a recipe job: the dataset
or mixture of datasets a recipe names, the batches of this process from a position of the seeded
order on, and the event saying what was read."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from relay.dataset_mixture import recipe_datasets
from relay.events import DatasetEvent, Event
from relay_engine.core.data import BatchOrder, DataPosition, EpochSamples
from relay_engine.errors import ConfigError
from relay_engine.families.base import RecipeRun

if TYPE_CHECKING:
    from relay_engine.datasets.mixture import DatasetMixture
    from relay_engine.families.robot_validation import FrameSplit
    from relay_engine.image_fit import ImageFit


def open_recipe_data(run: RecipeRun, image_fit: ImageFit | None = None) -> DatasetMixture:
    """The recipe's dataset (a mixture of one, at its share of 1) or its mixture of datasets, opened
    with pi05's camera slots, video cameras decoded at `image_fit`'s size (the model's). One dataset
    is opened as it always was (its own norm_stats.json, if it ships one); a mixture's statistics
    are over all its frames (relay_engine.datasets.mixture)."""
    from relay_engine.datasets import open_dataset
    from relay_engine.datasets.mixture import DatasetMixture, open_mixture

    recipe = run.recipe
    sources = recipe_datasets(recipe.config)
    if len(sources) == 1:
        only = sources[0]
        dataset = open_dataset(
            only.name,
            cameras=only.cameras,
            action_horizon=recipe.action_horizon,
            cache_dir=run.dataset_cache_dir,
            revision=only.revision,
            image_fit=image_fit,
        )
        return DatasetMixture([dataset], [1.0])
    if recipe.episodes is not None:
        raise ConfigError("episodes selects episodes of one dataset; a mixture trains on all of each one's")
    return open_mixture(
        sources, action_horizon=recipe.action_horizon, cache_dir=run.dataset_cache_dir, image_fit=image_fit
    )


@dataclass(frozen=True)
class TrainingFrames:
    """What the seeded order reads of a recipe's data: `dataset[i]` for the training frames i in
    `indices`; an epoch is `samples` of them, `epoch_samples` choosing which (None: each once)."""

    dataset: Any
    indices: np.ndarray
    samples: int
    epoch_samples: EpochSamples | None = None


def training_frames(mixture: DatasetMixture, splits: Sequence[FrameSplit], seed: int) -> TrainingFrames:
    """One dataset's training split, or a mixture's training frames drawn at their shares afresh
    each epoch (WeightedFrames)."""
    from relay_engine.datasets.mixture import WeightedFrames

    if len(mixture.parts) == 1:
        training = splits[0].training
        return TrainingFrames(mixture.first, training, len(training))
    weighted = WeightedFrames(mixture, [split.training for split in splits], seed)
    return TrainingFrames(weighted, np.arange(len(weighted)), sum(weighted.counts), weighted.epoch_samples)


def lerobot_batches(
    run: RecipeRun, dataset: Any, indices: np.ndarray, collate: Callable[[Any], Any]
) -> Callable[[BatchOrder, DataPosition], Iterator[Any]]:
    """The batches of the frames `indices` (the training split), this process's part of each."""
    from relay_engine.core.data import batch_loader, select
    from relay_engine.core.group import batch_slice

    recipe = run.recipe
    # The training frames alone: held-out and left-out episodes are never read by the sampler.
    subset = select(dataset, indices.tolist()) if len(indices) != len(dataset) else dataset
    num_workers = (
        recipe.num_workers if recipe.num_workers is not None else (0 if run.device.type == "cpu" else 8)
    )

    def batches(order: BatchOrder, position: DataPosition) -> Iterator[Any]:
        return batch_loader(
            subset,
            order,
            position,
            collate,
            num_workers,
            part=lambda n: batch_slice(n, run.rank, run.processes),
        )

    return batches


def dataset_read(data: Any) -> Callable[[int], Event] | None:
    """The DatasetEvent of what `open_dataset` read (the whole dataset's episodes and frames); of a
    mixture (a DatasetMixture of several), its first dataset's, with every one's in ``mixture``."""
    parts = getattr(data, "parts", [data])
    if any(part.source is None for part in parts):
        return None
    if len(parts) == 1:
        source, summary = parts[0].source, parts[0].summary
        return lambda step: source.event(step, frames=summary.frames, episodes=summary.episodes)

    def read(step: int) -> Event:
        events = [
            part.source.event(step, frames=part.summary.frames, episodes=part.summary.episodes)
            for part in parts
        ]
        mixture = [
            {**{k: v for k, v in event.items() if k not in ("step", "event")}, "share": share}
            for event, share in zip(events, data.shares, strict=True)
        ]
        first = {k: v for k, v in events[0].items() if k not in ("step", "event")}
        return DatasetEvent(step=step, **first, mixture=mixture)

    return read
