"""How well a policy's sampled action chunks match a dataset's, in normalized units."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from relay_engine.models import Pi05Policy
from relay_engine.training.data import MapDataset


@dataclass(frozen=True)
class EvalResult:
    mse: float  # mean squared error over real (step, dimension) elements, normalized units
    samples: int


@torch.no_grad()
def evaluate_actions(
    policy: Pi05Policy,
    dataset: MapDataset,
    indices: Sequence[int],
    *,
    batch_size: int = 32,
    num_steps: int = 10,
    seed: int = 0,
) -> EvalResult:
    """Sample a chunk for each frame in `indices` and compare it with the dataset's chunk.

    Padded steps past an episode's end and padded action dimensions are left out, as in the loss.
    The sampler's noise comes from `seed`, so two evaluations of one policy agree exactly.
    """
    policy.eval()
    device = next(policy.parameters()).device
    # Sample every policy, trained or not, knowing the robot's action width (see sample_actions).
    summary = getattr(dataset, "summary", None)
    robot_action_dim = summary.action_dim if summary is not None else None
    generator = torch.Generator().manual_seed(seed)
    squared_error, count = 0.0, 0
    for start in range(0, len(indices), batch_size):
        batch = policy.collate([dataset[i] for i in indices[start : start + batch_size]]).to(device)
        predicted = policy.sample_actions(
            batch, num_steps=num_steps, generator=generator, robot_action_dim=robot_action_dim
        ).float()
        mask = batch.action_mask.float()
        squared_error += float((((predicted - batch.actions.float()) ** 2) * mask).sum())
        count += int(mask.sum())
    return EvalResult(mse=squared_error / max(count, 1), samples=len(indices))
