"""A recipe's from_checkpoint: the weights it starts from (a directory, a Hub repo at a revision, a
fine-tune's output), checked against the recipe's model, cut to the recipe's chunk length, with the
dataset's or the checkpoint's statistics, and reported in a weights event."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from relay.events import WeightsEvent
from relay.sft.config import SFTConfig
from relay_engine.datasets import write_synthetic_dataset
from relay_engine.datasets.norm_stats import NormStats
from relay_engine.errors import ConfigError
from relay_engine.families import family_for
from relay_engine.families.base import RecipeRun
from relay_engine.models import exported_state_dict, load_policy, to_policy_state_dict
from relay_engine.models.checkpoints import checkpoint_norm_stats, load_checkpoint, resolve_checkpoint
from relay_engine.models.weights import TINY_BASE_DIR
from relay_engine.recipe import Recipe, run_recipe
from tests.hub import FakeHub, Repo

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def recipe(dataset: Path, **changes: Any) -> Recipe:
    config: dict[str, Any] = dict(
        model="pi05-tiny", dataset_name=str(dataset), batch_size=4, steps=2, finetune="full"
    )
    engine: dict[str, Any] = dict(checkpoint_every=1000, num_workers=0)
    for name, value in changes.items():
        (config if name in SFTConfig.model_fields else engine)[name] = value
    return Recipe.from_config(SFTConfig(**config), **engine)


def train(recipe: Recipe, work_dir: Path, cache: Path) -> tuple[Path, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    result = run_recipe(
        recipe, work_dir, on_event=events.append, should_stop=lambda: False, dataset_cache_dir=cache
    )
    assert result.status == "completed" and result.output_dir is not None
    return Path(result.output_dir), events


@pytest.fixture(scope="module")
def parent(
    tmp_path_factory: pytest.TempPathFactory, synthetic_dataset_path: Path, dataset_cache: Path
) -> Path:
    """A fine-tune's output (2 full steps from the tiny base): Relay's format, with norm_stats.json."""
    output, _ = train(recipe(synthetic_dataset_path), tmp_path_factory.mktemp("parent"), dataset_cache)
    return output


@pytest.fixture(scope="module")
def other_robot_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another dataset of the same robot's widths, with other statistics (another seed)."""
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("other") / "dataset", episodes=6, episode_length=(12, 16), seed=11
    )


def file_weights(output: Path) -> dict[str, torch.Tensor]:
    return to_policy_state_dict(load_file(str(output / "model.safetensors")))


def test_resolved_job_output_loads_identical_tensors(parent: Path) -> None:
    checkpoint = resolve_checkpoint("ft-0123456789ab", job_output=parent)
    assert checkpoint.job == "ft-0123456789ab" and checkpoint.directory == parent
    policy = load_checkpoint(checkpoint, model="pi05-tiny", action_horizon=10)
    expected = file_weights(parent)
    state = policy.state_dict()
    assert sorted(state) == sorted(expected)
    assert all(torch.equal(state[key], expected[key].float()) for key in expected)
    # The base's weights differ: the test would see a load of the wrong file.
    base = file_weights(TINY_BASE_DIR)
    assert any(not torch.equal(base[key].float(), expected[key].float()) for key in expected)


def test_the_prepared_recipe_holds_the_checkpoints_weights_before_the_first_step(
    parent: Path, synthetic_dataset_path: Path, dataset_cache: Path, tmp_path: Path
) -> None:
    for finetune in ("full", "lora"):  # LoRA's adapters start at zero: merged, they change nothing
        child = recipe(synthetic_dataset_path, from_checkpoint="ft-0123456789ab", finetune=finetune)
        child = Recipe.from_dict({**child.to_dict(), "checkpoint_output": str(parent)})
        prepared = family_for("pi05-tiny").prepare_recipe(
            RecipeRun(child, tmp_path / finetune, torch.device("cpu"), None, dataset_cache)
        )
        expected = file_weights(parent)
        merged = exported_state_dict(prepared.learner.model)  # type: ignore[attr-defined]
        assert all(torch.equal(merged[key], expected[key].float()) for key in expected), finetune


def test_a_job_id_needs_the_service(
    synthetic_dataset_path: Path, dataset_cache: Path, tmp_path: Path
) -> None:
    with pytest.raises(
        ConfigError, match=r"ft-0123456789ab is a fine-tune of the service, and a job id needs"
    ):
        train(recipe(synthetic_dataset_path, from_checkpoint="ft-0123456789ab"), tmp_path, dataset_cache)


def test_a_directory_trains_at_the_recipes_chunk_length_and_is_reported(
    parent: Path, synthetic_dataset_path: Path, dataset_cache: Path, tmp_path: Path
) -> None:
    # A checkpoint trained at another chunk length (lerobot's pi05 checkpoints say chunk_size 50).
    checkpoint = tmp_path / "long-chunks"
    shutil.copytree(parent, checkpoint)
    config = json.loads((checkpoint / "relay_config.json").read_text())
    (checkpoint / "relay_config.json").write_text(json.dumps({**config, "action_horizon": 50}))
    assert load_policy(checkpoint).config.action_horizon == 50  # what a directory meant before

    output, events = train(
        recipe(synthetic_dataset_path, from_checkpoint=str(checkpoint)), tmp_path / "job", dataset_cache
    )
    assert json.loads((output / "relay_config.json").read_text())["action_horizon"] == 10
    weights = [event for event in events if isinstance(event, WeightsEvent)]
    assert weights == [
        WeightsEvent(
            step=0, model="pi05-tiny", repo=None, revision=None, sha=None, path=str(checkpoint), job=None
        )
    ]


