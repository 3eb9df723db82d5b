"""pi05's validation loss: the flow-matching loss, as pi05 trains it, on frames it never trained on
(a recipe's validation split, families/robot_validation.py, reports it beside the robot scores of
families/robot_scores.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from relay_engine.core.data import MapDataset
from relay_engine.families.robot_scores import EVAL_BATCH_SIZE
from relay_engine.families.robot_validation import ValidationLoss
from relay_engine.models import Pi05Policy, flow_matching_loss, sample_flow_time


@torch.no_grad()
def flow_loss(
    policy: Pi05Policy,
    dataset: MapDataset,
    indices: Sequence[int],
    *,
    batch_size: int = EVAL_BATCH_SIZE,
    seed: int = 0,
) -> float:
    """The flow-matching loss (training's definition, padding balanced as the model trains) on the
    frames in `indices`, without gradients: their mean, each frame weighted as in training.

    The noise and flow times come from `seed`, drawn in the order of `indices`, so the same frames
    give the same loss for the same weights: losses of two checkpoints differ by their weights
    alone."""
    policy.eval()
    generator = torch.Generator().manual_seed(seed)
    weighted, total_weight = 0.0, 0.0
    for start in range(0, len(indices), batch_size):
        samples = [dataset[i] for i in indices[start : start + batch_size]]
        batch = policy.collate(samples)
        noise = torch.randn(batch.actions.shape, generator=generator)
        time = sample_flow_time(batch.actions.shape[0], generator)
        outputs = policy.flow_outputs(batch, noise=noise, time=time)
        _, per_sample = flow_matching_loss(outputs, batch, balance_padding=policy.config.balance_padding)
        weights = batch.weights.to(per_sample.device, per_sample.dtype)
        weighted += float((weights * per_sample.float()).sum())
        total_weight += float(weights.sum())
    return weighted / max(total_weight, 1e-12)


def validation_loss(policy: Pi05Policy) -> ValidationLoss:
    """`flow_loss` of `policy`, as a recipe's Validator asks for it."""
    return lambda dataset, frames, seed: flow_loss(policy, dataset, frames, seed=seed)
