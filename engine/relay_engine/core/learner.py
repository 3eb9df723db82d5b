"""The one interface of a model family's step: what the loop, checkpoints and sessions train through.

A family's learner (pi05's `Pi05Learner`, RT-J's `RelationalLearner`, a test's toy) accumulates
gradients over forward_backward calls, as sums weighted by each datum's weight, and divides them
by the total weight in optim_step, so that any split of a batch gives the update of the whole
batch. `clipped_adam_step` is the one optimizer step every learner takes.
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import torch

from relay.optimizer import AdamParams


class Batch(Protocol):
    """What the loop needs of a batch: how many samples it holds (the speed figures)."""

    @property
    def batch_size(self) -> int: ...


BatchT = TypeVar("BatchT", bound=Batch)


@dataclass(frozen=True)
class ForwardBackwardResult:
    loss: float  # the weighted mean over this call's data
    per_sample: list[float]
    weight: float  # sum of the data's weights


@dataclass(frozen=True)
class OptimStepResult:
    grad_norm: float  # before clipping
    skipped: bool  # the gradient was not finite, so the weights were left as they were


class Learner(ABC, Generic[BatchT]):
    """A model, its optimizer and its loss: the step of one family."""

    device: torch.device

    @abstractmethod
    def forward_backward(self, batch: BatchT) -> ForwardBackwardResult:
        """Add the gradients of the family's loss on `batch` to those accumulated so far."""

    @abstractmethod
    def optim_step(self, params: AdamParams) -> OptimStepResult:
        """One step with the accumulated gradients (see clipped_adam_step), then clear them."""

    @abstractmethod
    def save_state(self, directory: Path) -> None:
        """What a resume needs (weights, optimizer, random generators), as files in `directory`."""

    @abstractmethod
    def load_state(self, directory: Path) -> None:
        """The inverse of save_state."""


def clipped_adam_step(
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.nn.Parameter],
    total_norm: torch.Tensor,
    adam: AdamParams,
) -> OptimStepResult:
    """Clip the gradients to `adam.grad_clip_norm` and take one step with `adam`'s settings, then
    clear them; a gradient whose norm is not finite is dropped and the weights stay as they were.
    The one optimizer step of every model family's learner."""
    grad_norm = float(total_norm)
    skipped = not math.isfinite(grad_norm)
    if not skipped:
        if adam.grad_clip_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(params, adam.grad_clip_norm, total_norm)
        for group in optimizer.param_groups:
            group.update(
                lr=adam.learning_rate,
                betas=(adam.beta1, adam.beta2),
                eps=adam.eps,
                weight_decay=adam.weight_decay,
            )
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return OptimStepResult(grad_norm=grad_norm, skipped=skipped)


def datum_generator(seed: int, step: int, place: int) -> torch.Generator:
    """The generator of one datum's noise: a pure function of the run's seed, the optimizer step
    and the datum's place among the step's data, so any split of a batch, and a resumed run, draw
    what one whole batch of an uninterrupted run drew."""
    key = hashlib.blake2b(f"{seed}:{step}:{place}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(key, "little") & ((1 << 63) - 1))
