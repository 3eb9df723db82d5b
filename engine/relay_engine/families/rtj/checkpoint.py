"""RT-J checkpoints on disk: a directory with `config.json` and `model.safetensors`.

The layout is RelativeDB's: the network's sizes at the top level of config.json (or under
"model"), `checkpoint_file` naming the weights, and, for a repository that holds both, one
`classification/` and one `regression/` subdirectory. RMSNorm scales load from `.scale` or
`.weight` names (both are in circulation) and are written as `.scale`, as RelativeDB writes them.
Weights load from fp32, fp16, bf16, fp8 (e4m3fn, e5m2), Q8 and Q4 files (see _dequantize); they are
always written in the network's dtype.
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
# Beside a quantized weight `<name>`: `<name>.q_scale` (Q8) or `<name>.q4_scale` (Q4, in groups of
# Q4_GROUP values).
Q8_SCALE_SUFFIX = ".q_scale"
Q4_SCALE_SUFFIX = ".q4_scale"
Q4_GROUP = 32


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
    """A state dict in our names, as float32 (fp16, bf16, fp8, Q8 and Q4 files alike)."""
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
        # float8_e4m3fn and float8_e5m2 are floating point too: an fp8 file widens here.
        renamed[key] = value.float() if value.is_floating_point() else value
    return _dequantize(renamed, path)


def _dequantize(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """RelativeDB's quantized layouts, widened to float32. Q8: an integer weight and beside it
    `<name>.q_scale`, one scale per output row. Q4: a uint8 weight [rows, width/2] holding two
    values a byte (the even one in the low nibble) and beside it `<name>.q4_scale`, a (scale,
    minimum) pair for each group of 32 values of a row; a value is nibble * scale + minimum."""
    for scale_key in [key for key in state if key.endswith(Q8_SCALE_SUFFIX)]:
        name = scale_key.removesuffix(Q8_SCALE_SUFFIX)
        if name in state:
            weight, scale = state[name], state.pop(scale_key).float()
            state[name] = weight.float() * scale.reshape(-1, *([1] * (weight.ndim - 1)))
    for scale_key in [key for key in state if key.endswith(Q4_SCALE_SUFFIX)]:
        name = scale_key.removesuffix(Q4_SCALE_SUFFIX)
        if name in state:
            state[name] = _unpack_q4(name, state[name], state.pop(scale_key), path)
    return state


def _unpack_q4(name: str, packed: torch.Tensor, params: torch.Tensor, path: Path) -> torch.Tensor:
    if packed.dtype != torch.uint8 or packed.ndim != 2:
        raise ConfigError(
            f"{path}: the Q4 weight {name} must be a 2-d uint8 tensor, "
            f"got {packed.dtype} {tuple(packed.shape)}"
        )
    rows, width = (int(n) for n in packed.shape)
    pairs = params.float().reshape(rows, -1, 2)  # [rows, groups, (scale, minimum)]
    groups = int(pairs.shape[1])
    if width != groups * Q4_GROUP // 2:
        raise ConfigError(
            f"{path}: the Q4 weight {name} has {width} bytes a row "
            f"but {groups} scale groups of {Q4_GROUP} values"
        )
    low, high = packed & 0x0F, packed >> 4
    values = torch.stack((low, high), dim=-1).reshape(rows, groups, Q4_GROUP).float()
    return (values * pairs[..., :1] + pairs[..., 1:]).reshape(rows, groups * Q4_GROUP)


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
