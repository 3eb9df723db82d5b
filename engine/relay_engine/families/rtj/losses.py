"""The task losses, by problem type: BCE on one logit for binary, Huber for regression and
forecasting, and for heads, cross-entropy (multiclass) or BCE per label (multilabel)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from torch import Tensor, nn
from torch.nn import functional as F

PROBLEM_TYPES: tuple[str, ...] = ("binary", "regression", "forecasting", "multiclass", "multilabel")
# Problem types the scalar target_scores output serves; the others need a head.
SCALAR_PROBLEM_TYPES: tuple[str, ...] = ("binary", "regression", "forecasting")
# Problem types whose target is a number, trained with Huber loss: forecasting is regression of a
# future value.
NUMERIC_PROBLEM_TYPES: tuple[str, ...] = ("regression", "forecasting")


class BinaryClassificationLoss(nn.Module):
    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(logits.reshape(-1), labels.float().reshape(-1))


class RegressionLoss(nn.Module):
    def __init__(self, delta: float = 1.0) -> None:
        super().__init__()
        self.delta = delta

    def forward(self, predictions: Tensor, labels: Tensor) -> Tensor:
        return F.huber_loss(predictions.reshape(-1), labels.float().reshape(-1), delta=self.delta)


class MulticlassClassificationLoss(nn.Module):
    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(logits, labels.long().reshape(-1))


class MultilabelClassificationLoss(nn.Module):
    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(logits, labels.float())


class ListwiseRankingLoss(nn.Module):
    """Cross-entropy between each group's softmax over its candidates' scores and its labels
    normalised to sum to 1, averaged over the groups; candidates of group g are
    group_offsets[g]:group_offsets[g+1]. Each group needs a positive label."""

    def forward(self, logits: Tensor, labels: Tensor, group_offsets: Sequence[int]) -> Tensor:
        scores, relevance = logits.reshape(-1), labels.float().reshape(-1)
        bounds = [int(offset) for offset in group_offsets]
        total = scores.new_zeros(())
        for start, end in itertools.pairwise(bounds):
            weights = relevance[start:end]
            mass = weights.sum()
            if not bool(mass > 0):
                raise ValueError(f"labels: the ranking group {start}:{end} has no positive label")
            total = total - (weights / mass * F.log_softmax(scores[start:end], dim=0)).sum()
        return total / max(len(bounds) - 1, 1)


_LOSSES: dict[str, type[nn.Module]] = {
    "binary": BinaryClassificationLoss,
    "regression": RegressionLoss,
    "forecasting": RegressionLoss,
    "multiclass": MulticlassClassificationLoss,
    "multilabel": MultilabelClassificationLoss,
}


def loss_for(problem_type: str) -> nn.Module:
    if problem_type not in _LOSSES:
        raise ValueError(f"problem_type must be one of {', '.join(PROBLEM_TYPES)}, got {problem_type!r}")
    return _LOSSES[problem_type]()
