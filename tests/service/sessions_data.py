"""Small datums for training-session tests (pi05-tiny on the CPU), and a reference loss."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from relay.training import types

HORIZON = 10


def datum(
    seed: int, *, size: int = 32, wrist: bool = True, action_dim: int = 6, **changes: Any
) -> types.Datum:
    rng = np.random.default_rng(seed)
    image = {"base_0_rgb": rng.integers(0, 255, (size, size, 3), dtype=np.uint8)}
    if wrist:
        image["left_wrist_0_rgb"] = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
    fields: dict[str, Any] = {
        "observation": {"image": image, "state": rng.uniform(-1, 1, 6).astype(np.float32), "prompt": "pick"},
        "actions": rng.uniform(-1, 1, (HORIZON, action_dim)).astype(np.float32),
        "weight": 1.0,
    }
    fields.update(changes)
    return types.Datum(**fields)


def batch(first: int, count: int) -> list[types.Datum]:
    return [datum(first + i) for i in range(count)]


def flow_matching_loss(data: Sequence[types.Datum], outputs: dict[str, Any]) -> tuple[Any, dict[str, float]]:
    """The built-in loss, written as a custom one: each datum's mean squared error over the robot's
    own action columns plus that over the padding columns (whose targets are zeros, as openpi
    trains them), then the mean weighted by the datums' weights."""
    import torch

    error = (outputs["velocity"] - outputs["target"]).square()  # (B, H, 32)
    widths = [np.asarray(item.actions).shape[1] for item in data]
    per_datum = torch.stack(
        [row[:, :width].mean() + row[:, width:].mean() for row, width in zip(error, widths, strict=True)]
    )
    weights = torch.tensor([float(item.weight) for item in data])
    loss = (weights * per_datum).sum() / weights.sum()
    return loss, {"same_as_builtin": loss.item()}
