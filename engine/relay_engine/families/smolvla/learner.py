"""SmolVLA's step (relay_engine.core.learner.Learner), and its batches from a LeRobot dataset.

As pi05's learner does, it accumulates sum_i(w_i * loss_i) over forward_backward calls and divides
by the total weight in optim_step, and draws each datum's noise and flow time from a generator
seeded by (seed, step, place), so any split of a batch, and a resumed run, give the same update.
A sample's loss is lerobot's: the squared error of the velocity over the robot's action columns
and the steps inside the episode, here averaged per sample (lerobot averages over the batch's
valid steps at once; the two agree where no sample's chunk runs past its episode's end).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from relay.optimizer import AdamParams
from relay_engine.core.learner import (
    ForwardBackwardResult,
    Learner,
    OptimStepResult,
    clipped_adam_step,
    datum_generator,
)
from relay_engine.datasets import LeRobotDataset
from relay_engine.errors import EngineError
from relay_engine.families.robot_scores import EVAL_BATCH_SIZE
from relay_engine.families.robot_validation import ValidationLoss
from relay_engine.families.smolvla.policy import (
    ACTION,
    ACTION_IS_PAD,
    STATE,
    TOKEN_MASK,
    TOKENS,
    SmolVLAPolicy,
)
from relay_engine.families.smolvla.processor import SmolVLAProcessor
from relay_engine.models.pi05 import sample_flow_time
from relay_engine.samples import Sample

TRAINABLE_FILE = "trainable.safetensors"
STATE_FILE = "optimizer_and_rng.pt"


@dataclass
class SmolVLABatch:
    """A batch as SmolVLAPolicy reads it (cameras, normalized state and actions, tokens), with each
    sample's weight in the loss."""

    tensors: dict[str, torch.Tensor]
    weights: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.weights.shape[0])

    def to(self, device: torch.device) -> SmolVLABatch:
        return SmolVLABatch({k: v.to(device) for k, v in self.tensors.items()}, self.weights.to(device))


class SmolVLACollate:
    """Dataset samples (already normalized by the dataset, mean and std) into a SmolVLABatch: images
    to [0, 1] channels-first, tasks tokenized as lerobot's processor does."""

    def __init__(self, processor: SmolVLAProcessor, cameras: Sequence[str]) -> None:
        self.processor = processor
        self.cameras = tuple(cameras)

    def __call__(self, samples: Sequence[Sample]) -> SmolVLABatch:
        tokens, mask = self.processor.tokenize([sample["prompt"] for sample in samples])
        tensors = {
            camera: torch.stack([torch.as_tensor(np.asarray(s["image"][camera])) for s in samples])
            .permute(0, 3, 1, 2)
            .float()
            / 255.0
            for camera in self.cameras
        }
        tensors[STATE] = torch.from_numpy(np.stack([s["state"] for s in samples]))
        if all("actions" in s for s in samples):  # training's; an observation to act on has none
            tensors[ACTION] = torch.from_numpy(np.stack([s["actions"] for s in samples]))
            tensors[ACTION_IS_PAD] = torch.from_numpy(np.stack([s["action_is_pad"] for s in samples]))
        tensors[TOKENS], tensors[TOKEN_MASK] = tokens, mask
        weights = torch.tensor([float(s.get("weight", 1.0)) for s in samples])
        return SmolVLABatch(tensors, weights)


