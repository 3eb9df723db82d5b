"""RelationalTransformer: load, run and save an RT-J model.

model = RelationalTransformer("rt-j-tiny")                  # fresh weights, seeded
model = RelationalTransformer("models/customer-churn")      # a checkpoint directory
model = RelationalTransformer("RelativeDB/rt-j-fp16")       # a Hub repository (needs the network)
scores = model.predict(batch)                               # one probability (or value) per context
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from relay_engine.errors import ConfigError
from relay_engine.families.rtj.batch import RelationalBatch, collate
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
from relay_engine.families.rtj.network import NAMED_CONFIGS, RTJNetwork

DEFAULT_MODEL = "RelativeDB/rt-j-fp16"
BACKENDS: tuple[str, ...] = ("torch", "meta")
HEADS_DIR = "heads"


class TaskHead(nn.Module):
    """A linear head on the target cell's features, for multiclass and multilabel tasks."""

    def __init__(self, d_model: int, num_labels: int = 1, problem_type: str = "multiclass") -> None:
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
    checkpoint directory, or a Hugging Face repository (default: RelativeDB/rt-j-fp16). `task`
    picks the classification or regression part of a repository that has both. `backend`:
    "torch", or "meta" for shapes only (nothing runs)."""

    def __init__(
        self,
        model_name_or_path: str | os.PathLike[str] | None = None,
        *,
        task: str = "classification",
        backend: str = "torch",
        device: str | torch.device | None = None,
        seed: int = 0,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.model_name_or_path = str(model_name_or_path or DEFAULT_MODEL)
        self.task = task
        self.backend_name = backend
        self.device = torch.device(device) if device is not None else _default_device()
        self.heads: dict[str, TaskHead] = {}
        name = self.model_name_or_path
        if name in NAMED_CONFIGS:
            self.config: dict[str, Any] = {"model_type": name, "problem_type": _problem_of(task)}
            meta = backend == "meta"
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                network = RTJNetwork(NAMED_CONFIGS[name], device="meta" if meta else None)
                if not meta:
                    network.init_weights()
        else:
            directory = _local_or_hub(name, task)
            if backend == "meta":
                self.config = read_config(directory)
                network = RTJNetwork(sizes_of(self.config), device="meta")
            else:
                network, self.config = load_network(directory)
                self._load_heads(directory)
        self.model: RTJNetwork = network if backend == "meta" else network.to(self.device).eval()

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

    def as_batch(self, inputs: RelationalBatch | Sequence[RelationalBatch]) -> RelationalBatch:
        if isinstance(inputs, RelationalBatch):
            return inputs
        if isinstance(inputs, Sequence) and inputs and all(isinstance(i, RelationalBatch) for i in inputs):
            return collate(list(inputs))
        raise TypeError("inputs must be a RelationalBatch or a non-empty sequence of them")

    def forward(self, inputs: RelationalBatch | Sequence[RelationalBatch]) -> Tensor:
        """target_scores: one raw score per context (a logit for classification)."""
        self._require_torch("running the model")
        with torch.inference_mode():
            return self.model(self.as_batch(inputs).to(self.device))

    def encode(self, inputs: RelationalBatch | Sequence[RelationalBatch]) -> Tensor:
        """target_features: the final hidden state summed over each context's target cells."""
        self._require_torch("running the model")
        with torch.inference_mode():
            return self.model.target_features(self.as_batch(inputs).to(self.device))

    def predict(
        self, inputs: RelationalBatch | Sequence[RelationalBatch], *, task_head: str | None = None
    ) -> np.ndarray:
        """Probabilities for classification (sigmoid; softmax for a multiclass head), else values."""
        if task_head is not None:
            if task_head not in self.heads:
                raise KeyError(f"no head named {task_head!r}; heads: {', '.join(self.heads) or 'none'}")
            head = self.heads[task_head]
            with torch.inference_mode():
                scores = head(self.encode(inputs))
            problem = head.problem_type
        else:
            scores = self.forward(inputs)
            problem = self.problem_type
        if problem == "multiclass":
            scores = scores.softmax(-1)
        elif problem != "regression":
            scores = scores.sigmoid()
        return scores.detach().float().cpu().numpy()

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


def _problem_of(task: str) -> str:
    return "regression" if task in REGRESSION_TASKS else "binary"


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _local_or_hub(name: str, task: str) -> Path:
    """The directory holding config.json: a local checkpoint, or a Hub repository's files fetched
    into the Hub cache (its `classification/` or `regression/` part when it has both)."""
    path = Path(name).expanduser()
    if path.exists() or name.startswith((".", "/", "~")):
        if not path.is_dir():
            raise ConfigError(f"no RT-J checkpoint directory at {path}")
        return checkpoint_directory(path, task)
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    options: dict[str, Any] = {
        "endpoint": (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/"),
        "token": os.environ.get("HF_TOKEN") or None,
        "cache_dir": os.environ.get("HF_HUB_CACHE") or None,
    }
    part = "regression" if task in REGRESSION_TASKS else "classification"
    try:
        try:
            config_path = Path(hf_hub_download(name, f"{part}/{CONFIG_FILE}", **options))
        except EntryNotFoundError:
            config_path = Path(hf_hub_download(name, CONFIG_FILE, **options))
        prefix = f"{part}/" if config_path.parent.name == part else ""
        weights = read_config(config_path.parent).get("checkpoint_file", WEIGHTS_FILE)
        hf_hub_download(name, f"{prefix}{weights}", **options)
    except Exception as error:  # offline, gated, missing: say which and how to fix it
        raise ConfigError(
            f"cannot get the RT-J checkpoint {name} from {options['endpoint']} "
            f"({type(error).__name__}: {error}); download it once, or pass a local checkpoint directory, "
            "rt-j or rt-j-tiny"
        ) from None
    return config_path.parent
