"""Heads fitted on the frozen backbone's target features, as RelativeDB's `relational-transformers`
has them: `fit_head` (a TaskHead stored on the model, served by predict(task_head=...)) and
`fit_feature_head` (a FineTunedHead: plain numpy weights plus the feature standardisation it was
fitted under, saved as safetensors with a JSON sidecar that the peer's files share).

The backbone never changes here; RelationalTrainer's multiclass and multilabel tuning is the
epoch-and-batch version of the same idea.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from relay_engine.errors import EngineError
from relay_engine.families.rtj.losses import ListwiseRankingLoss, loss_for
from relay_engine.families.rtj.transformer import TaskHead

if TYPE_CHECKING:
    from relay_engine.families.rtj.trainer import RelationalExample
    from relay_engine.families.rtj.transformer import RelationalTransformer

# The tasks fit_feature_head fits (ranking: one score per candidate, grouped by group_offsets).
FEATURE_HEAD_TASKS: tuple[str, ...] = ("binary", "regression", "multiclass", "ranking")
# Added to each feature's standard deviation so a constant feature does not divide by zero.
_STD_FLOOR = 1e-6


class HeadError(EngineError):
    """A fitted head's file is missing, unreadable, or given features of the wrong shape."""


def fit_head(
    transformer: RelationalTransformer,
    examples: Sequence[RelationalExample],
    *,
    task: str,
    num_labels: int = 1,
    problem_type: str = "binary",
    epochs: int = 100,
    learning_rate: float = 1e-3,
    weight_decay: float = 1e-4,
) -> TaskHead:
    """Fit a linear TaskHead on each example's target features (computed once) with full-batch
    AdamW for `epochs` steps, and store it as `transformer.heads[task]`."""
    if transformer.backend_name != "torch":
        raise RuntimeError(f"fit_head requires the torch backend, not {transformer.backend_name!r}")
    if not examples:
        raise ValueError("examples: fit_head needs at least one example")
    device = transformer.device
    rows = []
    for example in examples:
        features = transformer.encode(
            example.input, target=example.target, output_value="target_features", convert_to_numpy=False
        )
        assert isinstance(features, Tensor)
        rows.append(features.squeeze(0).detach().float().cpu())
    inputs = torch.stack(rows).to(device)
    labels = torch.as_tensor([example.label for example in examples], device=device)
    head = TaskHead(transformer.model.config.d_model, num_labels, problem_type).to(device)
    loss = loss_for(problem_type)
    _full_batch_adamw(head, lambda: loss(head(inputs), labels), epochs, learning_rate, weight_decay)
    head.eval()
    transformer.heads[task] = head
    return head


def _full_batch_adamw(
    head: nn.Module, loss_of: Callable[[], Tensor], epochs: int, learning_rate: float, weight_decay: float
) -> tuple[float, float]:
    """`epochs` AdamW steps on the whole set; the loss before the first and before the last step."""
    optimizer = torch.optim.AdamW(head.parameters(), lr=learning_rate, weight_decay=weight_decay)
    head.train()
    losses = []
    for _ in range(max(int(epochs), 1)):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses[0], losses[-1]


