"""A robot policy (pi05's, a tuned SmolVLA) loaded once to answer observations with action chunks in
the robot's raw units.

`ServedPolicy.load(model)` takes what `relay local eval` takes (a base model's name, a model
directory, a job's downloaded output, a work directory) and reads the model's norm_stats.json
and saved camera features beside it. `decode` checks and decodes one observation (a ConfigError
naming the field when it is wrong); `act` answers many in ONE batched forward pass, each from
the noise of its own seed (None: a fresh random one), and times each stage.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relay.catalog import MODEL_CAMERAS
from relay_engine.acting import (
    NORM_STATS_FILE,
    ActingPolicy,
    load_acting_policy,
    read_norm_stats,
    sample_chunks,
    seeded_noise,
)
from relay_engine.datasets.norm_stats import NormStats
from relay_engine.errors import ConfigError
from relay_engine.serving.observations import DecodedObservation, ObservationLayout, PixelBudget

DEFAULT_NUM_STEPS = 10
# Seeds as JSON and msgpack carry them: non-negative integers below 2**63.
SEED_MAX = 2**63 - 1


@dataclass(frozen=True)
class StageTiming:
    """Milliseconds one request spent in each stage; model_ms and the collate part of
    preprocess_ms are its batch's, shared with the requests batched with it."""

    decode_ms: float
    preprocess_ms: float
    model_ms: float
    postprocess_ms: float

    def as_dict(self) -> dict[str, float]:
        return {
            "decode_ms": self.decode_ms,
            "preprocess_ms": self.preprocess_ms,
            "model_ms": self.model_ms,
            "postprocess_ms": self.postprocess_ms,
        }


@dataclass(frozen=True)
class ActionChunk:
    """One request's answer: (action_horizon, action width) float32 in the robot's raw units."""

    actions: np.ndarray
    seed: int
    timing: StageTiming


def check_seed(value: Any, field: str = "seed") -> int | None:
    """A request's seed, or a ConfigError naming the field."""
    if value is None:
        return None
    if isinstance(value, np.integer):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise ConfigError(f"{field}: must be an integer from 0 to {SEED_MAX}, got {value!r}", param=field)
    return value


