"""What a served model reads, and one observation checked and decoded into its input.

An observation is `{"images": {CAMERA: image}, "state": [...], "prompt": "..."}` in the robot's
raw units. CAMERA is one of the model's saved camera features (`observation.images.top`), that
name without its `observation.images.` prefix (`top`), or the model slot it fills
(`base_0_rgb`); a base model saved no features and takes the slot names. An image is a uint8
array (H, W, 3) (or (3, H, W), as openpi's ALOHA clients send), encoded PNG or JPEG bytes, or
those bytes in base64 (JSON). Every problem is a ConfigError whose `param` names the field:
`observation.images.top`, `observation.state`, `observations[2].prompt`.

Each image becomes the model's input as soon as it is decoded (`relay_engine.models.model_image`,
the collator's own resize with padding to the model's size), before the next is read: a request
holds its images at 224x224, not at the size they were sent. A request's images may hold at most
MAX_REQUEST_PIXELS decoded pixels together (`PixelBudget`), counted from each image's header
before it is decoded.
"""

from __future__ import annotations

import base64
import binascii
import io
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from relay.catalog import MODEL_CAMERAS, STATE_DIM
from relay_engine.acting import observation_sample
from relay_engine.datasets.norm_stats import NormStats
from relay_engine.errors import ConfigError
from relay_engine.models.processor import model_image
from relay_engine.samples import Sample

IMAGE_PREFIX = "observation.images."
OBSERVATION_FIELDS = ("images", "state", "prompt")
# An encoded image larger than this many pixels is refused before it is decoded (a PNG of a
# few kilobytes can claim gigapixels).
MAX_IMAGE_PIXELS = 4096 * 4096
# Decoded pixels one request (a POST /actions, a websocket message) may carry, all its images
# together: 64 observations of three 640x480 cameras. Decoding costs time and, for the image being
# decoded, memory (about 16 bytes a pixel at its peak): a request of 32 4096x4096 images, 2.4 MiB
# as one-colour PNGs, once took a serving worker 51 s and 1.65 GB.
MAX_REQUEST_PIXELS = 64 * 3 * 640 * 480
_IMAGE_FORMATS = ("PNG", "JPEG")
# The model reads a few hundred tokens of prompt (longer ones are cut, as in training); a longer
# text would only cost every request of its batch the time to tokenize it.
MAX_PROMPT_CHARACTERS = 4096


class PixelBudget:
    """The decoded pixels left to one request (MAX_REQUEST_PIXELS). Each image takes its share by
    the size its header claims, before it is decoded, so an image past the budget costs nothing."""

    def __init__(self, limit: int = MAX_REQUEST_PIXELS) -> None:
        self.limit = limit
        self.left = limit

    def take(self, width: int, height: int, field: str) -> None:
        pixels = width * height
        if pixels > self.left:
            raise _problem(
                field,
                f"is {width}x{height}; with it, the request's images would hold more than {self.limit:,} "
                "decoded pixels, the most one request may carry (MAX_REQUEST_PIXELS): send fewer "
                "observations a request, or smaller images",
                code="too_many_pixels",
            )
        self.left -= pixels


@dataclass(frozen=True)
class DecodedObservation:
    """One observation as the model's input, and how long it took to get there."""

    sample: Sample
    decode_s: float  # images out of base64, PNG or JPEG
    preprocess_s: float  # checks, state normalization


