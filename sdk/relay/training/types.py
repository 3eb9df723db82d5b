"""What a training loop sends and gets back (docs/sessions.md): ``Datum``, ``AdamParams`` and
the results of the steps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pkgutil import resolve_name
from typing import Any

import numpy as np

from relay import families
from relay.codec import Codec
from relay.optimizer import AdamParams
from relay.training import wire

__all__ = [
    "AdamParams",
    "Datum",
    "ForwardBackwardOutput",
    "LoadStateOutput",
    "OptimStepOutput",
    "RelationalDatum",
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


@dataclass
class RelationalDatum:
    """One example for an RT-J session: a sampled context and the label of its target cell.

    ``context``: the twelve RelationalBatch fields of one context as arrays (``node_idxs`` ...
    ``col_name_values``, shaped [1, cells, ...] or [cells, ...]); from Relay's sampler,
    ``relay_engine.relational`` ``example.input.numpy()``. ``label``: 0/1 for a binary session, the
    (z-scored) value for a regression one. ``weight``: its weight in the loss's mean.
    """

    context: Mapping[str, Any]
    label: float
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
    """A saved state: its name, and its address in your account, ``relay://states/<name>``
    (``load_state`` takes the name)."""

    name: str
    path: str


@dataclass(frozen=True)
class LoadStateOutput:
    """The state loaded: its name and ``relay://states/<name>``, as ``save_state`` gave them."""

    name: str
    path: str


class DatumError(ValueError):
    """A datum that cannot even be sent (its step's future fails with this, as a user error)."""


def datum_message(
    index: int, datum: Datum | RelationalDatum | Mapping[str, Any], codec: Codec
) -> dict[str, Any]:
    """A datum as the wire carries it; frames become JPEG under Codec.JPEG_Q95."""
    observation: Any  # checked by observation_message
    for spec in families.family_specs():  # a family's own datum type (RT-J's RelationalDatum)
        if spec.datum_type is None or spec.encode_datum is None:
            continue
        if isinstance(datum, resolve_name(spec.datum_type)):
            encode: families.DatumEncoder = resolve_name(spec.encode_datum)
            return encode(index, datum)
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


def relational_datum_message(index: int, datum: RelationalDatum) -> dict[str, Any]:
    if not isinstance(datum.context, Mapping):
        raise DatumError(f"datum {index}: context must map the twelve RelationalBatch fields to arrays")
    context = {
        str(name): _array(index, f"context field {name!r}", value) for name, value in datum.context.items()
    }
    try:
        label = float(datum.label)
    except (TypeError, ValueError):
        raise DatumError(f"datum {index}: label must be a number, got {datum.label!r}") from None
    return {"context": context, "label": label, "weight": datum.weight}


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


def batch_message(
    batch: Sequence[Datum | RelationalDatum | Mapping[str, Any]], codec: Codec
) -> list[dict[str, Any]]:
    if isinstance(batch, Datum | RelationalDatum | Mapping) or not isinstance(batch, Sequence):
        raise DatumError("a batch must be a list of types.Datum (or types.RelationalDatum for rt-j)")
    return [datum_message(i, d, codec) for i, d in enumerate(batch)]
