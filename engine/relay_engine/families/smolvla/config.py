"""SmolVLA's settings, as lerobot 0.6.1's `SmolVLAConfig` names them and ships their defaults, and
the backbone's configuration, which lerobot reads from the directory (or Hub repo) its
`vlm_model_name` names.

Relay never fetches the backbone's configuration at run time: it must be a local directory holding
SmolVLM2's `config.json` (a Hub snapshot of `HuggingFaceTB/SmolVLM2-500M-Video-Instruct`, or the
tiny one a test writes), and a missing one is said plainly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from transformers import AutoConfig, SmolVLMConfig

from relay_engine.errors import ConfigError

# lerobot's default backbone (SmolVLAConfig.vlm_model_name).
DEFAULT_BACKBONE = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"


@dataclass(frozen=True)
class SmolVLAConfig:
    """The settings the network and its processing read. Defaults are lerobot 0.6.1's
    (`lerobot/policies/smolvla/configuration_smolvla.py`)."""

    chunk_size: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    # (width, height), as lerobot writes it: images are resized to fit, keeping their aspect
    # ratio, and padded on the left and top.
    resize_imgs_with_padding: tuple[int, int] = (512, 512)
    tokenizer_max_length: int = 48
    pad_language_to: str = "longest"  # or "max_length" (tokenizer_max_length)
    num_steps: int = 10
    vlm_model_name: str = DEFAULT_BACKBONE
    add_image_special_tokens: bool = False
    attention_mode: str = "cross_attn"
    num_expert_layers: int = -1  # <= 0: as many as the backbone keeps
    num_vlm_layers: int = 16  # the backbone's first layers kept
    self_attn_every_n_layers: int = 2  # every n-th layer attends jointly; the others cross-attend
    expert_width_multiplier: float = 0.75
    min_period: float = 4e-3
    max_period: float = 4.0
    freeze_vision_encoder: bool = True
    train_expert_only: bool = True
    train_state_proj: bool = True

    @classmethod
    def from_lerobot(cls, data: dict[str, Any]) -> SmolVLAConfig:
        """From lerobot's config.json (its other fields, robot features and training presets, are
        not the network's)."""
        if data.get("type") != "smolvla":
            raise ConfigError(f"not a SmolVLA config.json: its type is {data.get('type')!r}")
        if data.get("prefix_length", -1) > 0 or data.get("empty_cameras", 0) or data.get("adapt_to_pi_aloha"):
            raise ConfigError("prefix_length, empty_cameras and adapt_to_pi_aloha are not supported")
        names = {f.name for f in fields(cls)}
        values = {name: value for name, value in data.items() if name in names}
        if "resize_imgs_with_padding" in values:
            values["resize_imgs_with_padding"] = tuple(values["resize_imgs_with_padding"])
        config = cls(**values)
        if config.attention_mode != "cross_attn" or config.add_image_special_tokens:
            raise ConfigError(
                "only SmolVLA as lerobot ships it is supported: attention_mode cross_attn, "
                "add_image_special_tokens false"
            )
        return config


def read_lerobot_config(directory: Path) -> SmolVLAConfig:
    path = directory / "config.json"
    try:
        return SmolVLAConfig.from_lerobot(json.loads(path.read_text()))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: {error}") from None


def backbone_config(config: SmolVLAConfig, backbone_dir: Path | None = None) -> SmolVLMConfig:
    """SmolVLM2's configuration from `backbone_dir`, else from the directory `vlm_model_name`
    names; a Hub repo name is never fetched."""
    directory = backbone_dir if backbone_dir is not None else Path(config.vlm_model_name).expanduser()
    if not (directory / "config.json").is_file():
        raise ConfigError(
            f"SmolVLA's backbone configuration is missing: {directory}/config.json does not exist. "
            f"lerobot reads it from the Hub ({config.vlm_model_name}); Relay reads a local copy: "
            f"`hf download {config.vlm_model_name} config.json tokenizer.json tokenizer_config.json` "
            "puts it in the Hub cache, where Relay looks"
        )
    loaded = AutoConfig.from_pretrained(str(directory))
    if not isinstance(loaded, SmolVLMConfig):
        raise ConfigError(f"{directory}/config.json is a {type(loaded).__name__}, not SmolVLM's")
    return loaded
