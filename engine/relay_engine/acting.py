"""A robot policy acting on observations: what closed-loop evaluation and the policy server share.

- `load_acting_policy` loads a model by a base model's name, a model directory (a job's
  downloaded output, a local run's) or a work directory whose `output/` holds one, as
  `relay local eval` resolves models; `read_norm_stats` reads what it is normalized with.
- `observation_sample` turns one observation in the dataset's units (model camera -> uint8
  image, raw state, prompt) into the model's input: the state normalized and padded to 32.
- `sample_chunks` samples the chunks of many observations in ONE batched forward pass, each
  from its own noise (`seeded_noise`), so a chunk does not depend on what else was in the batch
  beyond floating-point rounding.
- `NormStats.unnormalize_actions` maps the chunks back to the dataset's units.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from relay.catalog import STATE_DIM
from relay_engine.datasets.norm_stats import NormStats
from relay_engine.errors import ConfigError
from relay_engine.samples import Sample

NORM_STATS_FILE = "norm_stats.json"


class ActingPolicy(Protocol):
    """What acting asks of a policy: a robot policy (pi05's, a tuned SmolVLA), or the blind
    baseline (relay_engine.families.robot_scores.BlindPolicy), which answers without looking."""

    @property
    def config(self) -> Any: ...  # its model's name, action_horizon and action_dim

    # The cameras it reads under their own (dataset feature) names, in order (SmolVLA's); None:
    # pi05's camera slots (relay.catalog.MODEL_CAMERAS), filled from the model's saved features;
    # empty: none at all (the blind baseline).
    reads_cameras: tuple[str, ...] | None

    @property
    def frame_size(self) -> int | None:
        """The square size a frame is made (resized with padding) before the model reads it, done
        once as a served frame is decoded (pi05's); None: the model resizes frames itself, or reads
        none."""

    def eval(self) -> Any: ...

    def collate(self, samples: Sequence[Sample]) -> Any: ...

    def sample_actions(
        self, batch: Any, num_steps: int = ..., generator: Any = ..., noise: torch.Tensor | None = ...
    ) -> torch.Tensor: ...


def model_directory(name_or_dir: str) -> Path | None:
    """The directory holding a saved model's weights: the directory itself, or its `output/`
    (a recipe's work directory); None for a name that is not a directory."""
    path = Path(name_or_dir).expanduser()
    if not path.is_dir():
        return None
    for candidate in (path, path / "output"):
        if (candidate / "model.safetensors").is_file():
            return candidate
    return path  # the loader says what is missing


def load_acting_policy(
    policy_or_model: ActingPolicy | str | os.PathLike[str], device: str
) -> tuple[ActingPolicy, str, Path | None]:
    """The policy, its name for reports, and its directory (None for a loaded policy or a base
    model by name), resolved as `relay local eval` resolves models."""
    from relay_engine.families import family_owning
    from relay_engine.recipe import pick_device

    if not isinstance(policy_or_model, str | os.PathLike):  # loaded already
        return policy_or_model, policy_or_model.config.model, None
    name = str(policy_or_model)
    directory = model_directory(name)
    family = family_owning(str(directory) if directory is not None else name)
    policy = family.acting_policy(str(directory) if directory is not None else name, pick_device(device))
    return policy, name, directory


def read_norm_stats(path: Path) -> NormStats:
    """Stats from a norm_stats.json, a directory holding one (a model's), or a dataset directory."""
    from relay_engine.datasets import dataset_norm_stats

    file = path / NORM_STATS_FILE if path.is_dir() else path
    if file.is_file():
        try:
            return NormStats.from_json(file.read_text())
        except (OSError, ValueError) as error:
            raise ConfigError(f"norm_stats {file}: {error}") from None
    if path.is_dir():
        return dataset_norm_stats(str(path))[0]
    raise ConfigError(f"norm_stats {path}: no such file or directory")


def observation_sample(
    images: Mapping[str, np.ndarray | torch.Tensor],
    state: np.ndarray | None,
    prompt: str,
    stats: NormStats | None,
) -> Sample:
    """One observation as the model's input (no actions). `images`: model camera -> uint8
    (H, W, 3); `state`: raw, in the dataset's units, normalized with `stats` (None: already
    normalized, as a base model without stats takes it); None: the policy gets no state."""
    padded = np.zeros(STATE_DIM, dtype=np.float32)
    width = 0
    if state is not None:
        raw = np.asarray(state, dtype=np.float32).reshape(-1)
        width = raw.shape[0]
        padded[:width] = stats.normalize_state(raw) if stats is not None else raw
    sample: dict[str, Any] = {
        # A tensor is an image made the model's input already (the policy server's, model_image).
        "image": {
            camera: image if isinstance(image, torch.Tensor) else np.asarray(image, dtype=np.uint8)
            for camera, image in images.items()
        },
        "state": padded,
        "state_dim": width,
        "prompt": prompt,
    }
    return sample  # type: ignore[return-value]  # a Sample without actions, as sampling takes


def seeded_noise(policy: ActingPolicy, generator: torch.Generator) -> torch.Tensor:
    """One chunk's starting noise (action_horizon, action_dim), float32 on the CPU: the same
    numbers on any device the model runs on."""
    config = policy.config
    return torch.randn((config.action_horizon, config.action_dim), generator=generator)


def sample_chunks(
    policy: ActingPolicy, samples: Sequence[Sample], noise: Sequence[torch.Tensor], num_steps: int
) -> np.ndarray:
    """Normalized chunks (B, H, 32), float32, of every sample in one forward pass, sample i
    starting from noise[i]."""
    with torch.inference_mode():
        batch = policy.collate(samples)
        chunks = policy.sample_actions(batch, num_steps=num_steps, noise=torch.stack(list(noise)))
    return chunks.float().cpu().numpy()
