"""The files lerobot 0.6.1 opens beside a pi05 `model.safetensors`, written by Relay.

lerobot reads a policy directory through two files of its own: `config.json` (its `PI05Config`,
tagged `"type": "pi05"`, parsed strictly: an unknown key is an error) and the processor pipelines
(`policy_preprocessor.json`, `policy_postprocessor.json`), whose normalizer steps keep their
statistics in safetensors files beside them. Relay writes all four in lerobot's layout, so
`PI05Policy.from_pretrained(OUT)`, `PolicyProcessorPipeline.from_pretrained(OUT, ...)` and
`lerobot-eval --policy.path=OUT` open a Relay output as it is. Relay's own description of the
model (its sizes, tokenizer, tuning) goes to `relay_config.json`, which lerobot never reads.

What maps across: the dataset's cameras (in the order of the model's camera slots), state and action
widths become lerobot's input and output features; Relay's quantile normalization (q01 -> -1,
q99 -> +1) is lerobot's QUANTILES mode; the action horizon is `chunk_size`; the prompt's token
budget is `tokenizer_max_length`. lerobot's pi05 knows two model sizes by name (`gemma_2b` with
`gemma_300m`); `pi05-tiny` has no name there (see `variants`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import save_file

from relay.catalog import MODEL_CAMERAS
from relay_engine.datasets.norm_stats import NormStats
from relay_engine.datasets.summary import DatasetSummary
from relay_engine.models.config import Pi05Config
from relay_engine.models.tokenizer import PALIGEMMA_TOKENIZER_REPO

LEROBOT_CONFIG_FILE = "config.json"
PREPROCESSOR = "policy_preprocessor"
# The preprocessor's normalizer step: its state holds the statistics the policy was trained with.
NORMALIZER_FILE = f"{PREPROCESSOR}_step_3_normalizer_processor.safetensors"
POSTPROCESSOR = "policy_postprocessor"
STATE_KEY = "observation.state"
ACTION_KEY = "action"
# lerobot's pi05 pads state and action to 32 columns, as Relay's model does.
MAX_DIM = 32
# lerobot's names for pi05's two Gemma sizes; Relay's pi05 is exactly these.
LEROBOT_VARIANTS = {"pi05": ("gemma_2b", "gemma_300m")}
NORM_MAP = {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}
# The normalizer's guard against a zero range (lerobot's default); Relay adds 1e-6 to every range
# instead, so the two agree to about 1e-6 of a range's width.
NORMALIZER_EPS = 1e-8


class DescribesRobot(Protocol):
    """What a training dataset tells the output about the robot (LeRobotDataset has these)."""

    norm_stats: NormStats
    camera_map: dict[str, str]
    summary: DatasetSummary


@dataclass(frozen=True)
class RobotFeatures:
    """The robot's inputs and outputs, as lerobot names them: cameras (dataset feature -> height,
    width) in the model's slot order, and the state and action widths."""

    cameras: dict[str, tuple[int, int]]
    state_dim: int
    action_dim: int

    @classmethod
    def of(cls, dataset: DescribesRobot) -> RobotFeatures:
        by_slot = sorted(dataset.camera_map.items(), key=lambda item: MODEL_CAMERAS.index(item[0]))
        cameras = {feature: dataset.summary.cameras[feature] for _, feature in by_slot}
        return cls(cameras, dataset.summary.state_dim, dataset.summary.action_dim)

    def input_features(self) -> dict[str, Any]:
        features: dict[str, Any] = {
            camera: {"type": "VISUAL", "shape": [3, height, width]}
            for camera, (height, width) in self.cameras.items()
        }
        features[STATE_KEY] = {"type": "STATE", "shape": [self.state_dim]}
        return features

    def output_features(self) -> dict[str, Any]:
        return {ACTION_KEY: {"type": "ACTION", "shape": [self.action_dim]}}

    @classmethod
    def read(cls, directory: Path) -> RobotFeatures | None:
        """The features lerobot's config.json in `directory` names, or None where it names none
        (a base model, or Relay's own older config.json)."""
        path = directory / LEROBOT_CONFIG_FILE
        try:
            config = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        inputs = config.get("input_features") if config.get("type") == "pi05" else None
        outputs = config.get("output_features") or {}
        if not isinstance(inputs, dict) or not inputs or ACTION_KEY not in outputs:
            return None
        cameras = {
            name: (int(feature["shape"][1]), int(feature["shape"][2]))
            for name, feature in inputs.items()
            if feature.get("type") == "VISUAL"
        }
        state = inputs.get(STATE_KEY, {}).get("shape", [0])
        return cls(cameras, int(state[0]), int(outputs[ACTION_KEY]["shape"][0]))


def variants(config: Pi05Config) -> tuple[str, str]:
    """lerobot's names for the language model's and the action expert's sizes. A size lerobot has
    no name for is written as Relay's model name, which lerobot refuses with "Invalid
    paligemma_variant": its pi05 builds only the real sizes."""
    return LEROBOT_VARIANTS.get(config.model, (config.model, config.model))