class FineTunedHead:
    """A linear head over frozen target features: logits = standardised(features) @ weight.T + bias.

    `feat_mu` and `feat_sd` are the per-feature mean and deviation it was fitted under (None: no
    standardisation); `column_stats` is whatever preprocessing record the caller wants kept with
    it (an object with `to_dict()`, or a dict), saved and returned as JSON untouched."""

    def __init__(
        self,
        weight: Any,
        bias: Any,
        *,
        task: str,
        initial_loss: float | None = None,
        final_loss: float | None = None,
        seconds: float | None = None,
        n_examples: int | None = None,
        classes: Sequence[Any] = (),
        feat_mu: Any = None,
        feat_sd: Any = None,
        column_stats: Any = None,
        normalization_mode: Any = "zero_shot",
    ) -> None:
        self.weight = np.asarray(weight, dtype=np.float32)
        self.bias = np.asarray(bias, dtype=np.float32)
        self.task = task
        self.initial_loss = initial_loss
        self.final_loss = final_loss
        self.seconds = seconds
        self.n_examples = n_examples
        self.classes = tuple(classes)
        self.feat_mu = None if feat_mu is None else np.asarray(feat_mu, dtype=np.float32)
        self.feat_sd = None if feat_sd is None else np.asarray(feat_sd, dtype=np.float32)
        self.column_stats = column_stats
        # An enum's value, or the string itself.
        self.normalization_mode = str(getattr(normalization_mode, "value", normalization_mode))

    @property
    def n_outputs(self) -> int:
        return int(self.weight.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.weight.shape[1])

    @staticmethod
    def sidecar_path(path: str | Path) -> Path:
        """Where the preprocessing of the head saved at `path` goes."""
        return Path(f"{path}.preproc.json")

    def save(self, path: str | Path) -> str:
        """The weights to `path` (safetensors: weight, bias) and the preprocessing to
        `<path>.preproc.json`."""
        from safetensors.numpy import save_file

        save_file({"weight": self.weight, "bias": self.bias}, str(path))
        stats = self.column_stats.to_dict() if hasattr(self.column_stats, "to_dict") else self.column_stats
        sidecar = {
            "task": self.task,
            "feat_mu": None if self.feat_mu is None else self.feat_mu.tolist(),
            "feat_sd": None if self.feat_sd is None else self.feat_sd.tolist(),
            "column_stats": stats,
            "normalization_mode": self.normalization_mode,
            "classes": [str(name) for name in self.classes],
        }
        self.sidecar_path(path).write_text(json.dumps(sidecar))
        return str(path)

    @staticmethod
    def load(path: str | Path) -> FineTunedHead:
        """A head saved by `save` (here or by RelativeDB's package). Without its sidecar the head
        is refused: serving it would skip the standardisation it was fitted under."""
        from safetensors.numpy import load_file

        try:
            tensors = load_file(str(path))
            weight, bias = tensors["weight"], tensors["bias"]
        except Exception as error:  # missing file, not safetensors, no weight/bias: say which
            raise HeadError(
                f"cannot load a fine-tuned head from {path}: {type(error).__name__}: {error}"
            ) from None
        sidecar = FineTunedHead.sidecar_path(path)
        if not sidecar.is_file():
            raise HeadError(
                f"{sidecar} is missing: the head at {path} was saved without the feature "
                "standardisation it was fitted under; fit it again"
            )
        try:
            settings = json.loads(sidecar.read_text())
        except json.JSONDecodeError as error:
            raise HeadError(f"{sidecar} is not valid JSON: {error}") from None
        return FineTunedHead(
            weight,
            bias,
            task=str(settings.get("task", "binary")),
            classes=tuple(settings.get("classes") or ()),
            feat_mu=settings.get("feat_mu"),
            feat_sd=settings.get("feat_sd"),
            column_stats=settings.get("column_stats"),
            # A sidecar that predates the field was written for the reference preprocessing.
            normalization_mode=settings.get("normalization_mode", "reference"),
        )

    def predict(self, features: Any) -> np.ndarray:
        """Logits [N, n_outputs] for frozen features [N, d_model]."""
        values = np.asarray(features, dtype=np.float32)
        if values.ndim != 2 or values.shape[1] != self.d_model:
            raise HeadError(f"features must have shape [N, {self.d_model}], got {values.shape}")
        if self.feat_mu is not None and self.feat_sd is not None:
            values = (values - self.feat_mu) / self.feat_sd
        return np.ascontiguousarray(values, dtype=np.float32) @ self.weight.T + self.bias

    def __repr__(self) -> str:
        fitted = f" on {self.n_examples} examples" if self.n_examples else ""
        if self.initial_loss is not None and self.final_loss is not None:
            fitted += f" loss {self.initial_loss:.4f}->{self.final_loss:.4f}"
        return f"<FineTunedHead {self.task}{fitted}>"


