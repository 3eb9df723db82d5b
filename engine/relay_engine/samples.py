"""The shape of one training sample, shared by the dataset reader, the sessions and the model.

A sample is what the model's processor turns into tensors. Datasets produce them from LeRobot
frames; training-loop sessions produce them from the user's ``types.Datum``.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

import numpy as np


class Sample(TypedDict):
    # Model camera name (relay.catalog.MODEL_CAMERAS) -> uint8 image (H, W, 3). A model camera
    # that is absent here is masked.
    image: dict[str, np.ndarray]
    # Normalized state, zero-padded to 32 (float32, (32,)); only the first `state_dim` values are
    # real, and only those become state tokens in the prompt.
    state: np.ndarray
    state_dim: int
    # The task, as the prompt.
    prompt: str
    # Normalized action chunk, zero-padded to 32 wide (float32, (action_horizon, 32)); the first
    # `action_dim` columns are real.
    actions: np.ndarray
    action_dim: int
    # True for chunk steps past the episode's end (the last action repeated); they stay out of the loss.
    action_is_pad: np.ndarray
    # In the loss's weighted mean; 1.0 for dataset samples.
    weight: NotRequired[float]
