"""ONNX export of RT-J's target_scores, as RelativeDB's `relational-transformers` lays it out: one
input per batch field, named as the field (int64 indices, bool masks, float32 values), one output
`target_scores` [batch], and the batch and cell axes dynamic (d_text is fixed by the example).

    path = model.export_onnx("churn.onnx", example_batch)
    scores = onnxruntime.InferenceSession(str(path)).run(None, batch.numpy())[0]
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import torch
from torch import Tensor, nn

from relay_engine.families.rtj.batch import BATCH_FIELDS, RelationalBatch
from relay_engine.families.rtj.network import RTJNetwork

ONNX_OUTPUT = "target_scores"


class _FieldScorer(nn.Module):
    """The network's target_scores from the twelve fields as positional tensors: the exporter
    traces tensors, not a batch object (whose checks would run once, at trace time)."""

    def __init__(self, network: RTJNetwork) -> None:
        super().__init__()
        self.network = network

    def forward(self, *fields: Tensor) -> Tensor:
        batch = SimpleNamespace(**dict(zip(BATCH_FIELDS, fields, strict=True)))
        return cast(Tensor, self.network(cast(RelationalBatch, batch)))


def export_onnx(
    network: RTJNetwork, example: RelationalBatch, path: str | Path, *, opset_version: int = 18
) -> Path:
    """Write `network`'s target_scores as an ONNX graph to `path` (its folder is made)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    dynamic_axes = {name: {0: "batch", 1: "cells"} for name in BATCH_FIELDS}
    dynamic_axes[ONNX_OUTPUT] = {0: "batch"}
    with warnings.catch_warnings():
        # The TorchScript exporter, as RelativeDB's export uses: the newer torch.export-based one
        # needs onnxscript besides onnx, and gives no different graph for this model.
        warnings.filterwarnings(
            "ignore", category=DeprecationWarning, message=".*legacy TorchScript-based ONNX"
        )
        torch.onnx.export(
            _FieldScorer(network).eval(),
            tuple(getattr(example, name) for name in BATCH_FIELDS),
            str(target),
            input_names=list(BATCH_FIELDS),
            output_names=[ONNX_OUTPUT],
            dynamic_axes=dynamic_axes,
            opset_version=opset_version,
            do_constant_folding=True,
            dynamo=False,
        )
    return target
