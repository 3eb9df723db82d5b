"""What a training loop sends and gets back (docs/sessions.md): ``Datum``, ``AdamParams`` and
the results of the steps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relay.codec import Codec
from relay.optimizer import AdamParams
from relay.training import wire

__all__ = [
    "AdamParams",
    "Datum",
    "ForwardBackwardOutput",
    "LoadStateOutput",
    "OptimStepOutput",
    "SaveStateOutput",
]


@dataclass
class Datum:
    """One example: an observation in OpenPI's format and the action chunk to learn for it.

    ``observation``: ``{"image": {camera: (H, W, 3) uint8}, "state": up to 32 values, "prompt": str}``;
    ``actions``: (action_horizon, up to 32), normalized like the state; ``weight``: its weight in the
    loss's mean. The GPU checks a datum; a malformed one fails its step's ``.result()``, naming it.
    """

    observation: Mapping[str, Any]
    actions: Any = None
    weight: float = 1.0


@dataclass(frozen=True)
class ForwardBackwardOutput:
    """``metrics["loss"]``: the batch's weighted mean loss; ``loss_fn_outputs``: ``{"loss": ...}`` per
    datum (for a custom loss, the metrics its function returned, and no per-datum outputs)."""

    metrics: dict[str, Any]
    loss_fn_outputs: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class OptimStepOutput:
    """``metrics``: ``{"grad_norm": ..., "skipped": ...}``; a step whose gradient was not finite is
    skipped."""

    metrics: dict[str, Any]


@dataclass(frozen=True)
class SaveStateOutput:
    """A saved state: its name, and where it lies on the service's disk (under your account)."""

    name: str
    path: str


@dataclass(frozen=True)
class LoadStateOutput:
    name: str
    path: str


class DatumError(ValueError):
    """A datum that cannot even be sent (its step's future fails with this, as a user error)."""


def datum_message(index: int, datum: Datum | Mapping[str, Any], codec: Codec) -> dict[str, Any]:
    """A datum as the wire carries it; frames become JPEG under Codec.JPEG_Q95."""
    observation: Any  # checked by observation_message
    if isinstance(datum, Datum):
        observation, actions, weight = datum.observation, datum.actions, datum.weight
    elif isinstance(datum, Mapping):
        observation, actions, weight = (
            datum.get("observation"),
            datum.get("actions"),
            datum.get("weight", 1.0),
        )
    else:
        raise DatumError(f"datum {index}: must be a types.Datum, got {type(datum).__name__}")
    message: dict[str, Any] = {
        "observation": observation_message(index, observation, codec),
        "weight": weight,
    }
    if actions is not None:
        message["actions"] = _array(index, "actions", actions)
    return message


def observation_message(index: int, observation: Any, codec: Codec, label: str = "datum") -> dict[str, Any]:
    if not isinstance(observation, Mapping):
        raise DatumError(f"{label} {index}: observation must be a dict with image, state and prompt")
    message = dict(observation)
    images = observation.get("image")
    if isinstance(images, Mapping):
        frames: dict[str, Any] = {}
        for camera, frame in images.items():
            array = _array(index, f"image {camera!r}", frame, label)
            frames[str(camera)] = (
                wire.Jpeg(array) if codec == Codec.JPEG_Q95 and wire.is_jpeg_frame(array) else array
            )
        message["image"] = frames
    if observation.get("state") is not None:
        message["state"] = _array(index, "state", observation["state"], label)
    return message


def _array(index: int, name: str, value: Any, label: str = "datum") -> np.ndarray:
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise DatumError(f"{label} {index}: {name} is not an array of numbers ({error})") from None
    if array.dtype.hasobject or array.dtype.kind in "USV":
        raise DatumError(f"{label} {index}: {name} must be an array of numbers, got {array.dtype}")
    return array


def batch_message(batch: Sequence[Datum | Mapping[str, Any]], codec: Codec) -> list[dict[str, Any]]:
    if isinstance(batch, Datum | Mapping) or not isinstance(batch, Sequence):
        raise DatumError("a batch must be a list of types.Datum")
    return [datum_message(i, d, codec) for i, d in enumerate(batch)]
