"""Relay's outputs open in lerobot as they are: the config.json and processor files Relay writes for a
robot are the ones lerobot 0.6.1 itself saves for that robot (tests/fixtures/lerobot-pi05, written
by lerobot's own code: tests/fixtures/make_lerobot_pi05.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from relay_engine.datasets.norm_stats import NormStats, Stats
from relay_engine.models.config import named_config
from relay_engine.models.lerobot_files import RobotFeatures, write_lerobot_config, write_processors

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "lerobot-pi05"
PROCESSOR_FILES = (
    "policy_preprocessor.json",
    "policy_postprocessor.json",
    "policy_preprocessor_step_3_normalizer_processor.safetensors",
    "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
)
# The robot the fixture was made for.
ROBOT = RobotFeatures(
    cameras={"observation.images.top": (64, 64), "observation.images.wrist": (48, 48)},
    state_dim=2,
    action_dim=2,
)


def fixture_stats() -> NormStats:
    stats = json.loads((FIXTURE / "stats.json").read_text())

    def of(key: str) -> Stats:
        return Stats(**{name: np.array(values, dtype=np.float64) for name, values in stats[key].items()})

    return NormStats(state=of("observation.state"), actions=of("action"))


@pytest.fixture
def written(tmp_path: Path) -> Path:
    config = named_config("pi05", action_horizon=10)
    write_lerobot_config(tmp_path, config, ROBOT)
    write_processors(tmp_path, config, ROBOT, fixture_stats())
    return tmp_path


def test_config_json_is_lerobots_pi05_config(written: Path) -> None:
    ours = json.loads((written / "config.json").read_text())
    theirs = json.loads((FIXTURE / "config.json").read_text())
    # lerobot writes the device it was created on; Relay leaves it to the machine that loads the model.
    assert ours.pop("device") is None and theirs.pop("device") == "cpu"
    assert ours == theirs


def test_processor_files_are_lerobots(written: Path) -> None:
    for name in PROCESSOR_FILES[:2]:
        assert json.loads((written / name).read_text()) == json.loads((FIXTURE / name).read_text()), name
    for name in PROCESSOR_FILES[2:]:
        ours, theirs = load_file(str(written / name)), load_file(str(FIXTURE / name))
        assert sorted(ours) == sorted(theirs), name
        for key, tensor in theirs.items():
            assert ours[key].dtype == tensor.dtype and torch.equal(ours[key], tensor), (name, key)


def test_a_size_lerobot_cannot_build_is_named_as_relays(tmp_path: Path) -> None:
    """lerobot's pi05 knows its two real sizes by name; pi05-tiny's config says what it is, and lerobot
    refuses it by that name rather than building the wrong model."""
    write_lerobot_config(tmp_path, named_config("pi05-tiny"), ROBOT)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["paligemma_variant"], config["action_expert_variant"]) == ("pi05-tiny", "pi05-tiny")
    assert config["image_resolution"] == [32, 32] and config["tokenizer_max_length"] == 256
