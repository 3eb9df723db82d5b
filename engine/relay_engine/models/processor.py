"""Samples -> the tensors pi0.5 reads (a Pi05Batch).

The collator runs in DataLoader worker processes, so it holds only the config and a tokenizer
(no weights) and pickles cheaply. Images are resized with padding to the model's square size
(`image_fit`: bilinear with antialiasing, rounded to uint8 as openpi's PIL `resize_with_pad` is,
centred on black) and scaled to [-1, 1]; every model camera has a slot, and a camera a
sample lacks is a -1 image with its mask False. `model_image` is that step for one image, the one
definition of what the model sees: the collator applies it to a sample's uint8 images, and the
policy server applies it to each image as it decodes it (a sample then carries the (3, S, S)
result, which the collator takes as it is), so served pixels are the trained ones. A video camera
decoded into the frame index for pi05 comes already fitted (relay_engine.datasets.decoded_frames),
and fitting it again changes nothing: its batch is the one decoding each sample would make.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from relay.catalog import MODEL_CAMERAS
from relay_engine.errors import EngineError
from relay_engine.image_fit import ImageFit
from relay_engine.models.config import Pi05Config
from relay_engine.models.tokenizer import Tokenizer, format_prompt, make_tokenizer, tokenize_prompts
from relay_engine.samples import Sample


@dataclass(frozen=True)
class Pi05Batch:
    """One batch in the model's layout. B samples, C = 3 camera slots, H = action_horizon."""

    images: torch.Tensor  # (B, C, 3, S, S) float32 in [-1, 1]
    image_mask: torch.Tensor  # (B, C) bool
    tokens: torch.Tensor  # (B, L) int64, right-padded with 0
    token_mask: torch.Tensor  # (B, L) bool
    actions: torch.Tensor  # (B, H, 32) float32, normalized, zero-padded
    # (B, H, 32) bool: False for the steps padded past an episode's end. Every column of a real
    # step is trained, the padding columns beyond the robot's width towards their zero targets, as
    # openpi does: then a plain Euler loop over all 32 columns (openpi's, lerobot's) samples the
    # weights as they were trained.
    action_mask: torch.Tensor
    weights: torch.Tensor  # (B,) float32, in the loss's weighted mean
    # (B,) int64: how many of the 32 columns are each sample's robot's own (its action_dim); the
    # rest are padding. None: all of them (see flow_matching_loss and Pi05Config.balance_padding).
    action_width: torch.Tensor | None = None
    # Which camera slots any sample uses, known when collating so that the model can skip an
    # unused slot's tokens without asking the device. None: the model works it out.
    cameras_in_use: tuple[bool, ...] | None = None

    @property
    def batch_size(self) -> int:
        return int(self.actions.shape[0])

    def _map(self, fn: Any) -> Pi05Batch:
        changes = {
            f.name: fn(getattr(self, f.name))
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **changes)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Pi05Batch:
        device = torch.device(device)
        if self.actions.device == device:
            return self
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Pi05Batch:
        # Called by a DataLoader with pin_memory=True.
        return self._map(lambda t: t.pin_memory())


def image_fit(size: int) -> ImageFit:
    """How pi05 fits an image to its `size` x `size` input: aspect ratio kept, bilinear with
    antialiasing (close to openpi's PIL resize), rounded to uint8, centred, padded with black."""
    return ImageFit(size, size)


def model_image(image: Any, size: int, label: str = "image") -> torch.Tensor:
    """A uint8 (height, width, 3) image as the model reads it: (3, size, size) float32 in [-1, 1],
    fitted by `image_fit(size)`. An EngineError naming `label` for anything else."""
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[-1] != 3:
        raise EngineError(
            f"{label} must be a uint8 array of shape (height, width, 3), got {array.dtype} {array.shape}"
        )
    fitted = np.ascontiguousarray(image_fit(size)(array))
    return torch.from_numpy(fitted).permute(2, 0, 1).float().mul_(2.0 / 255.0).sub_(1.0)