def lerobot_config(config: Pi05Config, features: RobotFeatures | None) -> dict[str, Any]:
    """lerobot's PI05Config for these weights. Fields Relay has no view on keep lerobot's defaults;
    they are written out (as lerobot writes them) so the file says exactly what lerobot will run."""
    language, expert = variants(config)
    return {
        "type": "pi05",
        "n_obs_steps": 1,
        "input_features": features.input_features() if features else {},
        "output_features": features.output_features() if features else {},
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
        "paligemma_variant": language,
        "action_expert_variant": expert,
        "dtype": "float32",
        "chunk_size": config.action_horizon,
        "n_action_steps": config.action_horizon,
        "max_state_dim": MAX_DIM,
        "max_action_dim": MAX_DIM,
        "num_inference_steps": 10,
        "time_sampling_beta_alpha": 1.5,
        "time_sampling_beta_beta": 1.0,
        "time_sampling_scale": 0.999,
        "time_sampling_offset": 0.001,
        "min_period": 0.004,
        "max_period": 4.0,
        "use_relative_actions": False,
        "relative_exclude_joints": ["gripper"],
        "action_feature_names": None,
        "rtc_config": None,
        "image_resolution": [config.vision.image_size, config.vision.image_size],
        "empty_cameras": 0,
        "tokenizer_max_length": config.max_token_len,
        "normalization_mapping": NORM_MAP,
        "gradient_checkpointing": False,
        "compile_model": False,
        "compile_mode": "max-autotune",
        "freeze_vision_encoder": False,
        "train_expert_only": False,
        "optimizer_lr": 2.5e-05,
        "optimizer_betas": [0.9, 0.95],
        "optimizer_eps": 1e-08,
        "optimizer_weight_decay": 0.01,
        "optimizer_grad_clip_norm": 1.0,
        "scheduler_warmup_steps": 1000,
        "scheduler_decay_steps": 30000,
        "scheduler_decay_lr": 2.5e-06,
    }


def write_lerobot_config(directory: Path, config: Pi05Config, features: RobotFeatures | None) -> None:
    text = json.dumps(lerobot_config(config, features), indent=4) + "\n"
    (directory / LEROBOT_CONFIG_FILE).write_text(text)


def write_processors(directory: Path, config: Pi05Config, features: RobotFeatures, stats: NormStats) -> None:
    """lerobot's pre- and postprocessor pipelines for pi05, with the dataset's statistics."""
    tensors = _stats_tensors(stats)
    every_feature = {**features.input_features(), **features.output_features()}
    pre_state = NORMALIZER_FILE
    post_state = f"{POSTPROCESSOR}_step_0_unnormalizer_processor.safetensors"
    tokenizer = PALIGEMMA_TOKENIZER_REPO if config.tokenizer == "paligemma" else None
    device = {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}
    preprocessor = [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {
            "registry_name": "relative_actions_processor",
            "config": {"enabled": False, "exclude_joints": ["gripper"], "action_names": None},
        },
        _normalizer("normalizer_processor", every_feature, pre_state),
        {"registry_name": "pi05_prepare_state_tokenizer_processor_step", "config": {}},
        {
            "registry_name": "tokenizer_processor",
            "config": {
                "max_length": config.max_token_len,
                "task_key": "task",
                "padding_side": "right",
                "padding": "max_length",
                "truncation": True,
                "tokenizer_name": tokenizer,
            },
        },
        device,
    ]
    postprocessor = [
        _normalizer("unnormalizer_processor", features.output_features(), post_state),
        {"registry_name": "absolute_actions_processor", "config": {"enabled": False}},
        device,
    ]
    pipelines = ((PREPROCESSOR, preprocessor, pre_state), (POSTPROCESSOR, postprocessor, post_state))
    for name, steps, state_file in pipelines:
        save_file(tensors, str(directory / state_file))
        (directory / f"{name}.json").write_text(json.dumps({"name": name, "steps": steps}, indent=2) + "\n")


def _normalizer(registry_name: str, features: dict[str, Any], state_file: str) -> dict[str, Any]:
    return {
        "registry_name": registry_name,
        "config": {"eps": NORMALIZER_EPS, "features": features, "norm_map": NORM_MAP},
        "state_file": state_file,
    }


def _stats_tensors(stats: NormStats) -> dict[str, torch.Tensor]:
    """`observation.state.q01`, `action.q99`, ...: float32, as lerobot's normalizer stores them."""
    tensors: dict[str, torch.Tensor] = {}
    for key, values in ((STATE_KEY, stats.state), (ACTION_KEY, stats.actions)):
        for name, array in values.to_dict().items():
            tensors[f"{key}.{name}"] = torch.tensor(array, dtype=torch.float32)
    return tensors
