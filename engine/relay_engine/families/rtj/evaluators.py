"""Evaluators in the shape of RelativeDB's `relational-transformers`: built on labelled examples,
called with a model, returning a dict of metrics by the same names.

    metrics = SequentialEvaluator([BinaryClassificationEvaluator(val), RegressionEvaluator(val_ltv)])(model)

(evaluate.py holds the AUROC and nMAE evaluation the `relay` recipes report.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from relay_engine.families.rtj.trainer import RelationalExample
from relay_engine.families.rtj.transformer import RelationalTransformer

Evaluator = Callable[[RelationalTransformer], dict[str, float]]


def _labels(examples: Sequence[RelationalExample]) -> np.ndarray:
    if not examples:
        raise ValueError("examples: an evaluator needs at least one example")
    return np.asarray([example.label for example in examples])


def _predictions(
    model: RelationalTransformer,
    examples: Sequence[RelationalExample],
    task_head: str | None,
    activation: str | None,
) -> np.ndarray:
    """One prediction per example, all contexts run as one padded batch."""
    contexts = [model.as_batch(example.input, target=example.target) for example in examples]
    predicted = model.predict(contexts, task_head=task_head, activation=activation)
    return np.asarray(predicted, dtype=np.float64).reshape(-1)


@dataclass
class BinaryClassificationEvaluator:
    """accuracy, precision, recall and F1 of the predicted probabilities against 0/1 labels, a
    probability at or above `threshold` counting as positive. Precision (recall) is 0 when nothing
    is predicted (labelled) positive, and F1 is 0 when both are."""

    examples: Sequence[RelationalExample]
    threshold: float = 0.5
    task_head: str | None = None

    def __call__(self, model: RelationalTransformer) -> dict[str, float]:
        actual = _labels(self.examples).astype(bool).reshape(-1)
        predicted = _predictions(model, self.examples, self.task_head, None) >= self.threshold
        hits = int((predicted & actual).sum())
        precision = hits / max(int(predicted.sum()), 1)
        recall = hits / max(int(actual.sum()), 1)
        both = precision + recall
        return {
            "accuracy": float((predicted == actual).mean()),
            "precision": precision,
            "recall": recall,
            "f1": 2 * precision * recall / both if both > 0 else 0.0,
        }


@dataclass
class RegressionEvaluator:
    """MAE, RMSE and R² of the raw predictions (no activation) for regression and forecasting; R²
    is NaN when every label is the same."""

    examples: Sequence[RelationalExample]
    task_head: str | None = None

    def __call__(self, model: RelationalTransformer) -> dict[str, float]:
        actual = _labels(self.examples).astype(np.float64).reshape(-1)
        errors = _predictions(model, self.examples, self.task_head, "identity") - actual
        spread = float(np.square(actual - actual.mean()).sum())
        return {
            "mae": float(np.abs(errors).mean()),
            "rmse": float(np.sqrt(np.square(errors).mean())),
            "r2": 1.0 - float(np.square(errors).sum()) / spread if spread > 0 else math.nan,
        }


class SequentialEvaluator:
    """Runs evaluators in order and merges their metrics; two giving the same name is an error."""

    def __init__(self, evaluators: Sequence[Evaluator]) -> None:
        self.evaluators = list(evaluators)
        if not self.evaluators:
            raise ValueError("evaluators: SequentialEvaluator needs at least one evaluator")

    def __call__(self, model: RelationalTransformer) -> dict[str, float]:
        merged: dict[str, float] = {}
        for evaluator in self.evaluators:
            metrics = evaluator(model)
            repeated = sorted(merged.keys() & metrics.keys())
            if repeated:
                raise ValueError(f"evaluators: more than one gives the metric(s) {', '.join(repeated)}")
            merged.update(metrics)
        return merged