class ServedPolicy:
    """One loaded model and what it reads; `act` is not thread-safe (one inference thread)."""

    # What it answers (the policy server's /actions and openpi's websocket), and what a request
    # to the other endpoint is told.
    answers = "actions"
    use_instead = "this deployment serves a robot policy: POST /actions (or openpi's websocket)"

    def __init__(
        self,
        policy: ActingPolicy,
        name: str,
        layout: ObservationLayout,
        num_steps: int = DEFAULT_NUM_STEPS,
        *,
        kind: str,
    ) -> None:
        if num_steps < 1:
            raise ConfigError(f"num_steps must be at least 1, got {num_steps}", param="num_steps")
        self.policy = policy.eval()
        self.name = name
        self.layout = layout
        self.num_steps = num_steps
        self.kind = kind  # the model's family

    @classmethod
    def load(
        cls,
        model: ActingPolicy | str | os.PathLike[str],
        *,
        device: str = "auto",
        num_steps: int = DEFAULT_NUM_STEPS,
        norm_stats: NormStats | None = None,
    ) -> ServedPolicy:
        policy, name, directory = load_acting_policy(model, device)
        if policy.reads_cameras is None:  # camera slots (pi05's)
            layout = model_layout(directory, norm_stats, image_size=policy.frame_size)
            return cls(policy, name, layout, num_steps, kind=policy.config.family)
        if not policy.reads_cameras:  # the blind baseline acts in evaluations, not here
            raise ConfigError(f"{name}: only a robot policy is served")
        # A model that reads cameras by name (SmolVLA): every one required, kept as decoded (its
        # own collate makes them its input), its own statistics.
        stats = norm_stats
        if stats is None and directory is not None:
            stats = read_norm_stats(directory)
        layout = ObservationLayout(
            cameras=policy.reads_cameras, required=True, stats=stats, slots=policy.reads_cameras
        )
        return cls(policy, name, layout, num_steps, kind=policy.config.family)

    @property
    def action_dim(self) -> int:
        stats = self.layout.stats
        return stats.action_dim if stats is not None else self.policy.config.action_dim

    def metadata(self) -> dict[str, Any]:
        """What a client needs to know (sent on connect over the websocket, GET /metadata)."""
        config = self.policy.config
        return {
            "model": self.name,
            "kind": self.kind,
            "answers": self.answers,
            "cameras": list(self.layout.cameras),
            "camera_slots": dict(zip(self.layout.cameras, self.layout.slots, strict=False)),
            "cameras_required": self.layout.required,
            "state_dim": self.layout.state_dim,
            "action_dim": self.action_dim,
            "action_horizon": config.action_horizon,
            "num_steps": self.num_steps,
            "raw_units": self.layout.stats is not None,
            "device": str(self.policy.device),
        }

    def decode(
        self, observation: Any, field: str = "observation", budget: PixelBudget | None = None
    ) -> DecodedObservation:
        return self.layout.decode(observation, field, budget)

    def act(
        self, observations: Sequence[DecodedObservation], seeds: Sequence[int | None]
    ) -> list[ActionChunk]:
        """The chunks of every observation, sampled in one forward pass, each from its own seed."""
        if len(observations) != len(seeds):
            raise ValueError(f"{len(observations)} observations but {len(seeds)} seeds")
        started = time.perf_counter()
        used = [seed if seed is not None else secrets.randbits(63) for seed in seeds]
        noise = [seeded_noise(self.policy, torch.Generator().manual_seed(seed)) for seed in used]
        collated = time.perf_counter()
        chunks = sample_chunks(self.policy, [o.sample for o in observations], noise, self.num_steps)
        sampled = time.perf_counter()
        stats = self.layout.stats
        actions = stats.unnormalize_actions(chunks) if stats is not None else chunks
        finished = time.perf_counter()
        # sample_chunks collates and samples; the collate is a sliver of it, counted as the model's.
        shared_pre, model, post = collated - started, sampled - collated, (finished - sampled) / len(used)
        return [
            ActionChunk(
                actions=np.ascontiguousarray(actions[row], dtype=np.float32),
                seed=seed,
                timing=StageTiming(
                    decode_ms=observation.decode_s * 1000,
                    preprocess_ms=(observation.preprocess_s + shared_pre) * 1000,
                    model_ms=model * 1000,
                    postprocess_ms=post * 1000,
                ),
            )
            for row, (observation, seed) in enumerate(zip(observations, used, strict=True))
        ]


def model_layout(
    directory: Path | None, norm_stats: NormStats | None = None, *, image_size: int | None = None
) -> ObservationLayout:
    """The cameras the model saved (every one required) and its norm_stats.json; a base model
    takes any of the slot names and, without stats, normalized numbers."""
    from relay_engine.models.lerobot_files import RobotFeatures

    features = RobotFeatures.read(directory) if directory is not None else None
    stats = norm_stats
    if stats is None and directory is not None and (directory / NORM_STATS_FILE).is_file():
        stats = read_norm_stats(directory / NORM_STATS_FILE)
    if features is not None and features.cameras:
        if len(features.cameras) > len(MODEL_CAMERAS):
            raise ConfigError(
                f"the model saved {len(features.cameras)} cameras; pi05 has {len(MODEL_CAMERAS)}"
            )
        return ObservationLayout(
            cameras=tuple(features.cameras), required=True, stats=stats, image_size=image_size
        )
    return ObservationLayout(cameras=MODEL_CAMERAS, required=False, stats=stats, image_size=image_size)


def serve_robot_policy(
    model: str | os.PathLike[str],
    *,
    device: str,
    num_steps: int,
    database: str | os.PathLike[str] | None,
    task: str | None,
) -> ServedPolicy:
    """A robot family's served model (`Family.served_model` of pi05 and SmolVLA): a database and
    a task are an RT-J's, refused here naming the field."""
    for value, field in ((database, "database"), (task, "task")):
        if value is not None:
            raise ConfigError(
                f"{field}: only an RT-J model is served with a database and a task", param=field
            )
    return ServedPolicy.load(model, device=device, num_steps=num_steps)