class SmolVLALearner(Learner[SmolVLABatch]):
    """A SmolVLA policy, AdamW over what it trains, and its flow-matching noise."""

    def __init__(self, policy: SmolVLAPolicy, *, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.model = policy
        self.device = torch.device(device)
        self.params = policy.trainable()
        for parameter in policy.parameters():
            parameter.requires_grad_(False)
        for parameter in self.params:
            parameter.requires_grad_(True)
        if not self.params:
            raise EngineError("nothing to train: SmolVLA's settings freeze every weight")
        self.optimizer = torch.optim.AdamW(self.params, lr=0.0, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        self.seed = seed
        self.steps_taken = 0
        self._accumulated_weight = 0.0
        self._data_since_step = 0

    def _noise(self, batch: SmolVLABatch) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (self.model.config.chunk_size, self.model.config.max_action_dim)
        noises, times = [], []
        for place in range(self._data_since_step, self._data_since_step + batch.batch_size):
            generator = datum_generator(self.seed, self.steps_taken, place)
            noises.append(torch.randn(shape, generator=generator))
            times.append(sample_flow_time(1, generator))
        self._data_since_step += batch.batch_size
        return torch.stack(noises).to(self.device), torch.cat(times).to(self.device)

    def forward(self, batch: SmolVLABatch) -> torch.Tensor:
        """Each sample's loss without gradients (evaluation), from the noise the same data would
        get from the next forward_backward, without using up those places: forward(b) then
        forward_backward(b) report the same loss."""
        place = self._data_since_step
        was_training = self.model.training
        self.model.eval()
        try:
            batch = batch.to(self.device)
            noise, time = self._noise(batch)
            with torch.no_grad():
                return self.model.loss(batch.tensors, noise, time, reduction="none")
        finally:
            self._data_since_step = place
            self.model.train(was_training)

    def forward_backward(self, batch: SmolVLABatch) -> ForwardBackwardResult:
        if not self.model.training:
            self.model.train()
        batch = batch.to(self.device)
        noise, time = self._noise(batch)
        per_sample = self.model.loss(batch.tensors, noise, time, reduction="none")
        weight = batch.weights.sum()
        (per_sample * batch.weights).sum().backward()
        loss = (per_sample.detach() * batch.weights).sum() / weight.clamp_min(1e-12)
        self._accumulated_weight += float(weight)
        return ForwardBackwardResult(
            loss=float(loss), per_sample=[float(x) for x in per_sample.detach().cpu()], weight=float(weight)
        )

    def optim_step(self, params: AdamParams) -> OptimStepResult:
        if self._accumulated_weight <= 0:
            raise EngineError(
                "optim_step: no gradients accumulated since the last step; call forward_backward first"
            )
        grads = [p.grad for p in self.params if p.grad is not None]
        for grad in grads:
            grad.div_(self._accumulated_weight)
        total_norm = torch.nn.utils.get_total_norm(grads) if grads else torch.tensor(0.0)
        result = clipped_adam_step(self.optimizer, self.params, total_norm, params)
        self._accumulated_weight = 0.0
        self._data_since_step = 0
        self.steps_taken += 1
        return result

    def save_state(self, directory: Path) -> None:
        names = {id(p): name for name, p in self.model.named_parameters()}
        weights = {names[id(p)]: p.detach().contiguous().cpu() for p in self.params}
        save_file(weights, str(directory / TRAINABLE_FILE))
        torch.save(
            {
                "optimizer": self.optimizer.state_dict(),
                "steps_taken": self.steps_taken,
                "torch": torch.get_rng_state(),
                "numpy": np.random.get_state(),
                "python": random.getstate(),
            },
            directory / STATE_FILE,
        )

    def load_state(self, directory: Path) -> None:
        weights = load_file(str(directory / TRAINABLE_FILE), device=str(self.device))
        missing = {name for name, p in self.model.named_parameters() if p.requires_grad} - set(weights)
        if missing:
            raise EngineError(f"{directory}: the checkpoint lacks {len(missing)} trained weights")
        self.model.load_state_dict(weights, strict=False)
        # Our own file: the numpy RNG state needs full unpickling.
        state: dict[str, Any] = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps_taken = int(state["steps_taken"])
        torch.set_rng_state(state["torch"])
        np.random.set_state(state["numpy"])
        random.setstate(state["python"])
        self.optimizer.zero_grad(set_to_none=True)
        self._accumulated_weight = 0.0
        self._data_since_step = 0


def validation_loss(policy: SmolVLAPolicy, collate: SmolVLACollate) -> ValidationLoss:
    """SmolVLA's flow-matching loss on held-out frames, as a recipe's Validator asks for it: each
    frame weighted as in training, the noise and flow times drawn from `seed` in the frames' order,
    so the same frames give the same loss for the same weights."""

    @torch.no_grad()
    def loss(dataset: LeRobotDataset, frames: Sequence[int], seed: int) -> float:
        generator = torch.Generator().manual_seed(seed)
        device = next(policy.parameters()).device
        shape = (policy.config.chunk_size, policy.config.max_action_dim)
        was_training = policy.training
        policy.eval()
        weighted, total_weight = 0.0, 0.0
        try:
            for start in range(0, len(frames), EVAL_BATCH_SIZE):
                batch = collate([dataset[i] for i in frames[start : start + EVAL_BATCH_SIZE]]).to(device)
                noise = torch.randn((batch.batch_size, *shape), generator=generator)
                time = sample_flow_time(batch.batch_size, generator)
                per_sample = policy.loss(batch.tensors, noise.to(device), time.to(device), reduction="none")
                weighted += float((per_sample * batch.weights).sum())
                total_weight += float(batch.weights.sum())
        finally:
            policy.train(was_training)
        return weighted / max(total_weight, 1e-12)

    return loss


class ScoredSmolVLA:
    """SmolVLA as the robot policies' action scores read a policy
    (relay_engine.families.robot_scores.evaluate_actions): `collate` and `sample_actions`, the
    chunks over every one of the 32 columns."""

    def __init__(self, policy: SmolVLAPolicy, processor: SmolVLAProcessor) -> None:
        self.policy = policy
        self.collate = SmolVLACollate(processor, policy.cameras)

    def eval(self) -> ScoredSmolVLA:
        self.policy.eval()
        return self

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.policy.parameters()

    @torch.no_grad()
    def sample_actions(
        self,
        batch: SmolVLABatch,
        num_steps: int = 10,
        generator: torch.Generator | None = None,
        chunks: int = 1,
    ) -> torch.Tensor:
        """(B * chunks, chunk, 32): rows b * chunks to b * chunks + chunks - 1 are frame b's."""
        tensors = {key: value.repeat_interleave(chunks, dim=0) for key, value in batch.tensors.items()}
        config = self.policy.config
        shape = (batch.batch_size * chunks, config.chunk_size, config.max_action_dim)
        noise = torch.randn(shape, generator=generator)
        device = next(self.policy.parameters()).device
        return self.policy.sample_padded(tensors, noise.to(device), num_steps)


@dataclass(frozen=True)
class ActingConfig:
    """What acting reads of a policy's config: its name, chunk length and padded action width."""

    model: str
    action_horizon: int
    action_dim: int
    family: str = "smolvla"


class ActingSmolVLA:
    """SmolVLA as an acting policy (relay_engine.acting.ActingPolicy): observations under its own
    camera names in, normalized chunks over all 32 columns out."""

    def __init__(self, policy: SmolVLAPolicy, processor: SmolVLAProcessor, name: str) -> None:
        self.policy = policy
        self.collate = SmolVLACollate(processor, policy.cameras)
        self.reads_cameras: tuple[str, ...] | None = policy.cameras
        self.frame_size: int | None = None  # it resizes with its own left-top padding
        self.config = ActingConfig(name, policy.config.chunk_size, policy.config.max_action_dim)

    def eval(self) -> ActingSmolVLA:
        self.policy.eval()
        return self

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device

    @torch.no_grad()
    def sample_actions(
        self,
        batch: SmolVLABatch,
        num_steps: int = 10,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
    ) -> torch.Tensor:
        device = next(self.policy.parameters()).device
        if noise is None:
            shape = (batch.batch_size, self.config.action_horizon, self.config.action_dim)
            noise = torch.randn(shape, generator=generator)
        return self.policy.sample_padded(batch.to(device).tensors, noise.to(device), num_steps)
