"""Recipe jobs on pi05-tiny: exact resume, cooperative stop, merged output that reloads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from relay.events import RecipeResult
from relay.sft.config import SFTConfig
from relay_engine.datasets import LeRobotDataset
from relay_engine.errors import ConfigError, DatasetError, EngineError
from relay_engine.models import load_policy
from relay_engine.recipe import Recipe, run_recipe

STEPS = 12


def recipe_for(dataset: Path, **changes: Any) -> Recipe:
    """A recipe of SFTConfig's fields and the engine's settings; `changes` may override either."""
    config: dict[str, Any] = dict(
        model="pi05-tiny",
        dataset_name=str(dataset),
        batch_size=4,
        learning_rate=1e-3,
        steps=STEPS,
        finetune="lora",  # LoRA's adapters merged into the output are part of what these tests check
    )
    engine: dict[str, Any] = dict(
        checkpoint_every=4,
        log_every=1,  # an event per step, so every step's loss is compared
        num_workers=0,
    )
    for name, value in changes.items():
        (config if name in SFTConfig.model_fields else engine)[name] = value
    return Recipe.from_config(SFTConfig(**config), **engine)


def run(
    recipe: Recipe, work_dir: Path, cache: Path, stop_after: int | None = None
) -> tuple[RecipeResult, list[dict]]:
    events: list[dict[str, Any]] = []
    metrics = lambda: sum(1 for e in events if "loss" in e)  # noqa: E731
    result = run_recipe(
        recipe,
        work_dir,
        on_event=events.append,
        should_stop=lambda: stop_after is not None and metrics() >= stop_after,
        dataset_cache_dir=cache,
    )
    return result, events


def losses(events: list[dict[str, Any]]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events if "loss" in e}


def test_a_stopped_and_resumed_run_matches_an_uninterrupted_one(
    synthetic_dataset_path: Path, dataset_cache: Path, tmp_path: Path
) -> None:
    recipe = recipe_for(synthetic_dataset_path)
    straight, straight_events = run(recipe, tmp_path / "straight", dataset_cache)
    assert straight.status == "completed" and straight.step == STEPS

    # Stop after step 6: the last checkpoint is step 4, so steps 5 and 6 are trained again.
    first, first_events = run(recipe, tmp_path / "interrupted", dataset_cache, stop_after=6)
    assert first.status == "stopped" and first.step == 6
    assert not (tmp_path / "interrupted" / "output").exists()
    second, second_events = run(recipe, tmp_path / "interrupted", dataset_cache)
    assert second.status == "completed" and second.resumed_from == 4

    expected = losses(straight_events)
    assert sorted(expected) == list(range(1, STEPS + 1))
    resumed = {**losses(first_events), **losses(second_events)}
    assert min(losses(second_events)) == 5
    for step, loss in expected.items():
        assert resumed[step] == pytest.approx(loss, abs=1e-6), f"step {step}"

    straight_weights = load_file(str(straight.output_dir / "model.safetensors"))
    resumed_weights = load_file(str(second.output_dir / "model.safetensors"))
    assert straight_weights.keys() == resumed_weights.keys()
    for name, tensor in straight_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_events_and_output_of_a_completed_run(
    synthetic_dataset_path: Path, synthetic_dataset: LeRobotDataset, dataset_cache: Path, tmp_path: Path
) -> None:
    recipe = recipe_for(synthetic_dataset_path, log_every=10, steps=25, checkpoint_every=10)
    result, events = run(recipe, tmp_path, dataset_cache)

    metrics = [e for e in events if "loss" in e]
    assert [e["step"] for e in metrics] == [10, 20, 25]
    speed = {"steps_per_second", "samples_per_second", "data_wait"}
    assert set(metrics[0]) == {"step", "loss", "grad_norm", "lr", "skipped", *speed}
    assert metrics[0]["steps_per_second"] > 0 and 0 <= metrics[0]["data_wait"] <= 1
    # 10 steps of batch_size samples each, in the same time.
    ratio = metrics[0]["samples_per_second"] / metrics[0]["steps_per_second"]
    assert ratio == pytest.approx(recipe.config.batch_size)
    checkpoints = [e for e in events if e.get("event") == "checkpoint"]
    assert all(set(e) == {"step", "event", "seconds"} and e["seconds"] > 0 for e in checkpoints)
    assert metrics[0]["skipped"] == 0.0 and metrics[0]["lr"] > 0
    assert [e["step"] for e in events if e.get("event") == "checkpoint"] == [10, 20, 25]
    assert events[-2:] == [
        {"step": 25, "event": "finished"},
        {"step": 25, "event": "stage", "stage": "writing"},
    ]
    # First, once the dataset is open: what was read (a local directory: no revision or commit).
    assert events[0] == {
        "step": 0,
        "event": "dataset",
        "repo": None,
        "path": str(synthetic_dataset_path),
        "revision": None,
        "sha": None,
        "format": "v2.1",
        "frames": len(synthetic_dataset),
        "episodes": synthetic_dataset.summary.episodes,
    }
    assert [e.kind for e in events].count("dataset") == 1

    output = result.output_dir
    assert sorted(p.name for p in output.iterdir()) == [
        "config.json",  # lerobot's
        "model.safetensors",
        "norm_stats.json",
        "policy_postprocessor.json",
        "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
        "policy_preprocessor.json",
        "policy_preprocessor_step_3_normalizer_processor.safetensors",
        "relay_config.json",
    ]
    assert json.loads((output / "norm_stats.json").read_text()) == json.loads(
        synthetic_dataset.norm_stats.to_json()
    )
    config = json.loads((output / "relay_config.json").read_text())
    assert config["model"] == "pi05-tiny" and config["tuning"]["finetune"] == "lora"

    # The output reloads through the constructor that loads base models, and differs from the base.
    tuned, base = load_policy(str(output)), load_policy("pi05-tiny")
    batch = tuned.collate([synthetic_dataset[i] for i in range(4)])
    generator = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    tuned_actions = tuned.sample_actions(batch, generator=generator())
    assert not torch.allclose(tuned_actions, base.sample_actions(batch, generator=generator()))
    again = load_policy(str(output)).sample_actions(batch, generator=generator())
    torch.testing.assert_close(again, tuned_actions)


def test_a_work_dir_of_another_recipe_is_refused(
    synthetic_dataset_path: Path, dataset_cache: Path, tmp_path: Path
) -> None:
    run(recipe_for(synthetic_dataset_path, steps=4), tmp_path, dataset_cache)
    with pytest.raises(ConfigError, match="different recipe"):
        run(recipe_for(synthetic_dataset_path, steps=4, learning_rate=5e-4), tmp_path, dataset_cache)


def test_a_bad_dataset_fails_before_training(tmp_path: Path, dataset_cache: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError):
        run(recipe_for(tmp_path / "empty"), tmp_path / "work", dataset_cache)
    assert not (tmp_path / "work" / "checkpoints").exists()


def test_a_recipe_is_a_validated_sftconfig_whose_fingerprint_predates_that() -> None:
    # A stored job's config (a mapping) is validated as an SFTConfig: same messages, same defaults.
    with pytest.raises(ConfigError, match=r"bad steps: 0 \(must be an integer from 1 to 100,000\)") as bad:
        Recipe.from_config({"model": "pi05", "dataset_name": "lerobot/pusht_image", "steps": 0})
    assert bad.value.param == "steps" and isinstance(bad.value, EngineError)

    recipe = Recipe.from_config(
        {"model": "pi05", "dataset_name": "lerobot/pusht_image", "name": "first"}, seed=3
    )
    assert recipe.config == SFTConfig(model="pi05", dataset_name="lerobot/pusht_image", name="first")
    # Checkpoints written when Recipe spelled out SFTConfig's fields itself still resume: the
    # fingerprint hashes the same flat settings as then.
    flat = {
        "model": "pi05",
        "dataset_name": "lerobot/pusht_image",
        "batch_size": 128,
        "learning_rate": 2.5e-5,
        "steps": 6000,
        "finetune": "lora",
        "lora_rank": 32,
        "lora_alpha": 32.0,
        "targets": ["action_expert.attn", "action_expert.mlp", "heads"],
        "cameras": None,
        "action_horizon": 10,
        "checkpoint_every": 1000,
        "seed": 3,
        "episodes": None,
    }
    assert recipe.fingerprint() == hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).hexdigest()[:16]
    renamed = Recipe.from_config(recipe.config.model_copy(update={"name": "second"}), seed=3)
    assert renamed.fingerprint() == recipe.fingerprint()
    # dataset_revision counts only when set: another revision is another recipe.
    pinned = Recipe.from_config(recipe.config.model_copy(update={"dataset_revision": "v2.1"}), seed=3)
    assert pinned.fingerprint() != recipe.fingerprint()
    assert Recipe.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe


@pytest.mark.timeout(600)  # without the stop, 1,000 episodes of up to 100 steps take hours
@pytest.mark.parametrize("at_checkpoints", [False, True])
def test_a_stop_ends_the_eval_blocks_evaluation_and_the_run(
    synthetic_dataset_path: Path, dataset_cache: Path, tmp_path: Path, at_checkpoints: bool
) -> None:
    """A cancel that arrives while the policy is evaluated stops the evaluation between two
    environment steps; the run ends `stopped` (the worker then ends the job cancelled), with no
    eval event."""
    from relay.events import CheckpointEvent, EvalEvent, Event

    block = {"env": "relay/Dot-v0", "episodes": 1000, "max_steps": 100, "videos": 0}
    recipe = recipe_for(
        synthetic_dataset_path,
        steps=4,
        checkpoint_every=2,
        eval={**block, "at_checkpoints": at_checkpoints},
    )
    events: list[Event] = []
    stop_at = 2 if at_checkpoints else 4  # the checkpoint whose evaluation the stop falls in
    result = run_recipe(
        recipe,
        tmp_path / "run",
        on_event=events.append,
        should_stop=lambda: any(isinstance(e, CheckpointEvent) and e.step == stop_at for e in events),
        dataset_cache_dir=dataset_cache,
    )
    assert result.status == "stopped" and result.step == stop_at, result
    assert not [e for e in events if isinstance(e, EvalEvent)]
