"""backend="onnx": RT-J's target_scores through ONNX Runtime, from a graph export_onnx wrote (or
RelativeDB's, laid out alike: one input per batch field, named as the field, one output
`target_scores`).

    scorer = OnnxScorer(onnx_file("models/churn/model.onnx"), providers=["CPUExecutionProvider"])
    scores = scorer.scores(batch)  # a float32 tensor [B], on the CPU
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from relay_engine.errors import ConfigError
from relay_engine.families.rtj.batch import BATCH_FIELDS, RelationalBatch
from relay_engine.families.rtj.onnx_export import ONNX_OUTPUT
from relay_engine.hub_files import download, hub_endpoint

ONNX_FILE = "model.onnx"
DEFAULT_ONNX_MODEL = "RelativeDB/rt-j-onnx"
# What onnxruntime takes as providers: names, or (name, options) pairs.
Providers = Sequence[str | tuple[str, dict[str, Any]]]


def onnx_file(name: str, *, revision: str | None = None) -> Path:
    """The graph `name` names: an .onnx file, a directory holding model.onnx, or a Hub repository
    whose model.onnx (at `revision`) is fetched into the Hub cache."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        if not (path / ONNX_FILE).is_file():
            raise ConfigError(f"{path} holds no {ONNX_FILE}: export one with model.export_onnx")
        return path / ONNX_FILE
    if name.startswith((".", "/", "~")) or name.endswith(".onnx"):
        raise ConfigError(f"no ONNX file or directory at {path}")
    try:
        return download(name, ONNX_FILE, revision=revision)
    except Exception as error:  # offline, gated, missing, unknown revision: say which
        at = f" at revision {revision!r}" if revision is not None else ""
        raise ConfigError(
            f"cannot get {ONNX_FILE} of {name}{at} from {hub_endpoint()} ({type(error).__name__}: {error}); "
            "download it once, or pass a local .onnx file"
        ) from None


class OnnxScorer:
    """An ONNX Runtime session over an RT-J graph. `providers`: onnxruntime's execution providers
    in order of preference (None: onnxruntime's default)."""

    def __init__(self, path: str | os.PathLike[str], *, providers: Providers | None = None) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise ConfigError(
                "backend='onnx' needs the onnxruntime package (pip install onnxruntime)"
            ) from None
        available = onnxruntime.get_available_providers()
        names = [entry[0] if isinstance(entry, tuple) else entry for entry in providers or ()]
        missing = [name for name in names if name not in available]
        if missing:
            # onnxruntime would warn and fall back to the CPU: say so instead.
            raise ConfigError(
                f"providers: this onnxruntime has no {', '.join(missing)} (it has {', '.join(available)})"
            )
        try:
            self.session = onnxruntime.InferenceSession(
                str(path), providers=list(providers) if providers is not None else None
            )
        except Exception as error:  # not a graph, or providers this onnxruntime does not have
            raise ConfigError(f"ONNX Runtime cannot open {path} ({type(error).__name__}: {error})") from None
        inputs = {value.name: value for value in self.session.get_inputs()}
        outputs = [value.name for value in self.session.get_outputs()]
        strays = sorted(set(inputs) - set(BATCH_FIELDS))
        if strays or ONNX_OUTPUT not in outputs:
            raise ConfigError(
                f"{path} is not an RT-J target_scores graph: it needs inputs named as the batch fields "
                f"and an output {ONNX_OUTPUT!r} (inputs {sorted(inputs)}, outputs {outputs})"
            )
        self.input_names = list(inputs)
        # The graph fixes d_text (export_onnx leaves only the batch and cell axes free).
        width = inputs["text_values"].shape[-1] if "text_values" in inputs else None
        self.d_text: int | None = width if isinstance(width, int) else None

    def scores(self, batch: RelationalBatch) -> Tensor:
        """The raw target scores of `batch`, [B], float32 on the CPU."""
        if self.d_text is not None and batch.d_text != self.d_text:
            raise ValueError(
                f"text_values: this ONNX graph takes d_text {self.d_text}, the batch has {batch.d_text}"
            )
        arrays = batch.numpy()  # bool masks and float32 values, as the graph takes them
        feed = {
            name: arrays[name].astype(np.int64) if arrays[name].dtype.kind in "iu" else arrays[name]
            for name in self.input_names
        }
        (scores,) = self.session.run([ONNX_OUTPUT], feed)
        return torch.from_numpy(scores)
