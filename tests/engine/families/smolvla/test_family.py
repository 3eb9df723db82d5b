"""SmolVLA as a registered family: a recipe job on a LeRobot dataset (every camera under its own
name, mean/std normalization), lerobot's files as the output, a resume equal to an uninterrupted
run, and `relay local train` / `relay local eval` on it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from relay.cli import app
from relay.errors import ConfigError
from relay.sft.config import SFTConfig
from relay_engine.datasets import open_dataset, write_synthetic_dataset
from relay_engine.families import family_for, family_owning
from relay_engine.families.robot_validation import Validator
from relay_engine.families.smolvla.files import TINY_BASE_DIR
from relay_engine.families.smolvla.policy import SmolVLAPolicy
from relay_engine.recipe import Recipe, run_recipe

CAMERAS = {"observation.images.top": (24, 32), "observation.images.wrist": (16, 16)}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("smolvla") / "data",
        episodes=6,
        episode_length=(8, 14),
        cameras=CAMERAS,
        state_dim=3,
        action_dim=2,
        num_tasks=2,
    )


def recipe(
    dataset: Path, steps: int = 12, fields: dict[str, Any] | None = None, **settings: object
) -> Recipe:
    config = SFTConfig(
        model="smolvla-tiny", dataset_name=str(dataset), steps=steps, batch_size=4, **(fields or {})
    )
    return Recipe(config, checkpoint_every=5, log_every=1, **settings)  # type: ignore[arg-type]


def test_the_dataset_is_normalized_by_mean_and_std_under_its_own_camera_names(dataset: Path) -> None:
    quantile = open_dataset(str(dataset), action_horizon=10)
    data = open_dataset(str(dataset), action_horizon=10, normalization="mean_std", camera_names="dataset")
    assert data.camera_map == {name: name for name in CAMERAS}
    stats = data.norm_stats.state
    raw = quantile.norm_stats.state.unnormalize(quantile[5]["state"][:3])
    expected = (raw - stats.mean) / (stats.std + 1e-8)
    np.testing.assert_allclose(data[5]["state"][:3], expected, rtol=1e-5, atol=1e-5)
    assert set(data[5]["image"]) == set(CAMERAS)


def test_a_recipe_writes_lerobot_files_for_the_dataset_s_robot(dataset: Path, tmp_path: Path) -> None:
    result = run_recipe(recipe(dataset), tmp_path / "run", on_event=lambda e: None, should_stop=lambda: False)
    assert result.status == "completed" and result.step == 12
    output = result.output_dir
    config = json.loads((output / "config.json").read_text())
    assert config["type"] == "smolvla"
    assert config["input_features"] == {
        "observation.images.top": {"type": "VISUAL", "shape": [3, 24, 32]},
        "observation.images.wrist": {"type": "VISUAL", "shape": [3, 16, 16]},
        "observation.state": {"type": "STATE", "shape": [3]},
    }
    assert config["output_features"] == {"action": {"type": "ACTION", "shape": [2]}}
    # lerobot's normalizer reads the dataset's mean and std.
    data = open_dataset(str(dataset), normalization="mean_std", camera_names="dataset")
    stats = load_file(str(output / "policy_preprocessor_step_5_normalizer_processor.safetensors"))
    np.testing.assert_allclose(stats["action.mean"].numpy(), data.norm_stats.actions.mean, rtol=1e-6)
    np.testing.assert_allclose(stats["observation.state.std"].numpy(), data.norm_stats.state.std, rtol=1e-6)
    pipeline = json.loads((output / "policy_preprocessor.json").read_text())
    normalizer = pipeline["steps"][-1]
    assert normalizer["config"]["norm_map"] == {
        "VISUAL": "IDENTITY",
        "STATE": "MEAN_STD",
        "ACTION": "MEAN_STD",
    }

    # Loaded back strictly: lerobot's default training moved the expert and left the backbone.
    tuned = SmolVLAPolicy.from_lerobot(output, output / "vlm")
    assert tuned.cameras == tuple(CAMERAS) and tuned.action_dim == 2
    base = load_file(str(TINY_BASE_DIR / "model.safetensors"))
    weights = tuned.state_dict()
    vision = [name for name in base if ".vision_model." in name]
    expert = [name for name in base if ".lm_expert." in name]
    assert vision and expert
    assert all(torch.equal(weights[name], base[name]) for name in vision)
    assert any(not torch.equal(weights[name], base[name]) for name in expert)
    assert family_owning(str(output)).name == "smolvla"


def test_a_lora_recipe_adapts_where_lerobot_does_and_writes_plain_lerobot_files(
    dataset: Path, tmp_path: Path
) -> None:
    """finetune "lora": adapters on the expert's query and value projections and on the state,
    action and time projections (lerobot's PEFT defaults); the output has them merged in under
    lerobot's names, so it loads strictly as a plain SmolVLA."""
    result = run_recipe(
        recipe(dataset, fields={"finetune": "lora", "lora_rank": 4}),
        tmp_path / "run",
        on_event=lambda e: None,
        should_stop=lambda: False,
    )
    assert result.status == "completed"
    saved = load_file(str(result.output_dir / "model.safetensors"))
    assert not [name for name in saved if "lora_" in name or "base_layer" in name]
    tuned = SmolVLAPolicy.from_lerobot(result.output_dir, result.output_dir / "vlm")  # strict
    base = load_file(str(TINY_BASE_DIR / "model.safetensors"))
    weights = tuned.state_dict()
    changed = {name for name in base if not torch.equal(weights[name], base[name])}
    adapted = {name for name in changed if ".lm_expert." in name}
    assert adapted and all(name.endswith(("q_proj.weight", "v_proj.weight")) for name in adapted)
    assert "model.action_in_proj.weight" in changed and "model.action_out_proj.weight" in changed
    # Biases and everything outside the adapted layers stay the base's.
    assert all(name.endswith(".weight") for name in changed)
    assert not [name for name in changed if ".vlm." in name or "mlp." in name]


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_a_stopped_recipe_resumes_to_the_uninterrupted_weights(
    dataset: Path, tmp_path: Path, finetune: str
) -> None:
    fields = {"finetune": finetune, "lora_rank": 4}
    whole = run_recipe(
        recipe(dataset, fields=fields), tmp_path / "whole", on_event=lambda e: None, should_stop=lambda: False
    )
    calls = iter(range(100))
    events: list[dict[str, object]] = []
    stopped = run_recipe(
        recipe(dataset, fields=fields),
        tmp_path / "split",
        on_event=events.append,
        should_stop=lambda: next(calls) >= 7,
        checkpoint_on_stop=True,
    )
    assert (stopped.status, stopped.step) == ("stopped", 7)
    events.clear()
    resumed = run_recipe(
        recipe(dataset, fields=fields), tmp_path / "split", on_event=events.append, should_stop=lambda: False
    )
    assert {"step": 7, "event": "resumed"} in events and resumed.step == 12
    expected = load_file(str(whole.output_dir / "model.safetensors"))
    got = load_file(str(resumed.output_dir / "model.safetensors"))
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[name], got[name]) for name in expected)


