"""SmolVLA's files as lerobot 0.6.1 reads and writes them: `config.json` (its `SmolVLAConfig`,
tagged `"type": "smolvla"`), `model.safetensors`, and the processor pipelines
(`policy_preprocessor.json`, `policy_postprocessor.json`) with the mean and standard deviation
they normalize by; and where a base's files are (smolvla-tiny's shipped folder, or
`lerobot/smolvla_base` on the Hub).

A base's config.json names the robot it was pretrained for; a tuned output's names the dataset's
cameras (under the dataset's own names), state and action widths instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from relay.checkpoints import RELAY_CONFIG_FILE, RELAY_CONFIG_PREFIX
from relay_engine.datasets.norm_stats import NormStats
from relay_engine.errors import ConfigError
from relay_engine.families.smolvla.config import DEFAULT_BACKBONE

TINY_BASE_DIR = Path(__file__).resolve().parent / "tiny"
# The published base, and the backbone it names (a local copy of its config.json and tokenizer is
# needed: see config.backbone_config).
BASE_REPO = "lerobot/smolvla_base"
BACKBONE_DIR = "vlm"  # the backbone's config and tokenizer, beside a Relay output's weights
STATE_KEY = "observation.state"
ACTION_KEY = "action"
NORM_MAP = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
NORMALIZER_EPS = 1e-8
PREPROCESSOR = "policy_preprocessor"
POSTPROCESSOR = "policy_postprocessor"
NORMALIZER_FILE = f"{PREPROCESSOR}_step_5_normalizer_processor.safetensors"
UNNORMALIZER_FILE = f"{POSTPROCESSOR}_step_0_unnormalizer_processor.safetensors"


def write_relay_config(directory: Path, model: str) -> None:
    """Relay's record of which model the output is (smolvla or smolvla-tiny: lerobot's config.json
    says only "smolvla"), read by relay.checkpoints.checkpoint_model."""
    record = {"format": f"{RELAY_CONFIG_PREFIX}smolvla", "model": model}
    (directory / RELAY_CONFIG_FILE).write_text(json.dumps(record, indent=2) + "\n")


def robot_features(
    cameras: dict[str, tuple[int, int, int]], state_dim: int, action_dim: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """lerobot's input and output features: cameras (name -> (3, height, width)), state, action."""
    inputs: dict[str, Any] = {
        name: {"type": "VISUAL", "shape": list(shape)} for name, shape in cameras.items()
    }
    inputs[STATE_KEY] = {"type": "STATE", "shape": [state_dim]}
    return inputs, {ACTION_KEY: {"type": "ACTION", "shape": [action_dim]}}


def lerobot_config(
    cameras: dict[str, tuple[int, int, int]], state_dim: int, action_dim: int, vlm_model_name: str
) -> dict[str, Any]:
    """lerobot 0.6.1's SmolVLAConfig, every field written out with lerobot's default, for a robot."""
    inputs, outputs = robot_features(cameras, state_dim, action_dim)
    return {
        "type": "smolvla",
        "n_obs_steps": 1,
        "input_features": inputs,
        "output_features": outputs,
        "device": None,
        "use_amp": False,
        "use_peft": False,
        "push_to_hub": False,
        "repo_id": None,
        "private": None,
        "tags": None,
        "license": None,
        "pretrained_path": None,
        "pretrained_revision": None,
        "chunk_size": 50,
        "n_action_steps": 50,
        "normalization_mapping": NORM_MAP,
        "max_state_dim": 32,
        "max_action_dim": 32,
        "resize_imgs_with_padding": [512, 512],
        "empty_cameras": 0,
        "adapt_to_pi_aloha": False,
        "use_delta_joint_actions_aloha": False,
        "tokenizer_max_length": 48,
        "num_steps": 10,
        "use_cache": True,
        "freeze_vision_encoder": True,
        "train_expert_only": True,
        "train_state_proj": True,
        "optimizer_lr": 1e-4,
        "optimizer_betas": [0.9, 0.95],
        "optimizer_eps": 1e-08,
        "optimizer_weight_decay": 1e-10,
        "optimizer_grad_clip_norm": 10,
        "scheduler_warmup_steps": 1000,
        "scheduler_decay_steps": 30000,
        "scheduler_decay_lr": 2.5e-06,
        "vlm_model_name": vlm_model_name,
        "load_vlm_weights": False,
        "add_image_special_tokens": False,
        "attention_mode": "cross_attn",
        "prefix_length": -1,
        "pad_language_to": "longest",
        "num_expert_layers": -1,
        "num_vlm_layers": 16,
        "self_attn_every_n_layers": 2,
        "expert_width_multiplier": 0.75,
        "min_period": 0.004,
        "max_period": 4.0,
        "rtc_config": None,
        "compile_model": False,
        "compile_mode": "max-autotune",
    }