def test_a_checkpoint_of_another_architecture_is_refused_naming_both(
    parent: Path,
    synthetic_dataset_path: Path,
    dataset_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # pi05 on this CPU is allowed here, so that the checkpoint itself is what is refused.
    monkeypatch.setenv("RELAY_ALLOW_CPU_FULL_SIZE", "true")
    with pytest.raises(ConfigError) as refused:
        train(
            recipe(synthetic_dataset_path, model="pi05", from_checkpoint=str(parent)), tmp_path, dataset_cache
        )
    assert refused.value.param == "from_checkpoint"
    assert f'"{parent}" holds pi05-tiny weights, and model is "pi05"' in str(refused.value)


def test_a_hub_repo_is_read_at_its_revision(
    parent: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # main: the tiny base; tag v2: the fine-tune's output.
    repo = Repo.at(TINY_BASE_DIR)
    sha = repo.add_commit(parent, tag="v2")
    with FakeHub() as hub:
        hub.models["team/my-pi05"] = repo
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        at_v2 = resolve_checkpoint("team/my-pi05@v2")
        on_main = resolve_checkpoint("team/my-pi05")
        with pytest.raises(
            ConfigError,
            match=r"^bad from_checkpoint: cannot get model\.safetensors of "
            r"team/my-pi05 at revision v9 from http://127\.0\.0\.1:\d+ \(RevisionNotFoundError: "
            r"team/my-pi05 has no branch, tag or commit v9\); download it once",
        ):
            resolve_checkpoint("team/my-pi05@v9")
        with pytest.raises(ConfigError, match=r"cannot get model\.safetensors of team/missing from"):
            resolve_checkpoint("team/missing")
    assert (at_v2.repo, at_v2.revision, at_v2.sha) == ("team/my-pi05", "v2", sha)
    assert at_v2.event(0, "pi05-tiny") == WeightsEvent(
        step=0, model="pi05-tiny", repo="team/my-pi05", revision="v2", sha=sha, path=None, job=None
    )
    loaded = load_checkpoint(at_v2, model="pi05-tiny", action_horizon=10).state_dict()
    expected = file_weights(parent)
    assert all(torch.equal(loaded[key], expected[key].float()) for key in expected)
    main_weights = load_checkpoint(on_main, model="pi05-tiny", action_horizon=10).state_dict()
    assert any(not torch.equal(main_weights[key], expected[key].float()) for key in expected)
    # The statistics came with the revision (normalization "checkpoint" reads them).
    assert (at_v2.directory / "norm_stats.json").read_text() == (parent / "norm_stats.json").read_text()


def test_normalization_checkpoint_takes_the_checkpoints_statistics(
    parent: Path, other_robot_data: Path, dataset_cache: Path, tmp_path: Path
) -> None:
    own = (parent / "norm_stats.json").read_text()
    by_dataset, _ = train(
        recipe(other_robot_data, from_checkpoint=str(parent)), tmp_path / "d", dataset_cache
    )
    assert (by_dataset / "norm_stats.json").read_text() != own
    by_checkpoint, _ = train(
        recipe(other_robot_data, from_checkpoint=str(parent), normalization="checkpoint"),
        tmp_path / "c",
        dataset_cache,
    )
    assert (by_checkpoint / "norm_stats.json").read_text() == own


def test_lerobot_processor_statistics_are_read_without_norm_stats_json(parent: Path, tmp_path: Path) -> None:
    lerobot_only = tmp_path / "lerobot-only"
    shutil.copytree(parent, lerobot_only)
    (lerobot_only / "norm_stats.json").unlink()
    read = checkpoint_norm_stats(resolve_checkpoint(str(lerobot_only)))
    own = NormStats.from_json((parent / "norm_stats.json").read_text())
    for ours, theirs in ((read.state, own.state), (read.actions, own.actions)):
        for name in ("mean", "std", "q01", "q99"):  # stored as float32 by lerobot's normalizer
            assert np.allclose(getattr(ours, name), getattr(theirs, name), rtol=1e-6, atol=1e-6), name


def test_a_checkpoint_without_statistics_is_refused_for_normalization_checkpoint(
    synthetic_dataset_path: Path, dataset_cache: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(TINY_BASE_DIR, bare)
    with pytest.raises(
        ConfigError, match=rf"^bad normalization: \"checkpoint\", and {bare} carries no statistics"
    ):
        train(
            recipe(synthetic_dataset_path, from_checkpoint=str(bare), normalization="checkpoint"),
            tmp_path / "job",
            dataset_cache,
        )


def test_a_missing_directory_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"^bad from_checkpoint: {tmp_path}/nowhere is not a directory"):
        resolve_checkpoint(str(tmp_path / "nowhere"))