def test_a_validation_split_is_held_out_and_scored_at_each_checkpoint(dataset: Path, tmp_path: Path) -> None:
    """validation_episodes as for pi05: the held-out episode's frames never train, and after each
    checkpoint a ValidationEvent scores them (the loss, the robot scores, the blind baseline); the
    same weights score the same."""
    events: list[dict[str, object]] = []
    config = SFTConfig(
        model="smolvla-tiny", dataset_name=str(dataset), steps=10, batch_size=4, validation_episodes=[5]
    )
    # Each frame read, and whether the validator read it (inside Validator.__call__) or training did.
    read: list[tuple[bool, int]] = []
    validating = [False]
    data = open_dataset(str(dataset), normalization="mean_std", camera_names="dataset")
    held_out = set(data.indices_of_episodes([5]).tolist())
    original_read, original_score = type(data).__getitem__, Validator.__call__

    def recording(self: object, index: int) -> object:
        read.append((validating[0], int(index)))
        return original_read(self, index)  # type: ignore[arg-type]

    def scoring(self: Validator, step: int) -> object:
        validating[0] = True
        try:
            return original_score(self, step)
        finally:
            validating[0] = False

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(data), "__getitem__", recording)
        patch.setattr(Validator, "__call__", scoring)
        result = run_recipe(
            Recipe(config, checkpoint_every=5, log_every=1),
            tmp_path / "run",
            on_event=events.append,
            should_stop=lambda: False,
        )
    assert result.status == "completed"
    scored = [e for e in events if e.get("event") == "validation"]
    assert [e["step"] for e in scored] == [5, 10]
    for event in scored:
        assert event["episodes"] == 1 and event["frames"] == len(held_out)
        figures = [event[k] for k in ("validation_loss", "mean_action_mse", "action_mse", "blind_mse")]
        assert all(isinstance(x, float) and np.isfinite(x) and x > 0 for x in figures), event
    assert scored[0]["blind_mse"] == scored[1]["blind_mse"]  # the baseline does not train
    assert scored[0]["validation_loss"] != scored[1]["validation_loss"]  # the weights did
    # Training never read a held-out frame, and the validator read only those.
    trained_on = {index for by_validator, index in read if not by_validator}
    scored_frames = {index for by_validator, index in read if by_validator}
    assert trained_on and not trained_on & held_out
    assert scored_frames == held_out


