"""Small random samples in the engine's Sample shape, for the model and tuning tests."""

from __future__ import annotations

import numpy as np

from relay_engine.samples import Sample


def make_samples(
    count: int = 4,
    *,
    seed: int = 0,
    horizon: int = 10,
    action_dim: int = 6,
    state_dim: int = 5,
    cameras: tuple[str, ...] = ("base_0_rgb", "left_wrist_0_rgb"),
    padded_steps: int = 2,
) -> list[Sample]:
    rng = np.random.default_rng(seed)
    samples: list[Sample] = []
    for index in range(count):
        state = np.zeros(32, dtype=np.float32)
        state[:state_dim] = rng.uniform(-1, 1, state_dim)
        actions = np.zeros((horizon, 32), dtype=np.float32)
        actions[:, :action_dim] = rng.normal(size=(horizon, action_dim))
        is_pad = np.zeros(horizon, dtype=bool)
        if padded_steps:
            is_pad[horizon - padded_steps :] = True
        samples.append(
            Sample(
                image={camera: rng.integers(0, 256, (40, 56, 3), dtype=np.uint8) for camera in cameras},
                state=state,
                state_dim=state_dim,
                prompt=f"pick up block {index}",
                actions=actions,
                action_dim=action_dim,
                action_is_pad=is_pad,
                weight=1.0,
            )
        )
    return samples
