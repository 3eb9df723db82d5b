"""RelationalTransformer: load, run and save an RT-J model.

model = RelationalTransformer("rt-j-tiny")                  # fresh weights, seeded
model = RelationalTransformer("models/customer-churn")      # a checkpoint directory
model = RelationalTransformer("RelativeDB/rt-j-fp16")       # a Hub repository (needs the network)
model = RelationalTransformer("churn.onnx", backend="onnx")  # an exported graph, run by ONNX Runtime
scores = model.predict(batch)                               # one probability (or value) per context
out = model.forward(batch, output="target_features")        # a ModelOutput; out.features [B, d_model]
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from relay_engine.errors import ConfigError
from relay_engine.families.rtj.batch import BATCH_FIELDS, RelationalBatch, collate
from relay_engine.families.rtj.checkpoint import (
    CONFIG_FILE,
    REGRESSION_TASKS,
    WEIGHTS_FILE,
    checkpoint_directory,
    load_network,
    read_config,
    save_network,
    sizes_of,
)
from relay_engine.families.rtj.network import NAMED_CONFIGS, OUTPUT_VIEWS, ModelOutput, RTJNetwork
from relay_engine.families.rtj.onnx_runtime import DEFAULT_ONNX_MODEL, OnnxScorer, Providers, onnx_file
from relay_engine.hub_files import download, hub_endpoint

if TYPE_CHECKING:
    from relay_engine.families.rtj.trainer import RelationalExample

DEFAULT_MODEL = "RelativeDB/rt-j-fp16"
BACKENDS: tuple[str, ...] = ("torch", "triton", "onnx", "meta")
HEADS_DIR = "heads"
# What the model's entry points take: a batch (ours or any object with the twelve fields), a
# mapping of the fields, an array of text cells (with target=), or a sequence of these.
ModelInputs = RelationalBatch | Mapping[str, Any] | np.ndarray | Tensor | Sequence[Any] | object


class TaskHead(nn.Module):
    """A linear head on the target cell's features (binary by default, as RelativeDB's; the trainer
    fits multiclass and multilabel ones, fit_head any problem type)."""

    def __init__(self, d_model: int, num_labels: int = 1, problem_type: str = "binary") -> None:
        super().__init__()
        self.d_model = d_model
        self.num_labels = num_labels
        self.problem_type = problem_type
        self.projection = nn.Linear(d_model, num_labels)

    def forward(self, features: Tensor) -> Tensor:
        return self.projection(features)

    def save_pretrained(self, directory: Path) -> None:
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()},
            str(directory / "head.safetensors"),
        )
        settings = {"d_model": self.d_model, "num_labels": self.num_labels, "problem_type": self.problem_type}
        (directory / "head_config.json").write_text(json.dumps(settings, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, directory: Path) -> TaskHead:
        from safetensors.torch import load_file

        settings = json.loads((directory / "head_config.json").read_text())
        head = cls(int(settings["d_model"]), int(settings["num_labels"]), str(settings["problem_type"]))
        head.load_state_dict(load_file(str(directory / "head.safetensors")))
        return head


class RelationalTransformer:
    """An RT-J model. `model_name_or_path`: "rt-j" or "rt-j-tiny" (fresh weights from `seed`), a
    checkpoint directory, or a Hugging Face repository (default: RelativeDB/rt-j-fp16), fetched at
    `revision` (a branch, tag or commit; None: the default branch). `task` picks the
    classification or regression part of a repository that has both. `backend`: "torch";
    "triton", inference through torch.compile's Inductor (Triton kernels), on CUDA only, serving
    target_scores; "onnx", target_scores through ONNX Runtime from an exported graph (an .onnx
    file, a directory holding model.onnx, or a Hub repository's model.onnx; default
    RelativeDB/rt-j-onnx) with onnxruntime's execution `providers`; or "meta" for shapes only
    (nothing runs). `compile`: run the torch backend's forward passes through torch.compile."""

    def __init__(
        self,
        model_name_or_path: str | os.PathLike[str] | None = None,
        *,
        task: str = "classification",
        backend: str = "torch",
        device: str | torch.device | None = None,
        seed: int = 0,
        revision: str | None = None,
        compile: bool = False,
        providers: Providers | None = None,
    ) -> None:
        _check_options(backend, device, compile, providers)
        default = DEFAULT_ONNX_MODEL if backend == "onnx" else DEFAULT_MODEL
        self.model_name_or_path = str(model_name_or_path or default)
        self.task = task
        self.backend_name = backend
        self.heads: dict[str, TaskHead] = {}
        self.config: dict[str, Any] = {}
        self._network: RTJNetwork | None = None
        self._onnx: OnnxScorer | None = None
        self._compiled: Callable[[RelationalBatch], Tensor] | None = None
        if backend == "onnx":
            # ONNX Runtime takes numpy arrays and gives them back: inputs are prepared, and scores
            # returned, on the CPU; where the graph runs is the providers' choice.
            self.device = torch.device("cpu")
            if self.model_name_or_path in NAMED_CONFIGS:
                raise ConfigError(
                    f"{self.model_name_or_path} has no ONNX graph: write one with "
                    "RelationalTransformer(...).export_onnx(path, example) and load that path"
                )
            self._onnx = OnnxScorer(
                onnx_file(self.model_name_or_path, revision=revision), providers=providers
            )
            return
        self.device = torch.device(device) if device is not None else _default_device()
        if backend == "triton" and (self.device.type != "cuda" or not torch.cuda.is_available()):
            raise RuntimeError(
                "backend='triton' needs a CUDA GPU (it compiles the model to Triton kernels with "
                f"torch.compile); this model's device is {self.device}. Use backend='torch' on a CPU."
            )
        name = self.model_name_or_path
        if name in NAMED_CONFIGS:
            if revision is not None:
                raise ConfigError(
                    f"revision: {name} is built from fresh weights, not fetched from the Hub; "
                    "a revision applies to a Hugging Face repository"
                )
            self.config = {"model_type": name, "problem_type": _problem_of(task)}
            meta = backend == "meta"
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                network = RTJNetwork(NAMED_CONFIGS[name], device="meta" if meta else None)
                if not meta:
                    network.init_weights()
        else:
            directory = _local_or_hub(name, task, revision)
            if backend == "meta":
                self.config = read_config(directory)
                network = RTJNetwork(sizes_of(self.config), device="meta")
            else:
                network, self.config = load_network(directory)
                self._load_heads(directory)
        self._network = network if backend == "meta" else network.to(self.device).eval()
        # Shapes vary from call to call, hence dynamic: the Triton backend's compiled scorer, and
        # with compile=True every view's forward pass (one graph per view, compiled on first use).
        if backend == "triton":
            self._compiled = torch.compile(self._network, backend="inductor", dynamic=True)
        self._outputs: Callable[[RelationalBatch, str], ModelOutput] = (
            torch.compile(self._network.outputs, dynamic=True) if compile else self._network.outputs
        )

    @property
    def model(self) -> RTJNetwork:
        """The torch network (the weights training updates); the "onnx" backend has none."""
        if self._network is None:
            raise RuntimeError(
                f"a model loaded with backend='onnx' runs the ONNX graph {self.model_name_or_path}: "
                "it has no torch network (load the checkpoint with backend='torch' for that)"
            )
        return self._network

    @property
    def problem_type(self) -> str:
        """What the checkpoint was trained for: "regression" or "binary" (the default)."""
        stated = self.config.get("problem_type")
        return str(stated) if stated else _problem_of(self.task)

    def _require_torch(self, what: str) -> None:
        if self.backend_name != "torch":
            raise RuntimeError(
                f"{what} requires the torch backend (this model was loaded with {self.backend_name!r})"
            )

    def as_batch(self, inputs: ModelInputs, *, target: int | Sequence[int] | None = None) -> RelationalBatch:
        """One batch from any input the model takes: a RelationalBatch (ours, or any object with
        the twelve fields, such as RelativeDB's), a mapping of the twelve fields, an array of text
        cells [S, 2*d_text] with `target` naming the target cell(s), or a non-empty sequence of
        these (collated, each padded to the longest)."""
        if isinstance(inputs, RelationalBatch):
            return inputs
        if isinstance(inputs, Mapping):
            return RelationalBatch.from_mapping(inputs)
        if isinstance(inputs, (np.ndarray, Tensor)):
            if target is None:
                raise ValueError("target: name the target cell(s) when passing an array of cells")
            return RelationalBatch.from_text_cells(inputs, target=target)
        if all(hasattr(inputs, name) for name in BATCH_FIELDS):
            return RelationalBatch(**{name: getattr(inputs, name) for name in BATCH_FIELDS})
        if isinstance(inputs, Sequence) and not isinstance(inputs, str) and inputs:
            return collate([self.as_batch(item, target=target) for item in inputs])
        raise TypeError(
            "inputs must be a RelationalBatch, a mapping of its fields, an array of cells with target=, "
            f"or a non-empty sequence of these; got {type(inputs).__name__}"
        )

    def forward(
        self, inputs: ModelInputs, *, output: str = "target_scores", target: int | Sequence[int] | None = None
    ) -> ModelOutput:
        """One forward pass; `output` picks the view (see OUTPUT_VIEWS and ModelOutput):
        "target_scores" (default) sets `scores`, one raw score per context (a logit for
        classification)."""
        if self.backend_name == "meta":
            raise RuntimeError("a model loaded with backend='meta' has shapes only and cannot run")
        if output not in OUTPUT_VIEWS:
            raise ValueError(f"output must be one of {', '.join(OUTPUT_VIEWS)}, got {output!r}")
        if self._onnx is not None:
            if output != "target_scores":
                raise ValueError(f"backend='onnx' serves output='target_scores' only, not {output!r}")
            return ModelOutput(scores=self._onnx.scores(self.as_batch(inputs, target=target)))
        batch = self.as_batch(inputs, target=target).to(self.device)
        with torch.inference_mode():
            if self._compiled is None:
                return self._outputs(batch, output)
            if output != "target_scores":
                raise ValueError(f"backend='triton' serves output='target_scores' only, not {output!r}")
            return ModelOutput(scores=self._compiled(batch))

    def __call__(
        self, inputs: ModelInputs, output: str = "target_scores", *, target: int | Sequence[int] | None = None
    ) -> ModelOutput:
        """`model(batch)`, as the peer's `RTJModel` (an nn.Module) is called: `forward`'s ModelOutput,
        raw scores (no activation: that is `predict`'s)."""
        return self.forward(inputs, output=output, target=target)

    def target_scores(self, inputs: ModelInputs, *, target: int | Sequence[int] | None = None) -> Tensor:
        """forward(...).scores: one raw score per context, [B]."""
        scores = self.forward(inputs, output="target_scores", target=target).scores
        assert scores is not None  # the target_scores view always sets them
        return scores

    def encode(
        self,
        inputs: ModelInputs,
        *,
        target: int | Sequence[int] | None = None,
        output_value: str = "embeddings",
        convert_to_numpy: bool = True,
    ) -> np.ndarray | Tensor:
        """The final hidden states: "embeddings" [B, S, d_model], one per cell, or
        "target_features" [B, d_model], summed over each context's target cells (what heads read)."""
        if output_value not in ("embeddings", "target_features"):
            raise ValueError(f"output_value must be 'embeddings' or 'target_features', got {output_value!r}")
        result = self.forward(inputs, output=output_value, target=target)
        values = result.features if output_value == "target_features" else result.embeddings
        assert values is not None
        return values.detach().float().cpu().numpy() if convert_to_numpy else values

    def predict(
        self,
        inputs: ModelInputs,
        *,
        target: int | Sequence[int] | None = None,
        task_head: str | None = None,
        activation: str | None = None,
        convert_to_numpy: bool = True,
    ) -> float | np.ndarray | Tensor:
        """Scores after `activation`; None picks it from the problem type (the head's, or the
        checkpoint's): sigmoid for binary, multilabel and classification, softmax for multiclass,
        none for regression and forecasting. "identity" gives the raw scores. With
        `convert_to_numpy` the result is a numpy array, or a float for a single context's score."""
        if task_head is not None:
            if task_head not in self.heads:
                raise KeyError(f"no head named {task_head!r}; heads: {', '.join(self.heads) or 'none'}")
            head = self.heads[task_head]
            features = self.encode(
                inputs, target=target, output_value="target_features", convert_to_numpy=False
            )
            assert isinstance(features, Tensor)
            with torch.inference_mode():
                scores = head(features.to(head.projection.weight.dtype))
            problem = head.problem_type
        else:
            scores, problem = self.target_scores(inputs, target=target), self.problem_type
        scores = _activate(scores, activation or _DEFAULT_ACTIVATION.get(problem, "identity"))
        if not convert_to_numpy:
            return scores
        values = scores.detach().float().cpu().numpy()
        return float(values[0]) if values.shape == (1,) else values

    def get_model_kwargs(self) -> dict[str, int]:
        """The network's sizes (num_blocks, d_model, d_text, num_heads, d_ff); no weights needed,
        so a backend="meta" model answers too."""
        sizes = self.model.config
        return {
            "num_blocks": sizes.num_blocks,
            "d_model": sizes.d_model,
            "d_text": sizes.d_text,
            "num_heads": sizes.num_heads,
            "d_ff": sizes.d_ff,
        }

    def fit_head(
        self,
        examples: Sequence[RelationalExample],
        *,
        task: str,
        num_labels: int = 1,
        problem_type: str = "binary",
        epochs: int = 100,
        learning_rate: float = 1e-3,
        weight_decay: float = 1e-4,
    ) -> TaskHead:
        """A linear head fitted on the frozen target features of `examples` (full-batch AdamW for
        `epochs` steps), stored as heads[task] and served by predict(..., task_head=task)."""
        from relay_engine.families.rtj.heads import fit_head

        return fit_head(
            self,
            examples,
            task=task,
            num_labels=num_labels,
            problem_type=problem_type,
            epochs=epochs,
            learning_rate=learning_rate,
            weight_decay=weight_decay,
        )

    def export_onnx(
        self,
        path: str | os.PathLike[str],
        example: ModelInputs,
        *,
        target: int | Sequence[int] | None = None,
        opset_version: int = 18,
    ) -> Path:
        """Write target_scores as an ONNX graph (inputs: the twelve fields by name; output:
        target_scores; batch and cell counts free, d_text that of `example`). Needs the torch backend."""
        from relay_engine.families.rtj.onnx_export import export_onnx

        self._require_torch("ONNX export")
        batch = self.as_batch(example, target=target).to(self.device)
        return export_onnx(self.model, batch, Path(path), opset_version=opset_version)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """config.json + model.safetensors (+ heads/<name>/ for fitted heads), loadable by the constructor."""
        self._require_torch("saving")
        target = Path(directory)
        save_network(self.model, target, self.config)
        for name, head in self.heads.items():
            head.save_pretrained(target / HEADS_DIR / name)

    def _load_heads(self, directory: Path) -> None:
        heads = directory / HEADS_DIR
        if heads.is_dir():
            for path in sorted(heads.iterdir()):
                if (path / "head_config.json").is_file():
                    self.heads[path.name] = TaskHead.from_pretrained(path).to(self.device).eval()


