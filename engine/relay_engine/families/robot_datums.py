"""A robot policy session's datums (pi05's, SmolVLA's): {"observation": {"image", "state",
"prompt"}, "actions", "weight"} as a training Sample, on what every robot family shares: state and
actions arrive normalized, at most 32 wide, and padded here; within a batch each camera's frames
are one size. What a family reads of the images (pi05's fixed slots, SmolVLA's own camera names)
its session checks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from relay.catalog import ACTION_DIM, STATE_DIM
from relay_engine.errors import EngineError
from relay_engine.samples import Sample


def datum_to_sample(index: int, datum: Mapping[str, Any], *, with_actions: bool = True) -> Sample:
    """A session datum as a training Sample: the state padded to 32, the actions as given (with
    their width in `action_dim`). Image dtypes and shapes, chunk length and finite values the
    family's collator checks."""
    label = f"datum {index}"
    observation = datum.get("observation")
    if not isinstance(observation, Mapping):
        raise EngineError(f"{label}: observation must be a dict with image, state and prompt")
    state = np.asarray(observation.get("state", np.zeros(0)), dtype=np.float32).reshape(-1)
    if state.shape[0] > STATE_DIM:
        raise EngineError(f"{label}: state has {state.shape[0]} values; at most {STATE_DIM}")
    prompt = observation.get("prompt", "")
    if not isinstance(prompt, str):
        raise EngineError(f"{label}: prompt must be a string")
    images = observation.get("image") or {}
    if not isinstance(images, Mapping):
        raise EngineError(f"{label}: image must map camera names to frames")
    padded_state = np.zeros(STATE_DIM, dtype=np.float32)
    padded_state[: state.shape[0]] = state
    sample: dict[str, Any] = {
        "image": dict(images),
        "state": padded_state,
        "state_dim": int(state.shape[0]),
        "prompt": prompt,
        "weight": float(datum.get("weight", 1.0)),
    }
    if with_actions:
        if datum.get("actions") is None:
            raise EngineError(f"{label}: actions are missing")
        actions = np.asarray(datum["actions"], dtype=np.float32)
        if actions.ndim != 2 or actions.shape[1] > ACTION_DIM:
            raise EngineError(
                f"{label}: actions must be (action_horizon, up to {ACTION_DIM}), got {actions.shape}"
            )
        sample["actions"] = actions
        sample["action_dim"] = int(actions.shape[1])
    return sample  # type: ignore[return-value]


def check_frame_sizes(samples: Sequence[Mapping[str, Any]]) -> None:
    """Within a batch each camera's frames are one size (docs/sessions.md)."""
    first: dict[str, tuple[int, ...]] = {}
    for index, sample in enumerate(samples):
        for camera, frame in sample["image"].items():
            shape = tuple(np.shape(frame))
            if first.setdefault(camera, shape) != shape:
                raise EngineError(
                    f"datum {index}: image {camera!r} is {shape}, but an earlier datum's is {first[camera]}; "
                    "within a batch each camera's frames must be one size"
                )
