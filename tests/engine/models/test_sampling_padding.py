"""The sampler holds the padding columns beyond the robot's action width on their noise path."""

from __future__ import annotations

import torch

from relay_engine.models import load_policy
from tests.engine.models.samples import make_samples


def test_padding_columns_follow_their_training_path_and_end_at_zero() -> None:
    policy = load_policy("pi05-tiny")
    batch = policy.collate(make_samples(3, action_dim=6))
    noise = torch.randn((3, policy.config.action_horizon, 32), generator=torch.Generator().manual_seed(0))

    held = policy.sample_actions(batch, noise=noise, robot_action_dim=6)
    free = policy.sample_actions(batch, noise=noise)

    assert held[..., 6:].abs().max() < 1e-5
    assert free[..., 6:].abs().max() > 0.1  # left alone, the untrained columns drift
    # The robot's columns see the held padding as they would in training, so they differ too.
    assert not torch.allclose(held[..., :6], free[..., :6])


def test_a_trained_models_config_carries_the_width() -> None:
    policy = load_policy("pi05-tiny")
    batch = policy.collate(make_samples(2, action_dim=4))
    noise = torch.randn((2, policy.config.action_horizon, 32), generator=torch.Generator().manual_seed(1))
    policy.config = policy.config.replace(robot_action_dim=4)
    torch.testing.assert_close(
        policy.sample_actions(batch, noise=noise),
        policy.sample_actions(batch, noise=noise, robot_action_dim=4),
    )