def test_a_recipe_starts_from_a_smolvla_checkpoint_and_refuses_another_model_s(
    dataset: Path, tmp_path: Path
) -> None:
    quiet: dict[str, Any] = {"on_event": lambda e: None, "should_stop": lambda: False}
    first = run_recipe(recipe(dataset, steps=4), tmp_path / "first", **quiet)
    assert json.loads((first.output_dir / "relay_config.json").read_text())["model"] == "smolvla-tiny"
    events: list[dict[str, object]] = []
    config = SFTConfig(
        model="smolvla-tiny",
        dataset_name=str(dataset),
        steps=1,
        batch_size=4,
        learning_rate=1e-12,  # one step that barely moves: the output is the weights it started from
        from_checkpoint=str(first.output_dir),
    )
    second = run_recipe(
        Recipe(config), tmp_path / "second", on_event=events.append, should_stop=lambda: False
    )
    [weights] = [e for e in events if e.get("event") == "weights"]
    assert (weights["step"], weights["model"], weights["path"]) == (0, "smolvla-tiny", str(first.output_dir))
    started = load_file(str(first.output_dir / "model.safetensors"))
    ended = load_file(str(second.output_dir / "model.safetensors"))
    base = load_file(str(TINY_BASE_DIR / "model.safetensors"))
    assert all(torch.allclose(ended[name], started[name], rtol=0, atol=1e-9) for name in started)
    assert any(not torch.equal(started[name], base[name]) for name in base)

    # lerobot's own layout has no vlm/: the base's backbone files serve (the same architecture).
    bare = tmp_path / "bare"
    shutil.copytree(first.output_dir, bare, ignore=shutil.ignore_patterns("vlm"))
    from_bare = config.model_copy(update={"from_checkpoint": str(bare)})
    assert run_recipe(Recipe(from_bare), tmp_path / "from-bare", **quiet).status == "completed"

    # normalization "checkpoint": another recording of the robot, normalized as the checkpoint was.
    other = write_synthetic_dataset(
        tmp_path / "other",
        episodes=4,
        episode_length=(8, 14),
        cameras=CAMERAS,
        state_dim=3,
        action_dim=2,
        seed=7,
    )
    own = config.model_copy(update={"dataset_name": str(other), "normalization": "checkpoint"})
    third = run_recipe(Recipe(own), tmp_path / "own-stats", **quiet)
    stats = (first.output_dir / "norm_stats.json").read_text()
    assert (third.output_dir / "norm_stats.json").read_text() == stats
    assert open_dataset(str(other), normalization="mean_std").norm_stats.to_json() != stats

    # A pi05-tiny output named as a SmolVLA's starting point: refused before any dataset is read.
    pi05_output = tmp_path / "pi05-output"
    pi05_output.mkdir()
    (pi05_output / "model.safetensors").write_bytes(b"")
    (pi05_output / "relay_config.json").write_text(json.dumps({"format": "relay-pi05", "model": "pi05-tiny"}))
    refused_config = config.model_copy(update={"from_checkpoint": str(pi05_output)})
    with pytest.raises(ConfigError) as refused:
        run_recipe(
            Recipe(refused_config), tmp_path / "third", on_event=lambda e: None, should_stop=lambda: False
        )
    assert f'"{pi05_output}" holds pi05-tiny weights, and model is "smolvla-tiny"' in str(refused.value)


def test_fields_smolvla_does_not_take_are_refused_naming_them(dataset: Path) -> None:
    for fields, param in (
        ({"cameras": {"base_0_rgb": "observation.images.top"}}, "cameras"),
        ({"targets": ["vision"]}, "targets"),
        ({"gpus": 2}, "gpus"),
    ):
        with pytest.raises(ConfigError) as refused:
            SFTConfig.parse({"model": "smolvla-tiny", "dataset_name": str(dataset), **fields})
        assert refused.value.param == param, fields
    assert family_for("smolvla").name == "smolvla"