# The activation predict() applies by default, by problem type (none for the others).
_DEFAULT_ACTIVATION: dict[str, str] = {
    "binary": "sigmoid",
    "classification": "sigmoid",
    "clf": "sigmoid",
    "multilabel": "sigmoid",
    "multiclass": "softmax",
}
ACTIVATIONS: tuple[str, ...] = ("identity", "sigmoid", "softmax")


def _activate(scores: Tensor, activation: str) -> Tensor:
    if activation == "sigmoid":
        return scores.sigmoid()
    if activation == "softmax":
        return scores.softmax(dim=-1)
    if activation == "identity":
        return scores
    raise ValueError(f"activation must be None or one of {', '.join(ACTIVATIONS)}, got {activation!r}")


def _problem_of(task: str) -> str:
    return "regression" if task in REGRESSION_TASKS else "binary"


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _check_options(
    backend: str, device: str | torch.device | None, compile: bool, providers: Providers | None
) -> None:
    """The constructor's options that only some backends take."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if providers is not None and backend != "onnx":
        raise ValueError(
            f"providers: ONNX Runtime's execution providers apply to backend='onnx', not {backend!r}"
        )
    if compile and backend in ("onnx", "meta"):
        raise ValueError(f"compile=True compiles the torch network; backend={backend!r} runs none")
    if backend == "onnx" and device is not None and torch.device(device).type != "cpu":
        raise ValueError(
            "device: with backend='onnx' the providers choose where the graph runs "
            "(e.g. providers=['CUDAExecutionProvider']); leave device unset"
        )


def _local_or_hub(name: str, task: str, revision: str | None = None) -> Path:
    """The directory holding config.json: a local checkpoint, or a Hub repository's files at
    `revision` fetched into the Hub cache (its `classification/` or `regression/` part when it
    has both)."""
    path = Path(name).expanduser()
    if path.exists() or name.startswith((".", "/", "~")):
        if not path.is_dir():
            raise ConfigError(f"no RT-J checkpoint directory at {path}")
        if revision is not None:
            raise ConfigError(
                f"revision: {path} is a local checkpoint directory; "
                "a revision applies to a Hugging Face repository"
            )
        return checkpoint_directory(path, task)
    from huggingface_hub.errors import EntryNotFoundError

    part = "regression" if task in REGRESSION_TASKS else "classification"
    try:
        try:
            config_path = download(name, f"{part}/{CONFIG_FILE}", revision=revision)
        except EntryNotFoundError:
            config_path = download(name, CONFIG_FILE, revision=revision)
        prefix = f"{part}/" if config_path.parent.name == part else ""
        weights = read_config(config_path.parent).get("checkpoint_file", WEIGHTS_FILE)
        download(name, f"{prefix}{weights}", revision=revision)
    except Exception as error:  # offline, gated, missing, unknown revision: say which and how to fix it
        at = f" at revision {revision!r}" if revision is not None else ""
        raise ConfigError(
            f"cannot get the RT-J checkpoint {name}{at} from {hub_endpoint()} "
            f"({type(error).__name__}: {error}); download it once, or pass a local checkpoint directory, "
            "rt-j or rt-j-tiny"
        ) from None
    return config_path.parent