@dataclass(frozen=True)
class ObservationLayout:
    """The cameras, state and normalization of one served model.

    - `cameras`: the model's cameras in slot order as clients name them (the saved features, or
      the slot names of a base model); `required`: whether every one must be given.
    - `stats`: the state is normalized and actions un-normalized with them; None (a base model
      with no norm_stats.json): the state is taken as already normalized, any width up to 32.
    - `image_size`: the model's square image size; each image is made the model's input
      (`model_image`) as it is decoded. None: images are kept as decoded (uint8 arrays).
    """

    cameras: tuple[str, ...]
    required: bool
    stats: NormStats | None
    image_size: int | None = None
    # The model's camera keys the cameras fill, in order: pi05's slots, or (a model that reads
    # cameras by name, SmolVLA's) the camera names themselves.
    slots: tuple[str, ...] = MODEL_CAMERAS

    @property
    def state_dim(self) -> int | None:
        return self.stats.state_dim if self.stats is not None else None

    def aliases(self) -> dict[str, str]:
        """Every accepted camera name -> the model camera (slot) it fills."""
        names: dict[str, str] = {}
        for slot, camera in zip(self.slots, self.cameras, strict=False):
            names[camera] = slot
            names[camera.removeprefix(IMAGE_PREFIX)] = slot
            names[slot] = slot
        return names

    def decode(
        self, observation: Any, field: str = "observation", budget: PixelBudget | None = None
    ) -> DecodedObservation:
        """Check and decode one observation; a ConfigError naming the field when it is wrong.
        `budget`: the request's decoded pixels left (a request of several observations shares one;
        None: a budget of this observation's own)."""
        started = time.perf_counter()
        if not isinstance(observation, Mapping):
            raise _problem(field, "must be an object with images, state and prompt")
        unknown = [str(key) for key in observation if key not in OBSERVATION_FIELDS]
        if unknown:
            raise _problem(
                f"{field}.{unknown[0]}",
                "unknown field; an observation has " + ", ".join(OBSERVATION_FIELDS),
                code="unknown_field",
            )
        images, decode_s = self._images(
            observation.get("images"), f"{field}.images", budget if budget is not None else PixelBudget()
        )
        state = self._state(observation.get("state"), f"{field}.state")
        prompt = _prompt(observation.get("prompt", ""), f"{field}.prompt")
        sample = observation_sample(images, state, prompt, self.stats)
        return DecodedObservation(sample, decode_s, time.perf_counter() - started - decode_s)

    def _images(
        self, given: Any, field: str, budget: PixelBudget
    ) -> tuple[dict[str, np.ndarray | torch.Tensor], float]:
        if not isinstance(given, Mapping) or not given:
            raise _problem(field, "must be an object: camera name -> image", code="missing_field")
        aliases = self.aliases()
        images: dict[str, np.ndarray | torch.Tensor] = {}
        given_as: dict[str, str] = {}
        decode_s = 0.0
        for name, value in given.items():
            slot = aliases.get(name) if isinstance(name, str) else None
            if slot is None:
                raise _problem(
                    f"{field}.{name}",
                    "unknown camera; this model reads " + ", ".join(self.cameras),
                    code="unknown_field",
                )
            if slot in images:
                raise _problem(f"{field}.{name}", f"the same camera as {field}.{given_as[slot]}")
            started = time.perf_counter()
            decoded = decode_image(value, f"{field}.{name}", budget)
            # The model's input at once: the decoded image is let go before the next is read.
            images[slot] = decoded if self.image_size is None else model_image(decoded, self.image_size)
            del decoded
            decode_s += time.perf_counter() - started
            given_as[slot] = name
        if self.required:
            for slot, camera in zip(self.slots, self.cameras, strict=False):
                if slot not in images:
                    raise _problem(
                        f"{field}.{camera.removeprefix(IMAGE_PREFIX)}",
                        "missing camera; this model reads " + ", ".join(self.cameras),
                        code="missing_field",
                    )
        return images, decode_s

    def _state(self, given: Any, field: str) -> np.ndarray | None:
        width = self.state_dim
        if given is None:
            if width:
                raise _problem(field, f"missing; this model's state is {width} numbers", code="missing_field")
            return None
        try:
            raw = np.asarray(given)
        except (TypeError, ValueError):
            raw = np.asarray(None)
        if raw.ndim != 1 or raw.dtype.kind not in "fiu":
            raise _problem(field, "must be a flat list of numbers")
        state = raw.astype(np.float64)
        if width is not None and state.shape[0] != width:
            raise _problem(field, f"has {state.shape[0]} numbers; this model's state has {width}")
        if width is None and state.shape[0] > STATE_DIM:
            raise _problem(field, f"has {state.shape[0]} numbers; the model takes at most {STATE_DIM}")
        bad = np.flatnonzero(~np.isfinite(state))
        if bad.size:
            raise _problem(field, f"must be finite numbers (at {int(bad[0])}: {state[bad[0]]})")
        return state.astype(np.float32)


def _prompt(prompt: Any, field: str) -> str:
    if not isinstance(prompt, str):
        raise _problem(field, f"must be a string, got {type(prompt).__name__}")
    if len(prompt) > MAX_PROMPT_CHARACTERS:
        raise _problem(field, f"has {len(prompt):,} characters; at most {MAX_PROMPT_CHARACTERS:,}")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate ("\ud800" in JSON): no text the model reads
        raise _problem(
            field, f"must be text (valid Unicode): a lone surrogate at character {error.start}"
        ) from None
    return prompt


def decode_image(value: Any, field: str, budget: PixelBudget | None = None) -> np.ndarray:
    """An image as a uint8 (H, W, 3) array: from such an array (or (3, H, W)), from PNG or JPEG
    bytes, or from those bytes in base64. `budget` takes the image's pixels before it is decoded."""
    if isinstance(value, str):
        try:
            value = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise _problem(field, "must be a base64 PNG or JPEG image (it is not base64)") from None
    budget = budget if budget is not None else PixelBudget()
    if isinstance(value, bytes | bytearray | memoryview):
        return _decode_encoded(bytes(value), field, budget)
    if isinstance(value, np.ndarray):
        return _checked_array(value, field, budget)
    raise _problem(field, f"must be a base64 PNG or JPEG image or a uint8 array, got {type(value).__name__}")


def _checked_array(array: np.ndarray, field: str, budget: PixelBudget) -> np.ndarray:
    if array.dtype != np.uint8:
        raise _problem(field, f"must be a uint8 array of shape (height, width, 3), got dtype {array.dtype}")
    if array.ndim == 3 and array.shape[-1] != 3 and array.shape[0] == 3:
        array = array.transpose(1, 2, 0)  # (3, H, W), as openpi's ALOHA clients send
    if array.ndim != 3 or array.shape[-1] != 3 or array.shape[0] == 0 or array.shape[1] == 0:
        raise _problem(field, f"must be a uint8 array of shape (height, width, 3), got shape {array.shape}")
    if array.shape[0] * array.shape[1] > MAX_IMAGE_PIXELS:
        raise _problem(
            field, f"is {array.shape[1]}x{array.shape[0]}; at most {MAX_IMAGE_PIXELS:,} pixels are read"
        )
    budget.take(array.shape[1], array.shape[0], field)
    # A received message's arrays are read-only views of its bytes; the model's input is a copy.
    return np.array(array, order="C", copy=True)


def _decode_encoded(data: bytes, field: str, budget: PixelBudget) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data), formats=_IMAGE_FORMATS) as image:
            if image.width * image.height > MAX_IMAGE_PIXELS:
                raise _problem(
                    field, f"is {image.width}x{image.height}; at most {MAX_IMAGE_PIXELS:,} pixels are read"
                )
            budget.take(image.width, image.height, field)
            return np.array(image.convert("RGB"), dtype=np.uint8)
    except ConfigError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        raise _problem(field, "is not a readable PNG or JPEG image") from None


def _problem(field: str, problem: str, code: str = "invalid_value") -> ConfigError:
    return ConfigError(f"{field}: {problem}", param=field, code=code)
