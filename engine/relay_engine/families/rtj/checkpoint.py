"""RT-J checkpoints on disk: a directory with `config.json` and `model.safetensors`.

The layout is RelativeDB's: the network's sizes at the top level of config.json (or under
"model"), `checkpoint_file` naming the weights, and, for a repository that holds both, one
`classification/` and one `regression/` subdirectory. RMSNorm scales load from `.scale` or
`.weight` names (both are in circulation) and are written as `.scale`, as RelativeDB writes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from relay_engine.errors import ConfigError
from relay_engine.families.rtj.network import RTJConfig, RTJNetwork

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SIZE_KEYS = ("num_blocks", "d_model", "d_text", "num_heads", "d_ff")
REGRESSION_TASKS = ("regression", "forecasting", "reg")


def checkpoint_directory(directory: Path, task: str) -> Path:
    """The directory holding config.json: `directory`, or its classification/regression part."""
    part = directory / ("regression" if task in REGRESSION_TASKS else "classification")
    return part if (part / CONFIG_FILE).is_file() else directory


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{directory} is not an RT-J checkpoint: it has no {CONFIG_FILE}")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return config


def sizes_of(config: dict[str, Any], state_keys: set[str] | None = None) -> RTJConfig:
    """The network sizes a config.json states; the boolean channel is there if the weights have it."""
    merged = {**{k: config[k] for k in SIZE_KEYS if k in config}, **config.get("model", {})}
    missing = [k for k in SIZE_KEYS if k not in merged]
    if missing:
        raise ConfigError(f"{CONFIG_FILE} is missing the network sizes: {', '.join(missing)}")
    boolean = (
        "enc_dict.boolean.weight" in state_keys
        if state_keys is not None
        else bool(config.get("boolean_channel", True))
    )
    return RTJConfig(**{k: int(merged[k]) for k in SIZE_KEYS}, boolean_channel=boolean)


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """A state dict in our names, as float32."""
    if not path.is_file():
        raise ConfigError(f"no weights at {path}")
    state = load_file(str(path), device="cpu")
    renamed: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        is_norm = any(
            part in key for part in ("norms.", "norm_dict.", ".q_norm.", ".k_norm.")
        ) or key.startswith("norm_out.")
        if is_norm and key.endswith(".weight"):
            key = key.removesuffix(".weight") + ".scale"
        renamed[key] = value.float() if value.is_floating_point() else value
    return renamed


def load_network(directory: Path) -> tuple[RTJNetwork, dict[str, Any]]:
    """The network a checkpoint directory holds, on the CPU in float32, and its config."""
    config = read_config(directory)
    state = read_state(directory / str(config.get("checkpoint_file", WEIGHTS_FILE)))
    if not any(key.endswith(".wg.weight") for key in state):
        raise ConfigError(
            f"{directory} holds an RT-v1 style network (no attention output gates); Relay trains RT-J only"
        )
    network = RTJNetwork(sizes_of(config, set(state)))
    missing, unexpected = network.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError(
            f"{directory}: the weights do not fit the RT-J layout (missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]})"
        )
    return network, config


def save_network(network: RTJNetwork, directory: Path, config: dict[str, Any]) -> None:
    """Write model.safetensors and config.json (the sizes, plus whatever else `config` holds)."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in network.state_dict().items()}
    tmp = directory / (WEIGHTS_FILE + ".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(directory / WEIGHTS_FILE)
    sizes = network.config.to_dict()
    written = {**config, **sizes, "checkpoint_file": WEIGHTS_FILE}
    written.pop("model", None)
    (directory / CONFIG_FILE).write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")
