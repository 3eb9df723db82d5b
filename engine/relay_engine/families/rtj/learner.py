"""The RT-J step, a relay_engine.core.learner.Learner (forward_backward, optim_step, save_state,
load_state), so recipe jobs and the RelationalTrainer run it through the same loop, checkpoints
and events.

Jobs and sessions weigh each context 1: as in pi05's learner, gradients accumulate as sums over
the data until optim_step divides by the total weight (the number of contexts), so two half
batches make the update of one full batch. The task loss is the trainer's: BCE on target_scores
for binary tasks, Huber for regression.

The RelationalTrainer weighs each micro-batch as Hugging Face's Trainer (and RelativeDB's) does:
the gradient of its mean loss (relay_engine.families.rtj.losses), divided by the accumulation
steps. It also trains a head alone, on frozen target features: the learner's network is then the
head, and a batch's inputs are the features.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

from relay.optimizer import AdamParams
from relay_engine.core.learner import ForwardBackwardResult, Learner, OptimStepResult, clipped_adam_step
from relay_engine.errors import EngineError
from relay_engine.families.rtj.batch import RelationalBatch, collate
from relay_engine.families.rtj.losses import NUMERIC_PROBLEM_TYPES, loss_for

if TYPE_CHECKING:
    from relay_engine.families.rtj.trainer import RelationalExample


@dataclass(frozen=True)
class LabelledBatch:
    """Contexts (or, for a head, their target features) and their labels (0/1, z-scored values,
    class indices or 0/1 per label)."""

    contexts: RelationalBatch | torch.Tensor
    labels: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])

    @classmethod
    def of(cls, examples: Sequence[RelationalExample]) -> LabelledBatch:
        labels = torch.as_tensor([float(e.label) for e in examples], dtype=torch.float32)
        return cls(collate([e.input for e in examples]), labels)


def per_context_loss(scores: torch.Tensor, labels: torch.Tensor, problem_type: str) -> torch.Tensor:
    if problem_type == "binary":
        return F.binary_cross_entropy_with_logits(scores, labels, reduction="none")
    if problem_type in NUMERIC_PROBLEM_TYPES:
        return F.huber_loss(scores, labels, reduction="none", delta=1.0)
    raise EngineError(f"RT-J jobs train binary, regression or forecasting tasks, not {problem_type!r}")


class RelationalLearner(Learner[LabelledBatch]):
    """RT-J's step over every weight of `network` (an RTJNetwork, or a TaskHead on features).

    With `accumulation` (the RelationalTrainer's), each micro-batch adds the gradient of its mean
    loss divided by `accumulation`, and optim_step divides by nothing; without it (jobs, sessions),
    each context weighs 1. `forward` replaces the network's call (a compiled copy of it)."""

    def __init__(
        self,
        network: torch.nn.Module,
        problem_type: str,
        *,
        seed: int = 0,
        device: torch.device | str = "cpu",
        accumulation: int | None = None,
        forward: Callable[[Any], torch.Tensor] | None = None,
    ):
        self.model = network
        self.problem_type = problem_type
        self.device = torch.device(device)
        self.seed = seed
        self.params = list(network.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=0.0)
        self.steps_taken = 0
        self._accumulated_weight = 0.0
        self.accumulation = accumulation
        self._forward = forward or network
        self._mean_loss = loss_for(problem_type) if accumulation is not None else None

    def forward_backward(self, batch: LabelledBatch) -> ForwardBackwardResult:
        self.model.train()
        scores = self._forward(batch.contexts.to(self.device))
        labels = batch.labels.to(self.device)
        weight = float(batch.batch_size)
        self._accumulated_weight += weight
        if self._mean_loss is not None and self.accumulation is not None:
            loss = self._mean_loss(scores, labels)
            (loss / self.accumulation).backward()
            return ForwardBackwardResult(loss=float(loss.detach()), per_sample=[], weight=weight)
        losses = per_context_loss(scores, labels, self.problem_type)
        losses.sum().backward()
        return ForwardBackwardResult(
            loss=float(losses.detach().mean()),
            per_sample=[float(x) for x in losses.detach().cpu()],
            weight=weight,
        )

    def forward(self, batch: LabelledBatch) -> tuple[float, list[float]]:
        """The loss without gradients (evaluation)."""
        self.model.eval()
        with torch.no_grad():
            scores = self.model(batch.contexts.to(self.device))
            losses = per_context_loss(scores, batch.labels.to(self.device), self.problem_type)
        return float(losses.mean()), [float(x) for x in losses.cpu()]

    def optim_step(self, params: AdamParams) -> OptimStepResult:
        if self._accumulated_weight <= 0:
            raise EngineError(
                "optim_step: no gradients accumulated since the last step; call forward_backward first"
            )
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.accumulation is None:  # each context weighs 1 (see the module's note)
            for grad in grads:
                grad.div_(self._accumulated_weight)
        total_norm = torch.nn.utils.get_total_norm(grads) if grads else torch.tensor(0.0)
        result = clipped_adam_step(self.optimizer, self.params, total_norm, params)
        self._accumulated_weight = 0.0
        self.steps_taken += 1
        return result

    def save_state(self, directory: Path) -> None:
        """Every weight, the optimizer and the RNGs, as files in `directory`."""
        weights = {k: v.detach().contiguous().cpu() for k, v in self.model.state_dict().items()}
        save_file(weights, str(directory / "model.safetensors"))
        torch.save(
            {
                "optimizer": self.optimizer.state_dict(),
                "steps_taken": self.steps_taken,
                "torch": torch.get_rng_state(),
                "numpy": np.random.get_state(),
                "python": random.getstate(),
            },
            directory / "optimizer_and_rng.pt",
        )

    def load_state(self, directory: Path) -> None:
        self.model.load_state_dict(load_file(str(directory / "model.safetensors"), device=str(self.device)))
        # Our own file: the numpy RNG state needs full unpickling.
        state: dict[str, Any] = torch.load(
            directory / "optimizer_and_rng.pt", map_location="cpu", weights_only=False
        )
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps_taken = int(state["steps_taken"])
        torch.set_rng_state(state["torch"])
        np.random.set_state(state["numpy"])
        random.setstate(state["python"])
        self.optimizer.zero_grad(set_to_none=True)
        self._accumulated_weight = 0.0