class Pi05Collator:
    """`collate(samples) -> Pi05Batch`; picklable, no weights."""

    def __init__(self, config: Pi05Config, tokenizer: Tokenizer | None = None, source: str | None = None):
        self.config = config
        self.tokenizer = tokenizer if tokenizer is not None else make_tokenizer(config.tokenizer, source)

    def __call__(self, samples: Sequence[Sample], item: str = "sample") -> Pi05Batch:
        """Collate; a problem names the `item` ("sample 3", or "datum 3" for a session's data)."""
        if not samples:
            raise EngineError(f"a batch needs at least one {item}")
        config = self.config
        size = config.vision.image_size
        horizon, width = config.action_horizon, config.action_dim
        count = len(samples)
        images = torch.full((count, len(MODEL_CAMERAS), 3, size, size), -1.0)
        image_mask = torch.zeros((count, len(MODEL_CAMERAS)), dtype=torch.bool)
        actions = np.zeros((count, horizon, width), dtype=np.float32)
        action_mask = np.zeros((count, horizon, width), dtype=bool)
        weights = np.ones(count, dtype=np.float32)
        action_width = np.full(count, width, dtype=np.int64)
        prompts = []
        for row, sample in enumerate(samples):
            label = f"{item} {row}"
            for camera, image in (sample.get("image") or {}).items():
                slot = _camera_slot(label, camera)
                images[row, slot] = _sample_image(label, camera, image, size)
                image_mask[row, slot] = True
            prompts.append(format_prompt(str(sample.get("prompt", "")), _state(label, sample)))
            if sample.get("actions") is not None:
                action_width[row] = _fill_actions(label, sample, actions[row], action_mask[row])
            weights[row] = _weight(label, sample)
        tokens, token_mask = tokenize_prompts(self.tokenizer, prompts, config.max_token_len)
        return Pi05Batch(
            images=images,
            image_mask=image_mask,
            tokens=torch.from_numpy(tokens),
            token_mask=torch.from_numpy(token_mask),
            actions=torch.from_numpy(actions),
            action_mask=torch.from_numpy(action_mask),
            weights=torch.from_numpy(weights),
            action_width=torch.from_numpy(action_width),
            cameras_in_use=tuple(bool(x) for x in image_mask.any(0)),
        )


def _camera_slot(label: str, camera: str) -> int:
    try:
        return MODEL_CAMERAS.index(camera)
    except ValueError:
        raise EngineError(
            f"{label}: image: unknown model camera {camera!r}; valid: " + ", ".join(MODEL_CAMERAS)
        ) from None


def _sample_image(label: str, camera: str, image: Any, size: int) -> torch.Tensor:
    """A sample's image as the model reads it: a uint8 image through model_image, or one that went
    through it already (a float32 (3, size, size) tensor: the policy server's)."""
    if isinstance(image, torch.Tensor):
        if image.dtype != torch.float32 or tuple(image.shape) != (3, size, size):
            raise EngineError(
                f"{label}: image {camera!r} given as a tensor must be model_image's float32 (3, {size}, "
                f"{size}), got {image.dtype} {tuple(image.shape)}"
            )
        return image
    return model_image(image, size, f"{label}: image {camera!r}")


def _state(label: str, sample: Sample) -> np.ndarray:
    state = np.asarray(sample.get("state", np.zeros(0)), dtype=np.float32).reshape(-1)
    state_dim = int(sample.get("state_dim", state.shape[0]))
    if not 0 <= state_dim <= state.shape[0]:
        raise EngineError(f"{label}: state_dim must be between 0 and {state.shape[0]}, got {state_dim}")
    if not np.isfinite(state[:state_dim]).all():
        raise EngineError(f"{label}: state must be finite")
    return state[:state_dim]


def _fill_actions(label: str, sample: Sample, out: np.ndarray, mask: np.ndarray) -> int:
    """Write the sample's chunk and its valid steps' mask; returns the robot's action width."""
    horizon, width = out.shape
    chunk = np.asarray(sample["actions"], dtype=np.float32)
    if chunk.ndim != 2 or chunk.shape[0] != horizon or chunk.shape[1] > width:
        raise EngineError(
            f"{label}: actions must have shape ({horizon}, up to {width}) for this model's "
            f"action_horizon {horizon}, got {chunk.shape}"
        )
    if not np.isfinite(chunk).all():
        raise EngineError(f"{label}: actions must be finite")
    action_dim = int(sample.get("action_dim", chunk.shape[1]))
    if not 1 <= action_dim <= chunk.shape[1]:
        raise EngineError(f"{label}: action_dim must be between 1 and {chunk.shape[1]}, got {action_dim}")
    out[:, : chunk.shape[1]] = chunk
    valid_steps = ~np.asarray(sample.get("action_is_pad", np.zeros(horizon, dtype=bool)), dtype=bool)
    if valid_steps.shape != (horizon,):
        raise EngineError(f"{label}: action_is_pad must have shape ({horizon},), got {valid_steps.shape}")
    mask[:] = valid_steps[:, None]
    return action_dim


def _weight(label: str, sample: Sample) -> float:
    weight = float(sample.get("weight", 1.0))
    if not np.isfinite(weight) or weight < 0:
        raise EngineError(f"{label}: weight must be a finite number >= 0, got {weight}")
    return weight
