"""How well a policy's sampled action chunks match a dataset's, in normalized units, and the
blind baseline to judge that by."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from relay_engine.core.data import MapDataset
from relay_engine.datasets import LeRobotDataset, NormStats
from relay_engine.models import Pi05Policy
from relay_engine.samples import Sample


@dataclass(frozen=True)
class EvalResult:
    mse: float  # mean squared error over real (step, dimension) elements, normalized units
    samples: int


def _real_elements(sample: Sample) -> tuple[np.ndarray, np.ndarray]:
    """A sample's chunk and the mask of its real elements: steps before the episode's end and
    the robot's own columns (the padding columns are trained, but no robot reads them)."""
    actions = np.asarray(sample["actions"], dtype=np.float32)
    mask = np.zeros(actions.shape, dtype=bool)
    width = int(sample["action_dim"])
    valid_steps = ~np.asarray(sample["action_is_pad"], dtype=bool)
    mask[:, :width] = valid_steps[:, None]
    return actions, mask


@torch.no_grad()
def evaluate_actions(
    policy: Pi05Policy,
    dataset: MapDataset,
    indices: Sequence[int],
    *,
    batch_size: int = 32,
    num_steps: int = 10,
    seed: int = 0,
    on_batch: Callable[[int], None] | None = None,
) -> EvalResult:
    """Sample a chunk for each frame in `indices` and compare it with the dataset's chunk.

    Padded steps past an episode's end and the padding columns are left out. The sampler's noise
    comes from `seed`, so two evaluations of one policy agree exactly. `on_batch(frames_done)`
    after each batch, for progress.
    """
    policy.eval()
    device = next(policy.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    squared_error, count = 0.0, 0
    for start in range(0, len(indices), batch_size):
        samples = [dataset[i] for i in indices[start : start + batch_size]]
        batch = policy.collate(samples).to(device)
        predicted = policy.sample_actions(batch, num_steps=num_steps, generator=generator).float().cpu()
        for row, sample in enumerate(samples):
            actions, mask = _real_elements(sample)
            width = actions.shape[1]
            error = (predicted[row, :, :width].numpy() - actions) ** 2
            squared_error += float(error[mask].sum())
            count += int(mask.sum())
        if on_batch is not None:
            on_batch(start + len(samples))
    return EvalResult(mse=squared_error / max(count, 1), samples=len(indices))


def blind_baseline(
    train: MapDataset,
    train_indices: Iterable[int],
    held_out: MapDataset,
    held_out_indices: Sequence[int],
) -> EvalResult:
    """The error of a policy that ignores its inputs: it always answers the training frames'
    mean chunk (per step and column). A policy that learned to look must beat it.

    `held_out` may be the training dataset itself (other episodes of it) or another dataset
    normalized with the training set's stats (see `with_norm_stats`).
    """
    total: np.ndarray | None = None
    counts: np.ndarray | None = None
    for i in train_indices:
        actions, mask = _real_elements(train[i])
        if total is None or counts is None:
            total, counts = np.zeros(actions.shape), np.zeros(actions.shape)
        total += np.where(mask, actions, 0.0)
        counts += mask
    if total is None or counts is None:
        raise ValueError("the blind baseline needs at least one training frame")
    mean = total / np.maximum(counts, 1)
    squared_error, count = 0.0, 0
    for i in held_out_indices:
        actions, mask = _real_elements(held_out[i])
        squared_error += float(((mean - actions) ** 2)[mask].sum())
        count += int(mask.sum())
    return EvalResult(mse=squared_error / max(count, 1), samples=len(held_out_indices))


def with_norm_stats(dataset: LeRobotDataset, model_dir: str | Path) -> LeRobotDataset:
    """`dataset`, normalized as the model in `model_dir` was trained (its norm_stats.json), so
    that episodes the model never saw are compared in the model's units."""
    path = Path(model_dir) / "norm_stats.json"
    if path.is_file():
        dataset.norm_stats = NormStats.from_json(path.read_text())
    return dataset
