"""pi05's part of a training-loop session (relay_engine.core.session.Session): datums as
observations and action chunks, the flow-matching outputs, custom losses on the velocity, and
samplers of saved weights. The steps are the Pi05Learner's, the same code that runs recipe jobs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relay.catalog import (
    ACTION_DIM,
    ACTION_HORIZON,
    LORA_RANK_DEFAULT,
    default_targets,
)
from relay.events import weights_line
from relay_engine.core.session import Session
from relay_engine.errors import EngineError
from relay_engine.families.pi05.export import write_output
from relay_engine.families.pi05.learner import Pi05Learner
from relay_engine.families.robot_datums import check_frame_sizes, datum_to_sample
from relay_engine.models import FlowOutputs, Pi05Batch, Pi05Policy, load_policy
from relay_engine.models.checkpoints import Checkpoint, load_checkpoint, resolve_checkpoint
from relay_engine.tuning import apply_tuning

OUTPUT_KEYS = ("velocity", "target", "x_t", "noise", "time")


@dataclass(frozen=True)
class SessionSpec:
    """What a session trains: fixed for its life, and checked when a saved state is loaded."""

    base_model: str
    finetune: str = "lora"
    targets: list[str] | None = None
    lora_rank: int = LORA_RANK_DEFAULT
    lora_alpha: float | None = None
    action_horizon: int = ACTION_HORIZON
    # The weights to start from instead of the base's (a Hub repo[@revision], a directory or a
    # fine-tune's id, whose output directory the worker found: checkpoint_output).
    from_checkpoint: str | None = None
    checkpoint_output: str | None = None

    def identity(self) -> dict[str, Any]:
        """What a saved state must share with the session that loads it."""
        targets = list(self.targets) if self.targets is not None else list(default_targets(self.finetune))
        return {
            "base_model": self.base_model,
            "finetune": self.finetune,
            "targets": targets,
            "lora_rank": self.lora_rank if self.finetune == "lora" else None,
        }


class TrainingSession(Session[Pi05Batch]):
    """A tuned pi05, its optimizer and a session's calls (docs/sessions.md), on plain data."""

    loss_fn = "flow_matching"
    same_state = "model and targets"

    def __init__(self, spec: SessionSpec, *, device: torch.device | str = "cpu", seed: int = 0) -> None:
        self.spec = spec
        self.checkpoint: Checkpoint | None = None
        if spec.from_checkpoint is None:
            policy = load_policy(
                spec.base_model, device=device, action_horizon=spec.action_horizon, seed=seed
            )
        else:
            output = Path(spec.checkpoint_output) if spec.checkpoint_output is not None else None
            self.checkpoint = resolve_checkpoint(spec.from_checkpoint, output)
            policy = load_checkpoint(
                self.checkpoint,
                model=spec.base_model,
                action_horizon=spec.action_horizon,
                device=device,
                seed=seed,
            )
        self.model = apply_tuning(policy, spec.finetune, spec.targets, spec.lora_rank, spec.lora_alpha)
        self.learner: Pi05Learner = Pi05Learner(self.model, seed=seed, device=device)
        self._samplers: dict[str, Pi05Policy] = {}

    @property
    def info(self) -> dict[str, Any]:
        return {
            "model": self.spec.base_model,
            "action_horizon": self.spec.action_horizon,
            "action_dim": ACTION_DIM,
            "trainable_params": sum(p.numel() for p in self.learner.params),
            # Where the starting weights came from, when not the base's (relay.events.weights_line).
            **(
                {"weights": weights_line(self.checkpoint.event(0, self.spec.base_model))}
                if self.checkpoint
                else {}
            ),
        }

    def identity(self) -> dict[str, Any]:
        return self.spec.identity()

    # -- data -------------------------------------------------------------------------------------

    def batch(self, datums: Sequence[Mapping[str, Any]], *, with_actions: bool = True) -> Pi05Batch:
        if not datums:
            raise EngineError("a batch needs at least one datum")
        samples = [datum_to_sample(i, d, with_actions=with_actions) for i, d in enumerate(datums)]
        check_frame_sizes(samples)
        return self.model.collate(samples, item="datum")

    def training_batch(self, datums: Sequence[Mapping[str, Any]]) -> Pi05Batch:
        batch = self.batch(datums)
        self._note_action_width(datums)
        return batch

    def _note_action_width(self, datums: Sequence[Mapping[str, Any]]) -> None:
        """The robot's action width is the widest chunk trained on; the sampler needs it."""
        widest = max(int(np.shape(d["actions"])[-1]) for d in datums)
        known = self.model.config.robot_action_dim or 0
        if widest > known:
            self.model.config = self.model.config.replace(robot_action_dim=widest)

    # -- the family's calls -----------------------------------------------------------------------

    def forward_outputs(self, batch: Pi05Batch) -> dict[str, np.ndarray]:
        return _arrays(self.learner.forward(batch))

    def custom_forward(self, batch: Pi05Batch) -> tuple[Any, dict[str, np.ndarray]]:
        outputs = self.learner.forward_for_custom_loss(batch)
        return (outputs, batch), _arrays(outputs)

    def custom_backward(self, pending: Any, grad: np.ndarray, loss: float) -> None:
        outputs, batch = pending
        if tuple(grad.shape) != tuple(outputs.velocity.shape):
            raise EngineError(
                f"the custom loss's gradient has shape {tuple(grad.shape)}; "
                f"velocity's is {tuple(outputs.velocity.shape)}"
            )
        self.learner.backward_custom(outputs, batch, torch.tensor(grad), loss, [])

    def sample(
        self, observations: Sequence[Mapping[str, Any]], num_steps: int = 10, sampler: str | None = None
    ) -> np.ndarray:
        """(N, action_horizon, 32) actions, with the weights now or with a saved sampler's."""
        batch = self.batch([{"observation": o} for o in observations], with_actions=False)
        if sampler is None:
            return self.learner.sample(batch, num_steps=num_steps).numpy()
        policy = self._samplers.get(sampler)
        if policy is None:
            raise EngineError(f"no sampling client {sampler!r} in this session")
        with torch.no_grad():
            actions = policy.sample_actions(
                batch.to(policy.device), num_steps=num_steps, generator=self.learner.generator
            )
        return actions.float().cpu().numpy()

    def save_weights(self, name: str, directory: Path) -> None:
        """Merged weights to serve, and a sampler that keeps them however training goes on."""
        write_output(self.model, directory, None)
        self._samplers[name] = load_policy(str(directory), device=self.learner.device)


def _arrays(outputs: FlowOutputs) -> dict[str, np.ndarray]:
    return {key: getattr(outputs, key).detach().float().cpu().numpy() for key in OUTPUT_KEYS}
