"""What the robot families (pi05, SmolVLA) share of a LeRobot dataset in a recipe job: the batches
of this process from a position of the seeded order on, and the event saying what was read."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from relay.events import Event
from relay_engine.core.data import BatchOrder, DataPosition
from relay_engine.families.base import RecipeRun


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


def dataset_read(dataset: Any) -> Callable[[int], Event] | None:
    """The DatasetEvent of what `open_dataset` read (the whole dataset's episodes and frames)."""
    source, summary = dataset.source, dataset.summary
    if source is None:
        return None
    return lambda step: source.event(step, frames=summary.frames, episodes=summary.episodes)