def test_local_train_then_eval_scores_it_against_the_blind_baseline(dataset: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "out"
    trained = runner.invoke(
        app,
        ["local", "train", "--model", "smolvla-tiny", "--dataset", str(dataset), "--episodes", "0-4",
         "--steps", "6", "--batch-size", "4", "--output-dir", str(out)],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    scored = runner.invoke(
        app,
        ["local", "eval", "--model", str(out), "--dataset", str(dataset), "--episodes", "5",
         "--blind-from", "0-4", "--json"],
    )  # fmt: skip
    assert scored.exit_code == 0, scored.output
    report = json.loads(scored.output.strip().splitlines()[-1])
    assert report["frames"] > 0 and report["mean_action_mse"] > 0 and report["blind_mse"] > 0


def test_smolvla_reads_its_base_from_the_hub_and_its_backbone_from_the_hub_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import hf_hub_download

    from relay_engine.families.smolvla.config import DEFAULT_BACKBONE
    from relay_engine.families.smolvla.files import BASE_REPO
    from tests.hub import FakeHub, Repo

    # lerobot/smolvla_base as published names its backbone by Hub repo; here both hold the tiny ones.
    base = tmp_path / "base"
    base.mkdir()
    config = json.loads((TINY_BASE_DIR / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "vlm_model_name": DEFAULT_BACKBONE}))
    (base / "model.safetensors").write_bytes((TINY_BASE_DIR / "model.safetensors").read_bytes())
    smolvla = family_for("smolvla")
    with FakeHub() as hub:
        hub.models[BASE_REPO] = Repo.at(base)
        hub.models[DEFAULT_BACKBONE] = Repo.at(TINY_BASE_DIR / "vlm")
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        # Relay never fetches the backbone: until it is in the cache, the error says how to get it.
        with pytest.raises(ConfigError, match=rf"missing.*hf download {DEFAULT_BACKBONE} config.json"):
            smolvla.load_model("smolvla")
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):  # what `hf download` does
            hf_hub_download(DEFAULT_BACKBONE, name, endpoint=hub.endpoint, cache_dir=str(tmp_path / "cache"))
        loaded = smolvla.load_model("smolvla")
    expected = load_file(str(TINY_BASE_DIR / "model.safetensors"))
    assert all(torch.equal(value, expected[name]) for name, value in loaded.state_dict().items())


def test_a_smolvla_recipe_tunes_in_full_unless_it_asks_for_lora(dataset: Path) -> None:
    named = SFTConfig.parse({"model": "smolvla-tiny", "dataset_name": str(dataset)})
    assert (named.finetune, named.targets) == ("full", ["all"])
    lora = SFTConfig.parse(
        {"model": "smolvla", "dataset_name": str(dataset), "finetune": "lora", "lora_rank": 8}
    )
    assert (lora.finetune, lora.lora_rank, lora.lora_alpha, lora.targets) == ("lora", 8, 8.0, ["all"])
    # RT-J still trains in full only.
    with pytest.raises(ConfigError, match='must be "full"'):
        SFTConfig.parse({"model": "rt-j-tiny", "dataset_name": str(dataset), "task": "t", "finetune": "lora"})


def test_models_info_on_a_base_it_cannot_read_is_an_error_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `relay models info smolvla` off the Hub printed a traceback.
    from tests.hub import FakeHub

    with FakeHub() as hub:  # a Hub that holds no lerobot/smolvla_base
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        shown = CliRunner().invoke(app, ["models", "info", "smolvla"])
    assert shown.exit_code == 1, shown.output
    assert shown.exception is None or isinstance(shown.exception, SystemExit)
    assert "error: model: could not fetch lerobot/smolvla_base" in " ".join(shown.output.split())
    assert "Traceback" not in shown.output
    tiny = CliRunner().invoke(app, ["models", "info", "smolvla-tiny"])
    assert tiny.exit_code == 0 and "smolvla-tiny" in tiny.output
    # pi05's flags were ignored for SmolVLA (the description printed as if the plan held). Its
    # memory plan is its own (tests/engine/distributed/test_memory_plan.py).
    for flags in (["--keys"], ["--targets", "vision"]):
        refused = CliRunner().invoke(app, ["models", "info", "smolvla-tiny", *flags])
        assert refused.exit_code == 1, refused.output
        assert f"error: {flags[0]} is for pi05, pi05-tiny" in refused.output