def fit_feature_head(
    features: Any,
    labels: Any,
    task: str,
    *,
    classes: Sequence[Any] = (),
    group_offsets: Any = None,
    n_groups: int = 0,
    epochs: int = 100,
    learning_rate: float = 1e-3,
    weight_decay: float = 1e-4,
    class_embeddings: Any = None,
    text_decoder: nn.Linear | None = None,
    column_stats: Any = None,
    normalization_mode: Any = "zero_shot",
) -> FineTunedHead:
    """A FineTunedHead fitted with full-batch AdamW on frozen features [N, d_model].

    Each feature is standardised first (the target features of one checkpoint point in nearly the
    same direction, so unscaled a linear head learns little beyond its bias). `task`: binary,
    regression, multiclass (one output per entry of `classes`) or ranking (one score per
    candidate; candidates g run from group_offsets[g] to group_offsets[g+1], for n_groups groups).
    For multiclass, `class_embeddings` [C, d_text] with the checkpoint's `text_decoder` (its
    d_model -> d_text linear, model.model.dec_dict["text"]) start the head at the zero-shot scores
    of those class embeddings."""
    if task not in FEATURE_HEAD_TASKS:
        raise ValueError(f"task must be one of {', '.join(FEATURE_HEAD_TASKS)}, got {task!r}")
    if task == "multiclass" and not classes:
        raise ValueError("classes: a multiclass head needs the class names")
    count = len(labels)
    values = np.asarray(features, dtype=np.float32).reshape(count, -1)
    feat_mu = np.ascontiguousarray(values.mean(0), dtype=np.float32)
    feat_sd = np.ascontiguousarray(values.std(0) + _STD_FLOOR, dtype=np.float32)
    inputs = torch.as_tensor((values - feat_mu) / feat_sd)
    head = TaskHead(values.shape[1], len(classes) if task == "multiclass" else 1, problem_type=task)
    if task == "multiclass" and class_embeddings is not None and text_decoder is not None:
        _start_at_zero_shot(head.projection, class_embeddings, text_decoder, feat_mu, feat_sd)
    targets = torch.as_tensor(np.ascontiguousarray(labels, dtype=np.float32))
    loss_of = _feature_loss(task, group_offsets, n_groups)
    started = time.perf_counter()
    initial_loss, final_loss = _full_batch_adamw(
        head, lambda: loss_of(head(inputs), targets), epochs, learning_rate, weight_decay
    )
    head.eval()
    return FineTunedHead(
        head.projection.weight.detach().numpy(),
        head.projection.bias.detach().numpy(),
        task=task,
        initial_loss=initial_loss,
        final_loss=final_loss,
        seconds=time.perf_counter() - started,
        n_examples=int(targets.shape[0]),
        classes=classes,
        feat_mu=feat_mu,
        feat_sd=feat_sd,
        column_stats=column_stats,
        normalization_mode=normalization_mode,
    )


def _start_at_zero_shot(
    projection: nn.Linear,
    class_embeddings: Any,
    text_decoder: nn.Linear,
    feat_mu: np.ndarray,
    feat_sd: np.ndarray,
) -> None:
    """Set the head so that, on standardised features, it gives what the text decoder's output
    dotted with each class embedding gives on the raw ones."""
    embeddings = torch.as_tensor(np.ascontiguousarray(class_embeddings, dtype=np.float32))
    decoder = text_decoder.to("cpu").float()
    with torch.no_grad():
        weight = embeddings @ decoder.weight  # [C, d_model]
        bias = embeddings @ decoder.bias  # [C]
        projection.weight.copy_(weight * torch.as_tensor(feat_sd))
        projection.bias.copy_(bias + weight @ torch.as_tensor(feat_mu))


def _feature_loss(task: str, group_offsets: Any, n_groups: int) -> Callable[[Tensor, Tensor], Tensor]:
    if task == "ranking":
        offsets = np.ascontiguousarray(group_offsets if group_offsets is not None else [0], dtype=np.int64)
        ranking = ListwiseRankingLoss()
        return lambda logits, labels: ranking(logits, labels, offsets[: n_groups + 1])
    loss = loss_for(task)
    if task == "multiclass":
        return lambda logits, labels: loss(logits, labels)
    return lambda logits, labels: loss(logits.reshape(-1), labels)