def for_robot(
    config: dict[str, Any], cameras: dict[str, tuple[int, int, int]], state_dim: int, action_dim: int
) -> dict[str, Any]:
    """A base's config.json, now naming the robot a job trained it for."""
    inputs, outputs = robot_features(cameras, state_dim, action_dim)
    return {**config, "input_features": inputs, "output_features": outputs}


def write_processors(directory: Path, config: dict[str, Any], stats: NormStats) -> None:
    """lerobot's pre- and postprocessor pipelines for SmolVLA (as `make_smolvla_pre_post_processors`
    builds them), with the dataset's mean and standard deviation."""
    tensors = {
        f"{key}.{name}": torch.tensor(getattr(values, name), dtype=torch.float32)
        for key, values in ((STATE_KEY, stats.state), (ACTION_KEY, stats.actions))
        for name in ("mean", "std")
    }
    features = {**config["input_features"], **config["output_features"]}
    device = {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}
    preprocessor = [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "smolvla_new_line_processor", "config": {}},
        {
            "registry_name": "tokenizer_processor",
            "config": {
                "max_length": config["tokenizer_max_length"],
                "task_key": "task",
                "padding_side": "right",
                "padding": config["pad_language_to"],
                "truncation": True,
                "tokenizer_name": config["vlm_model_name"],
            },
        },
        device,
        _normalizer("normalizer_processor", features, NORMALIZER_FILE),
    ]
    postprocessor = [
        _normalizer("unnormalizer_processor", config["output_features"], UNNORMALIZER_FILE),
        device,
    ]
    for name, steps, state_file in (
        (PREPROCESSOR, preprocessor, NORMALIZER_FILE),
        (POSTPROCESSOR, postprocessor, UNNORMALIZER_FILE),
    ):
        save_file(tensors, str(directory / state_file))
        (directory / f"{name}.json").write_text(json.dumps({"name": name, "steps": steps}, indent=2) + "\n")


def _normalizer(registry_name: str, features: dict[str, Any], state_file: str) -> dict[str, Any]:
    return {
        "registry_name": registry_name,
        "config": {"eps": NORMALIZER_EPS, "features": features, "norm_map": NORM_MAP},
        "state_file": state_file,
    }


def base_files(model: str) -> tuple[Path, Path | None]:
    """A base model's directory (config.json, model.safetensors) and its backbone's (config and
    tokenizer): smolvla-tiny's are shipped; smolvla's weights come from the Hub, its backbone from
    the local directory its config.json's vlm_model_name names (None: that name as it is)."""
    backbone = base_backbone(model)
    return (TINY_BASE_DIR if model == "smolvla-tiny" else _fetch_base(BASE_REPO)), backbone


def base_backbone(model: str) -> Path | None:
    """A base model's backbone files (config and tokenizer), without its weights: smolvla-tiny's
    shipped ones, smolvla's from the Hub cache (None where they are not there)."""
    if model == "smolvla-tiny":
        return TINY_BASE_DIR / BACKBONE_DIR
    if model == "smolvla":
        return cached_backbone(DEFAULT_BACKBONE)
    raise ConfigError(f"unknown SmolVLA model {model!r}; known: smolvla, smolvla-tiny", param="model")


def cached_backbone(repo: str) -> Path | None:
    """The backbone's files in the Hub cache (`hf download REPO config.json tokenizer.json
    tokenizer_config.json` puts them there), else None: Relay never fetches them itself."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, "config.json", cache_dir=os.environ.get("HF_HUB_CACHE") or None)
    return Path(found).parent if isinstance(found, str) else None


def _fetch_base(repo: str) -> Path:
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    from relay_engine.hub_files import download

    try:
        download(repo, "config.json")
        return download(repo, "model.safetensors").parent
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as error:
        raise ConfigError(
            f"model: could not fetch {repo}'s config.json and model.safetensors from the Hub, nor find "
            f"them in the Hub cache ({type(error).__name__}: {error})",
            param="model",
        ) from None
