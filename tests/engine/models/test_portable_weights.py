"""Portable weights: a model trained here samples the same in a plain Euler loop over all 32
columns (the loop openpi and lerobot run), because training fits every column, the padding
columns beyond the robot's width towards their zero targets, as openpi does.

The comparison with the old way (padding columns left out of the loss, then held on their noise
path when sampling) bounds what the change costs on the robot's own columns. Measured here (40
LoRA steps from the shipped base, 4 held-out episodes, 3 noise draws): 0.060 against 0.056, about
7% more error at this size; the bound is 10%.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from relay.optimizer import AdamParams
from relay_engine.datasets import LeRobotDataset, open_dataset, write_synthetic_dataset
from relay_engine.families.pi05.learner import Pi05Learner
from relay_engine.models import Pi05Batch, Pi05Policy, load_policy
from relay_engine.tuning import apply_tuning, merged_policy

ROBOT_WIDTH = 3  # the dataset's action width, far narrower than the model's 32
STEPS = 40
BATCH = 8
TRAIN_EPISODES = list(range(10))
HELD_OUT_EPISODES = [10, 11, 12, 13]
NOISE_DRAWS = 3  # the held-out error is averaged over this many noise draws, to compare like with like

Sampler = Callable[[Pi05Policy, Pi05Batch, torch.Tensor], torch.Tensor]


def plain_euler(
    policy: Pi05Policy, batch: Pi05Batch, noise: torch.Tensor, num_steps: int = 10
) -> torch.Tensor:
    """openpi's and lerobot's sampler, written out: x += dt * v(x, t) over every column."""
    prefix = policy.model.prefix_cache(batch)
    x, dt = noise.clone(), -1.0 / num_steps
    for step in range(num_steps):
        t = torch.full((x.shape[0],), 1.0 + step * dt)
        x = x + dt * policy.model.velocity(prefix, x, t)
    return x


def held_padding_euler(
    policy: Pi05Policy, batch: Pi05Batch, noise: torch.Tensor, num_steps: int = 10
) -> torch.Tensor:
    """The sampler Relay used to have: padding columns held on their noise path x = t * noise."""
    prefix = policy.model.prefix_cache(batch)
    x, dt = noise.clone(), -1.0 / num_steps
    for step in range(num_steps):
        t = 1.0 + step * dt
        velocity = policy.model.velocity(prefix, x, torch.full((x.shape[0],), t))
        velocity[..., ROBOT_WIDTH:] = x[..., ROBOT_WIDTH:] / t
        x = x + dt * velocity
    return x


def train(dataset: LeRobotDataset, indices: list[int], *, only_robot_columns: bool) -> Pi05Policy:
    """The shipped base, LoRA-tuned with the recipe's step; `only_robot_columns` is the old loss."""
    policy = load_policy("pi05-tiny")
    model = apply_tuning(policy, "lora", None, 32, None)
    learner = Pi05Learner(model, seed=0)
    order = np.random.default_rng(0).permutation(np.resize(indices, STEPS * BATCH))
    for step in range(STEPS):
        batch = policy.collate([dataset[int(i)] for i in order[step * BATCH : (step + 1) * BATCH]])
        if only_robot_columns:
            mask = batch.action_mask.clone()
            mask[..., ROBOT_WIDTH:] = False
            batch = dataclasses.replace(batch, action_mask=mask)
        learner.forward_backward(batch)
        learner.optim_step(AdamParams(learning_rate=1e-3))
    return merged_policy(model).eval()


@torch.no_grad()
def held_out_mse(policy: Pi05Policy, dataset: LeRobotDataset, indices: list[int], sampler: Sampler) -> float:
    batch = policy.collate([dataset[i] for i in indices])
    mask = batch.action_mask.clone()
    mask[..., ROBOT_WIDTH:] = False  # a robot reads only its own columns
    generator = torch.Generator().manual_seed(0)
    errors = []
    for _ in range(NOISE_DRAWS):
        predicted = sampler(policy, batch, torch.randn(batch.actions.shape, generator=generator))
        errors.append(float(((predicted - batch.actions) ** 2)[mask].mean()))
    return sum(errors) / len(errors)


def test_a_trained_model_samples_the_same_in_a_plain_euler_loop(tmp_path: Path) -> None:
    path = write_synthetic_dataset(
        tmp_path / "narrow", episodes=14, episode_length=(20, 30), action_dim=ROBOT_WIDTH, seed=5
    )
    dataset = open_dataset(str(path), cache_dir=tmp_path / "cache")
    train_indices = dataset.indices_of_episodes(TRAIN_EPISODES).tolist()
    held_out = dataset.indices_of_episodes(HELD_OUT_EPISODES).tolist()

    tuned = train(dataset, train_indices, only_robot_columns=False)
    batch = tuned.collate([dataset[i] for i in held_out[:8]])
    noise = torch.randn((8, 10, 32), generator=torch.Generator().manual_seed(1))
    relay_chunk = tuned.sample_actions(batch, noise=noise)
    reference = plain_euler(tuned, batch, noise)
    torch.testing.assert_close(relay_chunk, reference, atol=1e-5, rtol=0)
    # The padding columns were trained towards zero, so they end there, as a lerobot user expects.
    assert relay_chunk[..., ROBOT_WIDTH:].abs().mean() < 0.1

    old = train(dataset, train_indices, only_robot_columns=True)
    now_error = held_out_mse(tuned, dataset, held_out, plain_euler)
    old_error = held_out_mse(old, dataset, held_out, held_padding_euler)
    # The old weights in a plain Euler loop: what a lerobot user of them got.
    old_in_lerobot = held_out_mse(old, dataset, held_out, plain_euler)
    print(
        f"held-out action MSE: all columns trained {now_error:.4f}; robot columns only, padding held "
        f"{old_error:.4f}; the same weights in a plain Euler loop {old_in_lerobot:.4f}"
    )
    assert now_error <= old_error * 1.10
