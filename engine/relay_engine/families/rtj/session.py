"""RT-J's part of a training-loop session (relay_engine.core.session.Session).

The same calls as the pi05 session (relay_engine.families.pi05.session), on RelationalDatums: each is a
sampled context (the twelve RelationalBatch fields) and its label. forward_backward computes the
task loss (BCE on target_scores for binary, Huber for regression) through the RelationalLearner,
the step recipe jobs run, so a session's update equals a job's on the same contexts. RT-J is tuned
in full. Calls that belong to pi05 (sampling actions, custom losses on velocity) are refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relay_engine.core.session import Session
from relay_engine.errors import EngineError
from relay_engine.families.rtj.batch import BATCH_FIELDS, RelationalBatch
from relay_engine.families.rtj.checkpoint import save_network
from relay_engine.families.rtj.learner import LabelledBatch, RelationalLearner, per_context_loss
from relay_engine.families.rtj.trainer import RelationalExample
from relay_engine.families.rtj.transformer import RelationalTransformer

TASK_LOSS = "task"


@dataclass(frozen=True)
class RelationalSessionSpec:
    """What an RT-J session trains: fixed for its life, and checked when a saved state is loaded."""

    base_model: str
    problem_type: str = "binary"

    def identity(self) -> dict[str, Any]:
        return {
            "base_model": self.base_model,
            "finetune": "full",
            "targets": ["all"],
            "lora_rank": None,
            "problem_type": self.problem_type,
        }


def datum_to_example(index: int, datum: Mapping[str, Any]) -> tuple[RelationalExample, float]:
    """A session datum ({"context": {12 fields}, "label", "weight"}) as an example and its weight."""
    label = f"datum {index}"
    context = datum.get("context")
    if not isinstance(context, Mapping):
        raise EngineError(
            f"{label}: an rt-j session takes RelationalDatums: context must map the twelve RelationalBatch "
            f"fields ({', '.join(BATCH_FIELDS)}) to arrays"
        )
    unknown = sorted(set(context) - set(BATCH_FIELDS))
    if unknown:
        raise EngineError(f"{label}: context has unknown fields {', '.join(unknown)}")
    # One context may come without its batch dimension.
    fields = {
        name: (value[None] if np.ndim(value) >= 1 and np.ndim(context["node_idxs"]) == 1 else value)
        for name, value in context.items()
    }
    try:
        batch = RelationalBatch.from_mapping(fields)
    except (ValueError, TypeError, RuntimeError) as error:
        raise EngineError(f"{label}: {error}") from None
    if batch.batch_size != 1:
        raise EngineError(f"{label}: context holds {batch.batch_size} contexts; a datum is one")
    if not bool(batch.is_targets.any()):
        raise EngineError(f"{label}: context marks no target cell (is_targets is all False)")
    value = datum.get("label")
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise EngineError(f"{label}: label must be a finite number, got {value!r}")
    weight = datum.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight >= 0:
        raise EngineError(f"{label}: weight must be a number >= 0, got {weight!r}")
    return RelationalExample(input=batch, label=float(value)), float(weight)


class RelationalSession(Session[LabelledBatch]):
    """rt-j / rt-j-tiny, its optimizer and a session's calls (docs/relational.md), on plain data."""

    loss_fn = TASK_LOSS
    same_state = "model and problem_type"

    def __init__(
        self, spec: RelationalSessionSpec, *, device: torch.device | str = "cpu", seed: int = 0
    ) -> None:
        self.spec = spec
        task = "regression" if spec.problem_type == "regression" else "classification"
        self.model = RelationalTransformer(spec.base_model, task=task, device=device, seed=seed)
        self.learner: RelationalLearner = RelationalLearner(
            self.model.model, spec.problem_type, seed=seed, device=device
        )

    @property
    def info(self) -> dict[str, Any]:
        return {
            "model": self.spec.base_model,
            "problem_type": self.spec.problem_type,
            "loss_fn": TASK_LOSS,
            "trainable_params": sum(p.numel() for p in self.learner.params),
        }

    def identity(self) -> dict[str, Any]:
        return self.spec.identity()

    def _batch(self, datums: Sequence[Mapping[str, Any]]) -> tuple[LabelledBatch, list[float]]:
        if not datums:
            raise EngineError("a batch needs at least one datum")
        pairs = [datum_to_example(i, d) for i, d in enumerate(datums)]
        widths = {example.input.d_text for example, _ in pairs}
        if len(widths) > 1:
            raise EngineError(f"the batch's contexts have text widths {sorted(widths)}; they must be one")
        return LabelledBatch.of([example for example, _ in pairs]), [weight for _, weight in pairs]

    def batch(self, datums: Sequence[Mapping[str, Any]]) -> LabelledBatch:
        return self._batch(datums)[0]

    def training_batch(self, datums: Sequence[Mapping[str, Any]]) -> LabelledBatch:
        batch, weights = self._batch(datums)
        if any(w != 1.0 for w in weights):
            raise EngineError("rt-j sessions weigh every context 1: leave weight at 1.0")
        return batch

    def forward_outputs(self, batch: LabelledBatch) -> dict[str, np.ndarray]:
        """Each context's target score (a logit, or a z-scored value) and loss, without gradients."""
        self.learner.model.eval()
        with torch.no_grad():
            scores = self.learner.model(batch.contexts.to(self.learner.device))
            losses = per_context_loss(scores, batch.labels.to(self.learner.device), self.spec.problem_type)
        return {"target_scores": scores.float().cpu().numpy(), "loss": losses.float().cpu().numpy()}

    def save_weights(self, name: str, directory: Path) -> None:
        """A checkpoint directory (config.json + model.safetensors) that RelationalTransformer loads."""
        save_network(
            self.model.model,
            directory,
            {"model_type": self.spec.base_model, "problem_type": self.spec.problem_type},
        )

    # -- calls that belong to robot policies -----------------------------------------------------

    def sample(
        self, observations: Sequence[Mapping[str, Any]], num_steps: int = 10, sampler: str | None = None
    ) -> Any:
        raise EngineError(
            f"sample draws a robot policy's actions; {self.spec.base_model} has none: use forward for "
            "target_scores"
        )

    def no_custom_loss(self) -> EngineError:
        return EngineError(
            f"forward_backward_custom differentiates pi05's velocity; {self.spec.base_model} sessions train "
            "on the task loss: use forward_backward"
        )
