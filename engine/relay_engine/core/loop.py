"""The training loop, shared by recipe jobs and the local trainer.

One step: read the step's batches, forward_backward each, optim_step at the scheduled rate.
Every `log_every` steps the loop reports the window's averages; every `checkpoint_every` steps
and at the end it asks for a checkpoint (and then `after_checkpoint`). It checks `should_stop()`
before every step. It knows nothing of databases or queues: the caller's callbacks do.

examples/local_loop.py is this loop written flat in one file (dataset, tuned model, step, schedule,
checkpoint), to read first or to start a variant from.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

from relay.events import CheckpointEvent, Event, FinishedEvent, MetricsEvent
from relay.optimizer import AdamParams
from relay_engine.core.learner import BatchT, Learner


@dataclass
class MetricsWindow:
    """Sums over the steps since the last metrics event (saved in checkpoints, for exact resume)."""

    steps: int = 0
    loss_sum: float = 0.0
    loss_count: int = 0
    grad_norm_sum: float = 0.0
    grad_norm_count: int = 0
    lr_sum: float = 0.0
    skipped: int = 0
    # Wall time of the window's steps, the part of it spent waiting for batches, and the samples
    # trained on: the speed figures of the metrics event.
    seconds: float = 0.0
    data_seconds: float = 0.0
    samples: int = 0

    def add(self, loss: float, grad_norm: float, lr: float, skipped: bool) -> None:
        self.steps += 1
        self.lr_sum += lr
        self.skipped += int(skipped)
        # A skipped step's gradient norm (and perhaps its loss) is not finite; the averages
        # describe the steps that were taken, `skipped` says how many were not.
        if math.isfinite(loss):
            self.loss_sum += loss
            self.loss_count += 1
        if not skipped:
            self.grad_norm_sum += grad_norm
            self.grad_norm_count += 1

    def event(self, step: int, gpu_memory_bytes: int | None = None) -> MetricsEvent:
        def mean(total: float, count: int) -> float | None:
            return total / count if count else None

        figures: dict[str, float | int] = {}
        if self.seconds > 0:
            figures["steps_per_second"] = self.steps / self.seconds
            figures["samples_per_second"] = self.samples / self.seconds
            figures["data_wait"] = min(1.0, self.data_seconds / self.seconds)
        if gpu_memory_bytes is not None:
            figures["gpu_memory_bytes"] = gpu_memory_bytes
        return MetricsEvent(
            step=step,
            loss=mean(self.loss_sum, self.loss_count),
            grad_norm=mean(self.grad_norm_sum, self.grad_norm_count),
            lr=self.lr_sum / self.steps,
            skipped=self.skipped / self.steps,
            **figures,
        )

    def time(self, seconds: float, data_seconds: float, samples: int) -> None:
        self.seconds += seconds
        self.data_seconds += data_seconds
        self.samples += samples

    def to_dict(self) -> dict[str, float]:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricsWindow:
        return cls(**data)


@dataclass
class LoopState:
    """Where a run is: the next step to take and the metrics window."""

    step: int = 0
    window: MetricsWindow = field(default_factory=MetricsWindow)
    last_loss: float | None = None


@dataclass(frozen=True)
class LoopResult:
    status: Literal["completed", "stopped"]
    step: int
    loss: float | None


def run_loop(
    learner: Learner[BatchT],
    next_step_batches: Callable[[], list[BatchT]],
    *,
    state: LoopState,
    total_steps: int,
    learning_rate_at: Callable[[int], float],
    adam: AdamParams,
    on_event: Callable[[Event], None],
    should_stop: Callable[[], bool],
    save_checkpoint: Callable[[LoopState], None] | None = None,
    checkpoint_every: int = 1000,
    log_every: int = 10,
    on_batch_loss: Callable[[float], None] | None = None,
    after_step: Callable[[LoopState], None] | None = None,
    after_checkpoint: Callable[[LoopState], None] | None = None,
) -> LoopResult:
    """Train from `state.step` to `total_steps`; `next_step_batches()` gives one step's micro-batches.
    `after_checkpoint` runs after each checkpoint's event (a validation split is scored there)."""
    while state.step < total_steps:
        if should_stop():
            return LoopResult("stopped", state.step, state.last_loss)

        started = time.perf_counter()
        lr = learning_rate_at(state.step)
        batches = next_step_batches()
        data_seconds = time.perf_counter() - started
        results = [learner.forward_backward(batch) for batch in batches]
        optim = learner.optim_step(replace(adam, learning_rate=lr))
        total_weight = sum(r.weight for r in results)
        loss = sum(r.loss * r.weight for r in results) / total_weight
        if on_batch_loss is not None:
            for result in results:
                on_batch_loss(result.loss)

        state.step += 1
        state.last_loss = loss
        state.window.add(loss, optim.grad_norm, lr, optim.skipped)
        state.window.time(
            time.perf_counter() - started, data_seconds, sum(batch.batch_size for batch in batches)
        )
        if state.step % log_every == 0 or state.step == total_steps:
            on_cuda = learner.device.type == "cuda"
            memory = torch.cuda.memory_allocated(learner.device) if on_cuda else None
            on_event(state.window.event(state.step, gpu_memory_bytes=memory))
            state.window = MetricsWindow()
        if save_checkpoint is not None and (state.step % checkpoint_every == 0 or state.step == total_steps):
            saving = time.perf_counter()
            save_checkpoint(state)
            on_event(CheckpointEvent(step=state.step, seconds=time.perf_counter() - saving))
            if after_checkpoint is not None:
                after_checkpoint(state)
        if after_step is not None:
            after_step(state)

    on_event(FinishedEvent(step=total_steps))
    return LoopResult("completed", total_steps, state.last_loss)
