"""One evaluator for before and after tuning: AUROC for binary tasks, MAE and nMAE for regression.

nMAE is the MAE divided by the standard deviation of the train split's labels, as the RelBench
leaderboard and RT-J report it. Regression predictions are made in z-scored units and turned back
into the label's units with the train split's mean and std before they are scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from relay_engine.errors import ConfigError
from relay_engine.families.rtj.database import seconds
from relay_engine.families.rtj.sampling import ContextSampler, LabelScale
from relay_engine.families.rtj.trainer import RelationalExample
from relay_engine.families.rtj.transformer import RelationalTransformer


def auroc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The area under the ROC curve (the Mann-Whitney statistic; tied scores count one half).
    NaN when only one class is present."""
    labels = np.asarray(labels, dtype=bool).reshape(-1)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    # Average ranks over runs of equal scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(scores)]
    for start, end in zip(starts, ends, strict=True):
        ranks[order[start:end]] = (start + end + 1) / 2.0
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


@dataclass(frozen=True)
class Evaluation:
    problem_type: str
    examples: int
    metrics: dict[str, float]


def predict_scores(
    model: RelationalTransformer, examples: Sequence[RelationalExample], batch_size: int = 32
) -> np.ndarray:
    """Raw target_scores (logits, or z-scored values) for each example, in order."""
    out = [
        model.target_scores([e.input for e in examples[start : start + batch_size]]).float().cpu().numpy()
        for start in range(0, len(examples), batch_size)
    ]
    return np.concatenate(out) if out else np.zeros(0)


def evaluate(
    model: RelationalTransformer,
    examples: Sequence[RelationalExample],
    problem_type: str,
    label_scale: LabelScale | None = None,
    batch_size: int = 32,
) -> Evaluation:
    if not examples:
        raise ValueError("evaluation needs at least one example")
    scores = predict_scores(model, examples, batch_size)
    labels = np.asarray([e.label for e in examples], dtype=np.float64)
    if problem_type == "binary":
        probabilities = 1.0 / (1.0 + np.exp(-scores))
        metrics = {
            "auroc": auroc(labels, scores),
            "accuracy": float(((probabilities >= 0.5) == (labels >= 0.5)).mean()),
            "positive_rate": float(labels.mean()),
        }
    elif problem_type == "regression":
        scale = label_scale or LabelScale(0.0, 1.0)
        predicted = scores * scale.std + scale.mean
        actual = labels * scale.std + scale.mean
        mae = float(np.abs(predicted - actual).mean())
        metrics = {
            "mae": mae,
            "nmae": mae / scale.std,
            "rmse": float(np.sqrt(np.square(predicted - actual).mean())),
        }
    else:
        raise ValueError(f"evaluation covers binary and regression tasks, not {problem_type!r}")
    return Evaluation(problem_type, len(examples), metrics)


def label_frequency_baseline(sampler: ContextSampler, split: str) -> np.ndarray:
    """A baseline without a model: for each row of the split, the mean label of the same entity's
    earlier train rows (the train split's mean when it has none)."""
    spec = sampler.spec
    train, rows = sampler.splits["train"], sampler.splits[split]
    train_entities = train.column(spec.entity_column).to_pylist()
    train_times = seconds(train.column(spec.time_column))
    train_labels = np.asarray(train.column(spec.target_column).to_pylist(), dtype=np.float64)
    overall = float(train_labels.mean())
    history: dict[object, list[tuple[float, float]]] = {}
    for entity, time, label in zip(train_entities, train_times, train_labels, strict=True):
        history.setdefault(entity, []).append((float(time), float(label)))
    times = seconds(rows.column(spec.time_column))
    out = []
    for entity, time in zip(rows.column(spec.entity_column).to_pylist(), times, strict=True):
        earlier = [label for t, label in history.get(entity, []) if t < time]
        out.append(float(np.mean(earlier)) if earlier else overall)
    return np.asarray(out)


def evaluate_split(
    model_name_or_dir: str,
    dataset: str,
    task: str | None,
    split: str,
    *,
    device: str = "auto",
    seed: int = 0,
    tasks_dir: str | None = None,
) -> dict[str, Any]:
    """The task's metrics on one split (AUROC for binary, MAE and nMAE for regression), a baseline's
    score on the same rows (binary: the label-frequency AUROC; regression: the train median's MAE)
    and `below_baseline`, whether the model scored worse than that baseline. `dataset`: a database
    directory or a SQL database's URL (read now, as it is); `tasks_dir`: where its tasks are kept."""
    from relay_engine.families.rtj.family import build_sampler, context_settings
    from relay_engine.recipe import pick_device

    model = RelationalTransformer(model_name_or_dir, device=pick_device(device), seed=seed)
    settings = context_settings(model.config)
    chosen = task or model.config.get("relay", {}).get("task")
    if not chosen:
        raise ConfigError(f"name the task to evaluate {model_name_or_dir} on (--task)")
    sampler = build_sampler(dataset, chosen, settings, model.model.config.d_text, seed, tasks_dir=tasks_dir)
    examples = sampler.examples(split)
    if not examples:
        raise ConfigError(f"the {split} split of task {chosen} has no rows")
    result = evaluate(model, examples, sampler.spec.problem_type, sampler.label_scale)
    report: dict[str, Any] = {
        "model": model_name_or_dir,
        "task": chosen,
        "split": split,
        "problem_type": result.problem_type,
        "examples": result.examples,
        **result.metrics,
    }
    labels = np.asarray([e.label for e in examples])
    if sampler.spec.problem_type == "binary":
        report["label_frequency_auroc"] = auroc(labels, label_frequency_baseline(sampler, split))
        # NaN (one class only) compares as not below: there is nothing to rank.
        report["below_baseline"] = bool(report["auroc"] < report["label_frequency_auroc"])
    else:
        report["median_baseline_mae"] = median_baseline_mae(sampler, labels)
        report["below_baseline"] = bool(report["mae"] > report["median_baseline_mae"])
    return report


def median_baseline_mae(sampler: ContextSampler, scaled_labels: np.ndarray) -> float:
    """A regression baseline without a model: the train split's median label for every row (the
    constant that minimizes the MAE on the train split), scored in the label's units."""
    scale = sampler.label_scale
    train = np.asarray(sampler.splits["train"].column(sampler.spec.target_column).to_pylist(), np.float64)
    actual = scaled_labels * scale.std + scale.mean
    return float(np.abs(actual - np.median(train)).mean())
