"""The robot policies' action scores (families/robot_scores.py) on a policy whose samples are the truth plus
noise: one sampled chunk's error carries the noise, the mean of several chunks cuts it, and the
spread measures it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from relay.events import CHUNKS_PER_FRAME
from relay_engine.families.robot_scores import evaluate_actions

HORIZON, WIDTH, COLUMNS = 5, 3, 32  # a chunk's steps, the robot's columns, the padded width
NOISE = 0.5  # the fake policy's sampling standard deviation


def frames(count: int) -> list[dict[str, Any]]:
    """Frames with random chunks; every third ends its episode two steps into the chunk."""
    rng = np.random.default_rng(0)
    samples = []
    for i in range(count):
        actions = np.zeros((HORIZON, COLUMNS), dtype=np.float32)
        actions[:, :WIDTH] = rng.normal(size=(HORIZON, WIDTH))
        is_pad = np.zeros(HORIZON, dtype=bool)
        if i % 3 == 0:
            is_pad[2:] = True
        samples.append({"actions": actions, "action_dim": WIDTH, "action_is_pad": is_pad})
    return samples


class NoisyPolicy(nn.Module):
    """Answers each frame's true chunk plus Gaussian noise of standard deviation `noise`, drawn
    from the sampler's generator, as pi05 draws its starting noise; counts its sampling passes."""

    def __init__(self, noise: float) -> None:
        super().__init__()
        self.noise = noise
        self.anchor = nn.Parameter(torch.zeros(1))  # evaluation reads the device off a parameter
        self.passes = 0

    def collate(self, samples: Sequence[dict[str, Any]]) -> torch.Tensor:
        return torch.stack([torch.as_tensor(s["actions"]) for s in samples])

    def sample_actions(
        self,
        batch: torch.Tensor,
        num_steps: int = 10,
        generator: torch.Generator | None = None,
        chunks: int = 1,
    ) -> torch.Tensor:
        self.passes += 1
        truth = batch.repeat_interleave(chunks, dim=0)
        return truth + self.noise * torch.randn(truth.shape, generator=generator)


def test_the_mean_of_chunks_cuts_the_sampling_noise_that_one_chunk_carries() -> None:
    data = frames(300)
    scores = evaluate_actions(NoisyPolicy(NOISE), data, range(len(data)), chunks=4, seed=1)  # type: ignore[arg-type]
    variance = NOISE**2
    assert scores.chunks == 4 and scores.samples == 300
    # One chunk misses by the noise; the mean of 4 by a quarter of it; their mean squared distance
    # from the mean is (4 - 1) / 4 of it.
    assert scores.mse == pytest.approx(variance, rel=0.05)
    assert scores.mean_mse == pytest.approx(variance / 4, rel=0.05)
    assert scores.spread == pytest.approx(variance * 3 / 4, rel=0.05)
    # Per element, one chunk's error is the mean's plus the spread: exactly, not only on average.
    assert scores.mse == pytest.approx(scores.mean_mse + scores.spread, rel=1e-9)


def test_a_policy_that_does_not_spread_scores_the_same_either_way() -> None:
    data = frames(10)
    scores = evaluate_actions(NoisyPolicy(0.0), data, range(len(data)), seed=0)  # type: ignore[arg-type]
    assert scores.chunks == CHUNKS_PER_FRAME
    assert scores.mse == scores.mean_mse == scores.spread == 0.0


def test_scores_repeat_with_the_seed_and_the_chunks_share_a_batch() -> None:
    data = frames(20)
    policy = NoisyPolicy(NOISE)
    first = evaluate_actions(policy, data, range(20), chunks=4, batch_size=8, seed=3)  # type: ignore[arg-type]
    # 8 chunks a batch: 2 frames of 4 chunks each, one sampling pass per batch.
    assert policy.passes == 10
    again = evaluate_actions(policy, data, range(20), chunks=4, batch_size=8, seed=3)  # type: ignore[arg-type]
    assert again == first
    # The noise comes in one order whatever the batches: other batch sizes score alike.
    wider = evaluate_actions(policy, data, range(20), chunks=4, batch_size=32, seed=3)  # type: ignore[arg-type]
    assert wider.mean_mse == pytest.approx(first.mean_mse, rel=1e-6)
    other_seed = evaluate_actions(policy, data, range(20), chunks=4, batch_size=8, seed=4)  # type: ignore[arg-type]
    assert other_seed.mean_mse != first.mean_mse
    with pytest.raises(ValueError, match="chunks must be at least 1"):
        evaluate_actions(policy, data, range(20), chunks=0)  # type: ignore[arg-type]
