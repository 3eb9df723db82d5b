"""pi05's step: its forward_backward and optim_step (relay_engine.core.learner.Learner).

Recipe jobs, the local trainer and training-loop sessions all train through a Pi05Learner, so a
session step and a job step are the same code.

Gradients accumulate across forward_backward calls until optim_step, so that any split of a
batch gives the same update as the whole batch:
- each call adds the gradient of sum_i(w_i * loss_i) over its data and the total weight
  sum_i(w_i); optim_step divides by the total weight;
- a datum's flow-matching noise and time are drawn from its own generator, seeded by the run's
  seed, the optimizer step and the datum's place among the data since the last optim_step, so
  the k-th datum of a step gets the same noise whichever call it comes in.
Two half batches then one step therefore equal one full batch then one step. The noise is also a
pure function of (seed, step, place), which makes a resumed run draw what an uninterrupted one did.

Across the processes of a group (`parallel`, see relay_engine.families.pi05.parallel), the place is the
datum's place in the GLOBAL batch: rank r's data come after those of ranks 0..r-1. Each call's
loss and weight are summed over the group, and the gradients DDP or FSDP average over it are
divided by the global weight, so N processes make the update, and report the loss, of one.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from relay_engine.errors import EngineError
from relay_engine.models import FlowOutputs, Pi05Batch, Pi05Policy, flow_matching_loss, sample_flow_time
from relay_engine.tuning import load_trainable_state_dict, trainable_state_dict

if TYPE_CHECKING:
    from relay_engine.families.pi05.parallel import Parallel


class Pi05Learner(Learner[Pi05Batch]):
    """pi05's learner: a tuned policy, its AdamW optimizer and its flow-matching noise generator."""

    def __init__(
        self,
        model: Pi05Policy,
        *,
        seed: int = 0,
        device: torch.device | str = "cpu",
        parallel: Parallel | None = None,
    ) -> None:
        self.model = model
        self.balance_padding = model.config.balance_padding
        self.device = torch.device(device)
        # Set up (DDP or FSDP) before the optimizer sees the parameters: FSDP replaces them by shards.
        self.parallel = parallel
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise EngineError("nothing to train: the targets select no parameters")
        # The rate, betas, eps and decay are set per step from AdamParams.
        self.optimizer = torch.optim.AdamW(self.params, lr=0.0, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        self.seed = seed
        self.steps_taken = 0
        self._accumulated_weight = 0.0
        self._data_since_step = 0  # the place of the next datum among this step's data
        # The sampler's noise (sample) is the one thing drawn from a running generator.
        self.generator = torch.Generator().manual_seed(seed)

    def _datum_generator(self, place: int) -> torch.Generator:
        return datum_generator(self.seed, self.steps_taken, place)

    def flow_noise(self, batch: Pi05Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Noise (B, H, 32) and flow time (B,) for the next data of this step (see the module's note)."""
        count = batch.actions.shape[0]
        first, in_all = self._data_since_step, count
        if self.parallel is not None:
            counts = self.parallel.gather_counts(count)
            first += sum(counts[: self.parallel.world.rank])
            in_all = sum(counts)
        noises, times = [], []
        for place in range(first, first + count):
            generator = self._datum_generator(place)
            noises.append(torch.randn(batch.actions.shape[1:], generator=generator))
            times.append(sample_flow_time(1, generator))
        self._data_since_step += in_all
        return torch.stack(noises), torch.cat(times)

    def _flow_outputs(self, batch: Pi05Batch, *, train: bool = False) -> FlowOutputs:
        noise, time = self.flow_noise(batch)
        with self._autocast():
            if train and self.parallel is not None:
                return self.parallel.flow_outputs(batch.to(self.device), noise, time)
            return self.model.flow_outputs(batch.to(self.device), noise=noise, time=time)

    # -- autocast --------------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        # bf16 activations on CUDA (fp32 master weights, gradients and optimizer); fp32 on the CPU.
        if self.device.type == "cuda":
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """Where the training model is scored between steps (a validation split): no gradients,
        training's autocast (bf16 on CUDA, where DDP keeps the frozen weights in bf16). The next
        forward_backward puts the model back in training mode."""
        with torch.no_grad(), self._autocast():
            yield

    def _mode(self, training: bool) -> None:
        # Module.train() walks every submodule (thousands in pi05); switch only when it changes.
        if self.model.training != training:
            self.model.train(training)

    # -- steps -----------------------------------------------------------------------------------

    def forward_backward(self, batch: Pi05Batch) -> ForwardBackwardResult:
        """Add the gradients of the flow-matching loss on `batch` to those accumulated so far."""
        self._mode(training=True)
        # The batch's weight read where the batch is made (the host), before it moves: reading it
        # from the device would wait for the device's queue.
        weight = float(batch.weights.sum())
        batch = batch.to(self.device)
        outputs = self._flow_outputs(batch, train=True)
        loss, per_sample = flow_matching_loss(outputs, batch, balance_padding=self.balance_padding)
        (loss * weight).backward()
        if self.parallel is not None:
            # The group's loss and weight: what one process with the whole batch would report.
            weighted_loss, weight = self.parallel.sum([float(loss.detach()) * weight, weight])
            loss = torch.tensor(weighted_loss / weight if weight > 0 else 0.0)
        return self._accumulate(loss, per_sample, weight)

    def forward(self, batch: Pi05Batch) -> FlowOutputs:
        """The flow-matching outputs without gradients (evaluation).

        It draws the noise that the same data would get from the next forward_backward, without
        using up those places, so forward(b) then forward_backward(b) report the same loss.
        """
        self._mode(training=False)
        place = self._data_since_step
        try:
            with torch.no_grad():
                return self._flow_outputs(batch)
        finally:
            self._data_since_step = place

    def forward_for_custom_loss(self, batch: Pi05Batch) -> FlowOutputs:
        """The forward pass of a custom loss: `velocity` keeps its graph until backward_custom."""
        self._mode(training=True)
        return self._flow_outputs(batch)

    def backward_custom(
        self,
        outputs: FlowOutputs,
        batch: Pi05Batch,
        grad_velocity: torch.Tensor,
        loss: float,
        per_sample: list[float],
    ) -> ForwardBackwardResult:
        """Backpropagate d(custom loss)/d(velocity).

        Weighted by the batch's total weight, like a built-in loss, so that optim_step's average
        leaves a lone custom loss's gradient as the user computed it.
        """
        weight = batch.weights.sum()
        outputs.velocity.backward(grad_velocity.to(outputs.velocity.device, outputs.velocity.dtype) * weight)
        return self._accumulate(torch.tensor(loss), torch.tensor(per_sample), weight)

    def _accumulate(
        self, loss: torch.Tensor, per_sample: torch.Tensor, weight: torch.Tensor | float
    ) -> ForwardBackwardResult:
        self._accumulated_weight += float(weight)
        # The loss and each sample's, brought to the host in one copy (one wait for the device).
        values = torch.cat([loss.detach().reshape(1).to(per_sample.device), per_sample.detach().reshape(-1)])
        host = values.float().cpu().tolist()
        return ForwardBackwardResult(loss=host[0], per_sample=host[1:], weight=float(weight))

    def optim_step(self, params: AdamParams) -> OptimStepResult:
        """One AdamW step with the accumulated gradients, then clear them.

        A gradient with a non-finite value is dropped and the weights are left unchanged, so one
        bad batch cannot poison the run; the step still counts.
        """
        if self._accumulated_weight <= 0:
            raise EngineError(
                "optim_step: no gradients accumulated since the last step; call forward_backward first"
            )
        grads = [p.grad for p in self.params if p.grad is not None]
        # DDP and FSDP leave the mean of the ranks' gradients, each a sum over its own data.
        divisor = self._accumulated_weight / (self.parallel.size if self.parallel is not None else 1)
        for grad in grads:
            grad.div_(divisor)
        total_norm = torch.nn.utils.get_total_norm(grads) if grads else torch.tensor(0.0)
        if self.parallel is not None:
            total_norm = self.parallel.full_norm(total_norm)
        result = clipped_adam_step(self.optimizer, self.params, total_norm, params)
        self._accumulated_weight = 0.0
        self._data_since_step = 0
        self.steps_taken += 1
        return result

    def sample(self, batch: Pi05Batch, num_steps: int = 10) -> torch.Tensor:
        """Actions (B, action_horizon, 32) for the batch's observations, with the weights as they are now."""
        self._mode(training=False)
        with torch.no_grad(), self._autocast():
            actions = self.model.sample_actions(
                batch.to(self.device), num_steps=num_steps, generator=self.generator
            )
        return actions.float().cpu()

    # -- state -----------------------------------------------------------------------------------

    def save_state(self, directory: Path) -> None:
        """Trainable weights, optimizer and every RNG, as files in `directory`."""
        weights = {
            name: t.detach().contiguous().cpu() for name, t in trainable_state_dict(self.model).items()
        }
        save_file(weights, str(directory / "trainable.safetensors"))
        torch.save(
            {"optimizer": self.optimizer.state_dict(), **self.rng_state()},
            directory / "optimizer_and_rng.pt",
        )

    def rng_state(self) -> dict[str, Any]:
        """The step count and every random generator this process draws from."""
        return {
            "steps_taken": self.steps_taken,
            "generator": self.generator.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        }

    def set_rng_state(self, state: dict[str, Any]) -> None:
        self.steps_taken = int(state["steps_taken"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch"])
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
        np.random.set_state(state["numpy"])
        random.setstate(state["python"])
        self.clear_accumulated()

    def clear_accumulated(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self._accumulated_weight = 0.0
        self._data_since_step = 0

    def load_state(self, directory: Path) -> None:
        load_trainable_state_dict(
            self.model, load_file(str(directory / "trainable.safetensors"), device=str(self.device))
        )
        # Our own file: the numpy RNG state needs full unpickling. Optimizer state moves to the
        # parameters' device in load_state_dict; the generator state must stay on the CPU.
        state = torch.load(directory / "optimizer_and_rng.pt", map_location="cpu", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.set_rng_state(state)

    def trainable_parameters(self) -> Iterator[torch.nn.Parameter]:
        return iter(self.params)
